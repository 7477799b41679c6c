"""`sim.sweeps.runner` (public as `sim.sweep`): run every cell of a sweep spec, resumably; gather a table.

Why it is built around folders: a sweep may be killed at any moment (a laptop lid, a pre-empted
node) and must restart without losing or duplicating a cell. A cell is *done* iff its final folder
`cells/<cell-id>/` exists with a summary.json; that folder only ever appears through one atomic
`os.rename` of a fully written sibling under `cells/.partial/`. A restart deletes `.partial/`, skips the
done cells and runs the rest; two writers of the same cell cannot both win the rename, so a duplicate
is discarded, never counted. `sweep.parquet` is rebuilt from the summaries and replaced atomically.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim import interrupts
from sim.files import (
    check_output_folder,
    dumps_json,
    ensure_folder,
    plain_name,
    publish_files,
    read_summary,
)
from sim.sweeps.executors import CellExecutor, check_backend_args, make_executor
from sim.sweeps.spec import Cell, SweepSpec, SweepSpecError, one_line, parse_spec

PARTIAL_DIR = ".partial"
LOCK_FILE = ".lock"
SUMMARY_FILE = "summary.json"
SWEEP_TABLE = "sweep.parquet"
CELLS_DIR = "cells"
ROW_LEAD_COLUMNS: tuple[str, ...] = ("cell_id", "status", "error", "cell_wall_s")


@dataclass(frozen=True, slots=True)
class CellTask:
    """What a worker needs to run one cell (picklable: it crosses process and network boundaries)."""

    cell_id: str
    scenario: Any  # sim.scenario.scenario.Scenario
    cells_dir: str  # absolute path of results/<sweep>/cells
    write_in_worker: bool  # False for a remote Dask cluster: the run travels back and is written here


@dataclass(slots=True)
class CellResult:
    """A worker's answer: ok with the run written (or carried back in `run`), or a one-line error."""

    cell_id: str
    ok: bool
    error: str = ""
    wall_s: float = 0.0
    run: Any = None


@dataclass(slots=True)
class SweepReport:
    """What one call of `sweep` did, beside the table: for the CLI's closing lines."""

    sweep_dir: Path
    total: int
    skipped: int
    ran: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # cell id -> one-line error


def commit_run(run: Any, cells_dir: Path, cell_id: str) -> bool:
    """Write `run` under .partial/ and rename it into place; False if the cell was already there.

    The rename is the commit point: before it the cell does not exist, after it it is complete.
    """
    from sim.results import write_run

    final_dir = cells_dir / cell_id
    partial_dir = cells_dir / PARTIAL_DIR / f"{cell_id}-{uuid.uuid4().hex[:8]}"
    partial_dir.parent.mkdir(parents=True, exist_ok=True)
    write_run(run, partial_dir)
    try:
        os.rename(partial_dir, final_dir)
    except OSError:
        if (final_dir / SUMMARY_FILE).is_file():  # another attempt of this cell won the race
            shutil.rmtree(partial_dir, ignore_errors=True)
            return False
        raise
    return True


def execute_cell(task: CellTask) -> CellResult:
    """Worker entry point: simulate one cell and commit it. Never raises for a failing simulation."""
    started = time.perf_counter()
    cells_dir = Path(task.cells_dir)
    if (cells_dir / task.cell_id / SUMMARY_FILE).is_file():
        return CellResult(task.cell_id, ok=True)
    try:
        from sim.api import simulate

        run = simulate(task.scenario)
        if not task.write_in_worker:
            return CellResult(task.cell_id, ok=True, wall_s=time.perf_counter() - started, run=run)
        commit_run(run, cells_dir, task.cell_id)
    except Exception as exc:  # a failed cell must not stop the sweep
        return CellResult(task.cell_id, ok=False, error=f"{type(exc).__name__}: {one_line(exc)}")
    return CellResult(task.cell_id, ok=True, wall_s=time.perf_counter() - started)


