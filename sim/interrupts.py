"""What a command has written so far, for the one line that Ctrl-C (or SIGTERM) prints.

Why: a user who interrupts a sweep after an hour must learn, in one line, what is safe on disk and
what is not: which outputs are complete, how many sweep cells were saved (a rerun resumes them), and
that nothing is half-written (every writer goes through a temporary name and a rename). Writers note
their finished outputs here as they go; `sim.cli.main` reads the notes when KeyboardInterrupt
arrives. The notes live for one command: `main` calls `reset()` first.

SIGTERM (the default of `kill`, `timeout` and batch schedulers) is handled like Ctrl-C: the handler
raises `Terminated`, a KeyboardInterrupt, so every cleanup that runs for Ctrl-C runs for it too; the
line starts with "terminated" and the exit code is 143 (128 + SIGTERM), as shells report it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what shells report for a Ctrl-C'd command
TERMINATED_EXIT_CODE = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: raised in the main thread wherever it is, like Ctrl-C's KeyboardInterrupt."""


@dataclass
class WriteNotes:
    """Complete outputs in the order written, and outputs that are partly there (key: the folder)."""

    written: list[str] = field(default_factory=list)
    partial: dict[str, str] = field(default_factory=dict)
    terminated: bool = False  # SIGTERM (not Ctrl-C) stopped the command


_NOTES = WriteNotes()  # one command per process: the CLI resets it at the start of each command


def reset() -> None:
    """Forget earlier notes (a new command starts)."""
    _NOTES.written.clear()
    _NOTES.partial.clear()
    _NOTES.terminated = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _NOTES.terminated = True
    raise Terminated()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` in the main thread; the previous handler after.

    Outside the main thread (a notebook's worker thread calling `sim.cli.main`) signals cannot be
    handled, so nothing changes there.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_code() -> int:
    """The exit code of the interrupted command: 143 after SIGTERM, 130 after Ctrl-C."""
    return TERMINATED_EXIT_CODE if _NOTES.terminated else INTERRUPTED_EXIT_CODE


def note_written(path: str | os.PathLike[str]) -> None:
    """`path` (a file or a folder) is now complete on disk.

    A path under a hidden name (`.partial/`, `.name.tmp-*`) is a kvsim temporary that is renamed
    into place later, so it is not noted: its final name is.
    """
    text = str(path)
    if any(part.startswith(".") and part not in (".", "..") for part in Path(text).parts):
        return
    _NOTES.partial.pop(text, None)
    if text not in _NOTES.written:
        _NOTES.written.append(text)


def note_partial(folder: str | os.PathLike[str], state: str) -> None:
    """`folder` is partly written; `state` says what is there and how to finish (one short clause)."""
    _NOTES.partial[str(folder)] = state


def interrupted_line() -> str:
    """The Ctrl-C line: what was written, what is partly there, and that nothing is half-written."""
    word = "terminated (SIGTERM)" if _NOTES.terminated else "interrupted"
    parts: list[str] = []
    if _NOTES.written:
        shown = _NOTES.written if len(_NOTES.written) <= 4 else [*_NOTES.written[:3], "..."]
        parts.append(f"written: {', '.join(shown)} ({len(_NOTES.written)} complete)")
    parts.extend(f"{folder}: {state}" for folder, state in _NOTES.partial.items())
    if not parts:
        return f"{word}: nothing was written (no output is left half-written)"
    return f"{word}: {'; '.join(parts)}; nothing else was written (no output is left half-written)"
