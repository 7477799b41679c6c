"""Running the typer app in-process and reading what it printed (one helper for the CLI tests)."""

from __future__ import annotations

import pytest

from sim.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `kvsim ARGS`; a command that returns normally exits 0."""
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
