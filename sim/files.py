"""Everything kvsim writes to disk goes through here: one atomic writer, one JSON rule, one owner rule.

Why one module: kvsim's outputs (results folders, reports, sweep tables, capacity plans, profiles)
are read later by people and programs that did not watch them being written, and they live next to
the user's own files. Three promises hold for every command, and they are kept here once:

1. **Atomic.** A file or folder is built in a staging folder beside its target and moved into
   place with `os.replace` (files mode 0644). A crash leaves the previous version or the new one,
   never half of one. A staging folder names its host and PID (`STAGING_MARKER`), so one left by a
   killed process is cleared by the next write there, and nothing else ever is; a write that fails
   (a full disk) is one line naming the output (`write_error`).
2. **One JSON rule** (docs/metrics.md, "JSON numbers"): NaN (undefined, e.g. TPOT of 1-token outputs)
   is written as `null`; ±inf (e.g. an unbounded request rate) as the strings `"inf"` / `"-inf"`,
   which pydantic and `float()` read back. Output is strict JSON (`allow_nan=False`).
3. **kvsim only replaces or deletes what it wrote itself.** Every folder kvsim writes into holds a
   marker, `kvsim-output.json`, naming the kind of folder (run, compare, sweep, report, capacity,
   calibrate, replay, describe-plot) and the SHA-256 of every file kvsim put there. An existing file
   may be replaced only if the marker lists it with its current content (a file the user edited
   since is theirs); a folder may be replaced or resumed only if everything in it is listed (or is
   itself a kvsim folder with a clean marker). Anything else is refused with one line naming the
   foreign files, before any work. The root, the home folder, a git work tree's root and the current
   folder (unless it is a kvsim folder) are never output folders; symlinks are resolved first, so
   a replaced folder is replaced where the link points and the link keeps working.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import socket
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sim.errors import KvsimError, ResultsError

MARKER_FILE = "kvsim-output.json"
MARKER_SCHEMA = 1
FOLDER_KINDS: tuple[str, ...] = (
    "run",
    "compare",
    "sweep",
    "report",
    "capacity",
    "calibrate",
    "replay",
    "describe-plot",
)
# Kinds whose whole folder kvsim replaces or resumes: an existing one must be of the same kind.
_FOLDER_OWNING_KINDS = frozenset({"run", "compare", "sweep"})
FILE_MODE = 0o644
# Names kvsim uses for short-lived state inside its own folders (a sweep's lock and half-written
# cells, staging folders of an interrupted write): kvsim's, whatever they hold.
TRANSIENT_NAMES = frozenset({".lock", ".partial"})
STAGING_PREFIX = ".kvsim-tmp-"
# Inside every staging folder: who made it (kvsim, this host, this PID). A later write clears a
# staging folder only when this file says kvsim made it and its process is gone (`clear_stale_staging`).
STAGING_MARKER = ".kvsim-staging.json"
SUMMARY_FILE = "summary.json"
_FOREIGN_SHOWN = 5
# Bound on what kvsim reads from a config or spec file (a TOML scenario, a sweep spec, a config.json):
# the largest real config.json (a multimodal one) is ~0.1 MB; this refuses /dev/zero and 1 GB files.
MAX_CONFIG_BYTES = 16 * 1024 * 1024
# Bound on a calibration profile (a measured grid, JSON or CSV): ample for any real grid (~1 MB).
MAX_PROFILE_BYTES = 256 * 1024 * 1024


class OutputPathError(KvsimError):
    """An output path that cannot or must not be written: names the path and why (exit 2)."""


# ------------------------------------------------------------------------------------------------ JSON


def json_safe(value: Any) -> Any:
    """`value` with the one JSON rule applied: NaN -> None, ±inf -> "inf"/"-inf", NumPy -> Python."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, str | bytes):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            return None
        return "inf" if value > 0 else "-inf"
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def dumps_json(value: Any, *, indent: int | None = 2) -> str:
    """Strict JSON text of `value` under the one rule (a trailing newline when indented)."""
    text = json.dumps(json_safe(value), indent=indent, allow_nan=False, default=str)
    return text + "\n" if indent is not None else text


def _refuse_unreadable_kind(source: Path, st: os.stat_result, what: str, limit_bytes: int) -> None:
    """One line for an input that is not a regular file, or is larger than a config can be."""
    if not stat.S_ISREG(st.st_mode):
        raise KvsimError(f"{source}: {what} must be a regular file (this is not)")
    if st.st_size > limit_bytes:
        raise KvsimError(f"{source}: {what} is larger than {limit_bytes // 2**20} MiB (not a {what}?)")


