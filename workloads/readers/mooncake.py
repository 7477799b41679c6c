"""Mooncake trace (FAST 2025): JSON lines with timestamp (ms), input_length, output_length, hash_ids.

`hash_ids` name the 512-token blocks of the prompt (equal id = identical KV), so they become
`block_hashes` with df.attrs["block_hash_tokens"] = 512 and shared prefixes become visible.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError
from workloads.readers.common import TraceRead, decode, finish, jsonl_records, to_numbers
from workloads.schema import RowCheck

COLUMNS = {
    "arrival_s": "timestamp",
    "prompt_tokens": "input_length",
    "output_tokens": "output_length",
    "block_hashes": "hash_ids",
}
BLOCK_HASH_TOKENS = 512


def sniff(first_record: dict) -> bool:
    return "input_length" in first_record and "hash_ids" in first_record


def read(data: bytes, file: str, on_bad_row: str) -> TraceRead:
    records, line_numbers, skipped = jsonl_records(decode(data, file), file, on_bad_row)
    for key in ("timestamp", "input_length", "output_length"):
        if not any(key in r for r in records[:1000]):
            raise WorkloadError(f"missing column (have: {', '.join(records[0])})", file=file, field=key)
    checks: list[RowCheck] = []
    columns: dict[str, np.ndarray] = {}
    raw_ms = np.array([r.get("timestamp") for r in records], dtype=object)
    time_ms, time_check = to_numbers(raw_ms, "timestamp")
    columns["arrival_s"] = time_ms / 1000.0
    columns["prompt_tokens"], prompt_check = to_numbers(
        np.array([r.get("input_length") for r in records], dtype=object), "input_length"
    )
    columns["output_tokens"], output_check = to_numbers(
        np.array([r.get("output_length") for r in records], dtype=object), "output_length"
    )
    checks += [time_check, prompt_check, output_check]
    hashes = np.empty(len(records), dtype=object)
    hashes[:] = [r.get("hash_ids", []) for r in records]
    not_ints = np.fromiter(
        (not isinstance(h, list) or not all(type(x) is int for x in h) for h in hashes),
        dtype=bool,
        count=len(records),
    )
    shown = {int(i): repr(hashes[i])[:40] for i in np.flatnonzero(not_ints)}
    checks.append(RowCheck("hash_ids", not_ints, lambda i: f"not a list of integer block ids ({shown[i]})"))
    for i in np.flatnonzero(not_ints):  # (element-wise: a list of lists would broadcast as 2-D)
        hashes[i] = []
    columns["block_hashes"] = hashes
    table = pd.DataFrame(columns)
    attrs = {"format": "mooncake", "block_hash_tokens": BLOCK_HASH_TOKENS}
    return finish(table, checks, line_numbers, file, COLUMNS, on_bad_row, attrs, skipped)
