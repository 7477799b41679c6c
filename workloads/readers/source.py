"""Opening a trace file safely: a regular file of bounded size, and its first bytes for detection.

Why before any read: `kvsim workload describe /dev/zero` read until MemoryError and a FIFO blocked
forever (issue 23 item 4). A trace is a regular file; its size is known before reading, so a file
beyond `MAX_TRACE_BYTES` is refused with one line instead of exhausting memory.
"""

from __future__ import annotations

import os
import stat

from workloads.errors import WorkloadError

# The largest trace kvsim reads: 16 GiB is ~800M CSV rows, two orders of magnitude above the largest
# public LLM trace (Azure 2024 code+conversation, ~44M rows, ~2 GB); a bigger file is a mistake or
# needs splitting, and reading it would take the machine's memory first.
MAX_TRACE_BYTES = 16 * 1024**3
HEAD_BYTES = 65536  # what format detection reads: the header line or the first JSON object


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    """What a file that is not regular is, in the words of the one-line refusal."""
    return next((name for is_kind, name in _KINDS if is_kind(mode)), "not a regular file")


def check_trace_file(path: str | os.PathLike[str]) -> int:
    """The file's size in bytes, after checking it is a readable regular file of bounded size."""
    name = str(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise WorkloadError("file not found", file=name) from None
    except OSError as exc:
        raise WorkloadError(f"cannot read ({exc.strerror})", file=name) from None
    if stat.S_ISDIR(info.st_mode):
        raise WorkloadError("is a folder, not a trace file", file=name)
    if not stat.S_ISREG(info.st_mode):
        raise WorkloadError(f"{_kind(info.st_mode)}, not a regular file: give a trace file", file=name)
    if info.st_size > MAX_TRACE_BYTES:
        raise WorkloadError(
            f"{info.st_size / 1024**3:.1f} GiB: larger than the {MAX_TRACE_BYTES // 1024**3} GiB kvsim "
            "reads (workloads.readers.source.MAX_TRACE_BYTES); split the trace",
            file=name,
        )
    return int(info.st_size)


def read_head(path: str | os.PathLike[str], size: int = HEAD_BYTES) -> bytes:
    """The first `size` bytes of a checked file (format detection reads no more)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError as exc:
        raise WorkloadError(f"cannot read ({exc.strerror})", file=str(path)) from None


def is_utf8(path: str | os.PathLike[str], chunk_bytes: int = 1 << 22) -> bool:
    """Whether the whole file is UTF-8, read in chunks (memory stays one chunk, whatever the size).

    Why: the Arrow readers parse only the kept columns, but the line-level reader refuses a file with
    bad bytes anywhere ("not UTF-8 text" at its line); the fast path must not accept what it refuses.
    """
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(chunk_bytes):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True
