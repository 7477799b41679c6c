"""The paged allocator's two lean-append paths leave exactly the same state.

Why: `grow` serves up to `_LEAN_LOOP_MAX` crossing sequences with a scalar loop (`_append_lean_few`)
and more with NumPy (`_append_lean`); issue 16 moved that threshold to the measured crossover (as
Python, `_LEAN_LOOP_MAX_PYTHON`; compiled, the loop takes every count), which
is only sound if both paths give the same blocks to the same sequences in the same order and keep
the same totals and limits. Counts on both sides of the threshold, final lengths inside the new
block (never-filled slots), and a short table (column growth) are covered.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest

from allocators.base import SeqSpec
from allocators.paged import _LEAN_LOOP_MAX_PYTHON, PagedAllocator

BLOCK_SIZE = 16


@contextlib.contextmanager
def _threshold(module: ModuleType, name: str, value: int) -> Iterator[None]:
    """Force one of the paged module's scalar-path thresholds for the duration of a block."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def _state(alloc: PagedAllocator) -> dict[str, object]:
    return {
        "tables": alloc._tables.tolist(),
        "num_seq_blocks": alloc.num_seq_blocks.tolist(),
        "lengths": alloc.lengths_tokens.tolist(),
        "quiet": alloc.quiet_limit_tokens.tolist(),
        "totals": (alloc._state.stored_tokens, alloc._state.held_slots, alloc._state.never_tokens),
        "refcount": alloc.pool.refcount.tolist(),
        "free": alloc.pool.queue.peek(alloc.pool.num_free).tolist(),
        "breakdown": alloc.breakdown(),
    }


@pytest.mark.parametrize(
    "count", [1, 2, _LEAN_LOOP_MAX_PYTHON, _LEAN_LOOP_MAX_PYTHON + 1, 3 * _LEAN_LOOP_MAX_PYTHON]
)
def test_scalar_and_numpy_lean_append_agree(count: int) -> None:
    rng = np.random.default_rng(count)
    alloc = PagedAllocator("paged", 4096 * BLOCK_SIZE, BLOCK_SIZE)
    for seq_id in range(count + 3):  # a few sequences that do not grow
        prompt_blocks = int(rng.integers(1, 9))
        output = int(rng.integers(1, 3 * BLOCK_SIZE))  # some end inside the block they are about to take
        assert alloc.admit(SeqSpec(seq_id, prompt_blocks * BLOCK_SIZE, output, output))
    ids = rng.permutation(count + 3)[:count].astype(np.int64)  # blocks go in this (unsorted) order
    alloc.lengths_tokens[ids] += 1  # grown past the quiet limit (full blocks), as `grow` leaves them
    scalar, vector = copy.deepcopy(alloc), copy.deepcopy(alloc)
    assert scalar._append_lean_few(ids.tolist())
    assert vector._append_lean(ids, vector.lengths_tokens[ids])
    assert _state(scalar) == _state(vector)
    assert _state(scalar) != _state(alloc)  # blocks were appended


