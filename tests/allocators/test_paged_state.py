"""`PagedState` (allocators/paged.py): one sequence's stores at admission and release, the lean
append's test and fused pop-and-append, its running totals, and its copies.

Why: compiled, the paged allocator's per-request and lean-append work are C methods of this
extension type (`admit_row`, `clear_row`, `lean_columns`, `lean_append_popped`) and its totals C
fields; they must do exactly what the allocator did before (the typed calls `seq_kernels.admit_seq`,
`clear_seq`, `lean_columns` and `lean_append_popped` they replace) and keep the totals as `_count_in`
would. Checked as loaded (compiled where the core is built) and as Python with Cython absent
(allocators/cython_shim.py stands in), and for deepcopy and pickle, which the jump integral's stepped
reference and the sweeps use.
"""

from __future__ import annotations

import copy
import pickle
from types import ModuleType

import numpy as np
import pytest
from _shim_helpers import load_with_shim
from hypothesis import given, settings
from hypothesis import strategies as st

from allocators import paged, seq_kernels
from allocators.base import SeqSpec
from allocators.paged import PagedAllocator

MODULES = pytest.mark.parametrize(
    "module", [paged, load_with_shim("allocators/paged.py", "_paged_shim")], ids=["as loaded", "shim"]
)
NAMES = ("lengths", "quiet", "caps", "num_blocks", "slots", "final", "block_from", "tail", "prefix_hit")


@MODULES
@settings(max_examples=100, deadline=None)
@given(
    bs=st.sampled_from([1, 2, 16]),
    length=st.integers(0, 500),
    blocks=st.integers(0, 40),
    final=st.integers(0, 700),
    cap=st.integers(-1, 700),
)
def test_admit_and_clear_row(
    module: ModuleType, bs: int, length: int, blocks: int, final: int, cap: int
) -> None:
    """One sequence's stores at admission and release, as `PagedAllocator` made them before, and its
    share of the running totals in and out."""
    rows = 5
    a = {name: np.full(rows, 7, dtype=np.int64) for name in NAMES}
    live = np.zeros(rows, dtype=bool)
    unused = {  # the block table and the pool's arrays, which these stores do not touch
        "table": np.full((rows, 2), -1, dtype=np.int32),
        "entries": np.zeros(4, dtype=np.int64),
        "in_queue": np.zeros(4, dtype=bool),
        "refcount": np.zeros(4, dtype=np.int32),
        "has_key": np.zeros(4, dtype=bool),
    }
    state = _state_of(module, {**a, **unused, "live": live})
    quiet = min(blocks * bs, cap)
    state.admit_row(3, length, blocks, final, quiet, cap, bs)
    tail = -final % bs
    expected = {
        "lengths": length, "quiet": quiet, "caps": cap, "num_blocks": blocks, "final": final,
        "block_from": final + tail - bs + 1, "tail": tail, "prefix_hit": 0, "slots": 7,
    }  # fmt: skip
    for name, value in expected.items():
        assert a[name].tolist() == [7, 7, 7, value, 7], name
    assert live.tolist() == [False, False, False, True, False]
    held = blocks * bs
    totals = (state.stored_tokens, state.held_slots, state.never_tokens, state.num_live)
    assert totals == (length, held, max(0, held - max(final, length)), 1)
    assert all(type(x) is int for x in totals)  # the running totals read as Python ints

    state.clear_row(3, bs)
    cleared = {"lengths": 0, "quiet": 0, "caps": -1, "num_blocks": 0, "slots": -1, "final": final}
    for name, value in cleared.items():
        assert a[name].tolist() == [7, 7, 7, value, 7], name
    assert not live.any()
    assert (state.stored_tokens, state.held_slots, state.never_tokens, state.num_live) == (0, 0, 0, 0)


@MODULES
def test_state_copies_keep_totals_not_views(module: ModuleType) -> None:
    """A copy or unpickled state has the totals and no views: its owner sets them from its own arrays."""
    state = module.PagedState()
    state.stored_tokens, state.held_slots, state.never_tokens, state.num_live = 5, 16, 3, 2
    twins = [copy.deepcopy(state)]
    if module is paged:  # pickle finds the class by its module's name, which the shim's copy has not
        twins.append(pickle.loads(pickle.dumps(state)))
    for twin in twins:
        assert (twin.stored_tokens, twin.held_slots, twin.never_tokens, twin.num_live) == (5, 16, 3, 2)


