"""The `kvsim ...` commands that README.md and docs/*.md show in fenced blocks, ready to run small.

Why: a documented command that no longer runs is the first thing a new user meets (issue 20 §4).
`tests/docs/test_documented_commands.py` runs every one of them (`run_kvsim`), read from the docs as
they are at test time (no fixed list), so a renamed flag or a missing file fails the suite.

Which commands: every line that starts with `kvsim ` (or `$ kvsim `) inside a fenced block whose
language is empty, `bash`, `sh`, `shell` or `console`; backslash continuations are joined and `#`
comments dropped. Other fences (`toml`, `python`, `text`, ...) are not commands. A command that cannot
run on a CPU-only machine is marked on the line before its fence with
`<!-- docs-test: skip REASON -->` (the reason is printed by the test).

Reduced size: the command runs as written except for the flags below, applied only when the command
accepts them (read from the typer app): `--num-prompts` at most SMALL_NUM_PROMPTS; capacity-style
lists (`--max-model-lens`, `--tensor-parallel-size`) keep their first value; `--allocators` keeps at
most two; a capacity search stops at `--rate-tol` COARSE_RATE_TOL with one allocator. Outputs go
where the command says, relative to the folder it runs in (the test runs it in a temporary folder
that mirrors the repository).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# The fence languages whose `kvsim` lines are commands to run.
COMMAND_LANGUAGES: frozenset[str] = frozenset({"", "bash", "sh", "shell", "console"})
# At most this many requests per documented run: enough for every code path, seconds per command.
SMALL_NUM_PROMPTS = 40
# A capacity bisection that stops at hi/lo - 1 <= 0.5 needs a handful of probes, not a dozen.
COARSE_RATE_TOL = "0.5"
# List flags whose first value is enough to exercise the command.
FIRST_VALUE_FLAGS: tuple[str, ...] = ("--max-model-lens", "--tensor-parallel-size")
MAX_ALLOCATORS = 2
# A documented command (or one `make docs` runs) that takes longer than this is a hang, not a result.
COMMAND_TIMEOUT_S = 600

_FENCE = re.compile(
    r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_SKIP = re.compile(r"<!--\s*docs-test:\s*skip\b(?P<reason>.*?)-->")


@dataclass(frozen=True)
class DocCommand:
    """One documented command: where it is written, its words, and why it is skipped (if it is)."""

    path: Path
    line: int
    text: str
    argv: tuple[str, ...]
    skip_reason: str | None = None
    block_line: int = 0  # the line of its fence: commands of one block run in order, in one folder

    @property
    def where(self) -> str:
        try:
            shown = self.path.relative_to(REPO_ROOT)
        except ValueError:
            shown = self.path
        return f"{shown}:{self.line}"


def doc_files(repo_root: Path = REPO_ROOT) -> list[Path]:
    """README.md and every docs/*.md, in a stable order."""
    return [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]


def _logical_lines(body: str, first_line: int) -> Iterable[tuple[int, str]]:
    """(line number, text) with backslash continuations joined."""
    pending, start = "", first_line
    for offset, raw in enumerate(body.splitlines()):
        if not pending:
            start = first_line + offset
        stripped = raw.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        yield start, pending + stripped
        pending = ""
    if pending:
        yield start, pending


def commands_in(path: Path) -> list[DocCommand]:
    """The `kvsim` commands in one Markdown file's command fences."""
    text = path.read_text(encoding="utf-8")
    found: list[DocCommand] = []
    for match in _FENCE.finditer(text):
        language = match.group("info").strip().split(" ")[0].lower()
        if language not in COMMAND_LANGUAGES:
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = _SKIP.search(before)
        body_line = text.count("\n", 0, match.start("body")) + 1
        for line, logical in _logical_lines(match.group("body"), body_line):
            command = logical.strip().removeprefix("$ ").strip()
            if not command.startswith("kvsim "):
                continue
            argv = tuple(shlex.split(command, comments=True))
            reason = skip.group("reason").strip() or "marked skip" if skip else None
            fence_line = text.count("\n", 0, match.start()) + 1
            found.append(DocCommand(path, line, command, argv, reason, fence_line))
    return found


def documented_commands(paths: Sequence[Path] | None = None) -> list[DocCommand]:
    """Every documented command, in file and line order."""
    return [command for path in (paths or doc_files()) for command in commands_in(path)]


def documented_blocks(paths: Sequence[Path] | None = None) -> list[list[DocCommand]]:
    """The commands grouped by fenced block: a block is a session (a later command may read what an
    earlier one wrote, e.g. `kvsim sweep` then `kvsim report`)."""
    blocks: dict[tuple[Path, int], list[DocCommand]] = {}
    for command in documented_commands(paths):
        blocks.setdefault((command.path, command.block_line), []).append(command)
    return list(blocks.values())


def _option_value(argv: list[str], flag: str) -> int | None:
    """Index of the value of `flag` in argv (`--flag value`), or None when absent or `--flag=value`."""
    for index, word in enumerate(argv[:-1]):
        if word == flag:
            return index + 1
    return None


def _split_equals(argv: Sequence[str]) -> list[str]:
    """`--flag=value` as two words, so that every flag is looked up one way."""
    out: list[str] = []
    for word in argv:
        if word.startswith("--") and "=" in word:
            out.extend(word.split("=", 1))
        else:
            out.append(word)
    return out


def reduced_argv(argv: Sequence[str], accepted_flags: frozenset[str]) -> list[str]:
    """The command at reduced size (module docstring), changing only flags the command accepts."""
    words = _split_equals(argv)
    if "--num-prompts" in accepted_flags:
        index = _option_value(words, "--num-prompts")
        if index is None:
            words += ["--num-prompts", str(SMALL_NUM_PROMPTS)]
        elif words[index].isdigit():
            words[index] = str(min(int(words[index]), SMALL_NUM_PROMPTS))
    for flag in FIRST_VALUE_FLAGS:
        index = _option_value(words, flag)
        if flag in accepted_flags and index is not None:
            words[index] = words[index].split(",")[0]
    allocators = _option_value(words, "--allocators")
    if "--allocators" in accepted_flags and allocators is not None:
        words[allocators] = ",".join(words[allocators].split(",")[:MAX_ALLOCATORS])
    if "--rate-tol" in accepted_flags:  # a capacity search: coarse, and one allocator unless named
        index = _option_value(words, "--rate-tol")
        if index is None:
            words += ["--rate-tol", COARSE_RATE_TOL]
        if allocators is None and "--allocators" in accepted_flags:
            words += ["--allocators", "paged"]
    return words


def accepted_flags(argv: Sequence[str]) -> frozenset[str]:
    """The long flags of the (sub)command that argv names, read from kvsim's typer app."""
    import typer

    from sim.cli.app import build_app

    # typer bundles its own click: a group is recognised by its sub-commands, not by click's class
    command = typer.main.get_command(build_app())
    for word in argv[1:]:
        if not hasattr(command, "commands") or word.startswith("-"):
            break
        sub = command.commands.get(word)
        if sub is None:
            break
        command = sub
    return frozenset(
        name
        for param in command.params
        for name in (*param.opts, *param.secondary_opts)
        if name.startswith("--")
    )


def run_kvsim(argv: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `kvsim ARGS` as a reader would: its own process, no terminal, 80 columns, head-less plots."""
    if list(argv[:1]) != ["kvsim"]:
        raise ValueError(f"not a kvsim command: {' '.join(argv)}")
    env = {**os.environ, "MPLBACKEND": "Agg", "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *argv[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
