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
from workloads.schema import RowCheck

COLUMNS = {
    "arrival_s": "timestamp",
    "prompt_tokens": "input_length",
    "output_tokens": "output_length",
    "block_hashes": "hash_ids",
}
BLOCK_HASH_TOKENS = 512
# Block ids become an int64 array (workloads.sharing); an id outside it would fail there, not here.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


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
    hashes = object_column([r.get("hash_ids") for r in records])
    not_ints = ~missing & np.fromiter(
        (not isinstance(h, list) or not all(type(x) is int for x in h) for h in hashes),
        dtype=bool,
        count=len(records),
    )
    out_of_range = ~missing & ~not_ints  # lists of ints here: min and max run at C speed
    out_of_range[out_of_range] = [
        bool(h) and (min(h) < INT64_MIN or max(h) > INT64_MAX) for h in hashes[out_of_range]
    ]
    shown = {int(i): repr(hashes[i])[:40] for i in np.flatnonzero(not_ints | out_of_range)}
    checks.append(RowCheck("hash_ids", missing, lambda i: "missing value"))
    checks.append(RowCheck("hash_ids", not_ints, lambda i: f"not a list of integer block ids ({shown[i]})"))
    checks.append(RowCheck("hash_ids", out_of_range, lambda i: f"block ids must fit in 64 bits ({shown[i]})"))
    unusable = missing | not_ints | out_of_range
    for i in np.flatnonzero(unusable):  # (element-wise: a list of lists would broadcast as 2-D)
        hashes[i] = []
    # Every prompt token lies in exactly one block, so len(hash_ids) == ceil(input_length / 512). Too many
    # ids is a request-table rule (workloads.schema); too few is checked here, because a short list
    # would silently understate the prefix sharing of a trace.
    counts = np.fromiter((len(h) for h in hashes), dtype=np.float64, count=len(records))
    prompt = columns["prompt_tokens"]
    with np.errstate(invalid="ignore"):
        expected = np.ceil(prompt / BLOCK_HASH_TOKENS)
        too_few = ~missing & ~not_ints & np.isfinite(expected) & (counts < expected)
    checks.append(
        RowCheck(
            "hash_ids",
            too_few,
            lambda i: (
                f"{int(counts[i])} block ids cover less than input_length ({prompt[i]:g}) at "
                f"{BLOCK_HASH_TOKENS} tokens per block (needs {int(expected[i])})"
            ),
        )
    )
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
