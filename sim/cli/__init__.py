"""The `kvsim` command line: a thin typer layer over the Python API (see `sim.cli.app`)."""

from sim.cli.app import build_app, main

__all__ = ["build_app", "main"]