def test_allocator_copy_is_independent() -> None:
    """A deepcopy of a paged allocator (the jump integral's stepped reference) grows and releases
    without touching the original, whose totals and arrays stay as they were."""
    alloc = PagedAllocator("paged", 1024, 16)
    for sid in range(3):
        assert alloc.admit(SeqSpec(sid, 20 + 7 * sid, 50, 40))
    alloc.grow(np.array([0, 1, 2]), 5)
    before = (alloc.breakdown(), alloc.state_snapshot())
    twin = copy.deepcopy(alloc)
    assert twin.breakdown() == before[0]
    twin.grow(np.array([0, 1, 2]), 13)
    twin.release(1)
    assert twin.admit(SeqSpec(3, 33, 10, 10))
    assert (alloc.breakdown(), alloc.state_snapshot()) == before
    restored = pickle.loads(pickle.dumps(alloc))
    assert (restored.breakdown(), restored.state_snapshot()) == before


def _state_of(module: ModuleType, arrays: dict) -> object:
    """A PagedState of `module` viewing these arrays (bool flags as uint8, as seq_kernels.flag_view)."""
    state = module.PagedState()
    views = tuple(arrays[name] for name in (*NAMES[:8], "table"))
    flags = (arrays["live"].view(np.uint8), arrays["prefix_hit"])
    pool = (
        arrays["entries"],
        arrays["in_queue"].view(np.uint8),
        arrays["refcount"],
        arrays["has_key"].view(np.uint8),
    )
    state.set_views(views, flags, pool)
    return state


@st.composite
def lean_batches(draw: st.DrawFn) -> dict:
    """Sequences crossing a block boundary: per-sequence arrays, a block table and a pool's arrays."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bs = draw(st.sampled_from([1, 2, 16]))
    rows = draw(st.integers(1, 30))
    ids = rng.permutation(rows)[: draw(st.integers(1, rows))].tolist()
    num_blocks = rng.integers(0, 6, rows).astype(np.int64)
    lengths = num_blocks * bs + 1  # each grew past its held slots
    final = lengths + rng.integers(-2, 300, rows)
    width = int(num_blocks.max()) + 2
    head = int(rng.integers(0, len(ids) + 5))
    num_pool = 3 * len(ids) + 5
    entries = np.zeros(head + len(ids) + 1, dtype=np.int64)
    entries[head : head + len(ids)] = rng.permutation(num_pool)[: len(ids)]
    arrays = {name: np.zeros(rows, dtype=np.int64) for name in NAMES}
    arrays.update(
        lengths=lengths,
        num_blocks=num_blocks,
        final=final,
        caps=final.copy(),
        slots=rng.permutation(rows).astype(np.int64),
        table=np.full((rows, width), -1, dtype=np.int32),
        live=np.ones(rows, dtype=bool),
        entries=entries,
        in_queue=rng.integers(0, 2, num_pool).astype(bool),
        refcount=rng.integers(0, 3, num_pool).astype(np.int32),
        has_key=rng.integers(0, 2, num_pool).astype(bool),
    )
    return {"bs": bs, "ids": ids, "head": head, "arrays": arrays}


@MODULES
@settings(max_examples=100, deadline=None)
@given(batch=lean_batches())
def test_lean_columns(module: ModuleType, batch: dict) -> None:
    """Columns one more block each needs (max held + 1), or -1 when one is past its lean cap."""
    a, ids = batch["arrays"], batch["ids"]
    state = _state_of(module, a)
    over = bool((a["lengths"][ids] > a["caps"][ids]).any())
    columns = state.lean_columns(ids)
    assert type(columns) is int
    assert columns == (-1 if over else int(a["num_blocks"][ids].max()) + 1)


@MODULES
@settings(max_examples=100, deadline=None)
@given(batch=lean_batches())
def test_lean_append_popped_is_pop_then_append(module: ModuleType, batch: dict) -> None:
    """The fused pop-and-append equals seq_kernels' `pop_blocks` then `lean_append` of the popped blocks."""
    bs, ids, head = batch["bs"], batch["ids"], batch["head"]
    fused, split = copy.deepcopy(batch["arrays"]), copy.deepcopy(batch["arrays"])
    evicted_fused: list[int] = []
    never = _state_of(module, fused).lean_append_popped(ids, bs, head, evicted_fused)
    evicted_split: list[int] = []
    blocks = seq_kernels.pop_blocks(
        split["entries"], seq_kernels.flag_view(split["in_queue"]), split["refcount"],
        seq_kernels.flag_view(split["has_key"]), head, len(ids), evicted_split,
    )  # fmt: skip
    expected_never = seq_kernels.lean_append(
        split["table"], split["num_blocks"], split["slots"], split["final"], split["quiet"], split["caps"],
        ids, blocks, bs,
    )  # fmt: skip
    assert type(never) is int  # it goes into the running totals
    assert never == int(expected_never)
    assert [int(b) for b in evicted_fused] == [int(b) for b in evicted_split]
    assert all(type(b) is int for b in evicted_fused)
    for name in ("table", "num_blocks", "quiet", "in_queue", "refcount", "has_key"):
        assert np.array_equal(fused[name], split[name]), name