@contextmanager
def _sweep_lock(sweep_dir: Path) -> Iterator[None]:
    """One sweep process per folder: the cleanup of .partial/ must not eat a live writer's files.

    flock is released by the kernel when the holder dies, even by SIGKILL, so no stale lock survives.
    """
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / LOCK_FILE, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise SweepSpecError(f"{sweep_dir}: another kvsim sweep is running on this folder") from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _canonical(value: Any) -> Any:
    """Comparable JSON form: what summary.json holds after `sim.files`' one JSON rule."""
    return json.loads(dumps_json(value, indent=None))


def _prepare_cells_dir(spec: SweepSpec, cells_dir: Path) -> list[Cell]:
    """Clear half-written cells and return the cells still to run.

    A done cell made from a different scenario (the base or a default changed since) is refused:
    reusing it would silently mix two experiments in one table.
    """
    shutil.rmtree(cells_dir / PARTIAL_DIR, ignore_errors=True)
    cells_dir.mkdir(parents=True, exist_ok=True)
    todo: list[Cell] = []
    for cell in spec.cells:
        cell_dir = cells_dir / cell.cell_id
        if not (cell_dir / SUMMARY_FILE).is_file():
            if cell_dir.exists():  # not ours (we only ever rename complete folders): stale junk
                shutil.rmtree(cell_dir)
            todo.append(cell)
            continue
        stored = read_summary(cell_dir).get("scenario")
        if stored is not None and _canonical(stored) != _canonical(cell.scenario.to_dict()):
            raise SweepSpecError(
                f"{cell_dir}: finished with a different scenario than the spec now gives; "
                "delete the folder or choose another --output"
            )
    return todo


def _flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping) and item:
            flat.update(_flatten(item, name + "."))
        elif isinstance(item, list | tuple | Mapping):
            flat[name] = dumps_json(item, indent=None)
        else:
            flat[name] = item
    return flat


def cell_row(cell: Cell, summary: Mapping[str, Any] | None, status: str, error: str = "") -> dict[str, Any]:
    """One row of sweep.parquet: id and status, the cell's scenario fields, then the metrics.

    Scenario fields keep their dotted names (`workload.request_rate`). A metric whose name is also a
    scenario field (`duration_s`) is stored as `metrics.<name>`; `allocator` is the allocator's
    canonical string as the engine reports it.
    """
    scenario = summary.get("scenario") if summary else None
    row: dict[str, Any] = {"cell_id": cell.cell_id, "status": status, "error": error}
    row["cell_wall_s"] = float((summary or {}).get("metrics", {}).get("wall_s", math.nan))
    row.update(_flatten(scenario if scenario is not None else cell.scenario.to_dict()))
    for key, value in cell.overrides.items():
        if key not in row:
            row[key] = dumps_json(value, indent=None) if isinstance(value, list | dict) else value
    clock = ((summary or {}).get("workload") or {}).get("clock") or {}
    if clock:  # which clock the cell's workload ran on (workloads/clock.py): a trace's own, a rescale...
        row["workload.clock"] = clock.get("kind")
        row["workload.mean_rate_req_s"] = clock.get("mean_rate_req_s")
    if summary and summary.get("allocator") is not None:
        row["allocator"] = summary["allocator"]
    elif isinstance(row.get("allocator.name"), str):
        row.setdefault("allocator", row["allocator.name"])
    for name, value in ((summary or {}).get("metrics") or {}).items():
        column = f"metrics.{name}" if name in row else name
        row[column] = value
    return row


def _arrow_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """Parquet needs one type per column: an object column mixing types is written as strings."""
    for column in frame.columns:
        if frame[column].dtype != object:
            continue
        kinds = {
            type(v) for v in frame[column] if v is not None and not (isinstance(v, float) and math.isnan(v))
        }
        if len(kinds) > 1:
            frame[column] = frame[column].map(lambda v: None if v is None else str(v))
    return frame


