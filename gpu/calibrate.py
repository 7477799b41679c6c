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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpu.backend import device_properties, require_cupy
from gpu.check import ATTN_REL_TOL, check_all, check_grid_families, raise_on_failures
from gpu.errors import GpuError, KernelCheckError
from gpu.fit import Fit, fit_rows, paged_ratios
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
    "launches_per_sample", "achieved_bytes_per_s", "pool_spread",
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
    row["pool_spread"] = layout.num_blocks / max(point.blocks_needed, 1)  # 4.0 for every shuffled point
    return row


@dataclass
class CalibrationState:
    """Everything a run has measured so far: a partial profile can be built from it at any moment.

    Why: a device run that fails (an exception, the call's time limit) must not lose the rows it has;
    gpu/device_run.py keeps this object and writes a profile from it whatever happens.
    """

    seed: int = 0
    quick: bool = False
    max_point_bytes: int = MAX_POINT_BYTES
    props: dict[str, Any] = field(default_factory=dict)
    checks: list[Any] = field(default_factory=list)
    linear_checks: list[dict[str, Any]] = field(default_factory=list)
    ceilings: dict[str, float] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    linear_rows: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    skipped_points: int = 0
    skipped_linear_rows: int = 0
    stage: str = "start"


class Recorder:
    """Hooks called as results arrive (the device script writes each to $OUT at once); no-ops here."""

    def on_checks(self, results: list[Any], linear_checks: list[dict[str, Any]]) -> None:
        """Every check result, before anything is timed (also when one failed)."""

    def on_row(self, row: dict[str, Any]) -> None:
        """One grid point's raw row, as soon as it is measured."""

    def on_linear_row(self, row: dict[str, Any]) -> None:
        """One linear-layer row (Vidur's CSV format), as soon as it is measured."""

    def on_error(self, entry: dict[str, Any]) -> None:
        """One point (grid or linear) that raised; the run goes on."""


