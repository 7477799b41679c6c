"""FreeBlockQueue against a plain-list model: same blocks, same order, under any mix of operations.

Why: the queue is a ring buffer with lazy deletion (stale entries left by `remove`), and `peek`,
`pop` and `pop_few` skip stale entries in windows rather than scanning the whole queue. The model
is the definition: a FIFO list where `remove` deletes from the middle. Every operation's result
and `peek` of every prefix length must match it, including wrap-around compactions (small pools,
many pushes at either end), with and without the stale-position heap (`track_positions`).

The number of examples comes from the hypothesis profile (tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from allocators.block_pool import FreeBlockQueue

# (operation, amount, pick): amount is how many blocks; pick chooses which ones where it matters
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["pop", "pop_few", "push", "push_front", "remove", "peek"]),
        st.integers(min_value=0, max_value=40),
        st.integers(min_value=0, max_value=2**31),
    ),
    max_size=80,
)


def _check(queue: FreeBlockQueue, model: list[int]) -> None:
    assert queue.num_free == len(model)
    for count in sorted({0, 1, 2, 7, len(model) // 2, len(model), len(model) + 3}):
        assert queue.peek(count).tolist() == model[:count]
    assert [b for b in range(queue.in_queue.size) if queue.in_queue[b]] == sorted(model)
    if queue._position is not None:  # the stale heap holds exactly the stale entries' positions
        stale = [p for p in range(queue._head, queue._tail) if not queue._valid(p, p + 1)[0]]
        assert sorted(queue._stale_positions) == stale
        assert queue._position[model].tolist() == [
            p for p in range(queue._head, queue._tail) if queue._valid(p, p + 1)[0]
        ]


@given(num_blocks=st.integers(min_value=1, max_value=64), ops=_OPS, track=st.booleans())
def test_free_queue_matches_list_model(num_blocks: int, ops: list[tuple[str, int, int]], track: bool) -> None:
    queue = FreeBlockQueue(num_blocks, track_positions=track)
    model = list(range(num_blocks))
    taken: list[int] = []  # blocks out of the queue, in the order they left
    for op, amount, pick in ops:
        rng = np.random.default_rng(pick)
        if op in ("pop", "pop_few"):
            count = min(amount, len(model))
            got = queue.pop(count).tolist() if op == "pop" else queue.pop_few(count)
            assert got == model[:count]
            del model[:count]
            taken.extend(got)
        elif op in ("push", "push_front"):
            count = min(amount, len(taken))
            chosen = rng.permutation(len(taken))[:count].tolist()
            blocks = [taken[i] for i in chosen]
            taken = [block for i, block in enumerate(taken) if i not in set(chosen)]
            getattr(queue, op)(np.asarray(blocks, dtype=np.int64))
            model = model + blocks if op == "push" else blocks + model
        elif op == "remove":  # a cache hit: free blocks leave from anywhere in the queue
            count = min(amount, len(model))
            chosen = set(rng.permutation(len(model))[:count].tolist())
            blocks = [block for i, block in enumerate(model) if i in chosen]
            queue.remove(np.asarray(blocks, dtype=np.int64))
            model = [block for i, block in enumerate(model) if i not in chosen]
            taken.extend(blocks)
        else:
            assert queue.peek(amount).tolist() == model[:amount]
        _check(queue, model)
