"""Fuzz of the trace readers (issue 11, part 3): random bytes, random rows, random types.

Every case must either load, or fail with the one-line user error: `kvsim workload describe` exits 2
with one line naming the file and, for a row's problem, its 1-based line in the file and the field.
Warnings are errors here: a RuntimeWarning from a cast is a value that slipped past the checks.
"""

from __future__ import annotations

import io
import json
import math
import tempfile
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workloads
from sim.cli import main
from workloads.errors import WorkloadError

GENERIC_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "max_tokens", "prefix_group", "turn")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
RATE = 2.0  # a length-only file needs a rate for its drawn arrivals; a timed one is rescaled to it
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Scalars a trace cell may hold, chosen to hit the edges: huge, tiny, non-finite, text, flags, empty.
EDGE_NUMBERS = st.sampled_from(
    [0, 1, -1, 2**53, 2**53 + 1, 2**63, 2**64 - 1, 2**64, 10**30, 1e23, 1e30, 1e308, -1e308, 0.5, 3.0]
)
NUMBERS = st.one_of(
    EDGE_NUMBERS,
    st.integers(-(10**40), 10**40),
    st.integers(0, 5000),
    st.floats(allow_nan=True, allow_infinity=True),
)
TEXT = st.one_of(
    st.sampled_from(
        ["", "nan", "NaN", "null", "inf", "-inf", "1e400", "abc", " 12 ", "1_000", "0x10", "true"]
    ),
    st.text(max_size=8),
)
JSON_LEAVES = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def _line_count(data: bytes) -> int:
    return max(1, len(data.decode("utf-8", errors="replace").splitlines()))