MAX_CONSECUTIVE_ERRORS = 3  # after an illegal address every call fails: stop the grid instead of looping
LINEAR_BUDGET_FRACTION = 0.25  # of the time budget, at most, for the linear layers (they take ~25 s)


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
    linear: bool = False,
    linear_models: tuple[Any, ...] | None = None,
    linear_tp_sizes: tuple[int, ...] | None = None,
    linear_tokens: tuple[int, ...] | None = None,
    warm_up_s: float = 1.0,
    state: CalibrationState | None = None,
    recorder: Recorder | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The device procedure; returns (profile, raw rows). Needs a CUDA device.

    Order: compile; check every instantiation, every grid shape family (on a replica at the top of the
    shared arena) and, with `linear`, every GEMM -- then hand all check results to the recorder and
    stop with KernelCheckError if any failed, before anything is timed; warm the clocks up; measure
    the ceilings (their buffers are freed after); time the linear layers (`linear`, at most a quarter
    of the budget); time the grid; fit. An exception in one point is recorded in `state.errors`
    and the run goes on (MAX_CONSECUTIVE_ERRORS in a row stop it). With `time_budget_s`, points left
    when the budget is spent are skipped and counted. `points` replaces the grid (tests, custom sweeps).
    """
    state = CalibrationState() if state is None else state
    recorder = Recorder() if recorder is None else recorder
    state.seed, state.quick, state.max_point_bytes = seed, quick, max_point_bytes
    cp = require_cupy()
    state.props = props = device_properties()
    log("device: " + ", ".join(f"{k}={v}" for k, v in props.items()))
    rng = np.random.default_rng(seed)
    num_sms = props["multiprocessor_count"]
    started = time.perf_counter()

    def out_of_time() -> bool:
        return time_budget_s is not None and time.perf_counter() - started > time_budget_s

    state.stage = "compile"
    kernels = Kernels(cp)
    log(f"compiled {len(all_name_expressions())} kernel instantiations")
    if points is None:
        points = quick_grid(max_point_bytes) if quick else grid_points(max_point_bytes=max_point_bytes)
    buffers = _SharedBuffers(cp, rng, max_point_bytes, points)
    if check:
        state.stage = "checks"
        results = check_all(kernels, rng, num_sms, raise_on_failure=False)
        results += check_grid_families(kernels, rng, num_sms, buffers.arena)
        state.checks = results
        if linear:
            from gpu.linear import check_linear

            state.linear_checks = check_linear(
                cp, rng, **({"models": linear_models} if linear_models else {})
            )
        recorder.on_checks(results, state.linear_checks)
        raise_on_failures(results)
        bad_linear = [c for c in state.linear_checks if not c["ok"]]
        if bad_linear:
            raise KernelCheckError(
                f"{len(bad_linear)} GEMM check(s) failed; first: {bad_linear[0]['model']} "
                f"tp={bad_linear[0]['tp']} {bad_linear[0]['op']} rel_err={bad_linear[0]['rel_err']:.3g}"
            )
        worst = max(r.rel_err for r in results if r.kernel == "attention")
        log(
            f"kernel checks: {len(results)} passed (gather bit-exact, worst per-sequence attention rel err "
            f"{worst:.2e} < {ATTN_REL_TOL:g}); GEMM checks: {len(state.linear_checks)} passed"
        )
    state.stage = "ceilings"
    timer = EventTimer(cp, props["l2_cache_bytes"], kernels=kernels, num_sms=num_sms)
    launches = timer.warm_up(warm_up_s, nbytes=min(2**30, max_point_bytes // 4))
    log(f"warm-up: {launches} streaming reads over {warm_up_s:.1f} s")
    copy_bw, _ = timer.copy_ceiling(min(2 * 2**30, max_point_bytes // 4), repeats)
    read_bw, _ = timer.read_ceiling(min(4 * 2**30, max_point_bytes // 2), repeats)
    state.ceilings = {"copy_bytes_per_s": copy_bw, "read_bytes_per_s": read_bw}
    log(f"ceilings: copy {copy_bw / 1e9:.0f} GB/s (read+write), streaming read {read_bw / 1e9:.0f} GB/s")

    if linear:
        state.stage = "linear"
        from gpu.linear import run_linear

        linear_started = time.perf_counter()

        def linear_out_of_time() -> bool:
            if time_budget_s is None:
                return False
            spent = time.perf_counter() - linear_started
            return spent > LINEAR_BUDGET_FRACTION * time_budget_s or out_of_time()

        def linear_error(entry: dict[str, Any]) -> None:
            state.errors.append(entry)
            recorder.on_error(entry)
            log(f"error: {entry['what']}: {entry['error']}")

        def linear_row(row: dict[str, Any]) -> None:
            state.linear_rows.append(row)
            recorder.on_linear_row(row)

        options = {
            k: v
            for k, v in {
                "models": linear_models,
                "tp_sizes": linear_tp_sizes,
                "num_tokens": linear_tokens,
            }.items()
            if v is not None
        }
        _, state.skipped_linear_rows = run_linear(
            cp, timer, rng, repeats=repeats, on_row=linear_row, on_error=linear_error,
            deadline=linear_out_of_time, **options,
        )  # fmt: skip
        log(
            f"linear layers: {len(state.linear_rows)} rows in {time.perf_counter() - linear_started:.0f} s"
            + (f", {state.skipped_linear_rows} skipped (budget)" if state.skipped_linear_rows else "")
        )

    state.stage = "grid"
    consecutive = 0
    for i, point in enumerate(points):
        if out_of_time():
            state.skipped_points = len(points) - i
            log(f"grid: time budget of {time_budget_s:.0f} s spent, skipping {state.skipped_points} points")
            break
        try:
            row = time_point(
                point, kernels=kernels, timer=timer, buffers=buffers, rng=rng, num_sms=num_sms,
                max_point_bytes=max_point_bytes, repeats=repeats,
            )  # fmt: skip
        except Exception as exc:
            entry = {"what": _point_name(point), "error": _one_line(exc)}
            state.errors.append(entry)
            recorder.on_error(entry)
            log(f"error: {entry['what']}: {entry['error']}")
            consecutive += 1
            if consecutive >= MAX_CONSECUTIVE_ERRORS:
                raise GridAborted(
                    f"{consecutive} grid points failed in a row; last: {entry['error']}"
                ) from exc
            continue
        consecutive = 0
        state.rows.append(row)
        recorder.on_row(row)
        if (i + 1) % 50 == 0 or i + 1 == len(points):
            log(f"grid: {i + 1}/{len(points)} points, {time.perf_counter() - started:.0f} s")
    state.stage = "fit"
    profile = build_profile(state)
    state.stage = "done"
    return profile, state.rows


class GridAborted(RuntimeError):
    """Several grid points failed in a row (the CUDA context is likely broken): the grid stops."""


def _point_name(point: GridPoint) -> str:
    return (
        f"{point.kernel} {point.layout} block={point.block_size} batch={point.batch} "
        f"context={point.context_tokens} heads={point.heads}"
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def safe_fits(rows: list[dict[str, Any]]) -> tuple[list[Fit], list[str]]:
    """fit_rows per group, skipping (and naming) groups that cannot be fitted (partial runs)."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["kernel"], row["layout"], int(row["block_size"])), []).append(row)
    fits: list[Fit] = []
    failed: list[str] = []
    for key, members in sorted(groups.items()):
        try:
            fits += fit_rows(members)
        except GpuError as exc:
            failed.append(f"{key}: {exc}")
    return fits, failed


