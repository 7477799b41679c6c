"""`kvsim cost validate PROFILE.csv [--gpu NAME]`: check the step-time model against measured times.

Why a command: every latency and capacity figure rests on the cost model, so anyone should be able to
hold it against a measured file (Vidur's `*.mlp.csv` format, or one gpu/ writes) in one line. The
work is in sim/cost/validate.py; a bad or foreign file is one line and exit 2.
"""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The step-time cost model: validate it on measured files.", no_args_is_help=True)

    @group.command("validate")
    def validate(
        profile: Path = typer.Argument(..., help="Measured linear-layer profile CSV (Vidur mlp format)."),
        gpu: str | None = typer.Option(
            None, "--gpu", help="GPU preset the file was measured on (default: from the file name)."
        ),
    ) -> None:
        """Per-bucket measured vs predicted linear-layer time; the last line is `MAPE <x> %`."""
        from sim.cost.validate import validate_profile

        typer.echo(validate_profile(profile, gpu).text())

    app.add_typer(group, name="cost")
