"""Issue 23 item 10: the Arrow readers give the line-level readers' tables and errors, only faster.

`read_trace(reader="auto")` takes Arrow's table only for a clean file and reads anything else line by
line; these tests hold it to that: on random files mixing good cells with every kind of bad one, the
two readers must agree exactly -- the same table and attrs, or the same one-line error -- in both
`on_bad_row` modes. Then: the real traces, a clean file really taking the fast path, and files that
are not regular files (FIFO, /dev/zero, a folder) or too large, each refused with one line.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workloads
from sim.cli import main
from workloads.errors import WorkloadError
from workloads.readers import arrow, read_trace, source

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"
REAL_TRACES = (
    SHARED / "azure_conv_2023" / "AzureLLMInferenceTrace_conv.csv",
    SHARED / "mooncake_conversation" / "conversation_trace.jsonl",
    SHARED / "sharegpt_lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
)
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

GOOD_NUMBERS = st.one_of(st.integers(1, 5000).map(str), st.sampled_from(["7", "12", "300", "1e3", "2.0"]))
ODD_NUMBERS = st.sampled_from(
    [" 12", "12 ", "+5", ".5", "0", "-1", "nan", "NaN", "", "inf", "1e400", "abc", '"7"', "1_0", "0x10",
     "１２", "9007199254740993", "1e30", "N/A", "null", "True", "1.", "-0", "  "]
)  # fmt: skip
CELLS = st.one_of(GOOD_NUMBERS, GOOD_NUMBERS, GOOD_NUMBERS, ODD_NUMBERS)
STAMPS = st.one_of(
    st.integers(0, 59).map(lambda s: f"2023-11-16 18:15:{s:02d}.6805900"),
    st.sampled_from(
        ["2023-11-16 18:16:46", "2023-11-16T18:17:00", "2023-11-16", "2023-11-16 18:15",
         "2023-11-17 18:15:46Z", "2023-11-16 18:15:46.1234567891", "2023-11-16 18:15:46+01:00",
         "3023-11-16 18:15:46", "yesterday", "", "2023-11-16 18:15:46.68059"]
    ),
)  # fmt: skip


def outcome(path: Path, reader: str, on_bad_row: str) -> tuple[str, object]:
    """("table", (frame, attrs)) or ("error", message) of one read."""
    try:
        trace = read_trace(path, reader=reader, on_bad_row=on_bad_row)
    except WorkloadError as exc:
        return "error", str(exc)
    return "table", (trace.table, trace.attrs)


def assert_same_outcome(path: Path) -> None:
    for on_bad_row in ("error", "skip"):
        fast, lines = outcome(path, "auto", on_bad_row), outcome(path, "lines", on_bad_row)
        assert fast[0] == lines[0], (on_bad_row, fast, lines)
        if fast[0] == "error":
            assert fast[1] == lines[1]
        else:
            pd.testing.assert_frame_equal(fast[1][0], lines[1][0], check_exact=True)
            assert fast[1][1] == lines[1][1]


def _write(text: str, suffix: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="kvsim-arrow-"))
    path = folder / f"t{suffix}"
    path.write_bytes(text.encode("utf-8"))
    return path


ROW_EXTRAS = st.sampled_from(["", "", "", "", "\n", "\n   ", ",9", "\r"])


@SETTINGS
@given(
    rows=st.lists(st.tuples(CELLS, CELLS, CELLS, ROW_EXTRAS), min_size=1, max_size=8),
    increasing=st.booleans(),
    bom=st.sampled_from(["", "", "\ufeff"]),
    header=st.sampled_from(
        [
            "arrival_s,prompt_tokens,output_tokens",
            "arrival_s, prompt_tokens,output_tokens",
            "prompt_tokens,output_tokens,x",
        ]
    ),  # fmt: skip
)
def test_generic_csv_auto_agrees_with_lines(rows, increasing, bom, header) -> None:
    lines = [bom + header]
    for i, (a, b, c, extra) in enumerate(rows):
        first = str(i * 0.5) if increasing and a in {"7", "12", "300"} else a
        lines.append(f"{first},{b},{c}{extra}")
    path = _write("\n".join(lines) + "\n", ".csv")
    assert_same_outcome(path)


@SETTINGS
@given(rows=st.lists(st.tuples(STAMPS, CELLS, CELLS, ROW_EXTRAS), min_size=1, max_size=8))
def test_azure_csv_auto_agrees_with_lines(rows) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},{p},{o}{x}\n" for t, p, o, x in rows)
    assert_same_outcome(_write(text, ".csv"))


JSON_SCALARS = st.one_of(
    st.integers(1, 5000),
    st.integers(1, 5000),
    st.sampled_from([0, -1, 0.5, 2.0, 1e30, 2**53 + 1, 2**64, None, True, "12", "x", [1], {}]),
)
IDS = st.one_of(st.integers(0, 50), st.sampled_from([2**63, -(2**63) - 1, 1.0, True, "3", None]))


@st.composite
def mooncake_lines(draw: st.DrawFn) -> str:
    records = []
    for i in range(draw(st.integers(1, 6))):
        length = draw(st.one_of(st.integers(1, 2000), JSON_SCALARS))
        is_length = isinstance(length, int) and not isinstance(length, bool) and 0 < length <= 2000
        blocks = -(-length // 512) if is_length else 1
        ids = draw(st.lists(IDS, min_size=max(0, blocks - 1), max_size=blocks + 1))
        record = {
            "timestamp": draw(st.one_of(st.just(i * 250), JSON_SCALARS)),
            "input_length": length,
            "output_length": draw(JSON_SCALARS),
            "hash_ids": ids,
        }
        drop = draw(st.sampled_from([None, None, None, None, "hash_ids", "timestamp"]))
        if drop:
            del record[drop]
        if draw(st.booleans()):
            record["extra"] = {"nested": [1, {"x": None}]}
        line = json.dumps(record)
        line = draw(st.sampled_from([line, line, line, line, "", "  ", "[1, 2]", line[:-3], line + " "]))
        records.append(line)
    return "\n".join(records) + draw(st.sampled_from(["\n", "", "\r\n"]))


@SETTINGS
@given(text=mooncake_lines())
def test_mooncake_auto_agrees_with_lines(text) -> None:
    assert_same_outcome(_write(text, ".jsonl"))


@SETTINGS
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {"prompt_tokens": JSON_SCALARS, "output_tokens": JSON_SCALARS, "n": JSON_SCALARS}
        ),
        min_size=1,
        max_size=6,
    )
)
def test_generic_jsonl_auto_agrees_with_lines(rows) -> None:
    text = "".join(json.dumps({"arrival_s": i, **row}) + "\n" for i, row in enumerate(rows))
    assert_same_outcome(_write(text, ".jsonl"))


def test_parquet_auto_agrees_with_lines(tmp_path: Path) -> None:
    good = pa.table(
        {"arrival_s": [0.0, 1.5], "prompt_tokens": [10, 20], "output_tokens": [3, 4], "x": ["a", "b"]}
    )
    bad = pa.table({"arrival_s": [0.0, 1.5], "prompt_tokens": [10, None], "output_tokens": [3, 4]})
    text = pa.table({"prompt_tokens": ["10", "x"], "output_tokens": [3, 4]})
    for name, table in (("good", good), ("bad", bad), ("text", text)):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path)
        assert_same_outcome(path)
    (tmp_path / "broken.parquet").write_bytes(b"PAR1" + b"\0" * 40)
    assert_same_outcome(tmp_path / "broken.parquet")


def test_a_null_block_id_takes_the_line_level_path(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [null]}\n')
    assert_same_outcome(path)


@pytest.mark.parametrize("path", REAL_TRACES, ids=lambda p: p.name)
def test_real_traces_read_the_same_both_ways(path: Path) -> None:
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    fast, lines = read_trace(path), read_trace(path, reader="lines")
    pd.testing.assert_frame_equal(fast.table, lines.table, check_exact=True)
    assert fast.attrs == lines.attrs


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("g.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,6\n1.5,7,8\n"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,5,6\n"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}\n'),
    ],
)
def test_a_clean_file_takes_the_arrow_path(tmp_path: Path, monkeypatch, name: str, text: str) -> None:
    """A clean file is read by Arrow alone: the line-level reader is never called."""
    path = tmp_path / name
    path.write_text(text)
    expected = read_trace(path, reader="lines")

    def refuse(*args: object) -> None:
        raise AssertionError("read line by line")

    import dataclasses

    from workloads.readers import FORMATS

    for fmt in FORMATS.names():
        monkeypatch.setitem(FORMATS._entries, fmt, dataclasses.replace(FORMATS.get(fmt), read=refuse))
    got = read_trace(path)
    pd.testing.assert_frame_equal(got.table, expected.table, check_exact=True)


def test_shared_int_lists_share_equal_ids() -> None:
    column = pa.chunked_array([pa.array([[10**12, 7], [10**12]]), pa.array([[], [7, 10**12]])])
    lists = arrow.shared_int_lists(column)
    assert lists.tolist() == [[10**12, 7], [10**12], [], [7, 10**12]]
    assert lists[0][0] is lists[1][0]  # one Python int per distinct id within a chunk


def describe_cli(path: Path, capsys) -> tuple[int, str]:
    try:
        main(["workload", "describe", str(path)])
    except SystemExit as exc:
        captured = capsys.readouterr()
        return int(exc.code or 0), (captured.out + captured.err).strip()
    return 0, capsys.readouterr().out


def test_a_fifo_is_refused_with_one_line_without_blocking(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "trace.csv"
    os.mkfifo(fifo)
    code, printed = describe_cli(fifo, capsys)  # would block forever if opened
    assert code == 2 and printed == f"error: {fifo}: a FIFO, not a regular file: give a trace file"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_is_refused_with_one_line(capsys) -> None:
    code, printed = describe_cli(Path("/dev/zero"), capsys)
    assert (
        code == 2 and printed == "error: /dev/zero: a character device, not a regular file: give a trace file"
    )


def test_a_folder_and_a_missing_file_keep_their_lines(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="is a folder, not a trace file"):
        read_trace(tmp_path)
    with pytest.raises(WorkloadError, match="file not found"):
        read_trace(tmp_path / "nope.csv")


def test_a_file_beyond_the_size_bound_is_refused_before_reading(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "g.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,6\n")
    monkeypatch.setattr(source, "MAX_TRACE_BYTES", 16)
    with pytest.raises(WorkloadError, match=r"larger than the 0 GiB kvsim reads .*MAX_TRACE_BYTES"):
        workloads.load(path)


def reference_hit_tokens(prompt: list[int], hashes: list[list[int]], block_tokens: int) -> list[int]:
    """The definition, block by block: a block hits if an earlier request had its id, while every earlier
    block of the same prompt hit; the last block holds the rest of the prompt."""
    seen: set[int] = set()
    hits = []
    for tokens, ids in zip(prompt, hashes, strict=True):
        hit, matching = 0, True
        for k, block in enumerate(ids):
            matching = matching and block in seen
            if matching:
                hit += max(0, min(block_tokens, tokens - k * block_tokens))
        seen.update(ids)
        hits.append(hit)
    return hits


@SETTINGS
@given(
    rows=st.lists(
        st.tuples(st.integers(1, 3000), st.lists(st.integers(0, 9), max_size=6)), min_size=1, max_size=30
    )
)
def test_describe_hit_tokens_match_the_definition(rows) -> None:
    """describe's vectorised hit count (pandas factorisation, issue 23 item 10) equals the definition."""
    import numpy as np

    from workloads.describe import prefix_hit_tokens_from_hashes

    prompt = [p for p, _ in rows]
    hashes = np.empty(len(rows), dtype=object)
    hashes[:] = [ids for _, ids in rows]
    got = prefix_hit_tokens_from_hashes(np.array(prompt), hashes, 512)
    assert got.tolist() == reference_hit_tokens(prompt, [ids for _, ids in rows], 512)