def build_profile(
    state: CalibrationState, *, complete: bool = True, failure: str | None = None
) -> dict[str, Any]:
    """A schema-v1 profile from what `state` holds; `complete` False (with `failure`) for partial runs."""
    fits, unfitted = safe_fits(state.rows)
    profile: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "measured": True,
        "complete": complete,
        "device": {
            **state.props,
            "name": state.props.get("name", "unknown"),
            "seed": state.seed,
            "grid": "quick" if state.quick else "full",
            "max_point_bytes": state.max_point_bytes,
            "skipped_points": state.skipped_points,
        },
        "ceilings": dict(state.ceilings),
        "rows": state.rows,
        "fits": [f.as_dict() for f in fits],
        "ratios": paged_ratios(state.rows, "paged_shuffled"),
        "ratios_sequential": paged_ratios(state.rows, "paged_sequential"),
        "errors": list(state.errors),
        "checks": {
            "kernels": len(state.checks),
            "failed": sum(not r.ok for r in state.checks),
            "worst_attention_rel_err": max(
                (r.rel_err for r in state.checks if r.kernel == "attention"), default=None
            ),
            "attention_rel_tol": ATTN_REL_TOL,
            "gemm": len(state.linear_checks),
            "gemm_failed": sum(not c["ok"] for c in state.linear_checks),
        },
    }
    if unfitted:
        profile["unfitted_groups"] = unfitted
    if state.linear_rows or state.skipped_linear_rows:
        from gpu.linear import linear_summary

        read_bw = float(state.ceilings.get("read_bytes_per_s", 0.0)) or float("nan")
        profile["linear"] = {
            **linear_summary(state.linear_rows, read_bw),
            "skipped_rows": state.skipped_linear_rows,
            "csv": LINEAR_CSV_NAME,
        }
    if not complete:
        profile["failure"] = failure or f"stopped during {state.stage}"
        profile["stage"] = state.stage
    return profile


LINEAR_CSV_NAME = "linear.mlp.csv"


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
    linear = profile.get("linear")
    if linear:
        read = linear.get("median_read_fraction_at_1_token")
        flops = linear.get("median_flops_fraction_at_max_tokens")
        best = linear.get("best_flops_fraction_at_max_tokens")
        lines.append(
            f"linear layers ({linear['rows']} rows, {linear.get('skipped_rows', 0)} skipped): "
            + (f"weights read at 1 token at {100 * read:.1f}% of the read ceiling (median); " if read else "")
            + (
                f"GEMMs at the largest batch at {100 * flops:.1f}% (median) / {100 * best:.1f}% (best) of "
                f"{linear['peak_flops'] / 1e12:.0f} TFLOP/s"
                if flops
                else ""
            )
        )
    if profile.get("errors"):
        lines.append(
            f"errors: {len(profile['errors'])} points raised (errors.csv); first: {profile['errors'][0]}"
        )
    if profile.get("complete") is False:
        lines.append(f"INCOMPLETE: {profile.get('failure')}")
    return "\n".join(lines)