def write_table_atomic(frame: pd.DataFrame, sweep_dir: Path) -> None:
    """sweep.parquet through `sim.files.publish_files`: never half a table, never a user's file."""
    publish_files(sweep_dir, "sweep", [(SWEEP_TABLE, lambda path: frame.to_parquet(path, index=False))])


def gather(spec: SweepSpec, cells_dir: Path, failed: Mapping[str, str]) -> pd.DataFrame:
    """The sweep table in grid order: every cell, done ones with their metrics, failed ones with the error."""
    rows = []
    for cell in spec.cells:
        cell_dir = cells_dir / cell.cell_id
        if (cell_dir / SUMMARY_FILE).is_file():
            rows.append(cell_row(cell, read_summary(cell_dir), "ok"))
        else:
            rows.append(cell_row(cell, None, "failed", failed.get(cell.cell_id, "not run")))
    frame = pd.DataFrame(rows)
    ordered = [c for c in ROW_LEAD_COLUMNS if c in frame.columns]
    return _arrow_safe(frame[ordered + [c for c in frame.columns if c not in ordered]])


class _Progress:
    """The rich bar: done/total, running, failed and ETA; silent when progress is off."""

    def __init__(self, enabled: bool, name: str, total: int, skipped: int) -> None:
        self._bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = Console(stderr=True)
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "done · [cyan]{task.fields[running]}[/] running · [red]{task.fields[failed]}[/] failed"
            ),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        label = f"sweep {name}" + (f" ({skipped} already done)" if skipped else "")
        self._task = self._bar.add_task(label, total=total, completed=skipped, running=0, failed=0)
        self._bar.start()

    def update(self, *, advance: int = 0, running: int, failed: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, running=running, failed=failed)

    def close(self, failed: Mapping[str, str], spec: SweepSpec) -> None:
        if self._bar is None:
            return
        self._bar.stop()
        if failed:
            overrides = {cell.cell_id: cell.overrides for cell in spec.cells}
            self.console.print(f"[red]{len(failed)} failed cell(s):[/]")
            for cid, error in failed.items():
                where = ", ".join(f"{k}={v!r}" for k, v in overrides.get(cid, {}).items())
                self.console.print(
                    f"  {cid} ({where}): {error}", markup=False, highlight=False, soft_wrap=True
                )


def run_sweep(
    spec_or_path: SweepSpec | str | os.PathLike[str] | Mapping[str, Any],
    *,
    jobs: int | None = None,
    scheduler: str | None = None,
    dask_local: int | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    executor: CellExecutor | None = None,
) -> tuple[pd.DataFrame, SweepReport]:
    """`sweep` plus a report of what ran, skipped and failed (the CLI prints it).

    Everything that can be refused is refused before the sweep folder is touched: the spec, the
    backend flags, an output folder that cannot be created or written, and a Dask scheduler that
    does not answer (connected here, before the folder and its .lock exist). A failed start thus
    leaves no empty sweep folder behind.
    """
    check_backend_args(jobs=jobs, scheduler=scheduler, dask_local=dask_local)
    spec = spec_or_path if isinstance(spec_or_path, SweepSpec) else parse_spec(spec_or_path)
    if output_dir is None:
        output_dir = Path("results") / plain_name(spec.name, what="sweep name")
    sweep_dir = check_output_folder(output_dir, "sweep", what="sweep folder")
    cells_dir = sweep_dir / CELLS_DIR
    # Cells without a summary yet (read-only look; the locked clean-up below decides for real): with
    # none, a resume starts no workers at all.
    pending = [c for c in spec.cells if not (cells_dir / c.cell_id / SUMMARY_FILE).is_file()]
    own_executor = executor is None and bool(pending)
    if own_executor:
        executor = _make_sweep_executor(len(pending), jobs, scheduler, dask_local)
    try:
        ensure_folder(sweep_dir, "sweep", what="sweep folder", dirs=(CELLS_DIR,))
        with _sweep_lock(sweep_dir):
            todo = _prepare_cells_dir(spec, cells_dir)
            report = SweepReport(
                sweep_dir=sweep_dir, total=len(spec.cells), skipped=len(spec.cells) - len(todo)
            )
            if todo:
                if executor is None:  # a cell vanished since the look above (deleted by hand)
                    own_executor = True
                    executor = _make_sweep_executor(len(todo), jobs, scheduler, dask_local)
                _run_cells(spec, todo, cells_dir, report, progress, executor)
            with suppress(OSError):  # tidy: an empty .partial/ is left only while cells are running
                (cells_dir / PARTIAL_DIR).rmdir()
            table = gather(spec, cells_dir, report.failed)
            write_table_atomic(table, sweep_dir)
            interrupts.note_written(sweep_dir)
    finally:
        if own_executor and executor is not None:
            executor.close()
    return table, report