def check_loads_or_one_line(path: Path, *, max_row: int, fields: set[str] | None = None) -> None:
    """`workloads.load` returns a table or raises the one-line WorkloadError at a real line and field;
    the CLI then exits 2 with that one line, and no traceback."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            table = workloads.load(path, request_rate=RATE)
        except WorkloadError as exc:
            message = str(exc)
            assert "\n" not in message and message.startswith(f"{path}"), message
            assert exc.file == str(path)
            if exc.row is not None:
                assert 1 <= exc.row <= max_row, message
            if exc.field is not None and fields is not None:
                assert exc.field in fields, message
            cli_exit, cli_err = _cli_describe(path)
            assert cli_exit == 2, cli_err
            assert cli_err.strip() == f"error: {message}"
        else:
            assert len(table) >= 1
            assert table["prompt_tokens"].min() >= 1 and table["output_tokens"].min() >= 1
            assert table["arrival_s"].notna().all()


def _cli_describe(path: Path) -> tuple[int, str]:
    import contextlib

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(["workload", "describe", str(path), "--request-rate", str(RATE)])
        except SystemExit as exit_:
            return int(exit_.code or 0), err.getvalue()
    return 0, err.getvalue()


@FUZZ
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".csv", ".jsonl", ".parquet", ".txt"]))
def test_random_bytes_load_or_fail_in_one_line(data: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"trace{suffix}"
        path.write_bytes(data)
        check_loads_or_one_line(path, max_row=_line_count(data))


@FUZZ
@given(
    header=st.lists(st.sampled_from(GENERIC_COLUMNS), min_size=1, max_size=6),
    rows=st.lists(
        st.lists(st.one_of(NUMBERS.map(str), TEXT), min_size=0, max_size=7), min_size=1, max_size=6
    ),
    blank_lines=st.lists(st.integers(0, 8), max_size=2),
)
def test_random_csv_rows_load_or_fail_at_their_line(
    header: list[str], rows: list[list[str]], blank_lines: list[int]
) -> None:
    lines = [",".join(header)] + [
        ",".join(cell.replace(",", ";").replace("\n", " ") for cell in r) for r in rows
    ]
    for position in sorted(blank_lines, reverse=True):
        lines.insert(min(position, len(lines)), "")
    text = "\n".join(lines) + "\n"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.csv"
        path.write_text(text, encoding="utf-8")
        check_loads_or_one_line(path, max_row=_line_count(text.encode()), fields=set(GENERIC_COLUMNS))


@FUZZ
@given(
    records=st.lists(
        st.dictionaries(st.sampled_from(GENERIC_COLUMNS), JSON_VALUES, min_size=1, max_size=6),
        min_size=1,
        max_size=5,
    ),
    mooncake=st.booleans(),
)
def test_random_json_lines_load_or_fail_at_their_line(records: list[dict], mooncake: bool) -> None:
    if mooncake:
        renamed = dict(zip(GENERIC_COLUMNS[:4], MOONCAKE_KEYS, strict=True))
        records = [{renamed.get(k, k): v for k, v in r.items()} for r in records]
        records[0].setdefault("input_length", 10)
        records[0].setdefault("hash_ids", [1])
    text = "\n".join(json.dumps(r) for r in records) + "\n"  # NaN and Infinity as Python writes them
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.jsonl"
        path.write_text(text, encoding="utf-8")
        fields = set(GENERIC_COLUMNS) | set(MOONCAKE_KEYS)
        check_loads_or_one_line(path, max_row=len(records), fields=fields)


@FUZZ
@given(
    rows=st.lists(
        st.tuples(NUMBERS, NUMBERS, st.one_of(st.lists(NUMBERS, max_size=4), JSON_VALUES)),
        min_size=1,
        max_size=5,
    )
)
def test_random_mooncake_rows_load_or_fail_at_their_line(rows: list[tuple]) -> None:
    records = [
        {"timestamp": i * 1000, "input_length": length, "output_length": output, "hash_ids": ids}
        for i, (length, output, ids) in enumerate(rows)
    ]
    text = "\n".join(json.dumps(r) for r in records) + "\n"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mooncake.jsonl"
        path.write_text(text, encoding="utf-8")
        check_loads_or_one_line(path, max_row=len(records), fields=set(MOONCAKE_KEYS))


PARQUET_COLUMNS = st.sampled_from(
    [
        pa.array([1, 2, 3], pa.int64()),
        pa.array([1, 2**64 - 1, 3], pa.uint64()),
        pa.array([1.0, math.inf, 2.0]),
        pa.array([1.5, math.nan, None]),
        pa.array(["1", "x", ""]),
        pa.array([[1, 2], [3], []]),
        pa.array([True, False, True]),
        pa.array([None, None, None], pa.int64()),
        pa.array([{"a": 1}, {"a": 2}, {"a": 3}]),
        pa.array([10, 20, 30], pa.int8()),
        pa.array([1e30, 2.0, 3.0]),
    ]
)


@FUZZ
@given(
    columns=st.dictionaries(
        st.sampled_from(GENERIC_COLUMNS),
        PARQUET_COLUMNS,
        min_size=1,
        max_size=5,
    )
)
def test_random_parquet_types_load_or_fail_at_their_row(columns: dict[str, pa.Array]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.parquet"
        pq.write_table(pa.table(columns), path)
        check_loads_or_one_line(path, max_row=3, fields=set(GENERIC_COLUMNS))


STAMPS = st.one_of(
    st.sampled_from(
        [
            "2023-11-16 18:15:46.6805900",
            "2023-11-16 18:15:47.1+00:00",
            "2023-11-16T18:15:48Z",
            "2023-11-16 19:15:49-0100",
            "1700-01-01 00:00:00",
            "2200-01-01 00:00:00",
            "9999-12-31 23:59:59",
            "2023-11-16",
            "",
            "yesterday",
        ]
    ),
    st.text(max_size=10),
)


@FUZZ
@given(rows=st.lists(st.tuples(STAMPS, NUMBERS.map(str), NUMBERS.map(str)), min_size=1, max_size=5))
def test_random_azure_rows_load_or_fail_at_their_line(rows: list[tuple[str, str, str]]) -> None:
    clean = [tuple(cell.replace(",", ";").replace("\n", " ").replace("\r", " ") for cell in r) for r in rows]
    text = ",".join(AZURE_HEADER) + "\n" + "\n".join(",".join(r) for r in clean) + "\n"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "azure.csv"
        path.write_text(text, encoding="utf-8")
        check_loads_or_one_line(path, max_row=_line_count(text.encode()), fields=set(AZURE_HEADER))


@pytest.mark.parametrize("depth", [10, 5000, 200_000])
def test_deeply_nested_json_is_one_line_at_its_line(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "deep.jsonl"
    good = json.dumps({"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 5})
    path.write_text(good + "\n" + '{"prompt_tokens": ' + "[" * depth + "]" * depth + "}\n")
    check_loads_or_one_line(path, max_row=2, fields=set(GENERIC_COLUMNS))
    path.write_text("[" * depth + "]" * depth + "\n")
    check_loads_or_one_line(path, max_row=1)
