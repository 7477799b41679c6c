"""BlockPool's typed row paths equal its array paths: same blocks, order, refcounts, queue and names.

Why: admission takes its blocks straight into a block-table row (`allocate_into_row`), a decode step's
few blocks come as a list (`allocate_few`), and a release frees a block-table row in one typed pass
(`release_row`); each must leave the pool exactly as `allocate` / `release` of the same blocks would,
with and without prefix caching, with cached blocks evicted and stale queue entries (cache hits).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from allocators.block_pool import BlockPool

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "few", "release", "touch"]),
        st.integers(min_value=0, max_value=12),
        st.integers(min_value=0, max_value=2**31),
    ),
    max_size=60,
)


def _state(pool: BlockPool) -> tuple:
    return (
        pool.refcount.tobytes(),
        pool.queue.in_queue.tobytes(),
        pool.has_key.tobytes(),
        pool.num_free,
        pool.num_cached,
        tuple(pool.queue.peek(pool.num_free).tolist()),
        tuple(sorted(pool._block_by_key.items())),
        tuple(pool._key_of_block),
    )


@settings(max_examples=150, deadline=None)
@given(caching=st.booleans(), num_blocks=st.integers(4, 40), ops=_OPS)
def test_row_paths_match_array_paths(caching: bool, num_blocks: int, ops: list) -> None:
    typed, plain = BlockPool(num_blocks, caching), BlockPool(num_blocks, caching)
    table = np.full((64, num_blocks + 1), -1, dtype=np.int32)
    rows: list[tuple[int, list[int]]] = []  # (table row, blocks) held in both pools
    free_slots = list(range(64))[::-1]
    next_key = 0
    for op, amount, pick in ops:
        if op in ("admit", "few") and amount <= typed.num_free and free_slots:
            slot = free_slots.pop()
            if op == "admit":
                if not typed.allocate_into_row(table, slot, amount):
                    table[slot, :amount] = typed.allocate(amount)
                got = table[slot, :amount].tolist()
            else:
                got = typed.allocate_few(amount)
                assert all(type(b) is int for b in got)
                table[slot, :amount] = got
            assert got == plain.allocate(amount).tolist()
            keys = [("k", next_key + i) for i in range(amount)]  # name them: later evictions
            next_key += amount
            typed.register_list(got, keys)
            plain.register_list(got, keys)
            rows.append((slot, got))
        elif op == "release" and rows:
            slot, blocks = rows.pop(pick % len(rows))
            want = plain.release(np.array(blocks[::-1], dtype=np.int64))
            got = typed.release_row(table, slot, len(blocks), True)
            assert got is not None and got.tolist() == want.tolist()
            assert (table[slot, : len(blocks)] == -1).all()
            free_slots.append(slot)
        elif op == "touch" and caching and typed.num_cached and free_slots:  # a cache hit: stale entries
            cached = typed.cached_blocks()
            start = pick % cached.size
            hit = cached[start : start + 1 + amount % 3]
            assert typed.touch(hit).tolist() == plain.touch(hit.copy()).tolist()
            slot = free_slots.pop()
            table[slot, : hit.size] = hit
            rows.append((slot, hit.tolist()))
        assert _state(typed) == _state(plain)
