"""Run the calibration on a GPU: check kernels, measure ceilings, time the grid, fit, build the profile.

Why one driver for the CLI and the device script: `kvsim calibrate` and gpu/run_device.sh must
produce the same profile. All points share one pre-filled K/V arena (pools and gather outputs) sized
so that arena plus a point's metadata stays within the per-point cap; the grid spends its time timing
kernels, not filling memory, and each layout is just a block table over that arena. Kernels shorter
than ~20 us are timed as a CUDA graph over disjoint replicas of their layout (gpu.replicas, shared
with replay), so every launch still reads from DRAM.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gpu.backend import device_properties, require_cupy
from gpu.check import check_all
from gpu.fit import fit_rows, paged_ratios
from gpu.grid import MAX_POINT_BYTES, GridPoint, grid_points, point_budget
from gpu.kernels import Kernels, all_name_expressions
from gpu.layouts import DTYPE_BYTES, fill_random_bits, float32_to_bits, make_layout, random_values_f32
from gpu.profile import SCHEMA_VERSION, save_profile, write_text_atomic
from gpu.reference import bytes_and_flops
from gpu.replicas import replica_launches
from gpu.timing import MIN_REPEATS, EventTimer

RAW_COLUMNS: tuple[str, ...] = (
    "kernel", "layout", "block_size", "batch", "context_tokens", "heads", "num_q_heads", "num_kv_heads",
    "head_dim", "dtype", "bytes", "flops", "blocks_touched", "median_s", "p10_s", "p90_s", "repeats",
    "launches_per_sample", "achieved_bytes_per_s",
)  # fmt: skip


def quick_grid(max_point_bytes: int = MAX_POINT_BYTES) -> list[GridPoint]:
    """A small grid (2 batches x 2 contexts, block sizes 1/16/128) for smoke runs."""
    return grid_points(
        block_sizes=(1, 16, 128),
        batches=(8, 64),
        contexts_tokens=(1024, 8192),
        max_point_bytes=max_point_bytes,
    )


class _SharedBuffers:
    """One pre-filled KV arena and one q/out pair, reused by every grid point.

    The arena is `point_budget(max_point_bytes)[0]` bytes: each point carves its K/V pools (and the
    gather's outputs, for every replica) from it. q and out are sized for the largest point and come out
    of the metadata reserve, so a point's total device memory stays within `max_point_bytes`.
    """

    def __init__(
        self, cp: Any, rng: np.random.Generator, max_point_bytes: int, points: list[GridPoint]
    ) -> None:
        arena_bytes, self.reserve_bytes = point_budget(max_point_bytes)
        self.arena = fill_random_bits(cp.empty(arena_bytes // DTYPE_BYTES, dtype=cp.uint16), rng, "bf16", cp)
        max_q = max(p.batch * p.num_q_heads * p.head_dim for p in points)
        self.q = float32_to_bits(random_values_f32(cp, rng, max_q), "bf16", cp)
        self.out = cp.empty(max_q, dtype=cp.float32)

    @property
    def metadata_budget_bytes(self) -> int:
        """What is left of the reserve for a point's block tables, plans and workspaces."""
        return self.reserve_bytes - int(self.q.nbytes) - int(self.out.nbytes)


def time_point(
    point: GridPoint,
    *,
    kernels: Kernels,
    timer: EventTimer,
    buffers: _SharedBuffers,
    rng: np.random.Generator,
    num_sms: int,
    max_point_bytes: int,
    repeats: int,
) -> dict[str, Any]:
    """Build the point's layout over the shared arena, time it (replicas if short), return its raw row."""
    q_heads, head_dim = point.num_q_heads, point.head_dim
    lengths = np.full(point.batch, point.context_tokens, dtype=np.int64)
    layout = make_layout(
        point.layout, lengths, kv_heads=point.num_kv_heads, head_dim=head_dim,
        block_size=point.pool_block_size, rng=rng, dtype=point.dtype,
        max_pool_bytes=point.pool_bytes(max_point_bytes),
    )  # fmt: skip
    n_q = point.batch * q_heads * head_dim
    replicas = replica_launches(
        kernels, point.kernel, layout, buffers.arena,
        q=buffers.q[:n_q].reshape(point.batch, q_heads, head_dim),
        out=buffers.out[:n_q].reshape(point.batch, q_heads, head_dim),
        num_sms=num_sms, l2_bytes=timer.l2_bytes, graph_below_s=timer.graph_below_s,
        metadata_budget_bytes=buffers.metadata_budget_bytes,
    )  # fmt: skip
    timing = timer.time(replicas.launches, repeats=repeats)
    cost = bytes_and_flops(point.kernel, layout, q_heads)
    row = point.as_row()
    row.update(bytes=cost.bytes, flops=cost.flops, blocks_touched=cost.blocks_touched, **timing.as_dict())
    row["achieved_bytes_per_s"] = cost.bytes / timing.median_s
    return row


def run_calibration(
    *,
    seed: int = 0,
    quick: bool = False,
    max_point_bytes: int = MAX_POINT_BYTES,
    repeats: int = MIN_REPEATS,
    check: bool = True,
    time_budget_s: float | None = None,
    points: list[GridPoint] | None = None,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Steps 1-5 of the device procedure; returns (profile, raw rows). Needs a CUDA device.

    With `time_budget_s`, grid points left when the budget is spent are skipped (and counted in the
    profile's device.skipped_points); the shape-major grid order keeps every fit group populated.
    `points` replaces the grid (tests, custom sweeps).
    """
    cp = require_cupy()
    props = device_properties()
    log("device: " + ", ".join(f"{k}={v}" for k, v in props.items()))
    rng = np.random.default_rng(seed)
    num_sms = props["multiprocessor_count"]
    started = time.perf_counter()
    kernels = Kernels(cp)
    log(f"compiled {len(all_name_expressions())} kernel instantiations")
    if check:
        results = check_all(kernels, rng, num_sms)
        worst = max(r.rel_err for r in results if r.kernel == "attention")
        log(f"kernel checks: {len(results)} passed (gather bit-exact, worst attention rel err {worst:.2e})")
    timer = EventTimer(cp, props["l2_cache_bytes"])
    copy_bytes = min(2 * 2**30, max_point_bytes // 4)
    copy_bw, _ = timer.copy_ceiling(copy_bytes, repeats)
    read_bw, _ = timer.read_ceiling(kernels, min(4 * 2**30, max_point_bytes // 2), num_sms, repeats)
    log(f"ceilings: copy {copy_bw / 1e9:.0f} GB/s (read+write), streaming read {read_bw / 1e9:.0f} GB/s")

    if points is None:
        points = quick_grid(max_point_bytes) if quick else grid_points(max_point_bytes=max_point_bytes)
    buffers = _SharedBuffers(cp, rng, max_point_bytes, points)
    rows: list[dict[str, Any]] = []
    skipped = 0
    for i, point in enumerate(points):
        if time_budget_s is not None and time.perf_counter() - started > time_budget_s:
            skipped = len(points) - i
            log(f"grid: time budget of {time_budget_s:.0f} s spent, skipping the last {skipped} points")
            break
        rows.append(
            time_point(
                point, kernels=kernels, timer=timer, buffers=buffers, rng=rng, num_sms=num_sms,
                max_point_bytes=max_point_bytes, repeats=repeats,
            )
        )  # fmt: skip
        if (i + 1) % 50 == 0 or i + 1 == len(points):
            log(f"grid: {i + 1}/{len(points)} points, {time.perf_counter() - started:.0f} s")
    fits = fit_rows(rows)
    profile = {
        "schema_version": SCHEMA_VERSION,
        "measured": True,
        "device": {
            **props,
            "seed": seed,
            "grid": "quick" if quick else "full",
            "max_point_bytes": max_point_bytes,
            "skipped_points": skipped,
        },
        "ceilings": {"copy_bytes_per_s": copy_bw, "read_bytes_per_s": read_bw},
        "rows": rows,
        "fits": [f.as_dict() for f in fits],
        "ratios": paged_ratios(rows, "paged_shuffled"),
        "ratios_sequential": paged_ratios(rows, "paged_sequential"),
    }
    return profile, rows


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    """The raw rows as CSV text, RAW_COLUMNS in order."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(RAW_COLUMNS), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row.get(k, "") for k in RAW_COLUMNS})
    return buffer.getvalue()


def write_outputs(
    profile: dict[str, Any], rows: list[dict[str, Any]], profile_path: Path, raw_csv_path: Path
) -> None:
    """profile.json and raw.csv, each written atomically."""
    save_profile(profile, profile_path)
    write_text_atomic(raw_csv_path, rows_to_csv(rows))


def summary_table(profile: dict[str, Any]) -> str:
    """A short text table: ceilings, fits, paged/contiguous ratios, the gather's % of the copy ceiling."""
    ceilings = profile["ceilings"]
    copy_bw = float(ceilings["copy_bytes_per_s"])
    lines = [
        f"device: {profile['device']['name']}  measured: {profile['measured']}",
        f"ceilings: copy {copy_bw / 1e9:,.0f} GB/s  "
        f"read {float(ceilings['read_bytes_per_s']) / 1e9:,.0f} GB/s",
        f"{'kernel':<10} {'layout':<17} {'block':>5} {'BW_eff GB/s':>11} {'%copy':>6} {'a us':>7} "
        f"{'c ns/blk':>9} {'MAPE%':>6} {'n':>4}",
    ]
    for fit in profile["fits"]:
        bw = float(fit["bytes_per_s"])
        lines.append(
            f"{fit['kernel']:<10} {fit['layout']:<17} {fit['block_size']:>5} {bw / 1e9:>11,.0f} "
            f"{100 * bw / copy_bw:>6.1f} {fit['a_s'] * 1e6:>7.2f} {fit['c_s_per_block'] * 1e9:>9.3f} "
            f"{fit['mape_pct']:>6.2f} {fit['num_points']:>4}"
        )
    for kernel, per_block in profile["ratios"].items():
        cells = "  ".join(f"{b}:{r:.3f}" for b, r in sorted(per_block.items(), key=lambda kv: int(kv[0])))
        lines.append(f"paged_shuffled/contiguous {kernel}: {cells}")
    gathers = [r for r in profile.get("rows", []) if r["kernel"] == "gather" and r["bytes"] >= 2**30]
    if gathers:
        for layout in ("contiguous", "paged_sequential", "paged_shuffled"):
            achieved = [r["bytes"] / r["median_s"] for r in gathers if r["layout"] == layout]
            if achieved:
                best, median = max(achieved), float(np.median(achieved))
                lines.append(
                    f"gather {layout} (>=1 GiB points): median {100 * median / copy_bw:.1f}% / best "
                    f"{100 * best / copy_bw:.1f}% of the copy ceiling"
                )
    return "\n".join(lines)
