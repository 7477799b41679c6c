"""Every fenced `kvsim ...` command in README.md and docs/*.md runs (issue 20 §4).

The commands are read from the docs at test time (docs/doc_commands.py), so whatever the docs say now is
what runs; each at reduced size (fewer prompts, the first of a list of values) in a temporary copy
of the repository's layout, so relative paths in the docs (`scenarios/...`, `../shared/traces/...`)
resolve as they do for a reader at the repository root and every output lands in the temporary
folder. A command naming a file under ../shared/ that this checkout lacks is skipped (real traces
are never copied into the repository); one marked `<!-- docs-test: skip REASON -->` is skipped with
its reason.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest
from _docs_helpers import load_docs_module

REPO_ROOT = Path(__file__).resolve().parents[2]
# Top-level entries that a documented command never needs (and must never write into).
NOT_MIRRORED: frozenset[str] = frozenset({".git", ".venv", "results", ".pytest_cache", ".hypothesis"})


commands = load_docs_module("doc_commands")
DOC_COMMANDS = commands.documented_commands()
DOC_BLOCKS = commands.documented_blocks()


@functools.cache
def _flags(head: tuple[str, ...]) -> frozenset[str]:
    return commands.accepted_flags(head)


def mirror_repository(sandbox: Path) -> Path:
    """`sandbox/repo` whose entries link to the repository's, plus `sandbox/shared` when it exists."""
    repo = sandbox / "repo"
    repo.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name not in NOT_MIRRORED:
            (repo / entry.name).symlink_to(entry)
    shared = REPO_ROOT.parent / "shared"
    if shared.is_dir():
        (sandbox / "shared").symlink_to(shared)
    return repo


def run_documented(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `kvsim ARGS` as a user would (its own process), without a terminal."""
    return commands.run_kvsim(argv, cwd)


def _head(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The command words before the first option or argument that is not a sub-command name."""
    return tuple(word for word in argv[:3] if not word.startswith("-"))


def test_the_docs_document_commands() -> None:
    """The extraction finds the commands the README and docs show (a broken reader finds none)."""
    where = {command.where.split(":")[0] for command in DOC_COMMANDS}
    assert "README.md" in where and len(DOC_COMMANDS) >= 5


def _block_id(block) -> str:
    return f"{block[0].where.rsplit(':', 1)[0]}:{block[0].block_line}"


@pytest.mark.parametrize("block", DOC_BLOCKS, ids=[_block_id(b) for b in DOC_BLOCKS])
def test_documented_commands_run(block, tmp_path: Path) -> None:
    """The commands of one fenced block, in order, in one folder (a later one may read an earlier
    one's output); the first that fails is named with its file and line."""
    repo = mirror_repository(tmp_path)
    skipped, ran = [], 0
    for command in block:
        if command.skip_reason:
            skipped.append(f"{command.where}: {command.skip_reason}")
            continue
        missing = [w for w in command.argv if w.startswith("../shared/") and not (repo / w).exists()]
        if missing:
            skipped.append(f"{command.where}: {missing[0]} is not in this checkout")
            continue
        argv = commands.reduced_argv(command.argv, _flags(_head(command.argv)))
        done = run_documented(argv, repo)
        ran += 1
        assert done.returncode == 0, (
            f"{command.where}: `{command.text}` (run as `{' '.join(argv)}`) exited {done.returncode}:\n"
            f"{done.stderr[-2000:]}"
        )
    if skipped and not ran:
        pytest.skip("; ".join(skipped))


def test_a_failing_documented_command_fails_the_test(tmp_path: Path) -> None:
    """The runner reports a command that fails as it would fail a user (so the test above can fail)."""
    page = tmp_path / "page.md"
    page.write_text("```bash\nkvsim run --no-such-flag\n```\n", encoding="utf-8")
    (found,) = commands.commands_in(page)
    done = run_documented(list(found.argv), tmp_path)
    assert done.returncode == 2 and "no-such-flag" in done.stderr


def test_extraction_joins_lines_drops_comments_and_honours_skip_marks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text `kvsim inline` is not a fenced command.\n"
        "```bash\n$ kvsim run --model OPT-13B \\\n    --num-prompts 500   # a comment\nmake demo\n```\n"
        "```toml\nkvsim = 1\n```\n"
        "<!-- docs-test: skip needs a CUDA device -->\n"
        "```\nkvsim calibrate --output p.json\n```\n",
        encoding="utf-8",
    )
    first, second = commands.commands_in(page)
    assert first.argv == ("kvsim", "run", "--model", "OPT-13B", "--num-prompts", "500")
    assert first.line == 3 and first.skip_reason is None
    assert second.argv == ("kvsim", "calibrate", "--output", "p.json")
    assert second.skip_reason == "needs a CUDA device"


def test_reduction_only_touches_flags_the_command_accepts() -> None:
    run_flags = _flags(("kvsim", "run"))
    assert commands.reduced_argv(["kvsim", "run", "--num-prompts", "5000"], run_flags) == [
        "kvsim",
        "run",
        "--num-prompts",
        str(commands.SMALL_NUM_PROMPTS),
    ]
    assert commands.reduced_argv(["kvsim", "run", "--num-prompts=3"], run_flags)[-1] == "3"
    waste = ["kvsim", "waste", "--max-model-len", "8192", "180"]
    assert commands.reduced_argv(waste, _flags(("kvsim", "waste"))) == waste
    capacity = commands.reduced_argv(
        ["kvsim", "capacity", "--max-model-lens", "2K,4K", "--tensor-parallel-size", "1,2"],
        _flags(("kvsim", "capacity")),
    )
    assert capacity[3] == "2K" and capacity[5] == "1"
    assert "--allocators" in capacity and "--rate-tol" in capacity
