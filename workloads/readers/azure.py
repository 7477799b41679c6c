"""Azure LLM inference trace 2023 (Splitwise): CSV with TIMESTAMP, ContextTokens, GeneratedTokens.

Timestamps are absolute wall-clock times (100 ns resolution); they become seconds from the first
request. The trace has no client limit, so max_tokens comes from the load()'s policy.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError
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
    stamps = pd.to_datetime(pd.Series(raw_time, dtype=object), errors="coerce", format="ISO8601")
    stamp_ns = stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    bad_time = stamps.isna().to_numpy()
    valid = np.flatnonzero(~bad_time)
    origin_ns = stamp_ns[valid[0]] if valid.size else 0
    arrival_s = (stamp_ns - origin_ns) / 1e9
    arrival_s[bad_time] = np.nan
    time_check = RowCheck(
        "TIMESTAMP",
        bad_time,
        lambda i: "missing value" if raw_time[i] == "" else f"not a timestamp ({raw_time[i]!r})",
    )
    prompt, prompt_check = to_numbers(rows.columns["ContextTokens"], "ContextTokens")
    output, output_check = to_numbers(rows.columns["GeneratedTokens"], "GeneratedTokens")
    table = pd.DataFrame({"arrival_s": arrival_s, "prompt_tokens": prompt, "output_tokens": output})
    checks = [*rows.problems, time_check, prompt_check, output_check]
    return finish(table, checks, rows.line_numbers, file, COLUMNS, on_bad_row, {"format": "azure"})
