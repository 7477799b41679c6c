"""Allocator speed at 256 running sequences, next to a bare NumPy `lengths += 1` baseline.

Why: the engine calls `grow` once per decode iteration for the whole batch (~1M iterations for
100k requests), so `grow` must cost a small multiple of the NumPy update it wraps; `admit` and
`release` run once per request. All figures come from one run on one machine, so the ratios are
what to compare, not the absolute numbers.

    .venv/bin/python benchmarks/allocator_speed.py [--seqs 256] [--grow-steps 2000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from allocators import SeqSpec, make_allocator

PROMPT_TOKENS = 100
MAX_MODEL_LEN = 4096

CONFIGS: list[tuple[str, str, dict[str, Any]]] = [
    ("contiguous first_fit", "contiguous", {"max_model_len": MAX_MODEL_LEN}),
    ("contiguous buddy", "contiguous", {"max_model_len": MAX_MODEL_LEN, "placement": "buddy"}),
    ("request_limit best_fit", "request_limit", {"max_model_len": MAX_MODEL_LEN, "placement": "best_fit"}),
    ("paged block 16", "paged", {"block_size": 16}),
    ("paged 16 + prefix cache", "paged", {"block_size": 16, "enable_prefix_caching": True}),
    ("paged block 1", "paged", {"block_size": 1}),
    ("virtual 256 tok/page", "virtual", {"max_model_len": MAX_MODEL_LEN, "bytes_per_token_per_layer": 8192}),
]


def _best_seconds(run: Callable[[], None], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _specs(num_seqs: int, grow_steps: int, with_prefix: bool) -> list[SeqSpec]:
    prefix = {"prefix_group": 0, "prefix_tokens": 64} if with_prefix else {}
    return [
        SeqSpec(seq_id, PROMPT_TOKENS, max_tokens=grow_steps + 1, output_tokens=grow_steps + 1, **prefix)
        for seq_id in range(num_seqs)
    ]


def bench_allocator(name: str, params: dict[str, Any], num_seqs: int, grow_steps: int) -> dict[str, float]:
    """ops/s of admit and release (per sequence) and of grow (per call over all sequences)."""
    capacity = num_seqs * MAX_MODEL_LEN
    specs = _specs(num_seqs, grow_steps, with_prefix=params.get("enable_prefix_caching", False))
    ids = np.arange(num_seqs, dtype=np.int64)
    alloc = make_allocator(name, capacity_tokens=capacity, **params)

    def admit_all() -> None:
        for spec in specs:
            alloc.admit(spec)

    def release_all() -> None:
        for seq_id in range(num_seqs):
            alloc.release(seq_id)

    admit_s = release_s = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        admit_all()
        admit_s = min(admit_s, time.perf_counter() - start)
        start = time.perf_counter()
        release_all()
        release_s = min(release_s, time.perf_counter() - start)

    admit_all()
    start = time.perf_counter()
    for _ in range(grow_steps):
        failed = alloc.grow(ids, 1)
        if failed.size:  # pragma: no cover - capacity is sized for the run
            raise RuntimeError(f"{name}: grow failed for {failed.size} sequences")
    grow_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(200):
        alloc.breakdown(PROMPT_TOKENS)
    breakdown_s = (time.perf_counter() - start) / 200
    release_all()
    return {
        "admit_ops": num_seqs / admit_s,
        "grow_ops": grow_steps / grow_s,
        "release_ops": num_seqs / release_s,
        "breakdown_us": breakdown_s * 1e6,
    }


def bench_numpy(num_seqs: int, grow_steps: int) -> tuple[float, float]:
    """Calls/s of `lengths += 1` on a 256-array, and of `lengths[ids] += 1` (the indexed form grow needs)."""
    lengths = np.zeros(num_seqs, dtype=np.int64)
    ids = np.arange(num_seqs, dtype=np.int64)

    def plain() -> None:
        nonlocal lengths
        for _ in range(grow_steps):
            lengths += 1

    def indexed() -> None:
        for _ in range(grow_steps):
            lengths[ids] += 1

    return grow_steps / _best_seconds(plain, 3), grow_steps / _best_seconds(indexed, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--grow-steps", type=int, default=2000)
    args = parser.parse_args()
    plain, indexed = bench_numpy(args.seqs, args.grow_steps)
    print(f"{args.seqs} running sequences, {args.grow_steps} grow calls of 1 token each")
    print("admit/release: best of 3 rounds; grow vs numpy: how many times slower than `lengths += 1`")
    print(f"{'baseline numpy':<26}{'lengths += 1':>14}: {plain:>12,.0f} calls/s")
    print(f"{'baseline numpy':<26}{'lengths[ids] += 1':>14}: {indexed:>12,.0f} calls/s")
    header = (
        f"{'allocator':<26}{'admit/s':>12}{'grow calls/s':>14}{'grow vs numpy':>15}"
        f"{'release/s':>12}{'breakdown us':>14}"
    )
    print(header)
    print("-" * len(header))
    for label, name, params in CONFIGS:
        r = bench_allocator(name, params, args.seqs, args.grow_steps)
        print(
            f"{label:<26}{r['admit_ops']:>12,.0f}{r['grow_ops']:>14,.0f}{plain / r['grow_ops']:>14.1f}x"
            f"{r['release_ops']:>12,.0f}{r['breakdown_us']:>14.1f}"
        )


if __name__ == "__main__":
    main()
