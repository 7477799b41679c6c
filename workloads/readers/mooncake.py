"""Mooncake trace (FAST 2025): JSON lines with timestamp (ms), input_length, output_length, hash_ids.

`hash_ids` name the 512-token blocks of the prompt (equal id = identical KV), so they become
`block_hashes` with df.attrs["block_hash_tokens"] = 512 and shared prefixes become visible.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError
from workloads.readers import arrow
from workloads.readers.common import TraceRead, decode, finish, jsonl_records, object_column, to_numbers
from workloads.readers.hashes import parse_block_hashes, too_few_check
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
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if not any(key in r for r in records[:1000]):
            raise WorkloadError(f"missing column (have: {', '.join(records[0])})", file=file, field=key)
    checks: list[RowCheck] = []
    columns: dict[str, np.ndarray] = {}
    raw_ms = object_column([r.get("timestamp") for r in records])
    time_ms, time_check = to_numbers(raw_ms, "timestamp")
    columns["arrival_s"] = time_ms / 1000.0
    columns["prompt_tokens"], prompt_check = to_numbers(
        object_column([r.get("input_length") for r in records]), "input_length"
    )
    columns["output_tokens"], output_check = to_numbers(
        object_column([r.get("output_length") for r in records]), "output_length"
    )
    checks += [time_check, prompt_check, output_check]
    # A missing `hash_ids` is a missing field, not "no blocks": an empty list would hide the row's
    # prefix identity and later break the hit-ratio arithmetic.
    missing = np.fromiter(("hash_ids" not in r for r in records), dtype=bool, count=len(records))
    raw_hashes = object_column([r.get("hash_ids") for r in records])
    hashes, usable, hash_checks = parse_block_hashes(raw_hashes, "hash_ids", missing)
    checks += hash_checks
    # Too many ids is a request-table rule (workloads.schema); too few is checked here, because a short
    # list would silently understate the prefix sharing of a trace.
    prompt = columns["prompt_tokens"]
    checks.append(too_few_check(hashes, usable, prompt, BLOCK_HASH_TOKENS, "hash_ids", "input_length"))
    columns["block_hashes"] = hashes
    table = pd.DataFrame(columns)
    attrs = {"format": "mooncake", "block_hash_tokens": BLOCK_HASH_TOKENS}
    return finish(table, checks, line_numbers, file, COLUMNS, on_bad_row, attrs, skipped)


def read_fast(path: str, head: bytes, file: str) -> TraceRead | None:
    """The Arrow reader (`workloads.readers.arrow`): the same table for a clean file, else None.

    Clean here also means every `hash_ids` covers its prompt (ceil(input_length / 512) ids or more).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    number = pa.float64()
    types = {
        "timestamp": number,
        "input_length": number,
        "output_length": number,
        "hash_ids": pa.list_(pa.int64()),
    }
    read = arrow.read_json_columns(path, types)
    if read is None:
        return None
    columns, lists = read
    hashes = lists["hash_ids"]
    counts = pc.list_value_length(hashes).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        if (counts < np.ceil(columns["input_length"] / BLOCK_HASH_TOKENS)).any():
            return None
    table = pd.DataFrame(
        {
            "arrival_s": columns["timestamp"] / 1000.0,
            "prompt_tokens": columns["input_length"],
            "output_tokens": columns["output_length"],
            "block_hashes": arrow.shared_int_lists(hashes),
        },
        copy=False,
    )
    attrs = {"format": "mooncake", "block_hash_tokens": BLOCK_HASH_TOKENS}
    return arrow.accept(table, file, COLUMNS, attrs, first_line=1)
