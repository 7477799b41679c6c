"""Azure LLM inference trace 2023 (Splitwise): CSV with TIMESTAMP, ContextTokens, GeneratedTokens.

Timestamps are absolute wall-clock times (100 ns resolution); they become seconds from the first
request. The trace has no client limit, so max_tokens comes from the load()'s policy.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError
from workloads.readers import arrow
from workloads.readers.common import TraceRead, csv_rows, decode, finish, to_numbers
from workloads.schema import RowCheck

COLUMNS = {"arrival_s": "TIMESTAMP", "prompt_tokens": "ContextTokens", "output_tokens": "GeneratedTokens"}


def sniff(header: list[str]) -> bool:
    return set(COLUMNS.values()) <= set(header)


def read(data: bytes, file: str, on_bad_row: str) -> TraceRead:
    rows = csv_rows(decode(data, file), file)
    for column in COLUMNS.values():
        if column not in rows.columns:
            raise WorkloadError(f"missing column (have: {', '.join(rows.header)})", file=file, field=column)
    raw_time = rows.columns["TIMESTAMP"]
    arrival_s, time_check = seconds_from_first(raw_time)
    prompt, prompt_check = to_numbers(rows.columns["ContextTokens"], "ContextTokens")
    output, output_check = to_numbers(rows.columns["GeneratedTokens"], "GeneratedTokens")
    table = pd.DataFrame({"arrival_s": arrival_s, "prompt_tokens": prompt, "output_tokens": output})
    checks = [*rows.problems, time_check, prompt_check, output_check]
    return finish(table, checks, rows.line_numbers, file, COLUMNS, on_bad_row, {"format": "azure"})


def read_fast(path: str, head: bytes, file: str) -> TraceRead | None:
    """The Arrow reader (`workloads.readers.arrow`): the same table for a clean file, else None.

    Zone-less stamps only (Arrow refuses a zone in a `timestamp[ns]` column, so a zoned file takes the
    line-level path, which reads zones as UTC instants).
    """
    import pyarrow as pa

    header = arrow.csv_header(head)
    if header is None or not sniff(header):
        return None
    types = {"TIMESTAMP": pa.timestamp("ns"), "ContextTokens": pa.float64(), "GeneratedTokens": pa.float64()}
    columns = arrow.read_csv_columns(path, types)
    if columns is None:
        return None
    stamp_ns = columns["TIMESTAMP"].astype("datetime64[ns]").view(np.int64)
    table = pd.DataFrame(
        {
            "arrival_s": _seconds_since(stamp_ns, np.zeros(len(stamp_ns), dtype=bool)),
            "prompt_tokens": columns["ContextTokens"],
            "output_tokens": columns["GeneratedTokens"],
        },
        copy=False,
    )
    return arrow.accept(table, file, COLUMNS, {"format": "azure"}, first_line=2)


# An ISO 8601 time of day followed by a zone: "Z", "+01:00", "-0500" (a bare date has no zone).
_ZONE = re.compile(r"[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d*)?)?\s*(?:Z|[+-]\d{2}(?::?\d{2})?)$", re.IGNORECASE)


def seconds_from_first(raw_time: np.ndarray) -> tuple[np.ndarray, RowCheck]:
    """TIMESTAMP text to seconds since the first valid one (NaN where bad), and the check naming bad rows.

    The Azure 2023 files write "2023-11-16 18:15:46.6805900" (no zone). Zoned stamps are read as UTC
    instants (mixed offsets such as DST changes are fine); a file that mixes zoned and zone-less stamps
    is refused at the first row that differs from the first stamp, since a zone-less time's instant is
    unknown. Differences are taken in whole seconds plus nanoseconds, so two stamps centuries apart do
    not overflow int64 nanoseconds (the span rule of workloads.schema then refuses them).
    """
    # object dtype, not `astype(str)`: pandas 3 would build Arrow strings, whose memory pool keeps
    # ~10 MB resident after the read (issue 16's RSS bound); the parsed values are the same
    text = pd.Series([str(value) for value in raw_time], dtype=object)
    zoned = text.str.contains(_ZONE).to_numpy(dtype=bool)
    present = text.str.strip().ne("").to_numpy(dtype=bool)
    first = np.flatnonzero(present)
    first_zoned = bool(zoned[first[0]]) if first.size else False
    mixed = present & (zoned != first_zoned)
    stamps = pd.to_datetime(text.where(~mixed, ""), errors="coerce", format="ISO8601", utc=first_zoned)
    bad_time = stamps.isna().to_numpy() | mixed
    stamp_ns = stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    arrival_s = _seconds_since(stamp_ns, bad_time)

    def reason(i: int) -> str:
        if not present[i]:
            return "missing value"
        if mixed[i]:
            has = "has a time zone" if zoned[i] else "has no time zone"
            return f"{raw_time[i]!r} {has}, unlike the first timestamp ({raw_time[first[0]]!r})"
        return f"not a timestamp ({raw_time[i]!r})"

    return arrival_s, RowCheck("TIMESTAMP", bad_time, reason)


def _seconds_since(stamp_ns: np.ndarray, bad_time: np.ndarray) -> np.ndarray:
    """Seconds from the first good stamp: whole seconds plus nanoseconds (no int64 overflow); NaN if bad."""
    whole_s, part_ns = np.divmod(stamp_ns, 1_000_000_000)
    valid = np.flatnonzero(~bad_time)
    origin = valid[0] if valid.size else 0
    arrival_s = (whole_s - whole_s[origin]).astype(np.float64) + (part_ns - part_ns[origin]) / 1e9
    arrival_s[bad_time] = np.nan
    return arrival_s
