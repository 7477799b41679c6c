"""`kvsim report RESULTS_DIR...`: write report.html, report.md and figures/ for results folders.

Why so thin: the work is `sim.reports.publish.report`; this only parses arguments and prints where the report
went. Bad folders raise ResultsError, which `sim.cli.main` turns into one line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `kvsim report` to the app."""

    @app.command("report")
    def report_command(
        results_dirs: Annotated[
            list[Path],
            typer.Argument(
                help=(
                    "Results folders (`kvsim run`), a folder holding several (`kvsim compare`), "
                    "or a sweep folder (`kvsim sweep`)."
                ),
                show_default=False,
            ),
        ],
        output: Annotated[
            Path | None,
            typer.Option(
                "--output", "-o", help="Folder for report.html/report.md/figures (default: common parent)."
            ),
        ] = None,
        gpu_hour_cost: Annotated[
            float | None,
            typer.Option("--gpu-hour-cost", help="USD per GPU-hour: adds USD per 1M output tokens per run."),
        ] = None,
    ) -> None:
        """Write a self-contained HTML report, a Markdown twin and PNG figures for results folders."""
        from sim.planning.money import check_gpu_hour_cost
        from sim.reports.publish import timed_report

        path, wall_s = timed_report(list(results_dirs), output, check_gpu_hour_cost(gpu_hour_cost))
        typer.echo(
            f"report written to {path} (and {path.with_suffix('.md').name}, figures/) in {wall_s:.1f} s"
        )