def _make_sweep_executor(
    num_cells: int, jobs: int | None, scheduler: str | None, dask_local: int | None
) -> CellExecutor:
    """The backend for `num_cells` cells; local processes are capped at the number of cells."""
    if scheduler is None and dask_local is None:  # no idle worker processes for a short resume
        jobs = min(jobs if jobs is not None else os.cpu_count() or 1, num_cells)
    return make_executor(jobs=jobs, scheduler=scheduler, dask_local=dask_local)


def _run_cells(
    spec: SweepSpec,
    todo: list[Cell],
    cells_dir: Path,
    report: SweepReport,
    progress: bool,
    executor: CellExecutor,
) -> None:
    """Run `todo` on `executor` (the caller owns and closes it), committing each finished cell."""
    write_in_worker = not getattr(executor, "remote", False)
    tasks = [(c.cell_id, CellTask(c.cell_id, c.scenario, str(cells_dir), write_in_worker)) for c in todo]
    bar = _Progress(progress, spec.name, report.total, report.skipped)
    try:

        def show_running() -> None:
            bar.update(running=executor.running, failed=len(report.failed))

        def note_saved() -> None:  # for the line Ctrl-C prints (sim.interrupts)
            interrupts.note_partial(
                cells_dir.parent,
                f"{report.skipped + report.ran} of {report.total} cells saved "
                f"(rerun the same command to resume), {SWEEP_TABLE} not written",
            )

        note_saved()

        for outcome in executor.map_unordered(execute_cell, tasks, on_start=show_running):
            result: CellResult | None = outcome.value
            if outcome.ok and result is not None and result.ok:
                if result.run is not None:
                    commit_run(result.run, cells_dir, outcome.key)
                report.ran += 1
            else:
                report.failed[outcome.key] = result.error if result is not None else outcome.error
            bar.update(advance=1, running=executor.running, failed=len(report.failed))
            note_saved()
    finally:
        bar.close(report.failed, spec)


def sweep(
    spec_or_path: SweepSpec | str | os.PathLike[str] | Mapping[str, Any],
    *,
    jobs: int | None = None,
    scheduler: str | None = None,
    dask_local: int | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Run a sweep spec and return sweep.parquet's table: one row per cell, in grid order.

    `spec_or_path`: a TOML path, a dict with the same content, or a parsed SweepSpec. Cells run in
    `jobs` local processes (default: all cores), or on Dask (`scheduler="tcp://host:port"`, or
    `dask_local=N` workers on this machine). `output_dir` is the sweep's folder (default
    results/<name>); rerunning with the same folder resumes. Failed cells are rows with
    status "failed" and their one-line error; they do not stop the others.
    """
    table, _ = run_sweep(
        spec_or_path,
        jobs=jobs,
        scheduler=scheduler,
        dask_local=dask_local,
        output_dir=output_dir,
        progress=progress,
    )
    return table
