"""Loading results folders for a report: each one validated, refused with one line naming what is missing.

Why stricter than `sim.results.load_run`: the report needs every metric its table shows and a
non-empty steps table, so an older or partial run is refused here rather than rendered as half a page.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sim.errors import ResultsError
from sim.reports.render import REQUIRED_METRICS, RESULT_FILES
from sim.reports.types import LoadedRun
from sim.results import REQUESTS_FILE, STEPS_FILE, SUMMARY_FILE, load_run
from sim.results_checks import check_metric_numbers
from sim.sweeps.runner import CELLS_DIR, SWEEP_TABLE


def load_results(results_dir: Path) -> LoadedRun:
    """Validate one results folder and load what the report needs; ResultsError names what is missing.

    The folder rules (files, JSON, summary keys, table columns) are `sim.results.load_run`'s; on top
    the report needs every metric it shows and a non-empty steps table, so an older or partial run is
    refused here rather than rendered as half a page.
    """
    results_dir = Path(results_dir)
    missing_files = [name for name in RESULT_FILES if not (results_dir / name).is_file()]
    if results_dir.is_dir() and missing_files:
        raise ResultsError(f"{results_dir}: missing {', '.join(missing_files)} (older or partial run?)")
    run = load_run(results_dir)
    summary_path = results_dir / SUMMARY_FILE
    summary = run.summary
    metrics = summary["metrics"]
    if not isinstance(metrics, dict):
        raise ResultsError(f"{summary_path}: field metrics must be an object")
    missing_metrics = [key for key in REQUIRED_METRICS if key not in metrics]
    if missing_metrics:
        raise ResultsError(
            f"{summary_path}: missing metrics {', '.join(missing_metrics)} (older or partial run?)"
        )
    check_metric_numbers(metrics, summary_path, REQUIRED_METRICS)
    if not isinstance(summary["scenario"], dict):
        raise ResultsError(f"{summary_path}: field scenario must be an object")
    # Both tables alike (issue 23: 0 requests used to pass, 0 steps not): a report of nothing is refused.
    for name, table in ((REQUESTS_FILE, run.requests), (STEPS_FILE, run.steps)):
        if table.empty:
            raise ResultsError(f"{results_dir / name}: no rows (partial run?)")
    return LoadedRun(path=results_dir, summary=summary, requests=run.requests, steps=run.steps)


def _grid_order(sweep_dir: Path, cells: list[Path]) -> list[Path]:
    """A sweep's cells in grid order (sweep.parquet's rows: the spec's axes, first axis slowest), so
    the report lists allocators in the spec's order; cells the table lacks follow by name. Cell
    folders are named by a hash, so name order alone would be arbitrary."""
    import pandas as pd

    try:
        order = pd.read_parquet(sweep_dir / SWEEP_TABLE, columns=["cell_id"])["cell_id"].astype(str).tolist()
    except (OSError, KeyError, ValueError):
        order = []  # an unreadable table changes only the order; the cells themselves are validated later
    position = {cell_id: index for index, cell_id in enumerate(order)}
    return sorted(cells, key=lambda cell: (position.get(cell.name, len(position)), cell.name))


def expand_results_dirs(results_dirs: Sequence[Path]) -> list[Path]:
    """The run folders behind the arguments, in name order (a sweep's cells in grid order).

    A sweep folder (`kvsim sweep`: it holds sweep.parquet) stands for its finished cells,
    `cells/<id>/` with a summary.json; hidden folders (`cells/.partial/`) and cells without a
    summary (not committed) are skipped, as the sweep itself counts them. A folder without result
    files that holds run folders (e.g. the output of `kvsim compare`) stands for those sub-folders. Hidden
    folders (a crashed write's `.name.tmp-*`) are skipped; a sub-folder with only some result files is
    kept, so that loading refuses it by name instead of the report silently leaving it out."""
    expanded: list[Path] = []
    for results_dir in map(Path, results_dirs):
        if (results_dir / SWEEP_TABLE).is_file() and (results_dir / CELLS_DIR).is_dir():
            cells = _grid_order(
                results_dir,
                [
                    child
                    for child in (results_dir / CELLS_DIR).iterdir()
                    if child.is_dir()
                    and not child.name.startswith(".")
                    and (child / "summary.json").is_file()
                ],
            )
            if not cells:
                raise ResultsError(f"{results_dir}: a sweep folder without finished cells (rerun the sweep)")
            expanded.extend(cells)
            continue
        if results_dir.is_dir() and not any((results_dir / name).exists() for name in RESULT_FILES):
            children = sorted(
                child
                for child in results_dir.iterdir()
                if child.is_dir()
                and not child.name.startswith(".")
                and any((child / name).exists() for name in RESULT_FILES)
            )
            if children:
                expanded.extend(children)
                continue
        expanded.append(results_dir)
    return expanded
