"""Text tables of replays: one file side by side, several files one row each plus a total.

Why plain text: the replay's output is read by people and diffed by scripts; its last line is
always `MAPE <n> %` (issue 21), over mean TTFT, mean TPOT, mean E2E and request throughput.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sim.bench.replay import MAPE_METRICS, TABLE_METRICS, ReplayResult

_SHORT = {
    "request_throughput": "req/s",
    "mean_ttft_ms": "TTFT",
    "mean_tpot_ms": "TPOT",
    "mean_e2el_ms": "E2E",
}


def _cell(value: float, digits: int = 2) -> str:
    return "-" if not math.isfinite(value) else f"{value:,.{digits}f}"


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:+.1f} %"


def one_file_table(result: ReplayResult) -> str:
    """Measured vs simulated for every metric of one file, and the `MAPE <n> %` line."""
    lines = [result.name, f"{'metric':<22} {'measured':>12} {'simulated':>12} {'error':>10}"]
    for metric in TABLE_METRICS:
        lines.append(
            f"{metric:<22} {_cell(result.measured.get(metric, math.nan)):>12} "
            f"{_cell(result.simulated.get(metric, math.nan)):>12} {_pct(result.error_pct(metric)):>10}"
        )
    lines.append(f"MAPE {_cell(result.mape_pct(), 1)} %")
    return "\n".join(lines)


def median_abs_errors(results: Sequence[ReplayResult]) -> dict[str, float]:
    """Median over files of |% error| per MAPE metric (files that did not measure one are skipped)."""
    medians = {}
    for metric in MAPE_METRICS:
        errors = [abs(r.error_pct(metric)) for r in results if math.isfinite(r.error_pct(metric))]
        medians[metric] = float(np.median(errors)) if errors else math.nan
    return medians


def many_files_table(results: Sequence[ReplayResult], skipped: Sequence[str] = ()) -> str:
    """One row per file (signed % error of each MAPE metric and the file's MAPE), then a total:
    the median absolute error per metric; the last line is the MAPE over all files' metrics."""
    width = max([len("file")] + [len(r.name) for r in results])
    header = f"{'file':<{width}} " + " ".join(f"{_SHORT[m]:>9}" for m in MAPE_METRICS) + f" {'MAPE':>8}"
    lines = [header]
    for result in results:
        cells = " ".join(f"{_pct(result.error_pct(m)):>9}" for m in MAPE_METRICS)
        lines.append(f"{result.name:<{width}} {cells} {_cell(result.mape_pct(), 1):>6} %")
    medians = median_abs_errors(results)
    cells = " ".join(f"{_cell(medians[m], 1) + ' %':>9}" for m in MAPE_METRICS)
    lines.append(f"{'median |error|':<{width}} {cells}")
    lines.extend(f"skipped {line}" for line in skipped)
    errors = [abs(r.error_pct(m)) for r in results for m in MAPE_METRICS if math.isfinite(r.error_pct(m))]
    lines.append(f"MAPE {_cell(float(np.mean(errors)) if errors else math.nan, 1)} %")
    return "\n".join(lines)
