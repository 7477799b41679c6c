"""`kvsim bench fit`: the server-level terms that best explain a set of measured runs, and their
leave-one-file-out error.

Why a grid and not a free optimiser: three of the four terms (`frontend_service_s`,
`flops_efficiency_scale`, `overhead_scale`) change the simulated dynamics and need a simulation per
value, while the fourth (`frontend_s`) only adds to TTFT and E2E of an open-loop run and is solved
for each grid point by scanning it in 1 ms steps. A fixed, bounded grid (GRID) makes the fit
deterministic, keeps every value inside its bounds, and lets leave-one-file-out reuse the same
simulations: the fit on all files but one is a different argmin over the same table. The held-out
file is then replayed for real with the terms fitted without it; that error, on data not fitted on,
is the figure the fit reports.

Objective: the mean over files of each file's MAPE over mean TTFT, mean TPOT, mean E2E and request
throughput (sim.bench.replay.MAPE_METRICS), the metrics the replay's last line reports.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sim.bench.replay import MAPE_METRICS, ReplayResult, replay
from sim.bench.results_file import BenchFile
from sim.cost.server import BOUNDS, ServerTerms

# Grid of the three step-level terms, hand-picked points inside their bounds (sim/cost/server.py BOUNDS).
GRID: dict[str, tuple[float, ...]] = {
    "frontend_service_s": (0.0, 0.002, 0.005, 0.02),
    "flops_efficiency_scale": (0.5, 0.7, 1.0, 1.25),
    "overhead_scale": (0.15, 0.3, 0.5, 1.0),
}
# frontend_s candidates: 0 to its upper bound in 1 ms steps (solved by scanning, vectorised).
FRONTEND_STEP_S = 1e-3
# Metrics that a per-request front-end time adds to (in ms).
_FRONTEND_METRICS = ("mean_ttft_ms", "mean_e2el_ms")


@dataclass(frozen=True)
class FitResult:
    """The fitted terms, and per file the in-sample and held-out replays (same order as the files)."""

    terms: ServerTerms
    in_sample: list[ReplayResult]
    held_out: list[ReplayResult]

    def error_table(self) -> dict[str, dict[str, float]]:
        """Median absolute % error per MAPE metric, in sample and leave-one-file-out."""
        table: dict[str, dict[str, float]] = {}
        for label, results in (("in_sample", self.in_sample), ("leave_one_out", self.held_out)):
            row = {}
            for metric in MAPE_METRICS:
                errors = [abs(r.error_pct(metric)) for r in results if math.isfinite(r.error_pct(metric))]
                row[metric] = float(np.median(errors)) if errors else math.nan
            mapes = [r.mape_pct() for r in results if math.isfinite(r.mape_pct())]
            row["median_file_mape"] = float(np.median(mapes)) if mapes else math.nan
            table[label] = row
        return table


def _error_matrix(result: ReplayResult, frontends_s: np.ndarray) -> np.ndarray:
    """|% error| of each MAPE metric (columns) for each candidate frontend_s (rows); NaN if unmeasured."""
    columns = []
    for metric in MAPE_METRICS:
        measured, simulated = result.measured.get(metric, math.nan), result.simulated.get(metric, math.nan)
        if not (math.isfinite(measured) and math.isfinite(simulated)) or measured == 0:
            columns.append(np.full(frontends_s.size, np.nan))
            continue
        shifted = simulated + (
            frontends_s * 1e3 if metric in _FRONTEND_METRICS else np.zeros_like(frontends_s)
        )
        columns.append(np.abs(shifted - measured) / abs(measured) * 100.0)
    return np.stack(columns, axis=1)


def _file_losses(result: ReplayResult, frontends_s: np.ndarray) -> np.ndarray:
    """The file's MAPE for each candidate frontend_s."""
    return np.nanmean(_error_matrix(result, frontends_s), axis=1)


