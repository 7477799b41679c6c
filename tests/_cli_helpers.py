"""Running `kvsim` in-process (one helper module for the CLI tests).

`run_cli` gives the exit code of `sim.cli.main`, whether it returns or exits; `run_cli_output` also
reads what it printed.
"""

from __future__ import annotations

import pytest

from sim.cli import main


def run_cli(args: list[str]) -> int:
    """The exit code of `kvsim ARGS` (a command that returns normally exits 0)."""
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def run_cli_output(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `kvsim ARGS`."""
    code = run_cli(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
