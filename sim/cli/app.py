"""The `kvsim` command: a thin typer layer over the Python API.

Why thin: everything a command does is a function in sim/, workloads/, allocators/ or gpu/ first,
so notebooks and scripts use the same code. Each sub-command lives in `sim/cli/<name>.py` with a
`register(app)` function; this module only wires them and maps user errors to exit code 2. A command
module that fails to import is an error, never a silently missing command.
"""

from __future__ import annotations

import errno
import importlib
import re
import sys

import typer

COMMAND_MODULES: tuple[str, ...] = (
    "waste",  # kvsim waste
    "workload",  # kvsim workload describe / list
    "run",  # kvsim run / compare / presets
    "report",  # kvsim report
    "sweep",  # kvsim sweep / capacity
    "gpu",  # kvsim calibrate / replay
    "cost",  # kvsim cost validate
    "bench",  # kvsim bench replay / fit
)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="kvsim",
        help="Simulate LLM KV-cache allocators: where the memory goes and what it costs.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        # Click's plain help, not rich's boxed table: rich squeezes the flag column at 80 columns and
        # cuts long vLLM flag names (`--gpu-memory-util…`); click wraps the help text instead.
        rich_markup_mode=None,
    )
    app.callback()(_root_options)
    for name in COMMAND_MODULES:
        importlib.import_module(f"sim.cli.{name}").register(app)
    return app


def version_text() -> str:
    """`kvsim --version`: the package version and which path runs the hot loop (compiled or pure).

    Why the path: the compiled core is optional (no compiler, a stale build, KVSIM_PURE=1) and results
    are identical either way, so speed is the only sign of it; this line says which one a user has.
    """
    import sim

    return f"kvsim {sim.__version__}\ncore: {sim.core_path()}"


def _print_version(value: bool) -> None:
    if value:
        print(version_text())
        raise typer.Exit()


def _root_options(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version and the active core path (compiled or pure Python), then exit.",
    ),
) -> None:
    """Simulate LLM KV-cache allocators: where the memory goes and what it costs."""


# An argument of the Python API -> the flag that sets it (scenario fields: scenario_flags.FIELD_FLAGS).
ARGUMENT_FLAGS: dict[str, str] = {
    "jobs": "--jobs",
    "dask_local": "--dask-local",
    "scheduler": "--scheduler",
    "output_dir": "--output",
    "output": "--output",
    "target_rate_req_s": "--target-rate",
    "rate_bracket": "--rate-min/--rate-max",
    "rel_tol": "--rate-tol",
    "max_model_lens": "--max-model-lens",
    "tensor_parallel_sizes": "--tensor-parallel-size",
    "gpu_hour_cost": "--gpu-hour-cost",
    "model": "--model",
    "gpu": "--gpu",
    "kv_cache_dtype": "--kv-cache-dtype",
    "tensor_parallel_size": "--tensor-parallel-size",
    "quantization": "--quantization",
}


def in_flag_words(message: str, argv: list[str]) -> str:
    """A library error in the CLI's words: "field 'max_num_seqs': ..." -> "--max-num-seqs (field ...)".

    Why here: the library names scenario fields and API arguments (a notebook user sets those); a
    command-line user set a flag, so the line names the flag the user typed (and keeps the field).
    A field the user did not set by a flag (a --config or sweep file) keeps its field name.
    """
    from sim.cli.scenario_flags import FIELD_FLAGS

    typed = {word.split("=", 1)[0] for word in argv if word.startswith("--")}

    def flag_for(match: re.Match[str]) -> str:
        kind, name = match.group(1), match.group(2)
        if name.startswith("--"):
            return name
        flag = FIELD_FLAGS.get(name) if kind == "field" else ARGUMENT_FLAGS.get(name)
        if flag is None or not any(part in typed for part in flag.split("/")):
            return match.group(0)
        # an API argument is the flag itself; a field keeps its name for users of --config files
        return flag if kind == "argument" else f"{flag} ({kind} '{name}')"

    return re.sub(r"\b(field|argument) '([\w.-]+)'", flag_for, message)


# A write that fails for want of space names no file (pyarrow's and matplotlib's errors do not): kvsim's
# writers name the output themselves (`sim.files.write_error`); this catches any other writer.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _usage_line(exc: Exception) -> str:
    """Click's usage error as one line, pointing at the command's --help."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "kvsim"
    return f"{message} (see '{command} --help')"


def _exit_interrupted() -> None:
    """Ctrl-C or SIGTERM: one line saying what was and was not written, exit 130 / 143 (no traceback)."""
    from sim import interrupts

    print(interrupts.interrupted_line(), file=sys.stderr)
    sys.exit(interrupts.exit_code())


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turning any user error into one line and exit code 2.

    SIGTERM is handled like Ctrl-C while the command runs (`sim.interrupts`): one line, exit 143.
    """
    from sim import interrupts

    interrupts.reset()
    with interrupts.sigterm_as_interrupt():
        _run(argv)


def _run(argv: list[str] | None) -> None:
    """`main`'s body: run the app and map what it raises to one line and an exit code."""
    from sim import interrupts
    from sim.errors import user_error_types

    try:
        app = build_app()
        # Non-standalone: a command's normal return comes back here instead of SystemExit(0), so
        # tests and notebooks can call main() in-process; `raise typer.Exit(n)` returns n.
        exit_code = app(args=argv, standalone_mode=False)
    except KeyboardInterrupt:  # Ctrl-C outside click's own handling (e.g. while importing)
        _exit_interrupted()
    except user_error_types() as exc:
        print(f"error: {in_flag_words(str(exc), sys.argv[1:] if argv is None else argv)}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:
        # A path the user gave that cannot be read or written (permissions, a file where a folder
        # should be, a full disk): one line naming the path, like any other bad input.
        if exc.filename is None and exc.errno not in _DISK_ERRNOS:
            raise
        where = f"{exc.filename}: " if exc.filename is not None else "cannot write output: "
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:
        # typer bundles its own copy of click, so match click's usage errors by shape, not class.
        if hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int):
            print(f"error: {_usage_line(exc)}", file=sys.stderr)
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort" and isinstance(exc.__cause__, KeyboardInterrupt):
            _exit_interrupted()  # click turns Ctrl-C into Abort (after printing an empty line)
        if type(exc).__name__ == "Abort":
            print("aborted", file=sys.stderr)
            sys.exit(1)
        raise
    if exit_code == interrupts.INTERRUPTED_EXIT_CODE:
        _exit_interrupted()  # typer turns Ctrl-C into Exit(130), returned here in non-standalone mode
    if isinstance(exit_code, int) and exit_code != 0:
        sys.exit(exit_code)