def _grid_points(grid: dict[str, tuple[float, ...]]) -> list[dict[str, float]]:
    """Every combination of the grid's values, as keyword arguments of ServerTerms (inside BOUNDS)."""
    for name, values in grid.items():
        low, high = BOUNDS[name]
        if not values or not all(low <= value <= high for value in values):
            raise ValueError(f"argument 'grid': {name} values must lie in [{low}, {high}] (got {values})")
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


@dataclass(frozen=True)
class GridTable:
    """Each file's loss (its MAPE) at every grid point and front-end delay: the fit's whole input.

    `losses[g, i, k]`: file i at grid point g with frontend_s = frontends_s[k]. A fit to any subset of
    the files is an argmin over this table (`fit_members`), so leave-one-file-out and fits to groups of
    files cost no new simulations.
    """

    files: list[BenchFile]
    scenarios: list[Any]
    base: ServerTerms
    points: list[dict[str, float]]
    frontends_s: np.ndarray
    losses: np.ndarray

    def terms(self, members: Sequence[int], source: str) -> ServerTerms:
        """The grid point and front-end delay with the least mean loss over `members` (ties: first)."""
        mean = self.losses[:, np.asarray(members, dtype=np.int64), :].mean(axis=1)  # grid x frontend
        g, k = divmod(int(np.argmin(mean)), mean.shape[1])
        return replace(self.base, **self.points[g], frontend_s=float(self.frontends_s[k]), source=source)


def grid_table(
    files: Sequence[BenchFile],
    scenario_for: Callable[[BenchFile], Any],
    *,
    stack: ServerTerms | None = None,
    grid: dict[str, tuple[float, ...]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> GridTable:
    """Replay every file at every grid point (grid points x files simulations).

    `stack`: the serving-stack settings kept fixed (custom all-reduce, Ray workers; None: the engine's).
    `grid`: values per dynamic term (default GRID); a term left out keeps the stack's value.
    `frontend_s` is always scanned from 0 (FRONTEND_STEP_S steps), whatever `stack` holds: the
    replays run without it, so that `losses[g, i, k]` is file i with frontend_s = frontends_s[k] exactly,
    the value `GridTable.terms` returns. (Before, a stack with a front-end delay, the shipped terms
    sim/bench/lambda_set.py `fit_earlier` starts from, was replayed with it and the scan added on top,
    while the fitted terms carried the scanned value alone: the fit's optimum was not what it returned.)
    """
    if not files:
        raise ValueError("argument 'files': need at least one bench result file")
    base = replace(stack if stack is not None else ServerTerms.neutral(), frontend_s=0.0)
    frontends_s = np.arange(0.0, BOUNDS["frontend_s"][1] + FRONTEND_STEP_S / 2, FRONTEND_STEP_S)
    points = _grid_points(GRID if grid is None else grid)
    scenarios = [scenario_for(bench) for bench in files]
    losses = np.empty((len(points), len(files), frontends_s.size))
    total, done = len(points) * len(files), 0
    for g, point in enumerate(points):
        terms = replace(base, **point, source="grid")
        for i, bench in enumerate(files):
            losses[g, i] = _file_losses(replay(bench, scenarios[i], terms), frontends_s)
            done += 1
            if progress is not None:
                progress(done, total)
    return GridTable(list(files), scenarios, base, points, frontends_s, losses)


def fit_members(table: GridTable, members: Sequence[int]) -> FitResult:
    """Fit to the files `members` of `table`; in-sample and leave-one-file-out replays of each member.

    The held-out replay of file i uses the terms fitted to the other members (all of them when i is
    the only one).
    """
    members = list(members)
    terms = table.terms(members, "bench fit")
    in_sample = [replay(table.files[i], table.scenarios[i], terms) for i in members]
    held_out = []
    for i in members:
        others = [j for j in members if j != i] or members
        fold = table.terms(others, f"fit without {table.files[i].name}")
        held_out.append(replay(table.files[i], table.scenarios[i], fold))
    return FitResult(terms=terms, in_sample=in_sample, held_out=held_out)
