"""The `kvsim` command: a thin typer layer over the Python API.

Why thin: everything a command does is a function in sim/, workloads/, allocators/ or gpu/ first,
so notebooks and scripts use the same code. Each sub-command lives in `sim/commands/<name>.py` with a
`register(app)` function; this module only wires them and maps user errors to exit code 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

COMMAND_MODULES: tuple[str, ...] = (
    "waste",  # kvsim waste           (allocators issue)
    "workload",  # kvsim workload ...  (workloads issue)
    "run",  # kvsim run / compare / presets (engine issue)
    "report",  # kvsim report        (reports issue)
    "sweep",  # kvsim sweep / capacity (sweeps issue)
    "gpu",  # kvsim calibrate / replay (gpu issue)
)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="kvsim",
        help="Simulate LLM KV-cache allocators: where the memory goes and what it costs.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"sim.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"sim.commands.{name}":
                continue
            raise
        module.register(app)
    return app


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turning any user error into one line and exit code 2."""
    from sim.errors import user_error_types

    app = build_app()
    try:
        # standalone mode: typer/click print usage errors themselves and exit 2; anything else
        # raised inside a command propagates here.
        app(args=argv, standalone_mode=True)
    except user_error_types() as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
