"""A run's results on disk: requests.parquet, steps.parquet, summary.json (+ layouts/), written atomically.

Why a folder written through a temporary sibling and a rename: reports, sweeps and notebooks read
these folders later, often while other runs are being written; a crash or Ctrl-C must leave either
the previous complete folder or the new complete folder, never half of one. `load_run` checks what
it reads and raises ResultsError naming the missing file or column, so a stale or partial folder
gives one clear line instead of a KeyError deep in a report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim import interrupts
from sim.core.metrics import REQUEST_COLUMNS, STEP_COLUMNS
from sim.errors import ResultsError
from sim.files import check_output_folder, dumps_json, read_summary, replace_folder
from sim.results_checks import NON_NUMERIC_REQUEST_COLUMNS, check_numeric_columns

REQUESTS_FILE = "requests.parquet"
STEPS_FILE = "steps.parquet"
SUMMARY_FILE = "summary.json"
LAYOUTS_DIR = "layouts"
LAYOUT_INDEX_COLUMNS: tuple[str, ...] = (
    "step",
    "time_s",
    "allocator",
    "predicted_kv_read_s",
    "predicted_step_s",
)
SUMMARY_KEYS: tuple[str, ...] = ("kvsim_version", "versions", "scenario", "seed", "allocator", "metrics")
# The columns docs/architecture.md promises; later extensions (from `n` / `generated_tokens` on) are
# read when present, so a folder from a slightly older kvsim still loads.
CONTRACT_REQUEST_COLUMNS: tuple[str, ...] = REQUEST_COLUMNS[: REQUEST_COLUMNS.index("n")]
CONTRACT_STEP_COLUMNS: tuple[str, ...] = STEP_COLUMNS[: STEP_COLUMNS.index("generated_tokens")]


@dataclass
class Run:
    """One simulation's output: per-request and per-step tables and the summary dict."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict[str, Any]
    layouts: list[Any] = field(default_factory=list)  # sim.core.engine.LayoutSnapshot, written under layouts/
    path: Path | None = None  # where it was written or loaded from

    @property
    def metrics(self) -> dict[str, Any]:
        return self.summary["metrics"]

    @property
    def allocator(self) -> str:
        return str(self.summary.get("allocator", ""))


def _write_layouts(run: Run, folder: Path) -> None:
    layouts_dir = folder / LAYOUTS_DIR
    layouts_dir.mkdir()
    rows = []
    for snap in run.layouts:
        snap.layout.to_npz(str(layouts_dir / f"step_{snap.step:08d}.npz"))
        rows.append(
            {
                "step": snap.step,
                "time_s": snap.time_s,
                "allocator": run.allocator,
                "predicted_kv_read_s": snap.predicted_kv_read_s,
                "predicted_step_s": snap.predicted_step_s,
            }
        )
    pd.DataFrame(rows, columns=list(LAYOUT_INDEX_COLUMNS)).to_csv(layouts_dir / "index.csv", index=False)


def check_run_dir(directory: str | Path) -> Path:
    """`directory` (resolved) if `write_run` may write there, else a one-line user error.

    The rule is `sim.files.check_output_folder`: the folder must be creatable and writable, and an
    existing one must be empty or a kvsim run folder holding nothing kvsim did not write.

    Why public: the CLI calls it before simulating, so a run that could never be saved fails in a
    second instead of after minutes of simulation; `write_run` applies the same rule again, because
    the folder may have changed meanwhile.
    """
    return check_output_folder(directory, "run", what="results folder")


def write_run(run: Run, directory: str | Path) -> Path:
    """Write `run` to `directory` atomically: build a temporary sibling, then rename it into place."""

    def fill(folder: Path) -> None:
        run.requests.to_parquet(folder / REQUESTS_FILE, index=False)
        run.steps.to_parquet(folder / STEPS_FILE, index=False)
        if run.layouts:
            _write_layouts(run, folder)
        (folder / SUMMARY_FILE).write_text(dumps_json(run.summary), encoding="utf-8")

    target = replace_folder(directory, "run", fill, what="results folder")
    run.path = target
    interrupts.note_written(target)
    return target


def _read_parquet(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        raise ResultsError(f"{path.parent}: missing {path.name} (not a complete kvsim results folder)")
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise ResultsError(
            f"{path}: cannot read Parquet ({type(exc).__name__}: {exc})".splitlines()[0]
        ) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ResultsError(f"{path}: missing column(s) {', '.join(missing)} (written by an older kvsim?)")
    return frame


def load_run(directory: str | Path) -> Run:
    """Read a results folder written by `write_run`; ResultsError names whatever is missing."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: results folder not found")
    summary = read_summary(folder)
    summary_path = folder / SUMMARY_FILE
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise ResultsError(f"{summary_path}: missing key(s) {', '.join(missing)}")
    requests = _read_parquet(folder / REQUESTS_FILE, CONTRACT_REQUEST_COLUMNS)
    steps = _read_parquet(folder / STEPS_FILE, CONTRACT_STEP_COLUMNS)
    numeric_requests = [c for c in REQUEST_COLUMNS if c not in NON_NUMERIC_REQUEST_COLUMNS]
    check_numeric_columns(requests, folder / REQUESTS_FILE, numeric_requests)
    check_numeric_columns(steps, folder / STEPS_FILE, STEP_COLUMNS)
    return Run(requests=requests, steps=steps, summary=summary, path=folder)
