"""Generic request tables in our own column names: CSV, Parquet or JSON lines; and length-only CSVs.

Generic: `prompt_tokens`, `output_tokens`, usually `arrival_s` (seconds), optionally `max_tokens`,
`prefix_group`, `prefix_tokens`, `session_id`, `turn`, `n`. A file's own `request_id` is not kept:
request ids are always 0..N-1 in arrival order. Without `arrival_s`, load() draws arrivals.

Length-only ("sharegpt-lengths"): the ShareGPT statistics CSV of sarathi-serve, `num_prefill_tokens`,
`num_decode_tokens` -- (prompt, output) pairs without times, e.g. for `empirical(file)`.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError
from workloads.readers import arrow
from workloads.readers.common import (
    TraceRead,
    csv_rows,
    decode,
    finish,
    jsonl_records,
    object_column,
    to_numbers,
)
from workloads.readers.hashes import parse_block_hashes, too_few_check
from workloads.schema import RowCheck

REQUIRED = ("prompt_tokens", "output_tokens")
OPTIONAL = ("arrival_s", "max_tokens", "prefix_group", "prefix_tokens", "session_id", "turn", "n", "think_s")
# Layered prefixes (issue 21 §4): a per-request list of block content ids, and the block size they use.
HASH_COLUMNS = ("block_hashes", "block_hash_tokens")
LENGTH_COLUMNS = {"prompt_tokens": "num_prefill_tokens", "output_tokens": "num_decode_tokens"}


def sniff_generic(header: list[str] | set[str]) -> bool:
    return set(REQUIRED) <= set(header)


def sniff_lengths(header: list[str] | set[str]) -> bool:
    return set(LENGTH_COLUMNS.values()) <= set(header)


def _require(have: list[str], need: tuple[str, ...] | list[str], file: str) -> None:
    for column in need:
        if column not in have:
            raise WorkloadError(
                f"missing column (have: {', '.join(map(str, have))})", file=file, field=column
            )


def _numeric(raw: np.ndarray | pd.Series, field: str) -> tuple[np.ndarray, RowCheck]:
    """Numbers from a column: fast for numeric dtypes, text-aware (`not a number`) otherwise."""
    if (
        isinstance(raw, pd.Series)
        and pd.api.types.is_numeric_dtype(raw)
        and not pd.api.types.is_bool_dtype(raw)
    ):
        values = raw.to_numpy(dtype=np.float64, na_value=np.nan)
        return values, RowCheck(field, np.isnan(values), lambda i: "missing value")
    values = raw.to_numpy(dtype=object) if isinstance(raw, pd.Series) else raw
    return to_numbers(object_column(list(values)), field)


def _build(
    columns: dict[str, np.ndarray | pd.Series],
    line_numbers: np.ndarray,
    file: str,
    on_bad_row: str,
    fmt: str,
    extra: list[RowCheck],
    names: dict[str, str] | None = None,
    skipped: int = 0,
) -> TraceRead:
    table: dict[str, np.ndarray] = {}
    checks = list(extra)
    names = names or {}
    for ours in (*OPTIONAL[:1], *REQUIRED, *OPTIONAL[1:]):
        theirs = names.get(ours, ours)
        if theirs in columns:
            table[ours], check = _numeric(columns[theirs], theirs)
            checks.append(check)
    attrs: dict[str, object] = {"format": fmt}
    if "block_hashes" in columns:
        table["block_hashes"], block_tokens, hash_checks = _block_hashes(
            columns, table, file, text=fmt == "csv"
        )
        checks += hash_checks
        if block_tokens is not None:
            attrs["block_hash_tokens"] = block_tokens
    return finish(pd.DataFrame(table), checks, line_numbers, file, names, on_bad_row, attrs, skipped)


def _block_hashes(
    columns: dict[str, np.ndarray | pd.Series], table: dict[str, np.ndarray], file: str, *, text: bool
) -> tuple[np.ndarray, int | None, list[RowCheck]]:
    """Layered prefixes: `block_hashes` (ids of the prompt's blocks) at `block_hash_tokens` per block.

    The block size is stated on every row (a CSV has no other place for it) and must be one positive
    integer for the whole file; the first good row's value is the file's. Returns the id lists, that
    block size (None when no row states a good one: every row is then reported) and the checks.
    """
    if "block_hash_tokens" not in columns:
        raise WorkloadError(
            "missing column (block_hashes needs it: the tokens each block id covers)",
            file=file,
            field="block_hash_tokens",
        )
    sizes, size_check = _numeric(columns["block_hash_tokens"], "block_hash_tokens")
    good = np.isfinite(sizes) & (sizes >= 1) & (sizes == np.floor(sizes)) & (sizes <= 2**31)
    first = np.flatnonzero(good)
    block_tokens = int(sizes[first[0]]) if first.size else None
    not_size = ~size_check.bad & ~good
    differs = good & (sizes != block_tokens)
    field = "block_hash_tokens"
    checks = [
        size_check,
        RowCheck(field, not_size, lambda i: f"must be a whole number of tokens >= 1 (got {sizes[i]:g})"),
        RowCheck(field, differs, lambda i: f"differs from the first row's {block_tokens} (got {sizes[i]:g})"),
    ]
    raw = columns["block_hashes"]
    raw = raw.to_numpy(dtype=object) if isinstance(raw, pd.Series) else raw
    missing = np.fromiter(
        (
            v is None or (isinstance(v, float) and v != v) or (isinstance(v, str) and not v.strip())
            for v in raw
        ),
        dtype=bool,
        count=len(raw),
    )
    hashes, usable, hash_checks = parse_block_hashes(raw, "block_hashes", missing, text=text)
    checks += hash_checks
    if block_tokens is not None and "prompt_tokens" in table:
        prompt = table["prompt_tokens"]
        checks.append(too_few_check(hashes, usable, prompt, block_tokens, "block_hashes", "prompt_tokens"))
    return hashes, block_tokens, checks


def _kept(have: list[str] | set[str], names: dict[str, str]) -> list[str]:
    """Our columns that the file has, in the table's order (the line-level `_build` order)."""
    return [ours for ours in (*OPTIONAL[:1], *REQUIRED, *OPTIONAL[1:]) if names.get(ours, ours) in have]


def _fast_csv(path: str, head: bytes, file: str, fmt: str, names: dict[str, str]) -> TraceRead | None:
    import pyarrow as pa

    header = arrow.csv_header(head)
    needed = [names.get(ours, ours) for ours in REQUIRED]
    if header is None or not set(needed) <= set(header) or "block_hashes" in header:
        return None  # (id lists are parsed by the line-level reader)
    kept = _kept(header, names)
    columns = arrow.read_csv_columns(path, {names.get(ours, ours): pa.float64() for ours in kept})
    if columns is None:
        return None
    table = pd.DataFrame({ours: columns[names.get(ours, ours)] for ours in kept}, copy=False)
    return arrow.accept(table, file, names, {"format": fmt}, first_line=2)


def read_csv_fast(path: str, head: bytes, file: str) -> TraceRead | None:
    """The Arrow reader of a generic CSV (`workloads.readers.arrow`): the same table if clean, else None."""
    return _fast_csv(path, head, file, "csv", {})


def read_lengths_fast(path: str, head: bytes, file: str) -> TraceRead | None:
    """The Arrow reader of a lengths CSV: the same table if clean, else None."""
    return _fast_csv(path, head, file, "sharegpt-lengths", LENGTH_COLUMNS)


def read_jsonl_fast(path: str, head: bytes, file: str) -> TraceRead | None:
    """The Arrow reader of generic JSON lines: the first object's keys, as the line-level reader takes."""
    import json

    import pyarrow as pa

    first = next((line for line in head.decode("utf-8", errors="replace").splitlines() if line.strip()), "")
    try:
        record = json.loads(first)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not sniff_generic(record) or "block_hashes" in record:
        return None
    kept = _kept(list(record), {})
    read = arrow.read_json_columns(path, {key: pa.float64() for key in kept})
    if read is None:
        return None
    return arrow.accept(pd.DataFrame(read[0], copy=False), file, {}, {"format": "jsonl"}, first_line=1)


def read_parquet_fast(path: str, head: bytes, file: str) -> TraceRead | None:
    """Parquet read with only our columns (the line-level reader loads every column of the file)."""
    import pyarrow.parquet as pq

    try:
        have = pq.read_schema(path).names
        kept = _kept(have, {})
        if not set(REQUIRED) <= set(have) or len(set(have)) != len(have) or "block_hashes" in have:
            return None
        frame = pq.read_table(path, columns=kept).to_pandas()
    except Exception:  # a damaged file: the line-level reader names it
        return None
    if len(frame) == 0 or not all(pd.api.types.is_numeric_dtype(frame[c]) for c in kept):
        return None
    if any(pd.api.types.is_bool_dtype(frame[c]) for c in kept):
        return None
    table = pd.DataFrame({c: frame[c].to_numpy(dtype=np.float64, na_value=np.nan) for c in kept}, copy=False)
    return arrow.accept(table, file, {}, {"format": "parquet"}, first_line=1)


def read_csv(data: bytes, file: str, on_bad_row: str) -> TraceRead:
    rows = csv_rows(decode(data, file), file)
    _require(rows.header, REQUIRED, file)
    return _build(rows.columns, rows.line_numbers, file, on_bad_row, "csv", rows.problems)


def read_lengths(data: bytes, file: str, on_bad_row: str) -> TraceRead:
    rows = csv_rows(decode(data, file), file)
    _require(rows.header, list(LENGTH_COLUMNS.values()), file)
    return _build(
        rows.columns, rows.line_numbers, file, on_bad_row, "sharegpt-lengths", rows.problems, LENGTH_COLUMNS
    )


def read_jsonl(data: bytes, file: str, on_bad_row: str) -> TraceRead:
    records, line_numbers, skipped = jsonl_records(decode(data, file), file, on_bad_row)
    keys = list(records[0])
    _require(keys, REQUIRED, file)
    columns = {
        key: object_column([r.get(key) for r in records])
        for key in (*REQUIRED, *OPTIONAL, *HASH_COLUMNS)
        if key in keys
    }
    return _build(columns, line_numbers, file, on_bad_row, "jsonl", [], skipped=skipped)


def read_parquet(data: bytes, file: str, on_bad_row: str) -> TraceRead:
    try:
        frame = pd.read_parquet(io.BytesIO(data))
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise WorkloadError(f"not a readable Parquet file ({type(exc).__name__})", file=file) from None
    if len(frame) == 0:
        raise WorkloadError("no requests (zero rows)", file=file)
    _require(list(frame.columns), REQUIRED, file)
    columns = {key: frame[key] for key in (*REQUIRED, *OPTIONAL, *HASH_COLUMNS) if key in frame.columns}
    # Parquet has no lines: "row" is the 1-based data row.
    return _build(columns, np.arange(1, len(frame) + 1), file, on_bad_row, "parquet", [])
