"""`PagedState` (allocators/paged.py): one sequence's stores at admission and release, its running
totals, and its copies.

Why: compiled, the paged allocator's per-request stores are C methods of this extension type
(`admit_row`, `clear_row`) and its totals C fields; they must store exactly what the allocator stored
before (the typed calls `seq_kernels.admit_seq` and `clear_seq` they replace) and keep the totals
as `_count_in` would. Checked as loaded (compiled where the core is built) and as Python with Cython
absent (allocators/cython_shim.py stands in), and for deepcopy and pickle, which the jump integral's
stepped reference and the sweeps use.
"""

from __future__ import annotations

import copy
import importlib.util
import pickle
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocators import paged
from allocators.base import SeqSpec
from allocators.paged import PagedAllocator

REPO = Path(__file__).resolve().parents[2]


def _paged_with_shim() -> ModuleType:
    """paged.py executed as Python with `import cython` failing: the shim's path."""
    spec = importlib.util.spec_from_file_location("_paged_shim", REPO / "allocators" / "paged.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("cython")
    sys.modules["cython"] = None  # type: ignore[assignment]  # makes `import cython` raise ImportError
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["cython"]
        else:
            sys.modules["cython"] = saved
    assert module.cython.__name__ == "allocators.cython_shim"
    return module


MODULES = pytest.mark.parametrize("module", [paged, _paged_with_shim()], ids=["as loaded", "shim"])
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
    state = module.PagedState()
    state.set_views(*(a[name] for name in NAMES[:8]), live.view(np.uint8), a["prefix_hit"])
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
