"""Real-trace readers, one registry of formats, and format detection from the file's content.

Why detect from content rather than the file name: traces get renamed and re-exported; the header
line (CSV), the first object's keys (JSON lines) or the magic bytes (Parquet) say what a file is.
`fmt` overrides the detection.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from workloads.errors import WorkloadError
from workloads.readers import azure, generic, mooncake
from workloads.readers.common import TraceRead, check_on_bad_row, read_bytes
from workloads.readers.source import check_trace_file, read_head
from workloads.registry import Registry

# How read_trace reads: "auto" tries Arrow first (workloads/readers/arrow.py) and reads line by line
# only a file Arrow cannot take cleanly; "lines" always reads line by line (the reference path, for
# benchmarks/trace_read.py and the identity tests).
READERS = ("auto", "lines")


@dataclass(frozen=True)
class TraceFormat:
    """A readable format: `read(data, file, on_bad_row) -> TraceRead` reads line by line and names bad
    rows; `read_fast(path, head, file) -> TraceRead | None` is its Arrow twin, None unless clean."""

    name: str
    description: str
    read: Callable[[bytes, str, str], TraceRead]
    read_fast: Callable[[str, bytes, str], TraceRead | None] | None = None


FORMATS: Registry[TraceFormat] = Registry("format")
for _fmt in (
    TraceFormat(
        "azure",
        "Azure LLM inference trace 2023 CSV (TIMESTAMP, ContextTokens, GeneratedTokens)",
        azure.read,
        azure.read_fast,
    ),
    TraceFormat(
        "mooncake",
        "Mooncake JSON lines (timestamp ms, input_length, output_length, hash_ids)",
        mooncake.read,
        mooncake.read_fast,
    ),
    TraceFormat(
        "csv",
        "generic CSV (arrival_s, prompt_tokens, output_tokens[, max_tokens, ...])",
        generic.read_csv,
        generic.read_csv_fast,
    ),
    TraceFormat(
        "parquet",
        "generic Parquet with the generic CSV's columns",
        generic.read_parquet,
        generic.read_parquet_fast,
    ),
    TraceFormat(
        "jsonl", "generic JSON lines with the generic CSV's keys", generic.read_jsonl, generic.read_jsonl_fast
    ),
    TraceFormat(
        "sharegpt-lengths",
        "length pairs (num_prefill_tokens, num_decode_tokens), no times",
        generic.read_lengths,
        generic.read_lengths_fast,
    ),
):
    FORMATS.add(_fmt.name, _fmt)

UNKNOWN_HELP = (
    "unknown format: expected an Azure CSV (TIMESTAMP, ContextTokens, GeneratedTokens), Mooncake JSON lines "
    "(input_length, hash_ids), a generic CSV/Parquet/JSON lines (prompt_tokens, output_tokens"
    "[, arrival_s]) or a lengths CSV (num_prefill_tokens, num_decode_tokens); choose one with --format"
)


# Column names that only one format uses. A header with some of them but not all is that format with a
# column missing: reading it then names the missing column, which helps more than "unknown format".
CSV_COLUMNS: dict[str, frozenset[str]] = {
    "azure": frozenset(azure.COLUMNS.values()),
    "csv": frozenset((*generic.REQUIRED, *generic.OPTIONAL)),
    "sharegpt-lengths": frozenset(generic.LENGTH_COLUMNS.values()),
}
JSON_COLUMNS: dict[str, frozenset[str]] = {
    "mooncake": frozenset(mooncake.COLUMNS.values()),
    "jsonl": frozenset((*generic.REQUIRED, *generic.OPTIONAL)),
}


def _closest_format(header: list[str], candidates: dict[str, frozenset[str]]) -> str | None:
    """The format sharing the most column names with `header` (first listed wins a tie), or None."""
    overlap = {name: len(columns.intersection(header)) for name, columns in candidates.items()}
    best = max(overlap, key=lambda name: overlap[name])
    return best if overlap[best] > 0 else None


def detect_format(data: bytes, file: str) -> str:
    """The format name for a file's content, or a WorkloadError saying what was expected."""
    if data[:4] == b"PAR1":
        return "parquet"
    text = data[:65536].decode("utf-8-sig", errors="replace")
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.lstrip().startswith("{"):
        try:
            record = json.loads(first)
        except ValueError:
            raise WorkloadError("not valid JSON", file=file, row=1 + text.splitlines().index(first)) from None
        except RecursionError:
            raise WorkloadError(
                "not a request record (JSON nested too deeply)",
                file=file,
                row=1 + text.splitlines().index(first),
            ) from None
        if not isinstance(record, dict):  # e.g. "{" was the start of a longer line cut at 64 KiB
            raise WorkloadError("not a JSON object", file=file, row=1 + text.splitlines().index(first))
        if mooncake.sniff(record):
            return "mooncake"
        if generic.sniff_generic(record):
            return "jsonl"
        partial = _closest_format(list(record), JSON_COLUMNS)
        if partial is not None:
            return partial
        raise WorkloadError(f"{UNKNOWN_HELP} (first object's keys: {', '.join(record)})", file=file)
    header = [h.strip() for h in first.split(",")]
    if azure.sniff(header):
        return "azure"
    if generic.sniff_generic(header):
        return "csv"
    if generic.sniff_lengths(header):
        return "sharegpt-lengths"
    partial = _closest_format(header, CSV_COLUMNS)
    if partial is not None:
        return partial
    shown = first if len(first) <= 60 else first[:57] + "..."
    raise WorkloadError(f"{UNKNOWN_HELP} (first line: {shown!r})", file=file)


def read_trace(
    path: str | os.PathLike[str], *, fmt: str | None = None, on_bad_row: str = "error", reader: str = "auto"
) -> TraceRead:
    """Read a trace into canonical columns; bad rows raise (or are skipped and counted).

    The file must be a regular file of bounded size (`workloads.readers.source`); detection reads
    its first 64 KiB. `reader` (READERS): "auto" takes Arrow's table for a clean file and reads any
    other file line by line, so tables and one-line errors are those of "lines", only faster.
    """
    on_bad_row = check_on_bad_row(on_bad_row)
    if reader not in READERS:
        raise WorkloadError(f"must be one of {', '.join(READERS)} (got {reader!r})", field="reader")
    file = str(path)
    check_trace_file(path)
    head = read_head(path)
    data = read_bytes(path) if not head.strip() else None  # blank start: "empty file", or read it all
    name = fmt if fmt is not None else detect_format(head if data is None else data, file)
    trace_format = FORMATS.get(name)
    trace = None
    if reader == "auto" and data is None and trace_format.read_fast is not None:
        trace = trace_format.read_fast(file, head, file)
    if trace is None:
        trace = trace_format.read(read_bytes(path) if data is None else data, file, on_bad_row)
    trace.attrs["format"] = name
    return trace


__all__ = ["FORMATS", "READERS", "TraceFormat", "TraceRead", "detect_format", "read_trace"]
