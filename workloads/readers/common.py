"""What every trace reader shares: reading bytes, splitting CSV/JSONL lines with their line numbers,
turning text into numbers, and the bad-row policy (fail on the first, or skip and count).

Why line-level parsing of our own instead of pandas.read_csv: a bad row must be reported with its
1-based line number in the file, and pandas loses that mapping (blank lines, skipped lines, parser
errors with a different count). The C `csv` and `json` modules keep it cheap (20k rows in ~30 ms).
"""

from __future__ import annotations

import csv
import json
import math
import os
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError
from workloads.schema import RowCheck, bad_row_mask, beyond_span, first_problem, row_checks

ON_BAD_ROW = ("error", "skip")
NAN_WORDS = frozenset({"nan", "na", "n/a", "null", "none"})


@dataclass
class TraceRead:
    """A parsed trace: canonical columns (`arrival_s` may be absent for length-only files)."""

    table: pd.DataFrame
    line_numbers: np.ndarray
    file: str
    attrs: dict[str, Any] = field(default_factory=dict)


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file's content, or a one-line WorkloadError (missing, a folder, unreadable, empty)."""
    name = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise WorkloadError("file not found", file=name) from None
    except IsADirectoryError:
        raise WorkloadError("is a folder, not a trace file", file=name) from None
    except OSError as exc:
        raise WorkloadError(f"cannot read ({exc.strerror})", file=name) from None
    if not data.strip():
        raise WorkloadError("empty file", file=name)
    return data


