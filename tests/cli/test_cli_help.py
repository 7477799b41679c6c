"""`kvsim COMMAND --help` at 80 columns: every flag name readable in full (issue 11, part 5).

Rich's boxed option table used to squeeze the flag column and cut names (`--gpu-memory-util…`);
the CLI now uses click's plain help, which wraps help text and never truncates a flag.
"""

from __future__ import annotations

from typing import Any

import pytest
import typer

from sim.cli import build_app, main


def _commands() -> list[tuple[list[str], Any]]:
    """Every command as (argv path, click command), sub-groups (kvsim workload ...) included."""
    root = typer.main.get_command(build_app())
    found: list[tuple[list[str], Any]] = []

    def walk(path: list[str], command: Any) -> None:
        if hasattr(command, "commands"):  # typer bundles its own click: match groups by shape
            for name, sub in command.commands.items():
                walk([*path, name], sub)
        else:
            found.append((path, command))

    walk([], root)
    return found


COMMANDS = _commands()


def test_every_command_is_covered() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    expected = {"run", "compare", "report", "sweep", "capacity", "calibrate", "replay", "waste", "presets"}
    assert expected | {"workload describe", "workload list"} <= names


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_at_80_columns_shows_every_flag_in_full(
    path: list[str], command: Any, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    try:
        main([*path, "--help"])  # non-standalone: --help returns here instead of raising SystemExit
    except SystemExit as exc:
        assert exc.code in (0, None)
    text = capsys.readouterr().out
    assert "…" not in text
    tokens = set(text.replace(",", " ").replace("/", " ").split())
    flags = ["--help"] + [
        opt
        for param in command.params
        if param.param_type_name == "option"
        for opt in (*param.opts, *param.secondary_opts)
    ]
    missing = [flag for flag in flags if flag not in tokens]
    assert missing == [], f"kvsim {' '.join(path)} --help at 80 columns lacks {missing}"
    assert max(len(line) for line in text.splitlines()) <= 80
