"""Running `kvsim` in-process: the exit code of `sim.cli.main`, whether it returns or exits."""

from __future__ import annotations

from sim.cli import main


def run_cli(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