def decode(data: bytes, file: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise WorkloadError("not UTF-8 text", file=file, row=line) from None


def check_on_bad_row(on_bad_row: str) -> str:
    if on_bad_row not in ON_BAD_ROW:
        raise WorkloadError(
            f"must be one of {', '.join(ON_BAD_ROW)} (got {on_bad_row!r})", field="on_bad_row"
        )
    return on_bad_row


@dataclass
class CsvRows:
    """Header, data fields by column, and the 1-based line of each data row; structural problems."""

    header: list[str]
    columns: dict[str, np.ndarray]  # raw strings (object arrays); "" where a field is missing
    line_numbers: np.ndarray
    problems: list[RowCheck]


def csv_rows(text: str, file: str) -> CsvRows:
    """Split CSV text into rows, keeping line numbers; wrong field counts become row problems.

    Fully blank lines carry no request and are not rows. A short last line is reported as truncated.
    The csv reader is streamed into one list per column: no list of all rows' field lists is built,
    so the transient Python objects of a read stay few (issue 16's RSS bound).
    """
    nonblank = array("q")  # 1-based number of each non-blank line handed to the csv reader

    def lines() -> Iterator[str]:
        for i, line in enumerate(text.splitlines()):
            if line.strip():
                nonblank.append(i + 1)
                yield line

    reader = csv.reader(lines())
    parsed_header = next(reader, None)
    if parsed_header is None:
        raise WorkloadError("empty file", file=file)
    header = [h.strip() for h in parsed_header]
    width = len(header)
    fields: list[list[str]] = [[] for _ in range(width)]
    sizes = array("q")
    for row in reader:
        size = len(row)
        sizes.append(size)
        if size == width:
            for values, value in zip(fields, row, strict=True):
                values.append(value.strip())
        else:
            for j, values in enumerate(fields):
                values.append(row[j].strip() if j < size else "")
    duplicated = next((name for j, name in enumerate(header) if name in header[:j]), None)
    if duplicated is not None:
        # Which of the two columns would be the data? Refuse rather than silently take one of them.
        raise WorkloadError(
            "column name appears twice in the header", file=file, row=nonblank[0], field=duplicated
        )
    num_rows = len(sizes)
    if not num_rows:
        raise WorkloadError("no requests (only a header line)", file=file, row=nonblank[0])
    line_numbers = np.array(nonblank[1 : 1 + num_rows], dtype=np.int64)
    counts = np.array(sizes, dtype=np.int64)
    problems: list[RowCheck] = []
    short = counts < width
    if short.any():
        last = num_rows - 1

        def short_reason(i: int) -> str:
            what = "truncated line" if i == last else "missing fields"
            return f"{what}: {counts[i]} of {width} fields"

        first_short = int(np.flatnonzero(short)[0])
        problems.append(RowCheck(header[min(counts[first_short], width - 1)], short, short_reason))
    long = counts > width
    if long.any():
        problems.append(RowCheck(header[-1], long, lambda i: f"{counts[i]} fields, the header has {width}"))
    columns: dict[str, np.ndarray] = {}
    for name, values in zip(header, fields, strict=True):
        columns[name] = np.array(values, dtype=object)
        values.clear()
    return CsvRows(header, columns, line_numbers, problems)


def jsonl_records(text: str, file: str, on_bad_row: str) -> tuple[list[dict], np.ndarray, int]:
    """Parse JSON lines: (records, 1-based line of each, skipped count). Bad JSON fails or is skipped."""
    lines = text.splitlines()
    records: list[dict] = []
    numbers: list[int] = []
    skipped = 0
    last_nonblank = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    loads = json.loads
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = loads(line)
        except ValueError:
            record = None
            reason = "truncated line (incomplete JSON)" if i == last_nonblank else "not valid JSON"
        except RecursionError:  # e.g. 100,000 nested objects: Python's JSON parser recurses per level
            record = None
            reason = "not a request record (JSON nested too deeply)"
        else:
            reason = "not a JSON object"
        if not isinstance(record, dict):
            if on_bad_row == "skip":
                skipped += 1
                continue
            raise WorkloadError(reason, file=file, row=i + 1)
        records.append(record)
        numbers.append(i + 1)
    if not records:
        raise WorkloadError("no requests", file=file)
    return records, np.asarray(numbers, dtype=np.int64), skipped


def object_column(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array of `values`, one element each, even when the elements are equal-length lists.

    Why not `np.array(values, dtype=object)`: a JSON value that is a list (`"input_length": [1, 2]`)
    in every row would become a 2-D array and fail far from the file with a shape error.
    """
    return np.fromiter(values, dtype=object, count=len(values))


def _scalar_number(value: Any) -> Any:
    """`value` as something `pd.to_numeric` takes: None for lists and objects, ints beyond float as inf."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # a JSON integer with hundreds of digits
            return math.inf if value > 0 else -math.inf
    if value is None or isinstance(value, str | float | np.integer | np.floating):
        return value
    return None


# What a cell holds, as one small code per value: one pass of Python, then vectorised masks.
_MISSING, _FLAG, _SCALAR, _OTHER = 0, 1, 2, 3


def _kind(value: Any) -> int:
    if value is None or (type(value) is str and value == ""):
        return _MISSING
    if isinstance(value, bool | np.bool_):
        return _FLAG
    if isinstance(value, str | int | float | np.integer | np.floating):
        return _SCALAR
    return _OTHER  # a list, an object, an array: never a number


def to_numbers(raw: np.ndarray, field: str) -> tuple[np.ndarray, RowCheck]:
    """Text or JSON values to float64 (NaN where missing); the check flags values that are not numbers.

    Values are kept as float64 here, whatever their size: the range rules (`workloads.schema`) run on
    these floats, before any cast to int64, so 1e30 or 2**63 is reported as too large on its own line.
    """
    kinds = np.fromiter(map(_kind, raw), dtype=np.int8, count=len(raw))
    try:
        parsed = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce")
    except OverflowError:  # an integer beyond float64 (hundreds of digits): convert value by value
        parsed = pd.to_numeric(
            pd.Series(object_column([_scalar_number(v) for v in raw]), dtype=object), errors="coerce"
        )
    values = parsed.to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
    missing = kinds == _MISSING
    values[(kinds == _FLAG) | (kinds == _OTHER)] = np.nan
    not_number = (np.isnan(values) & ~missing) | (kinds == _FLAG) | (kinds == _OTHER)
    check_bad = not_number | missing

    def reason(i: int) -> str:
        value = raw[i]
        if missing[i]:
            return "missing value"
        if kinds[i] == _SCALAR and (
            (isinstance(value, float) and value != value) or str(value).strip().lower() in NAN_WORDS
        ):
            return f"missing value (NaN: {value!r})"
        return f"not a number ({_short_repr(value)})"

    return values, RowCheck(field, check_bad, reason)


def _short_repr(value: Any, limit: int = 40) -> str:
    """repr(value), cut to `limit` characters: a message stays one short line whatever the value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def finish(
    table: pd.DataFrame,
    extra_checks: Sequence[RowCheck],
    line_numbers: np.ndarray,
    file: str,
    field_names: Mapping[str, str],
    on_bad_row: str,
    attrs: dict[str, Any],
    skipped: int = 0,
) -> TraceRead:
    """Apply the reader's own checks and the request-table rules; fail on the first bad row or skip them.

    Field names in messages are the file's own (`input_length`, `ContextTokens`), not ours. With
    on_bad_row="skip", rows breaking any rule are dropped; then rows whose timestamp goes back in time
    (below the latest kept one) are dropped too. The count lands in attrs["skipped_rows"].
    """
    checks = list(extra_checks) + row_checks(table, block_hash_tokens=attrs.get("block_hash_tokens"))
    checks = [RowCheck(field_names.get(c.field, c.field), c.bad, c.reason, c.rule) for c in checks]
    if on_bad_row == "error":
        problem = first_problem(checks)
        if problem is not None:
            i, check = problem
            raise WorkloadError(check.reason(i), file=file, row=int(line_numbers[i]), field=check.field)
    else:
        bad = bad_row_mask([c for c in checks if c.rule != "order"], len(table))
        keep = ~bad
        if "arrival_s" in table.columns:
            arrival = table["arrival_s"].to_numpy(dtype=np.float64)
            kept_idx = np.flatnonzero(keep)
            kept_arrival = arrival[kept_idx]
            running_max = np.maximum.accumulate(kept_arrival) if kept_idx.size else kept_arrival
            backwards = np.zeros(kept_idx.size, dtype=bool)
            backwards[1:] = kept_arrival[1:] < running_max[:-1]
            keep[kept_idx[backwards]] = False
            kept_idx = np.flatnonzero(keep)  # now sorted: drop what lies beyond the span of the first kept
            keep[kept_idx[beyond_span(arrival[kept_idx])]] = False
        skipped += int(np.count_nonzero(~keep))
        if not keep.any():
            raise WorkloadError(f"every row is bad ({skipped} skipped)", file=file)
        table = table[keep].reset_index(drop=True)
        line_numbers = line_numbers[keep]
    attrs = dict(attrs, skipped_rows=skipped)
    return TraceRead(table, line_numbers, file, attrs)
