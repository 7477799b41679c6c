"""Where the paged allocator's scalar paths stop paying: `_append_lean_few` vs `_append_lean`, `_grow_few`.

Why: `PagedAllocator.grow` serves the sequences that cross a block boundary with a Python loop up to
`allocators.paged._LEAN_LOOP_MAX` of them and with fancy-indexed NumPy above; the constant should sit
at the measured crossover (issue 16: "scalar Python where a batch is small, NumPy where it is large").
Each round grows `c` sequences (full blocks, far from their final length) by one block's worth of
tokens, so each crosses exactly one boundary, then appends their blocks one way or the other. Both
paths give the same blocks in the same order (tests/allocators); only their cost differs. Per round,
best of --repeats batches of --rounds rounds, so other load on a shared machine shows less.

The second table times a whole `grow(ids, 1)` of `n` sequences, one token at a time (so one grow in
16 crosses a block boundary, as in decoding), with the scalar loop (`_grow_few`) and with the
vectorised tiers: `allocators.paged._SCALAR_GROW_MAX` should sit below where the loop stops winning.

    .venv/bin/python benchmarks/lean_crossover.py [--rounds 400] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import allocators.paged as paged_module
from allocators.base import SeqSpec
from allocators.paged import _LEAN_LOOP_MAX, PagedAllocator

BLOCK_SIZE = 16
PROMPT_TOKENS = 6 * BLOCK_SIZE  # full blocks: the next token crosses a boundary
CROSSING_COUNTS = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32, 64)
GROW_COUNTS = (1, 2, 3, 4, 5, 6, 8, 10, 12)


def _allocator(num_seqs: int, rounds: int) -> PagedAllocator:
    alloc = PagedAllocator("paged", num_seqs * (rounds + 10) * BLOCK_SIZE, BLOCK_SIZE)
    for seq_id in range(num_seqs):
        if not alloc.admit(SeqSpec(seq_id, PROMPT_TOKENS, 10**6, 10**6)):
            raise RuntimeError("admission failed")
    return alloc


def _round_us(num_seqs: int, scalar: bool, rounds: int, repeats: int) -> float:
    """Best time per round (us) of growing `num_seqs` sequences by one block and appending their blocks."""
    ids = np.arange(num_seqs, dtype=np.int64)
    best_s = float("inf")
    for _ in range(repeats):
        alloc = _allocator(num_seqs, rounds)
        lengths = alloc.lengths_tokens
        start = time.perf_counter()
        for _ in range(rounds):
            lengths[ids] += BLOCK_SIZE  # grown past the quiet limit, as `grow` leaves them
            done = alloc._append_lean_few(ids.tolist()) if scalar else alloc._append_lean(ids, lengths[ids])
            if not done:
                raise RuntimeError("lean append refused")
        best_s = min(best_s, (time.perf_counter() - start) / rounds)
    return best_s * 1e6


def _grow_us(num_seqs: int, scalar: bool, rounds: int, repeats: int) -> float:
    """Best time per `grow(ids, 1)` (us) of `num_seqs` sequences, scalar loop or vectorised tiers."""
    ids = np.arange(num_seqs, dtype=np.int64)
    saved = paged_module._SCALAR_GROW_MAX
    paged_module._SCALAR_GROW_MAX = num_seqs if scalar else 0
    try:
        best_s = float("inf")
        for _ in range(repeats):
            alloc = _allocator(num_seqs, rounds)
            start = time.perf_counter()
            for _ in range(rounds):
                if alloc.grow(ids, 1).size:
                    raise RuntimeError("grow refused")
            best_s = min(best_s, (time.perf_counter() - start) / rounds)
    finally:
        paged_module._SCALAR_GROW_MAX = saved
    return best_s * 1e6


def _crossover_table(label: str, counts: tuple[int, ...], time_us, rounds: int, repeats: int) -> None:
    """Print scalar vs NumPy us for each count (`time_us(count, scalar, rounds, repeats)`), then the
    first count where NumPy wins."""
    crossover = None
    for count in counts:
        scalar_us = time_us(count, True, rounds, repeats)
        numpy_us = time_us(count, False, rounds, repeats)
        faster = "scalar" if scalar_us < numpy_us else "numpy"
        if crossover is None and faster == "numpy":
            crossover = count
        print(f"  {label} {count:3d}: scalar loop {scalar_us:6.2f}  numpy {numpy_us:6.2f}  ({faster})")
    print(f"first {label} where NumPy wins: {crossover}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"_LEAN_LOOP_MAX = {_LEAN_LOOP_MAX}; us per round (incl. the shared lengths update):")
    _crossover_table("crossing", CROSSING_COUNTS, _round_us, args.rounds, args.repeats)
    print(f"_SCALAR_GROW_MAX = {paged_module._SCALAR_GROW_MAX}; us per grow(ids, 1) of n sequences:")
    _crossover_table("n", GROW_COUNTS, _grow_us, args.rounds, args.repeats)


if __name__ == "__main__":
    main()