def test_grow_takes_the_same_blocks_either_side_of_the_threshold() -> None:
    """grow() itself, with the threshold forced low and high: same state after many decode steps."""
    import allocators.paged as paged

    rng = np.random.default_rng(7)
    base = PagedAllocator("paged", 2048 * BLOCK_SIZE, BLOCK_SIZE)
    for seq_id in range(40):
        output = int(rng.integers(20, 200))
        assert base.admit(SeqSpec(seq_id, int(rng.integers(1, 300)), output, output))
    ids = np.arange(40, dtype=np.int64)
    finals = []
    for threshold in (0, 1000):
        with _threshold(paged, "_LEAN_LOOP_MAX", threshold):
            alloc = copy.deepcopy(base)
            for tokens in (1, 1, 5, 1, 16, 3, 1, 1, 9):
                assert alloc.grow(ids, tokens).size == 0
            finals.append(_state(alloc))
    assert finals[0] == finals[1]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_scalar_grow_of_few_sequences_agrees_with_the_vectorised_tiers(seed: int) -> None:
    """`_grow_few` (up to `_SCALAR_GROW_MAX` sequences) against the vectorised tiers, step by step.

    Small groups in random order grow by 1..block_size tokens in a cache that runs out of blocks,
    with max_model_len reached and forks sharing a partial block (copy-on-write): the failures
    returned and the whole state must be equal after every call.
    """
    import allocators.paged as paged

    rng = np.random.default_rng(seed)
    base = PagedAllocator("paged", 160 * BLOCK_SIZE, BLOCK_SIZE, max_model_len=400)
    for seq_id in range(12):
        output = int(rng.integers(5, 150))
        assert base.admit(SeqSpec(seq_id, int(rng.integers(1, 120)), output, output))
    for parent, child in ((0, 12), (3, 13)):  # forks: a shared partial last block until written
        assert base.fork(parent, SeqSpec(child, 1, 50, 50))
    live = np.arange(14, dtype=np.int64)
    calls = [
        (rng.permutation(live)[: int(rng.integers(1, 9))], int(rng.integers(1, BLOCK_SIZE + 1)))
        for _ in range(60)
    ]
    runs = []
    for threshold in (0, 1000):
        with _threshold(paged, "_SCALAR_GROW_MAX", threshold):
            alloc = copy.deepcopy(base)
            trace = []
            for ids, tokens in calls:
                failed = alloc.grow(ids, tokens)
                trace.append((failed.tolist(), _state(alloc)))
            runs.append(trace)
    assert runs[0] == runs[1]
    assert any(failed for failed, _ in runs[0])  # the cache ran out: the general rule's failures agree


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("caching", [False, True])
def test_single_sequence_chunk_grow_agrees_with_the_general_rule(seed: int, caching: bool) -> None:
    """`_grow_single` (one sequence, more than a block: a prefill chunk) against `_grow_general`.

    Chunks of 1..5 blocks' worth of tokens, in a cache that runs out of blocks and under
    max_model_len, with prefix caching on or off (cached blocks evicted when popped): the failures
    returned and the whole state must be equal after every call.
    """
    rng = np.random.default_rng(seed)
    base = PagedAllocator(
        "paged", 60 * BLOCK_SIZE, BLOCK_SIZE, enable_prefix_caching=caching, max_model_len=500
    )
    for seq_id in range(6):
        output = int(rng.integers(5, 150))
        spec = SeqSpec(
            seq_id, int(rng.integers(1, 120)), output, output, prefix_group=seq_id % 2, prefix_tokens=40
        )
        assert base.admit(spec)
    base.release(5)  # leaves cached blocks (with caching) to evict
    calls = [(int(rng.integers(0, 5)), int(rng.integers(BLOCK_SIZE + 1, 5 * BLOCK_SIZE))) for _ in range(40)]
    single, general = copy.deepcopy(base), copy.deepcopy(base)
    outcomes = []
    for seq_id, tokens in calls:
        failed = single.grow(np.array([seq_id], dtype=np.int64), tokens)
        expected = general._grow_general(np.array([seq_id], dtype=np.int64), tokens)
        assert failed.tolist() == expected.tolist()
        assert _state(single) == _state(general)
        outcomes.append(bool(failed.size))
    assert any(outcomes) and not all(outcomes)  # both growth and failure were exercised


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("caching", [False, True])
def test_multi_block_growth_agrees_with_the_general_rule(seed: int, caching: bool) -> None:
    """grow() by more than a block on several sequences (a decode jump) against `_grow_general`.

    Random groups grow by 17..39 tokens in a cache that runs out of blocks, under max_model_len and
    past final lengths, with a fork's pending copy-on-write: failures and state equal after every call.
    """
    rng = np.random.default_rng(seed)
    base = PagedAllocator(
        "paged", 300 * BLOCK_SIZE, BLOCK_SIZE, enable_prefix_caching=caching, max_model_len=1200
    )
    for seq_id in range(10):
        output = int(rng.integers(200, 1500))  # most stay below their final length a while
        spec = SeqSpec(
            seq_id, int(rng.integers(1, 120)), output, output, prefix_group=seq_id % 2, prefix_tokens=40
        )
        assert base.admit(spec)
    assert base.fork(0, SeqSpec(10, 1, 1000, 1000))
    base.release(9)
    live = [seq_id for seq_id in range(11) if seq_id != 9]
    calls = [
        (
            rng.permutation(live)[: int(rng.integers(2, 11))].astype(np.int64),
            int(rng.integers(BLOCK_SIZE + 1, 80)),
        )
        for _ in range(40)
    ]
    lean, general = copy.deepcopy(base), copy.deepcopy(base)
    outcomes = []
    for ids, tokens in calls:
        failed = lean.grow(ids, tokens)
        expected = general._grow_general(ids, tokens)
        assert failed.tolist() == expected.tolist()
        assert _state(lean) == _state(general)
        outcomes.append(bool(failed.size))
    assert any(outcomes) and not all(outcomes)
