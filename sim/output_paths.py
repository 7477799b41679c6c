"""Up-front checks of where a command will write, so that a bad path fails before any work is done.

Why up front: a sweep or a capacity plan may simulate for an hour; finding out at the end that
`--output` names a file, a read-only folder or a path under a regular file wastes all of it and used
to end in a traceback. These checks only look (no folder is created, no probe file is written): the
writer still writes through a temp file and os.replace, and turns a late OSError (a full disk) into
one line with `write_error`.
"""

from __future__ import annotations

import os
from pathlib import Path

from sim.errors import KvsimError


class OutputPathError(KvsimError):
    """An output path that cannot be written: names the path and why."""


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its closest ancestor that exists (a dangling link counts as existing)."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(path.anchor or ".")


def _writable_dir(folder: Path) -> bool:
    """Can this process add entries to `folder`? (write + search; honours read-only mounts)."""
    return os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids)


def check_output_dir(path: str | os.PathLike[str], *, what: str = "output folder") -> Path:
    """`path` as an absolute Path if it is a writable folder, or can be created as one.

    Creatable means: the closest existing ancestor is a writable folder (so `mkdir -p` will work).
    Raises OutputPathError naming the path and the obstacle (a file in the way, no write permission).
    """
    target = Path(path).expanduser().absolute()
    existing = _nearest_existing(target)
    if not existing.is_dir():
        where = "" if existing == target else f"{existing} "
        raise OutputPathError(f"{what} {target}: {where}is a file, not a folder")
    if not _writable_dir(existing):
        where = "" if existing == target else f" ({existing} is not writable)"
        raise OutputPathError(f"{what} {target}: no permission to write there{where}")
    return target


def check_output_file(path: str | os.PathLike[str], *, what: str = "output file") -> Path:
    """`path` as an absolute Path if a file can be written there through a temp file + os.replace.

    The parent folder must already exist (a typo in a folder name should not silently create a new
    tree) and be writable; `path` itself must not be a folder.
    """
    target = Path(path).expanduser().absolute()
    parent = target.parent
    if target.is_dir():
        raise OutputPathError(f"{what} {target}: is a folder, expected a file name")
    if not parent.exists():
        existing = _nearest_existing(parent)
        if not existing.is_dir():
            raise OutputPathError(f"{what} {target}: {existing} is a file, not a folder")
        raise OutputPathError(f"{what} {target}: folder {parent} does not exist (create it first)")
    if not parent.is_dir():
        raise OutputPathError(f"{what} {target}: {parent} is a file, not a folder")
    if not _writable_dir(parent):
        raise OutputPathError(f"{what} {target}: no permission to write in {parent}")
    return target


def write_error(what: str, path: Path, exc: OSError) -> OutputPathError:
    """A late write failure (disk full, folder removed meanwhile) as one line naming the path."""
    reason = exc.strerror or type(exc).__name__
    return OutputPathError(f"{what} {path}: cannot write ({reason})")
