"""The typed loops of allocators/seq_kernels.py equal the NumPy expressions they replace.

Why: the compiled core runs them as C loops (typed memoryviews) and the pure path as Python; both must
give exactly what the allocator's former NumPy calls gave, integers and float64 products alike. The
loops are checked against those expressions on random batches: as loaded (compiled where the core is
built), as Python with Cython absent (allocators/cython_shim.py stands in; the NumPy branches run), and
the loops themselves as Python.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
from _shim_helpers import load_with_shim
from hypothesis import given, settings
from hypothesis import strategies as st

from allocators import seq_kernels


def _loops_as_python() -> ModuleType:
    """seq_kernels.py with the shim claiming to be compiled: the typed loops themselves, run as Python
    (the compiled module's logic, testable without a compiler)."""
    module = load_with_shim("allocators/seq_kernels.py", "_seq_kernels_shim")
    compiled_shim = ModuleType("cython_shim_compiled")
    compiled_shim.__dict__.update(module.cython.__dict__)
    compiled_shim.compiled = True  # type: ignore[attr-defined]
    module.cython = compiled_shim  # type: ignore[attr-defined]  # read at call time
    return module


PURE = load_with_shim("allocators/seq_kernels.py", "_seq_kernels_shim")
LOOPS = _loops_as_python()
KERNELS = pytest.mark.parametrize(
    "kernels", [seq_kernels, PURE, LOOPS], ids=["as loaded", "shim (NumPy branches)", "loops as Python"]
)


@st.composite
def batches(draw: st.DrawFn) -> dict:
    """A paged allocator's per-sequence state for a batch: lengths within held blocks, finals beyond."""
    block_size = draw(st.sampled_from([1, 2, 16]))
    rows = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(1, 200, rows)
    num_blocks = -(-lengths // block_size) + rng.integers(0, 2, rows) * draw(st.integers(0, 2))
    final = lengths + rng.integers(0, 300, rows)
    tail = -final % block_size
    ids = rng.permutation(rows)[: draw(st.integers(1, rows))].astype(np.int64)
    steps = draw(st.integers(2, 70))
    return {
        "bs": block_size,
        "lengths": lengths.astype(np.int64),
        "num_blocks": num_blocks.astype(np.int64),
        "final": final.astype(np.int64),
        "tail": tail.astype(np.int64),
        "block_from": (final + tail - block_size + 1).astype(np.int64),
        "ids": ids,
        "steps": steps,
        "durations": rng.random(steps) * 0.05,
    }


@KERNELS
@settings(max_examples=150, deadline=None)
@given(batch=batches(), grow_by=st.integers(1, 40))
def test_grow_quiet(kernels: ModuleType, batch: dict, grow_by: int) -> None:
    lengths, ids = batch["lengths"], batch["ids"]
    quiet = np.minimum(batch["num_blocks"] * batch["bs"], batch["final"])
    expected = lengths.copy()
    grown = expected[ids] + grow_by
    expected[ids] = grown
    events = kernels.grow_quiet(lengths, quiet, ids, grow_by)
    assert np.array_equal(lengths, expected)
    assert [int(x) for x in events] == ids[grown > quiet[ids]].tolist()
    assert int(kernels.longest_length(lengths, ids)) == int(lengths[ids].max())


@KERNELS
@settings(max_examples=200, deadline=None)
@given(batch=batches())
def test_jump_scan_and_final_block_terms(kernels: ModuleType, batch: dict) -> None:
    """As jump_integral.py computed them with NumPy before (bincount, accumulate, minimum, where)."""
    bs, ids, steps = batch["bs"], batch["ids"], batch["steps"]
    lengths, final = batch["lengths"][ids], batch["final"][ids]
    remaining = final - lengths
    held = batch["num_blocks"][ids] * bs
    room = held - lengths
    per_room = np.bincount(room, minlength=bs)
    appended = np.zeros(steps)
    phase = np.arange(steps - 1) % bs
    np.add.accumulate(per_room[phase], out=appended[1:])
    from_now = batch["block_from"][ids] - lengths
    if per_room.size == bs:
        starts = np.maximum(from_now, 0)
    else:
        starts = np.where(room >= remaining, 0, from_now)

    got_appended = np.full(steps, np.nan)
    min_remaining, all_small, min_start = kernels.jump_scan(
        batch["lengths"],
        batch["final"],
        batch["num_blocks"],
        batch["block_from"],
        ids,
        bs,
        steps,
        np.full(bs, 7, dtype=np.int64),
        got_appended,
    )
    assert int(min_remaining) == int(remaining.min())
    assert bool(all_small) == (per_room.size == bs)
    assert (int(min_start) < steps) == (int(starts.min()) < steps)
    if int(min_remaining) >= steps - 1:
        assert np.array_equal(got_appended, appended)

    suffix_s = np.zeros(steps + 1)
    np.add.accumulate(batch["durations"][::-1], out=suffix_s[-2::-1])
    products = np.empty(ids.size)
    never = kernels.final_block_terms(
        batch["lengths"],
        batch["final"],
        batch["num_blocks"],
        batch["block_from"],
        batch["tail"],
        ids,
        bs,
        steps,
        bool(all_small),
        suffix_s,
        products,
    )
    expected_products = batch["tail"][ids] * suffix_s[np.minimum(starts, steps)]
    assert products.tobytes() == expected_products.tobytes()  # bit for bit
    assert int(never) == int(np.add.reduce(np.maximum(0, held - final)))


@KERNELS
@settings(max_examples=100, deadline=None)
@given(batch=batches())
def test_lean_append_and_release_loops(kernels: ModuleType, batch: dict) -> None:
    bs, ids = batch["bs"], batch["ids"]
    seq_list = [int(x) for x in ids]
    num_blocks = batch["num_blocks"]
    caps = batch["final"].copy()

    width = int(num_blocks.max()) + 1
    tables = np.arange(ids.size * 0 + num_blocks.size * width, dtype=np.int32).reshape(num_blocks.size, width)
    slots = np.arange(num_blocks.size, dtype=np.int64)[::-1].copy()
    quiet = np.zeros(num_blocks.size, dtype=np.int64)
    blocks = [1000 + i for i in range(len(seq_list))]
    exp_tables, exp_blocks, exp_quiet = tables.copy(), num_blocks.copy(), quiet.copy()
    exp_tables[slots[ids], exp_blocks[ids]] = blocks
    exp_blocks[ids] += 1
    held = exp_blocks[ids] * bs
    exp_quiet[ids] = np.minimum(held, caps[ids])
    never = kernels.lean_append(tables, num_blocks, slots, batch["final"], quiet, caps, seq_list, blocks, bs)
    assert int(never) == int(np.maximum(held - batch["final"][ids], 0).sum())
    assert np.array_equal(tables, exp_tables)
    assert np.array_equal(num_blocks, exp_blocks)
    assert np.array_equal(quiet, exp_quiet)

    slot, count = int(slots[ids[0]]), int(num_blocks[ids[0]])
    expected_row = tables[slot, :count][::-1].astype(np.int64)
    row = np.empty(count, dtype=np.int64)
    kernels.take_row_reversed(tables, slot, count, row)
    assert np.array_equal(row, expected_row)
    assert (tables[slot, :count] == -1).all()

    refcount = (np.arange(2000) % 3 + 1).astype(np.int32)
    released = np.unique(batch["lengths"] * 7)[::-1].astype(np.int64)
    expected_left = refcount[released] - 1
    freed = np.empty(released.size, dtype=np.int64)
    num_freed = kernels.drop_refs(refcount, released, freed)
    assert np.array_equal(freed[:num_freed], released[expected_left == 0])
    assert np.array_equal(refcount[released], expected_left)


@KERNELS
def test_typed_views_write_through(kernels: ModuleType) -> None:
    """A kept view (what the paged allocator passes) reads and writes its array, 1-D and table alike."""
    lengths = np.zeros(6, dtype=np.int64)
    quiet = np.full(6, 3, dtype=np.int64)
    events = kernels.grow_quiet(
        kernels.typed_view(lengths), kernels.typed_view(quiet), np.array([4, 1], dtype=np.int64), 5
    )
    assert [int(x) for x in events] == [4, 1]
    assert lengths.tolist() == [0, 5, 0, 0, 5, 0]
    table = np.full((2, 3), -1, dtype=np.int32)
    table[1] = [7, 8, 9]
    row = np.empty(3, dtype=np.int64)
    kernels.take_row_reversed(kernels.typed_view(table), 1, 3, row)
    assert row.tolist() == [9, 8, 7] and table[1].tolist() == [-1, -1, -1]
    refcount = np.ones(4, dtype=np.int32)
    freed = np.empty(2, dtype=np.int64)
    assert kernels.drop_refs(kernels.typed_view(refcount), np.array([3, 0]), freed) == 2
    assert freed.tolist() == [3, 0] and refcount.tolist() == [0, 1, 1, 0]


def test_a_deep_copied_paged_allocator_makes_its_own_views() -> None:
    """The jump integral's stepped reference grows a deep copy: never through the original's views."""
    import copy

    from allocators.base import SeqSpec
    from allocators.paged import PagedAllocator

    alloc = PagedAllocator("paged", 4096, 16)
    assert alloc.admit(SeqSpec(0, 20, 0, 100))
    alloc.grow(np.array([0]), 1)
    probe = copy.deepcopy(alloc)
    assert probe.grow(np.array([0]), 30).size == 0
    assert int(alloc.lengths_tokens[0]) == 21 and int(probe.lengths_tokens[0]) == 51
    assert alloc.state_snapshot() != probe.state_snapshot()


@KERNELS
@settings(max_examples=100, deadline=None)
@given(
    num_blocks=st.integers(4, 60),
    head=st.integers(0, 20),
    count=st.integers(0, 20),
    seed=st.integers(0, 2**32 - 1),
)
def test_block_pool_pop_and_push_loops(
    kernels: ModuleType, num_blocks: int, head: int, count: int, seed: int
) -> None:
    """The free queue's typed pop (as a list and into a table row) and the release of a table row equal
    the array expressions `BlockPool.allocate` and `release` use."""
    rng = np.random.default_rng(seed)
    count = min(count, num_blocks)
    head = min(head, 2 * num_blocks - count)
    entries = np.zeros(2 * num_blocks + 1, dtype=np.int64)
    entries[head : head + count] = rng.permutation(num_blocks)[:count]
    in_queue = rng.integers(0, 2, num_blocks).astype(bool)
    refcount = rng.integers(0, 3, num_blocks).astype(np.int32)
    has_key = rng.integers(0, 2, num_blocks).astype(bool)
    taken = entries[head : head + count]
    exp_in_queue, exp_refcount, exp_has_key = in_queue.copy(), refcount.copy(), has_key.copy()
    exp_in_queue[taken] = False
    exp_refcount[taken] = 1
    exp_has_key[taken] = False
    exp_evicted = taken[has_key[taken]].tolist()

    arrays = [in_queue.copy(), refcount.copy(), has_key.copy()]
    evicted: list[int] = []
    blocks = kernels.pop_blocks(
        entries, kernels.flag_view(arrays[0]), arrays[1], kernels.flag_view(arrays[2]), head, count, evicted
    )
    assert [int(b) for b in blocks] == taken.tolist()
    if kernels is not LOOPS:  # Python ints (block table entries, dict keys' holders); C ints compiled
        assert all(type(b) is int for b in blocks)
    assert [int(b) for b in evicted] == exp_evicted
    assert np.array_equal(arrays[0], exp_in_queue) and np.array_equal(arrays[1], exp_refcount)
    assert np.array_equal(arrays[2], exp_has_key)

    arrays = [in_queue.copy(), refcount.copy(), has_key.copy()]
    evicted = []
    tables = np.full((3, num_blocks + 2), -1, dtype=np.int32)
    kernels.pop_into_row(
        entries,
        kernels.flag_view(arrays[0]),
        arrays[1],
        kernels.flag_view(arrays[2]),
        head,
        count,
        tables,
        1,
        evicted,
    )
    assert tables[1, :count].tolist() == taken.tolist() and (tables[1, count:] == -1).all()
    assert (tables[[0, 2]] == -1).all()
    assert [int(b) for b in evicted] == exp_evicted
    assert np.array_equal(arrays[0], exp_in_queue) and np.array_equal(arrays[1], exp_refcount)
    assert np.array_equal(arrays[2], exp_has_key)

    # a row of distinct held blocks released, last first: refcounts down, the freed ones to the tail
    row = rng.permutation(num_blocks)[:count]
    held_refcount = rng.integers(1, 3, num_blocks).astype(np.int32)
    tables = np.full((2, num_blocks + 1), -1, dtype=np.int32)
    tables[0, :count] = row
    tail = 2 * num_blocks + 1 - count
    queue_flags = np.zeros(num_blocks, dtype=bool)
    out = entries.copy()
    released = row[::-1]
    exp_left = held_refcount[released] - 1
    exp_freed = released[exp_left == 0]
    exp_refcount = held_refcount.copy()
    exp_refcount[released] = exp_left
    num_freed = kernels.release_row_to_tail(
        tables, 0, count, held_refcount, out, kernels.flag_view(queue_flags), tail
    )
    assert int(num_freed) == exp_freed.size
    assert out[tail : tail + exp_freed.size].tolist() == exp_freed.tolist()
    assert np.array_equal(out[:tail], entries[:tail])
    assert (tables == -1).all()
    assert np.array_equal(held_refcount, exp_refcount)
    assert np.flatnonzero(queue_flags).tolist() == sorted(exp_freed.tolist())
