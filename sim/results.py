"""A run's results on disk: requests.parquet, steps.parquet, summary.json (+ layouts/), written atomically.

Why a folder written through a temporary sibling and a rename: reports, sweeps and notebooks read
these folders later, often while other runs are being written; a crash or Ctrl-C must leave either
the previous complete folder or the new complete folder, never half of one. `load_run` checks what
it reads and raises ResultsError naming the missing file or column, so a stale or partial folder
gives one clear line instead of a KeyError deep in a report.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim import interrupts
from sim.errors import ResultsError
from sim.metrics import REQUEST_COLUMNS, STEP_COLUMNS
from sim.output_paths import check_output_dir
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
    layouts: list[Any] = field(default_factory=list)  # sim.engine.LayoutSnapshot, written under layouts/
    path: Path | None = None  # where it was written or loaded from

    @property
    def metrics(self) -> dict[str, Any]:
        return self.summary["metrics"]

    @property
    def allocator(self) -> str:
        return str(self.summary.get("allocator", ""))


def _json_safe(value: Any) -> Any:
    """NaN/inf are not JSON: write them as null; NumPy scalars as Python numbers."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


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


def _is_replaceable(folder: Path) -> bool:
    """Only an empty folder or a previous kvsim run may be replaced (never a user's other files)."""
    if not folder.is_dir():
        return False
    entries = {p.name for p in folder.iterdir()}
    return not entries or SUMMARY_FILE in entries


def check_run_dir(directory: str | Path) -> Path:
    """`directory` as a Path if `write_run` may write there, else a one-line user error.

    Two rules: the folder must be creatable and writable (`sim.output_paths.check_output_dir`, shared
    with sweeps and reports), and an existing folder must be a kvsim results folder, never anything else.

    Why public: the CLI calls it before simulating, so a run that could never be saved fails in a
    second instead of after minutes of simulation; `write_run` applies the same rule again, because
    the folder may have changed meanwhile.
    """
    target = check_output_dir(directory, what="results folder")
    if target.exists() and not _is_replaceable(target):
        raise ResultsError(f"{target}: exists and is not a kvsim results folder; choose another --output")
    return target


def write_run(run: Run, directory: str | Path) -> Path:
    """Write `run` to `directory` atomically: build a temporary sibling, then rename it into place."""
    target = check_run_dir(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        run.requests.to_parquet(tmp / REQUESTS_FILE, index=False)
        run.steps.to_parquet(tmp / STEPS_FILE, index=False)
        if run.layouts:
            _write_layouts(run, tmp)
        text = json.dumps(_json_safe(run.summary), indent=2, sort_keys=False, allow_nan=False)
        (tmp / SUMMARY_FILE).write_text(text + "\n", encoding="utf-8")
        if target.exists():
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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
    summary_path = folder / SUMMARY_FILE
    if not summary_path.is_file():
        raise ResultsError(f"{folder}: missing {SUMMARY_FILE} (not a complete kvsim results folder)")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{summary_path}: cannot read JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise ResultsError(f"{summary_path}: expected a JSON object")
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise ResultsError(f"{summary_path}: missing key(s) {', '.join(missing)}")
    requests = _read_parquet(folder / REQUESTS_FILE, CONTRACT_REQUEST_COLUMNS)
    steps = _read_parquet(folder / STEPS_FILE, CONTRACT_STEP_COLUMNS)
    numeric_requests = [c for c in REQUEST_COLUMNS if c not in NON_NUMERIC_REQUEST_COLUMNS]
    check_numeric_columns(requests, folder / REQUESTS_FILE, numeric_requests)
    check_numeric_columns(steps, folder / STEPS_FILE, STEP_COLUMNS)
    return Run(requests=requests, steps=steps, summary=summary, path=folder)
