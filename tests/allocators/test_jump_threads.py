"""The jump integral's kept scratch is the calling thread's own.

Why: `kvsim sweep --scheduler` runs cells on dask workers with several threads each, so simulations
run in threads of one process. The jump integral keeps its scratch arrays between calls (no allocation
per jump), and a jump still reads its `appended` array after its loop wrote it, through NumPy calls
that may let another thread run. With one scratch per process another thread's jump overwrote it in
between: a sweep cell's kv_reservation_pct differed from the same cell run alone
(tests/sweeps/test_sweep.py, scheduler address path). These tests fail with a shared scratch.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from allocators import SeqSpec, jump_integral, make_allocator


def _growing_allocator(seed: int) -> tuple[object, np.ndarray, np.ndarray]:
    """A paged allocator with decoding sequences, their ids and a jump's step durations."""
    rng = np.random.default_rng(seed)
    alloc = make_allocator("paged", capacity_tokens=20_000, block_size=16)
    for seq_id in range(30):
        assert alloc.admit(SeqSpec(seq_id, int(rng.integers(1, 200)), max_tokens=900, output_tokens=800))
    ids = np.arange(30, dtype=np.int64)
    steps = 1 + alloc.max_uniform_growth(ids, int(rng.integers(40, 120)))
    return alloc, ids, rng.uniform(0.01, 0.05, size=steps)


def _in_thread(function: object) -> object:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(function).result()  # type: ignore[arg-type]


def test_another_threads_jump_leaves_this_threads_scratch_alone() -> None:
    alloc, ids, durations = _growing_allocator(0)
    alloc.breakdown_integral(ids, durations, 0)
    mine = jump_integral._SCRATCH.slots
    appended = mine[4].copy()
    other_alloc, other_ids, other_durations = _growing_allocator(1)
    theirs = _in_thread(
        lambda: (
            other_alloc.breakdown_integral(other_ids, other_durations, 0),
            jump_integral._SCRATCH.slots,
        )[1]
    )
    assert theirs is not mine
    assert jump_integral._SCRATCH.slots is mine
    np.testing.assert_array_equal(mine[4], appended)


def test_concurrent_jumps_equal_jumps_one_at_a_time() -> None:
    cases = [_growing_allocator(seed) for seed in range(8)]
    alone = [alloc.breakdown_integral(ids, durations, 0) for alloc, ids, durations in cases]
    start = threading.Barrier(4)

    def run(case: tuple[object, np.ndarray, np.ndarray]) -> list[dict[str, float]]:
        alloc, ids, durations = case
        start.wait()
        return [alloc.breakdown_integral(ids, durations, 0) for _ in range(200)]

    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(run, cases[:4]))
    for expected, repeats in zip(alone[:4], together, strict=True):
        assert all(result == expected for result in repeats)
