"""One writer per output, and nothing left behind by a command that fails.

Why: three concurrent `kvsim run -o same` all printed "results written" and exited 0; the files were
never mixed (every write is a rename), but two of three users were told a lie. And a command that
failed late (a full disk) left the folders it had just created, empty or holding only a marker.

`claim_output(path)` is held by a CLI command from its up-front checks to its last write:
- it takes an exclusive `flock` on a lock file beside the output (`.kvsim-tmp-lock-<name>`, the
  same hidden prefix as kvsim's staging folders, removed when the command ends; the kernel drops
  the lock of a killed process, and the next writer of that output removes its file), so a second
  writer of the same output gets one line and exit 2 before any work;
- if the command fails with an error, an output that did not exist before and holds only what
  kvsim wrote is removed again, and so are the empty parent folders the claim created.
A Ctrl-C or SIGTERM keeps what was completely written (the interrupted line lists it).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.files import STAGING_PREFIX, OutputPathError, check_utf8_path, foreign_entries, read_marker

LOCK_PREFIX = f"{STAGING_PREFIX}lock-"

_HELD: dict[Path, int] = {}  # lock file -> how many claims of this process hold it (re-entrant)


def lock_path(target: Path) -> Path:
    """The lock file of the output `target` (a resolved path)."""
    return target.parent / f"{LOCK_PREFIX}{target.name}"


def _holder(fd: int) -> str:
    text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    return f"pid {text}" if text.isdigit() else "another process"


def _is_lock_text(raw: bytes) -> bool:
    """What a kvsim lock file holds: nothing yet (just created) or one PID line."""
    text = raw.decode("ascii", errors="replace")
    return text == "" or (text.endswith("\n") and text[:-1].isdigit())


def _acquire(lock: Path, target: Path, what: str) -> int:
    """An open, exclusively locked descriptor of `lock` holding this PID; one line if it is taken."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OutputPathError(
                f"{what} {target}: cannot write in {lock.parent} ({exc.strerror or type(exc).__name__})"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputPathError(
                f"{what} {target}: another kvsim ({holder}) is writing it now; wait for it to finish "
                "or choose another --output"
            ) from None
        # The previous holder unlinks the file on release: if it did so between our open and our
        # flock, we hold a lock on a file nobody else will open. Retry on the file now at the path.
        try:
            same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same and not _is_lock_text(os.pread(fd, 64, 0)):
            # a file of that name that kvsim did not write: never truncated, never removed
            os.close(fd)
            raise OutputPathError(
                f"{what} {target}: {lock} is in the way and is not a kvsim lock file; move it or choose "
                "another --output"
            )
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


def _discard_new_output(target: Path) -> None:
    """Remove `target`, created by the failed command, if everything in it is kvsim's."""
    if target.is_symlink() or not target.is_dir():
        return
    if any(target.iterdir()) and (read_marker(target) is None or foreign_entries(target)):
        return
    shutil.rmtree(target, ignore_errors=True)


@contextmanager
def claim_output(path: str | os.PathLike[str], *, what: str = "output folder") -> Iterator[Path]:
    """Hold the output `path` (a folder or a file) for this command; yields the resolved path.

    Call after the up-front checks of the output (they give the better message for a bad path).
    """
    check_utf8_path(path, what=what)
    target = Path(os.path.realpath(Path(path).expanduser().absolute()))
    existed = os.path.lexists(target)
    created: list[Path] = []
    for parent in reversed(target.parents):
        if not os.path.lexists(parent):
            try:
                parent.mkdir()
            except OSError as exc:
                raise OutputPathError(
                    f"{what} {target}: cannot create {parent} ({exc.strerror or type(exc).__name__})"
                ) from None
            created.append(parent)
    lock = lock_path(target)
    fd = None
    if lock not in _HELD:
        try:
            fd = _acquire(lock, target, what)
        except BaseException:
            _remove_empty(created)
            raise
    _HELD[lock] = _HELD.get(lock, 0) + 1
    try:
        yield target
    except Exception:
        if not existed:
            _discard_new_output(target)
        raise
    finally:
        _HELD[lock] -= 1
        if fd is not None:
            del _HELD[lock]
            lock.unlink(missing_ok=True)
            os.close(fd)
        _remove_empty(created)


def _remove_empty(created: list[Path]) -> None:
    """Remove the folders a claim created (deepest first) where they are still empty."""
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            return
