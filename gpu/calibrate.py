"""Run the calibration on a GPU: check kernels, measure ceilings, time the grid, fit, build the profile.

Why one driver for the CLI and the device script: `kvsim calibrate` and gpu/run_device.sh must
produce the same profile. All points share one pre-filled K/V pool (and one output buffer) sized to
the per-point cap, so the grid spends its time timing kernels, not filling memory; each layout is
just a block table over that pool. Kernels shorter than ~20 us are timed as a CUDA graph over
disjoint replicas of their layout, so every launch still reads from DRAM.
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
from gpu.grid import MAX_POINT_BYTES, GridPoint, grid_points
from gpu.kernels import DeviceLayout, DevicePlan, Kernels, all_name_expressions, attention_plan, gather_plan
from gpu.layouts import float32_to_bits, make_layout, random_values_f32
from gpu.profile import SCHEMA_VERSION, save_profile, write_text_atomic
from gpu.reference import bytes_and_flops
from gpu.timing import MIN_REPEATS, EventTimer, replicas_needed

ESTIMATE_BYTES_PER_S = 3e12  # only to decide whether replicas are worth building (graph timing)
CONTIGUOUS_POOL_BLOCK = 16  # contiguous slabs are laid out in 16-token blocks of the shared pool
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
    """One K and V pool, one gather output and one q/out/workspace set, reused by every grid point."""

    def __init__(
        self, cp: Any, rng: np.random.Generator, max_point_bytes: int, points: list[GridPoint]
    ) -> None:
        half = max_point_bytes // 2 // 16 * 16
        self.k_pool = cp.empty(half // 2, dtype=cp.uint16)
        self.v_pool = cp.empty(half // 2, dtype=cp.uint16)
        chunk = 1 << 26
        for pool in (self.k_pool, self.v_pool):
            for start in range(0, pool.size, chunk):
                n = min(chunk, pool.size - start)
                pool[start : start + n] = float32_to_bits(random_values_f32(cp, rng, n), "bf16", cp)
        self.k_out = cp.empty(half // 2, dtype=cp.uint16)
        self.v_out = cp.empty(half // 2, dtype=cp.uint16)
        max_q = max(p.batch * p.num_q_heads * p.head_dim for p in points)
        self.q = float32_to_bits(random_values_f32(cp, rng, max_q), "bf16", cp)
        self.out = cp.empty(max_q, dtype=cp.float32)
        self.pool_bytes = half  # per pool (K or V)


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
    """Build the point's layout over the shared pool, time it, and return its raw row."""
    cp = kernels.cupy
    q_heads, kv_heads, head_dim = point.num_q_heads, point.num_kv_heads, point.head_dim
    block_size = CONTIGUOUS_POOL_BLOCK if point.layout == "contiguous" else point.block_size
    lengths = np.full(point.batch, point.context_tokens, dtype=np.int64)
    layout = make_layout(
        point.layout, lengths, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size, rng=rng,
        dtype=point.dtype, max_pool_bytes=max_point_bytes,
    )  # fmt: skip
    cost = bytes_and_flops(point.kernel, layout, q_heads)
    block_bytes = block_size * layout.row_bytes
    capacity_blocks = buffers.pool_bytes // block_bytes
    out_rows_capacity = buffers.pool_bytes // layout.row_bytes
    n_replicas = min(replicas_needed(cost.kv_bytes, timer.l2_bytes), capacity_blocks // layout.num_blocks)
    if point.kernel == "gather":  # outputs need disjoint replicas too (written bytes also pass L2)
        n_replicas = min(n_replicas, out_rows_capacity // max(layout.live_tokens, 1))
    if cost.bytes / ESTIMATE_BYTES_PER_S > 4 * timer.graph_below_s:  # long kernel: timed alone, no graph
        n_replicas = 1
    n_replicas = max(n_replicas, 1)
    launches: list[Callable[[], None]] = []
    keep_alive: list[Any] = []
    for r in range(n_replicas):
        replica = layout.shifted(r * layout.num_blocks)
        dev = DeviceLayout.upload(cp, replica)
        if point.kernel == "gather":
            plan = DevicePlan.upload(cp, gather_plan(replica, num_sms))
            row_elems = kv_heads * head_dim
            base = r * layout.live_tokens * row_elems
            k_out = buffers.k_out[base : base + layout.live_tokens * row_elems]
            v_out = buffers.v_out[base : base + layout.live_tokens * row_elems]
            launches.append(
                lambda dev=dev, plan=plan, k_out=k_out, v_out=v_out: kernels.gather(
                    dev, plan, buffers.k_pool, buffers.v_pool, k_out, v_out
                )
            )
            keep_alive += [dev, plan]
        else:
            host_plan = attention_plan(replica, num_sms)
            plan = DevicePlan.upload(cp, host_plan)
            n_q = point.batch * q_heads * head_dim
            q = buffers.q[:n_q].reshape(point.batch, q_heads, head_dim)
            out = buffers.out[:n_q].reshape(point.batch, q_heads, head_dim)
            workspace = kernels.attention_workspace(replica, host_plan, q_heads)
            launches.append(
                lambda dev=dev, plan=plan, q=q, out=out, ws=workspace: kernels.attention(
                    dev, plan, q, buffers.k_pool, buffers.v_pool, out, ws
                )
            )
            keep_alive += [dev, plan, workspace]
    timing = timer.time(launches, repeats=repeats)
    row = point.as_row()
    row.update(bytes=cost.bytes, flops=cost.flops, blocks_touched=cost.blocks_touched, **timing.as_dict())
    row["achieved_bytes_per_s"] = cost.bytes / timing.median_s
    del keep_alive
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