def check_input_file(path: str | os.PathLike[str], *, what: str, limit_bytes: int = MAX_CONFIG_BYTES) -> None:
    """Refuse, before a reader opens it, an input file that is a device, a FIFO or far too large.

    For readers that open the file themselves (a calibration profile: `gpu.profile`, the linear-layer
    CSV): `--calibration /dev/zero` read until the OOM killer came. A missing file is left to the
    reader, which names it in its own words.
    """
    source = Path(path)
    try:
        st = os.stat(source)
    except OSError:
        return
    _refuse_unreadable_kind(source, st, what, limit_bytes)


def read_text_bounded(path: str | os.PathLike[str], *, what: str, limit_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of the config or spec file `path`; one-line KvsimError naming it otherwise.

    Why bounded and regular-only: `--config /dev/zero` used to read until MemoryError and a FIFO
    blocked forever. A config is a small regular file; anything else is refused before reading.
    """
    source = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever
        with open(os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            _refuse_unreadable_kind(source, os.fstat(handle.fileno()), what, limit_bytes)
            raw = handle.read(limit_bytes + 1)
    except FileNotFoundError:
        raise KvsimError(f"{source}: {what} not found") from None
    except OSError as exc:
        raise KvsimError(f"{source}: cannot read {what} ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > limit_bytes:  # a file that grew since fstat
        raise KvsimError(f"{source}: {what} is larger than {limit_bytes // 2**20} MiB (not a {what}?)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KvsimError(f"{source}: {what} is not UTF-8 text (byte {exc.start})") from None


def read_json(path: Path, *, what: str = "JSON") -> Any:
    """Parsed JSON of `path`; ResultsError naming the file for an unreadable or invalid one."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        raise ResultsError(f"{path}: cannot read {what} ({reason})") from None


def read_summary(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """A results folder's summary.json as a dict: the one reader (results, sweeps, replay use it)."""
    path = Path(folder) / SUMMARY_FILE
    if not path.is_file():
        raise ResultsError(f"{Path(folder)}: missing {SUMMARY_FILE} (not a complete kvsim results folder)")
    summary = read_json(path)
    if not isinstance(summary, dict):
        raise ResultsError(f"{path}: expected a JSON object")
    return summary


# --------------------------------------------------------------------------------------- atomic writes


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fill(path: Path, content: bytes | str | Callable[[Path], None]) -> None:
    """Write `content` to `path`; text as UTF-8, with undecodable file-name bytes as `\\udcff`.

    Why backslashreplace: a trace named with non-UTF-8 bytes reaches a report through summary.json
    as a lone surrogate, which strict UTF-8 cannot encode (a traceback after rendering, issue 23);
    every other text is written unchanged.
    """
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_bytes(content.encode("utf-8", errors="backslashreplace"))
    else:
        content(path)


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (another user's process counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def _is_stale_staging(entry: Path) -> bool:
    """A staging folder kvsim made (its marker says so) whose process on this host is gone."""
    if not entry.name.startswith(STAGING_PREFIX) or entry.is_symlink() or not entry.is_dir():
        return False
    marker = entry / STAGING_MARKER
    if marker.is_symlink() or not marker.is_file():
        return False
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if (
        not isinstance(data, dict)
        or data.get("kvsim") != "staging"
        or data.get("host") != socket.gethostname()
    ):
        return False
    pid = data.get("pid")
    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and not _pid_alive(pid)


def clear_stale_staging(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove staging folders in `folder` left by a killed kvsim (SIGKILL, power loss); return them.

    Only folders named `.kvsim-tmp-*` that hold kvsim's staging marker naming a process of this host
    that no longer runs: a user's folder of the same name, a live run's staging, or one made on
    another host (a shared disk) is never touched.
    """
    root = Path(folder)
    try:
        entries = [entry for entry in root.iterdir() if _is_stale_staging(entry)]
    except OSError:
        return []
    for entry in entries:
        shutil.rmtree(entry, ignore_errors=True)
    return entries


@contextmanager
def staging_folder(parent: Path, label: str) -> Iterator[Path]:
    """A fresh hidden folder in `parent` for building outputs, removed on the way out.

    It holds kvsim's staging marker (host and PID), so if this process is killed before the way
    out, the next kvsim write into `parent` recognises and removes it (`clear_stale_staging`).
    """
    clear_stale_staging(parent)
    folder = parent / f"{STAGING_PREFIX}{label}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    try:
        (folder / STAGING_MARKER).write_text(
            json.dumps({"kvsim": "staging", "host": socket.gethostname(), "pid": os.getpid()}),
            encoding="utf-8",
        )
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_error(what: str, path: Path, exc: OSError) -> OutputPathError:
    """A late write failure (disk full, folder removed meanwhile) as one line naming the path."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return OutputPathError(f"{what} {path}: cannot write ({reason})")


def write_file_atomic(
    path: str | os.PathLike[str],
    content: bytes | str | Callable[[Path], None],
    *,
    what: str = "output file",
) -> Path:
    """Write `content` (bytes, text, or a function that writes the given path) to `path` atomically.

    Built in a staging folder beside `path` and renamed into place; a write failure (a full disk)
    is one OutputPathError line naming `path`, with nothing left behind. No ownership check:
    callers check first (`check_output_file`, `publish_files`).
    """
    target = Path(path)
    try:
        with staging_folder(target.parent, target.name) as staging:
            temp = staging / target.name
            _fill(temp, content)
            os.chmod(temp, FILE_MODE)
            os.replace(temp, target)
    except OSError as exc:
        raise write_error(what, target, exc) from None
    return target


# -------------------------------------------------------------------------------------------- markers


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The folder's marker ({kind, files: {relative path: [sha256...] or "dir"}}), or None."""
    path = folder / MARKER_FILE
    if not path.is_file() or path.is_symlink():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("kind") not in FOLDER_KINDS:
        return None
    if not isinstance(data.get("files"), dict):
        return None
    return data


def folder_kind(folder: str | os.PathLike[str]) -> str | None:
    """The kind a kvsim marker gives `folder`, or None for any other folder."""
    marker = read_marker(Path(folder))
    return None if marker is None else str(marker["kind"])


def _refuse_foreign_marker(folder: Path, *, what: str) -> None:
    """A file with the marker's name that is not kvsim's marker is the user's: never overwritten."""
    path = folder / MARKER_FILE
    if os.path.lexists(path) and read_marker(folder) is None:
        raise OutputPathError(
            f"{what}: {path} exists and is not kvsim's marker (kvsim did not write it); move it or "
            "choose another folder"
        )


def _write_marker(folder: Path, kind: str, files: Mapping[str, Any]) -> None:
    _refuse_foreign_marker(folder, what="output folder")
    marker = {
        "kvsim": "output folder",
        "schema": MARKER_SCHEMA,
        "kind": kind,
        "files": dict(sorted(files.items())),
    }
    write_file_atomic(folder / MARKER_FILE, dumps_json(marker))


def _manifest(folder: Path) -> dict[str, Any]:
    """Every file (its hash) and plain folder ("dir") under `folder`, except nested kvsim folders."""
    files: dict[str, Any] = {}
    for entry in sorted(folder.iterdir()):
        if entry.name == MARKER_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            if (entry / MARKER_FILE).is_file():
                continue
            files[entry.name] = "dir"
            files.update({f"{entry.name}/{k}": v for k, v in _manifest(entry).items()})
        elif entry.is_file() and not entry.is_symlink():
            files[entry.name] = [_sha256(entry)]
    return files


def mark_folder(folder: Path, kind: str) -> None:
    """Give a folder kvsim has just filled its marker, listing everything in it as kvsim's."""
    _write_marker(folder, kind, _manifest(folder))


def _foreign(folder: Path, owned: Mapping[str, Any], prefix: str) -> list[Path]:
    out: list[Path] = []
    for entry in sorted(folder.iterdir()):
        rel = f"{prefix}{entry.name}"
        if entry.name == MARKER_FILE and not prefix:
            if read_marker(folder) is not None:
                continue
            out.append(entry)  # a file of the user's that only has the marker's name: never overwritten
            continue
        if entry.name in TRANSIENT_NAMES or entry.name.startswith(STAGING_PREFIX):
            continue
        if entry.is_symlink():
            out.append(entry)
        elif entry.is_dir():
            if (entry / MARKER_FILE).is_file():
                out += foreign_entries(entry)
            elif owned.get(rel) == "dir":
                out += _foreign(entry, owned, f"{rel}/")
            else:
                out.append(entry)
        else:
            hashes = owned.get(rel)
            if not isinstance(hashes, list) or _sha256(entry) not in hashes:
                out.append(entry)
    return out


def foreign_entries(folder: str | os.PathLike[str]) -> list[Path]:
    """What under `folder` kvsim did not write (or the user changed since): empty = all kvsim's."""
    root = Path(folder)
    marker = read_marker(root)
    if marker is None:
        return sorted(root.iterdir()) if root.is_dir() else []
    return _foreign(root, marker["files"], "")


def _foreign_line(folder: Path, foreign: Sequence[Path]) -> str:
    names = [os.path.relpath(p, folder) for p in foreign[:_FOREIGN_SHOWN]]
    more = f" and {len(foreign) - _FOREIGN_SHOWN} more" if len(foreign) > _FOREIGN_SHOWN else ""
    return ", ".join(names) + more


# -------------------------------------------------------------------------------------- path checks


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its closest ancestor that exists (a dangling link counts as existing)."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(path.anchor or ".")


def _writable_dir(folder: Path) -> bool:
    """Can this process add entries to `folder`? (write + search; honours read-only mounts)."""
    return os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids)


def plain_name(name: str, *, what: str = "field 'name'") -> str:
    """`name` if it can be one folder's name (no '/', not '.' or '..', not empty), else a user error.

    Why: `results/<name>` must stay under `results/`; `--name ../../x` used to reach any folder.
    """
    if not name or name.strip() != name or name in {".", ".."} or "/" in name or "\\" in name or "\0" in name:
        raise OutputPathError(f"{what} {name!r}: must be a plain name (no '/', not '.' or '..')")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in name):
        # a newline in a run's name split report.md's table rows; no file name needs a control character
        raise OutputPathError(f"{what} {name!r}: must not contain control characters (newline, tab, ...)")
    check_utf8_path(name, what=what)
    return name


def shown_path(path: str | os.PathLike[str]) -> str:
    """`path` printable whatever its bytes: undecodable bytes as \\xNN (the one line must print)."""
    return os.fsencode(path).decode("utf-8", errors="backslashreplace")


def check_utf8_path(path: str | os.PathLike[str], *, what: str = "output folder") -> None:
    """Refuse a path whose bytes are not UTF-8, before any work.

    Why: kvsim writes output paths into summary.json, markers and reports (UTF-8 text); a name of
    other bytes (`-o $'bad\\xff'`) passed every other check, ran the whole simulation and then
    raised UnicodeEncodeError.
    """
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        raise OutputPathError(
            f"{what} {shown_path(path)}: the name is not valid UTF-8; choose a UTF-8 name"
        ) from None


def check_no_links_inside(folder: Path, rels: Iterable[str], *, what: str = "output folder") -> None:
    """Refuse when a folder on the way from `folder` to any of `rels` is a symbolic link.

    Why: the user named `folder`; a link inside it (`figures -> ../victim`) would carry kvsim's
    writes somewhere the user did not name. The output folder itself may be a link (named by the
    user, resolved up front); links below it are never followed.
    """
    for rel in rels:
        parts = Path(rel).parts[:-1]
        for depth in range(1, len(parts) + 1):
            inside = folder.joinpath(*parts[:depth])
            if inside.is_symlink():
                raise OutputPathError(
                    f"{what} {folder}: {os.path.relpath(inside, folder)} is a symbolic link; kvsim "
                    "never writes through a link inside the output folder (remove it or choose another "
                    "--output)"
                )


def _refused_folder(target: Path) -> str | None:
    """Why `target` (resolved) can never be an output folder, or None."""
    if target == Path(target.anchor):
        return "is the filesystem root"
    home = Path.home().resolve()
    if target == home:
        return "is the home folder"
    if (target / ".git").exists():
        return "is the root of a git work tree"
    if target == Path.cwd().resolve() and folder_kind(target) not in ("run", "compare", "sweep", "report"):
        return "is the current folder (give a new or kvsim folder)"
    return None


def _resolve(path: str | os.PathLike[str]) -> Path:
    """Absolute, symlinks resolved (also a dangling link's target), '~' expanded."""
    return Path(os.path.realpath(Path(path).expanduser().absolute()))


def check_output_dir(path: str | os.PathLike[str], *, what: str = "output folder") -> Path:
    """`path`, resolved, if it is a writable folder or can be created as one (no ownership rule).

    Creatable means: the closest existing ancestor is a writable folder (so `mkdir -p` will work).
    Raises OutputPathError naming the path and the obstacle. Creates nothing.
    """
    check_utf8_path(path, what=what)
    target = _resolve(path)
    existing = _nearest_existing(target)
    if not existing.is_dir():
        where = "" if existing == target else f"{existing} "
        raise OutputPathError(f"{what} {target}: {where}is a file, not a folder")
    if not _writable_dir(existing):
        where = "" if existing == target else f" ({existing} is not writable)"
        raise OutputPathError(f"{what} {target}: no permission to write there{where}")
    why = _refused_folder(target)
    if why is not None:
        raise OutputPathError(f"{what} {target}: {why}; kvsim never writes there")
    return target


def check_output_folder(path: str | os.PathLike[str], kind: str, *, what: str = "output folder") -> Path:
    """`path`, resolved, if kvsim may write a `kind` folder there: new, empty, or kvsim's own.

    An existing folder of another owning kind (a sweep where a run should go) is refused, and so is
    one holding anything kvsim did not write; the message names the foreign files.
    """
    target = check_output_dir(path, what=what)
    if not target.is_dir():
        return target
    if not any(target.iterdir()):
        return target
    marker = read_marker(target)
    if marker is None:
        shown = _foreign_line(target, sorted(target.iterdir()))
        raise OutputPathError(
            f"{what} {target}: exists and is not a kvsim folder (holds {shown}); choose another --output"
        )
    if kind in _FOLDER_OWNING_KINDS and marker["kind"] != kind:
        raise OutputPathError(f"{what} {target}: is a kvsim {marker['kind']} folder, not a {kind} folder")
    foreign = foreign_entries(target)
    if foreign:
        raise OutputPathError(
            f"{what} {target}: holds files kvsim did not write ({_foreign_line(target, foreign)}); "
            "move them or choose another --output"
        )
    return target


def ensure_folder(
    path: str | os.PathLike[str], kind: str, *, what: str = "output folder", dirs: Sequence[str] = ()
) -> Path:
    """Check `path` as a `kind` folder, create it (and its sub-folders `dirs`) and mark it kvsim's."""
    target = check_output_folder(path, kind, what=what)
    target.mkdir(parents=True, exist_ok=True)
    marker = read_marker(target)
    missing = {name: "dir" for name in dirs if marker is None or marker["files"].get(name) != "dir"}
    if marker is None or missing:
        _update_marker(target, kind, missing)
    for name in dirs:
        (target / name).mkdir(exist_ok=True)
    return target


def check_output_file(path: str | os.PathLike[str], kind: str, *, what: str = "output file") -> Path:
    """`path`, resolved, if kvsim may write a file there: the folder exists and is writable, and the
    file is new or one kvsim wrote there unchanged since (never a user's file).

    The folder must already exist: a typo in a folder name should not silently create a new tree.
    """
    check_utf8_path(path, what=what)
    target = _resolve(path)
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
    if target.name == MARKER_FILE:
        raise OutputPathError(f"{what} {target}: {MARKER_FILE} is kvsim's marker file; choose another name")
    _refuse_foreign_marker(parent, what=f"{what} {target}")
    if os.path.lexists(target) and not _owned_file(parent, target.name):
        raise OutputPathError(
            f"{what} {target}: exists and kvsim did not write it (or it was changed since); "
            "choose another name or move it"
        )
    return target


def check_files_in_folder(folder: Path, rels: Iterable[str], *, what: str = "output folder") -> None:
    """Refuse (one line naming them) if any of `rels` exists in `folder` and is not kvsim's unchanged.

    For commands that add files to a folder they do not replace as a whole (a report beside the
    runs it describes): new names are fine, a user's `report.html` is never overwritten.
    """
    rels = list(rels)
    check_no_links_inside(folder, rels, what=what)
    clashes = [rel for rel in rels if os.path.lexists(folder / rel) and not _owned_file(folder, rel)]
    if clashes:
        raise OutputPathError(
            f"{what} {folder}: {', '.join(clashes)} exist(s) and kvsim did not write them "
            "(or they were changed since); move them or choose another --output"
        )


def _owned_file(folder: Path, rel: str) -> bool:
    marker = read_marker(folder)
    path = folder / rel
    if marker is None or path.is_symlink() or not path.is_file():
        return False
    hashes = marker["files"].get(rel)
    return isinstance(hashes, list) and _sha256(path) in hashes


def _update_marker(folder: Path, kind: str, changes: Mapping[str, Any], removed: Iterable[str] = ()) -> None:
    marker = read_marker(folder)
    files = dict(marker["files"]) if marker is not None else {}
    folder_kind_now = marker["kind"] if marker is not None else kind
    for rel in removed:
        files.pop(rel, None)
    files.update(changes)
    _write_marker(folder, folder_kind_now, files)


def adopt_files(paths: Iterable[str | os.PathLike[str]], kind: str) -> None:
    """Record files just written by code that cannot use this module (gpu/, workloads/) as kvsim's.

    The caller checked each path with `check_output_file` before writing it.
    """
    for path in paths:
        target = _resolve(path)
        if target.is_file():
            os.chmod(target, FILE_MODE)  # every output is 0644 (a mkstemp file is 0600)
            _update_marker(target.parent, kind, {target.name: [_sha256(target)]})


def publish_files(
    folder: Path,
    kind: str,
    files: Sequence[tuple[str, bytes | str | Callable[[Path], None]]],
    remove: Iterable[str] = (),
) -> None:
    """Write `files` ((relative path, content) in order) into `folder` atomically, then delete `remove`.

    Every file is first staged in a hidden folder inside `folder` (same filesystem, so every move is
    a rename). The marker lists old and new hashes while the moves run, so a crash part-way leaves
    every file recognisable as kvsim's; afterwards only the new ones. `remove` names only files the
    marker lists unchanged; others are left alone. The caller checked the folder and each target,
    and turns an OSError (a full disk) into one line naming its output (`write_error`).
    """
    folder.mkdir(parents=True, exist_ok=True)
    check_no_links_inside(folder, [rel for rel, _ in files], what=f"{kind} folder")
    with staging_folder(folder, kind) as staging:
        _publish_staged(folder, kind, staging, files, remove)


def _publish_staged(
    folder: Path,
    kind: str,
    staging: Path,
    files: Sequence[tuple[str, bytes | str | Callable[[Path], None]]],
    remove: Iterable[str],
) -> None:
    """`publish_files`' work, from the staging folder it made."""
    marker = read_marker(folder)
    owned = dict(marker["files"]) if marker is not None else {}
    staged: list[tuple[str, Path, str]] = []
    for index, (rel, content) in enumerate(files):
        temp = staging / f"{index}-{Path(rel).name}"
        _fill(temp, content)
        os.chmod(temp, FILE_MODE)
        staged.append((rel, temp, _sha256(temp)))
    during: dict[str, Any] = {}
    for rel, _, digest in staged:
        old = owned.get(rel)
        during[rel] = sorted({digest, *(old if isinstance(old, list) else [])})
        parent = str(Path(rel).parent)
        if parent != ".":
            during[parent] = "dir"
    _update_marker(folder, kind, during)
    for rel, temp, _ in staged:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(temp, folder / rel)
    gone = [rel for rel in remove if _owned_file(folder, rel)]
    for rel in gone:
        (folder / rel).unlink()
    _update_marker(folder, kind, {rel: [digest] for rel, _, digest in staged}, removed=gone)


def replace_folder(
    path: str | os.PathLike[str], kind: str, fill: Callable[[Path], None], *, what: str = "output folder"
) -> Path:
    """Build a `kind` folder with `fill(temp folder)` and rename it into place over `path`.

    `path` must pass `check_output_folder` (checked again here: it may have changed since the CLI's
    up-front check). The new folder is built, and the previous one (all kvsim's) moved aside, inside
    one staging folder beside `path`, which is removed only after the new one is in place; a killed
    process leaves that staging folder, which the next write beside `path` clears. A write failure
    (a full disk) is one OutputPathError line naming `path`, with nothing left behind. Returns the
    resolved path.
    """
    target = check_output_folder(path, kind, what=what)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with staging_folder(target.parent, target.name) as staging:
            new = staging / "new"
            new.mkdir()
            fill(new)
            for entry in new.rglob("*"):
                if entry.is_file():
                    os.chmod(entry, FILE_MODE)
            mark_folder(new, kind)
            old = staging / "old"
            if target.exists():
                os.replace(target, old)
            try:
                os.replace(new, target)
            except BaseException:  # a failed rename, Ctrl-C or SIGTERM between the two renames
                if old.exists() and not target.exists():
                    os.replace(old, target)  # the previous results go back before staging is removed
                raise
    except OSError as exc:
        raise write_error(what, target, exc) from None
    return target
