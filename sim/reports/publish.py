"""`sim.reports.publish` (public as `sim.report`): results folders -> report.html, report.md, figures/*.png.

Why this shape: a report is read by people who did not run the simulation, so it must be complete or
absent. Every folder is validated first (files, summary.json keys, table columns) and refused with
one line naming what is missing, and so is an output folder that cannot be written; then everything
is rendered in memory; only then are files written, each to a temporary name and moved into place with
os.replace: figures first, then report.md, then report.html, then stale figures removed (`_publish`).
The HTML is one self-contained file (figures as base64 data URIs, inline CSS, no scripts) so it reads
offline.

The report reads the results contract of docs/architecture.md directly (not `sim.results.load_run`)
because it needs a stricter check than loading does: the exact metric keys its table shows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from sim import interrupts
from sim.errors import ResultsError
from sim.files import check_files_in_folder, check_output_dir, publish_files, write_error
from sim.output_lock import claim_output
from sim.reports import diagnosis
from sim.reports.load import expand_results_dirs, load_results
from sim.reports.render import (
    FIGURE_FILES,
    add_gpu_cost,
    render_figures,
    render_html,
    render_markdown,
)
from sim.reports.varied import order_runs, run_labels


def _publish(output_dir: Path, pngs: Mapping[str, bytes], markdown: str, page: str) -> None:
    """Write the report through `sim.files.publish_files`, so that no reader sees a mix.

    Order of the moves: every new figure first, then report.md, then report.html, and only then are
    figures of an earlier report that this one does not produce (e.g. a sweep's figure 5) removed,
    and only those kvsim wrote. So at any instant report.md links only figures that exist (the old
    report.md still finds its old figure 5; the new one never links it), report.html is
    self-contained either way, and a crash part-way leaves the previous report readable, not a
    report.md of one run beside a report.html of another.
    """
    files: list[tuple[str, bytes | str]] = [(f"figures/{FIGURE_FILES[k]}", png) for k, png in pngs.items()]
    files += [("report.md", markdown), ("report.html", page)]
    stale = [f"figures/{name}" for key, name in FIGURE_FILES.items() if key not in pngs]
    publish_files(output_dir, "report", files, remove=stale)


def report_files(pngs: Mapping[str, bytes]) -> list[str]:
    """The files (relative to the report folder) a report with these figures writes."""
    return ["report.md", "report.html", *(f"figures/{FIGURE_FILES[key]}" for key in pngs)]


def default_output_dir(results_dirs: Sequence[Path]) -> Path:
    """Where the report goes by default: the arguments' common parent (a single argument: itself).

    Taken from the arguments, not the run folders they expand to, so that the report on a sweep lands
    in the sweep folder (not in its cells/) and the one on a compare folder in that folder. Taken
    from the paths as typed (made absolute, links not resolved): with `runB` a link to a run
    elsewhere, resolving made the common parent a folder the user never named (issue 23).
    """
    return Path(os.path.commonpath([os.path.abspath(Path(p).expanduser()) for p in results_dirs]))


def report(
    results_dirs: list[Path], output_dir: Path | None = None, gpu_hour_cost: float | None = None
) -> Path:
    """Validate the results folders and write report.html, report.md and figures/*.png.

    A folder that holds run folders (such as `kvsim compare`'s output) stands for them, a sweep
    folder for its finished cells. Returns the path of report.html. Raises ResultsError (one line) for
    a missing or incomplete folder, and OutputPathError for an output folder that cannot be written,
    both before anything is rendered or written.
    """
    if not results_dirs:
        raise ResultsError("no results folders given")
    run_dirs = expand_results_dirs(results_dirs)
    # a sweep's cells by allocator and varied values (their folders are in hash order)
    runs = order_runs([load_results(path) for path in run_dirs])
    add_gpu_cost(runs, gpu_hour_cost)  # USD per GPU-hour -> a USD / 1M output tokens column
    labels = run_labels(runs)
    output_dir = Path(output_dir) if output_dir is not None else default_output_dir(results_dirs)
    output_dir = check_output_dir(output_dir, what="report folder")
    # a user's report.html (or figures/) beside the runs is never overwritten; checked before rendering
    check_files_in_folder(output_dir, report_files(FIGURE_FILES), what="report folder")
    with claim_output(output_dir, what="report folder"):  # one writer; nothing left if it fails
        statements = diagnosis.diagnose(dict(zip(labels, runs, strict=True)))
        pngs = render_figures(labels, runs)
        page = render_html(labels, runs, statements, pngs)
        markdown = render_markdown(labels, runs, statements, {key: FIGURE_FILES[key] for key in pngs})
        try:
            _publish(output_dir, pngs, markdown, page)
        except OSError as exc:  # checked above, so only a late failure: a full disk, a folder removed
            raise write_error("report folder", output_dir, exc) from None
    interrupts.note_written(output_dir)
    return output_dir / "report.html"


def timed_report(
    results_dirs: list[Path], output_dir: Path | None = None, gpu_hour_cost: float | None = None
) -> tuple[Path, float]:
    """`report` plus its wall time in seconds (for the CLI's one-line summary)."""
    start_s = time.perf_counter()
    path = report(results_dirs, output_dir, gpu_hour_cost)
    return path, time.perf_counter() - start_s
