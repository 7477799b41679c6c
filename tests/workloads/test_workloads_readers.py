"""Trace readers: the real public traces (when ../shared/traces exists) and every bad-input case."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import workloads
from workloads.errors import WorkloadError

AZURE = "azure_conv_2023/AzureLLMInferenceTrace_conv.csv"
MOONCAKE = "mooncake_conversation/conversation_trace.jsonl"
SHAREGPT = "sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROWS = [
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,109",
    "2023-11-16 18:15:51.0000000,879,31",
    "2023-11-16 18:15:58.2000000,120,7",
]


def mooncake_line(ts: int, inp: int, out: int, first_id: int = 0) -> str:
    blocks = math.ceil(inp / 512)
    return json.dumps(
        {
            "timestamp": ts,
            "input_length": inp,
            "output_length": out,
            "hash_ids": list(range(first_id, first_id + blocks)),
        }
    )


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error_of(path: str, **kwargs) -> str:
    with pytest.raises(WorkloadError) as info:
        workloads.load(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- real traces


def test_azure_conversation_trace(traces_dir: Path) -> None:
    df = workloads.load(traces_dir / AZURE)
    assert len(df) == 19_366
    assert df.attrs["format"] == "azure"
    assert df["prompt_tokens"].mean() == pytest.approx(1155, abs=1)
    assert df["output_tokens"].mean() == pytest.approx(211, abs=1)
    assert df["arrival_s"].iloc[0] == 0.0 and df["arrival_s"].iloc[-1] == pytest.approx(3501.72, abs=0.01)
    assert workloads.describe(df)["mean_rate"] == pytest.approx(5.53, abs=0.01)
    assert (df["max_tokens"] == 2048).all()


def test_azure_trace_options(traces_dir: Path) -> None:
    path = traces_dir / AZURE
    first = workloads.load(path, num_prompts=1000)
    assert len(first) == 1000
    fast = workloads.load(path, num_prompts=1000, time_scale=0.5)
    np.testing.assert_allclose(fast["arrival_s"], 0.5 * first["arrival_s"])
    rated = workloads.load(path, num_prompts=1000, request_rate=20)
    assert workloads.describe(rated)["mean_rate"] == pytest.approx(20.0)
    # Rescaling keeps the shape: the same burstiness.
    assert workloads.describe(rated)["interarrival_cv"] == pytest.approx(
        workloads.describe(first)["interarrival_cv"]
    )
    early = workloads.load(path, duration_s=60.0)
    assert early["arrival_s"].max() < 60.0 and len(early) == int((first["arrival_s"] < 60).sum())
    exact = workloads.load(path, num_prompts=100, max_tokens_policy="exact")
    assert (exact["max_tokens"] == exact["output_tokens"]).all()
    over = workloads.load(path, max_model_len=4096)
    assert over.attrs["over_length_prompts"] == int((workloads.load(path)["prompt_tokens"] > 4096).sum()) > 0
    assert over.attrs["clipped_requests"] == 0
    clipped = workloads.load(path, max_model_len=4096, clip=True)
    assert clipped.attrs["clipped_requests"] > 0 and (clipped["prompt_tokens"] < 4096).all()


def test_mooncake_conversation_trace(traces_dir: Path) -> None:
    df = workloads.load(traces_dir / MOONCAKE)
    assert len(df) == 12_031
    assert df.attrs["format"] == "mooncake" and df.attrs["block_hash_tokens"] == 512
    blocks = df["block_hashes"].map(len).to_numpy()
    assert (blocks == np.ceil(df["prompt_tokens"].to_numpy() / 512)).all()
    assert df["prompt_tokens"].mean() == pytest.approx(12_035, abs=1)
    assert workloads.describe(df)["prefix_hit_ratio"] == pytest.approx(0.374, abs=0.002)


def test_sharegpt_lengths_file_gets_drawn_arrivals(traces_dir: Path) -> None:
    df = workloads.load(traces_dir / SHAREGPT, request_rate=3.0, num_prompts=5000, seed=1)
    assert df.attrs["format"] == "sharegpt-lengths" and len(df) == 5000
    assert workloads.describe(df)["mean_rate"] == pytest.approx(3.0, rel=0.05)
    with pytest.raises(WorkloadError, match="request_rate"):
        workloads.load(traces_dir / SHAREGPT)  # no times and no rate


# ---------------------------------------------------------------- generic formats


def test_generic_csv_parquet_and_jsonl_round_trip(tmp_path: Path) -> None:
    source = workloads.load("chat-system-prompt", num_prompts=50, max_tokens_policy="exact", seed=4)
    columns = ["arrival_s", "prompt_tokens", "output_tokens", "max_tokens", "prefix_group", "prefix_tokens"]
    csv_path = tmp_path / "t.csv"
    source[columns].to_csv(csv_path, index=False)
    parquet_path = tmp_path / "t.parquet"
    source[columns].to_parquet(parquet_path)
    jsonl_path = tmp_path / "t.data"  # the name says nothing: the content decides
    source[columns].to_json(jsonl_path, orient="records", lines=True)
    for path, fmt in ((csv_path, "csv"), (parquet_path, "parquet"), (jsonl_path, "jsonl")):
        df = workloads.load(path)
        assert df.attrs["format"] == fmt
        pd.testing.assert_frame_equal(df[columns], source[columns], check_exact=False)


def test_format_override(tmp_path: Path) -> None:
    path = write(tmp_path, "a.txt", AZURE_HEADER + "\n".join(AZURE_ROWS) + "\n")
    assert len(workloads.load(path, fmt="azure")) == 4
    assert error_of(path, fmt="mooncake") == f"{path}: row 1: not valid JSON"
    assert "field 'prompt_tokens': missing column" in error_of(path, fmt="csv")
    assert "field 'format': unknown format 'xml'" in error_of(path, fmt="xml")


# ---------------------------------------------------------------- bad input, one line each


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (["2023-11-16 18:15:46.0,abc,44"], "row 2, field 'ContextTokens': not a number ('abc')"),
        (
            ["2023-11-16 18:15:46.0,374,44", "2023-11-16 18:15:47.0,-5,44"],
            "row 3, field 'ContextTokens': must be a positive length (>= 1) (got -5)",
        ),
        (
            ["2023-11-16 18:15:46.0,374,0"],
            "row 2, field 'GeneratedTokens': must be a positive length (>= 1) (got 0)",
        ),
        (["2023-11-16 18:15:46.0,374,NaN"], "row 2, field 'GeneratedTokens': missing value (NaN: 'NaN')"),
        (["2023-11-16 18:15:46.0,,44"], "row 2, field 'ContextTokens': missing value"),
        (["2023-11-16 18:15:46.0,374.5,44"], "row 2, field 'ContextTokens': not an integer (374.5)"),
        (["yesterday,374,44"], "row 2, field 'TIMESTAMP': not a timestamp ('yesterday')"),
        (
            ["2023-11-16 18:15:50.0,374,44", "2023-11-16 18:15:46.0,374,44"],
            "row 3, field 'TIMESTAMP': timestamps not sorted (-4 s comes after 0 s)",
        ),
        (
            AZURE_ROWS[:2] + ["2023-11-16 18:15:51.0,87"],
            "row 4, field 'GeneratedTokens': truncated line: 2 of 3 fields",
        ),
        (
            ["2023-11-16 18:15:46.0,374", *AZURE_ROWS[1:]],
            "row 2, field 'GeneratedTokens': missing fields: 2 of 3 fields",
        ),
        (["2023-11-16 18:15:46.0,374,44,9"], "row 2, field 'GeneratedTokens': 4 fields, the header has 3"),
    ],
)
def test_bad_azure_rows(tmp_path: Path, rows: list[str], expected: str) -> None:
    path = write(tmp_path, "azure.csv", AZURE_HEADER + "\n".join(rows) + "\n")
    assert error_of(path) == f"{path}: {expected}"


def test_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    text = AZURE_HEADER + AZURE_ROWS[0] + "\n\n\n" + "2023-11-16 18:15:50.9951690,oops,1\n"
    path = write(tmp_path, "azure.csv", text)
    assert error_of(path) == f"{path}: row 5, field 'ContextTokens': not a number ('oops')"


def test_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path, "azure.csv", "TIMESTAMP,ContextTokens,Tokens\n2023-11-16 18:15:46.0,1,2\n")
    expected = f"{path}: field 'GeneratedTokens': missing column (have: TIMESTAMP, ContextTokens, Tokens)"
    # Two of Azure's columns: detection picks Azure, so the message names the missing column.
    assert error_of(path) == expected
    assert error_of(path, fmt="azure") == expected
    generic = write(tmp_path, "g.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,5\n")
    frame = workloads.load(generic)
    assert len(frame) == 1


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("g.csv", "arrival_s,prompt_tokens\n0,5\n", "field 'output_tokens': missing column"),
        ("g.csv", "output_tokens,max_tokens\n5,9\n", "field 'prompt_tokens': missing column"),
        ("a.csv", "TIMESTAMP,GeneratedTokens\n2023-11-16 18:15:46.0,2\n", "field 'ContextTokens'"),
        ("l.csv", "num_prefill_tokens\n5\n", "field 'num_decode_tokens': missing column"),
        ("g.jsonl", '{"arrival_s": 0, "prompt_tokens": 5}\n', "field 'output_tokens': missing column"),
        (
            "m.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 3}\n',
            "field 'hash_ids': missing column",
        ),
    ],
)
def test_partial_header_names_the_missing_column(tmp_path: Path, name: str, text: str, expected: str) -> None:
    """A header with some of one format's columns is that format with a column missing, not unknown."""
    path = write(tmp_path, name, text)
    assert error_of(path).startswith(f"{path}: {expected}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty file"),
        ("\n  \n", "empty file"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "row 1: no requests (only a header line)"),
        ("hello,world\n1,2\n", "unknown format"),
        ("<html></html>\n", "unknown format"),
    ],
)
def test_empty_and_unknown_files(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, "x.csv", text)
    message = error_of(path)
    assert message.startswith(f"{path}: {expected}")


def test_missing_file_and_folder(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.csv")
    assert error_of(missing) == f"{missing}: file not found"
    assert error_of(str(tmp_path)).endswith("is a folder, not a trace file")


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            [mooncake_line(0, 600, 5), '{"timestamp": 1, "input_length": 7'],
            "row 2: truncated line (incomplete JSON)",
        ),
        ([mooncake_line(0, 600, 5), "{oops}", mooncake_line(2, 10, 5)], "row 2: not valid JSON"),
        (
            [
                mooncake_line(0, 600, 5),
                '{"timestamp": 3, "input_length": "x", "output_length": 1, "hash_ids": [1]}',
            ],
            "row 2, field 'input_length': not a number ('x')",
        ),
        (
            [
                mooncake_line(0, 600, 5),
                '{"timestamp": 3, "input_length": 5, "output_length": NaN, "hash_ids": [1]}',
            ],
            "row 2, field 'output_length': missing value (NaN: nan)",
        ),
        (
            [mooncake_line(0, 600, 5), '{"timestamp": 3, "input_length": 5, "hash_ids": [1]}'],
            "row 2, field 'output_length': missing value",
        ),
        (
            [mooncake_line(3000, 600, 5), mooncake_line(0, 600, 5)],
            "row 2, field 'timestamp': timestamps not sorted (0 s comes after 3 s)",
        ),
        (
            [
                mooncake_line(0, 600, 5),
                '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": "ab"}',
            ],
            "row 2, field 'hash_ids': not a list of integer block ids ('ab')",
        ),
        (
            [
                mooncake_line(0, 600, 5),
                '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}',
            ],
            "row 2, field 'hash_ids': 2 block ids cover more than prompt_tokens (5) at 512 tokens per block",
        ),
        (
            [
                mooncake_line(0, 600, 5),
                '{"timestamp": 3, "input_length": 0, "output_length": 1, "hash_ids": []}',
            ],
            "row 2, field 'input_length': must be a positive length (>= 1) (got 0)",
        ),
        (
            [mooncake_line(0, 600, 5), '{"timestamp": 3, "input_length": 5, "output_length": 1}'],
            "row 2, field 'hash_ids': missing value",
        ),
        (
            [
                mooncake_line(0, 600, 5),
                '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": null}',
            ],
            "row 2, field 'hash_ids': not a list of integer block ids (None)",
        ),
        (
            [
                mooncake_line(0, 600, 5),
                '{"timestamp": 3, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}',
            ],
            "row 2, field 'hash_ids': 2 block ids cover less than input_length (1025) "
            "at 512 tokens per block (needs 3)",
        ),
        (
            [
                mooncake_line(0, 600, 5),
                '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": []}',
            ],
            "row 2, field 'hash_ids': 0 block ids cover less than input_length (5) "
            "at 512 tokens per block (needs 1)",
        ),
    ],
)
def test_bad_mooncake_rows(tmp_path: Path, lines: list[str], expected: str) -> None:
    path = write(tmp_path, "mc.jsonl", "\n".join(lines))
    assert error_of(path) == f"{path}: {expected}"


def test_skip_bad_rows_counts_them(tmp_path: Path) -> None:
    rows = [
        "2023-11-16 18:15:46.0,374,44",
        "2023-11-16 18:15:47.0,abc,44",  # not a number
        "2023-11-16 18:15:48.0,374,0",  # zero length
        "2023-11-16 18:15:45.0,10,10",  # goes back in time
        "2023-11-16 18:15:49.0,200,20",
        "2023-11-16 18:15:50.0,20",  # truncated
    ]
    path = write(tmp_path, "azure.csv", AZURE_HEADER + "\n".join(rows))
    df = workloads.load(path, on_bad_row="skip")
    assert len(df) == 2 and df.attrs["skipped_rows"] == 4
    assert df["prompt_tokens"].tolist() == [374, 200] and df["arrival_s"].tolist() == [0.0, 3.0]
    lines = [mooncake_line(0, 600, 5), "{broken", mooncake_line(5, 900, 7, 10), '{"timestamp": 9}']
    mc = write(tmp_path, "mc.jsonl", "\n".join(lines) + "\n")
    df = workloads.load(mc, on_bad_row="skip")
    assert len(df) == 2 and df.attrs["skipped_rows"] == 2
    assert "field 'on_bad_row'" in error_of(mc, on_bad_row="ignore")


def test_mooncake_rows_without_hash_ids_are_skipped_and_counted(tmp_path: Path) -> None:
    """A missing or short hash_ids is a bad row: skipped and counted, and describe() still works."""
    lines = [
        mooncake_line(0, 600, 5),
        '{"timestamp": 1, "input_length": 600, "output_length": 3}',  # no hash_ids
        '{"timestamp": 2, "input_length": 1100, "output_length": 3, "hash_ids": [0]}',  # needs 3 ids
        mooncake_line(3, 700, 7),  # same first two blocks as row 1: 700 tokens hit
    ]
    path = write(tmp_path, "mc.jsonl", "\n".join(lines) + "\n")
    df = workloads.load(path, on_bad_row="skip")
    assert len(df) == 2 and df.attrs["skipped_rows"] == 2
    assert df["block_hashes"].tolist() == [[0, 1], [0, 1]]
    summary = workloads.describe(df)
    assert summary["prefix_hit_ratio"] == pytest.approx(700 / 1300)


def test_every_row_bad_is_still_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "azure.csv", AZURE_HEADER + "2023-11-16 18:15:46.0,x,y\n")
    assert error_of(path, on_bad_row="skip") == f"{path}: every row is bad (1 skipped)"


def test_damaged_parquet(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1" + b"\x00" * 40)
    assert "not a readable Parquet file" in error_of(str(path))


def test_trace_parameters_are_checked(tmp_path: Path) -> None:
    path = write(tmp_path, "azure.csv", AZURE_HEADER + "\n".join(AZURE_ROWS) + "\n")
    assert "field 'prompt_len': not a parameter of a trace file" in error_of(path, prompt_len="fixed(3)")
    assert "field 'arrival'" in error_of(path, arrival="poisson")


# ---------------------------------------------------------------- properties


@st.composite
def table_with_one_bad_cell(draw):
    rows = draw(st.integers(1, 8))
    arrival = sorted(draw(st.lists(st.integers(1, 10_000), min_size=rows, max_size=rows)))
    prompt = draw(st.lists(st.integers(1, 5000), min_size=rows, max_size=rows))
    output = draw(st.lists(st.integers(1, 5000), min_size=rows, max_size=rows))
    cells = [[str(a / 10), str(p), str(o)] for a, p, o in zip(arrival, prompt, output, strict=True)]
    column = draw(st.integers(0, 2))
    row = draw(st.integers(0, rows - 1))
    if column == 0:
        bad = draw(st.sampled_from(["abc", "", "nan", "-3"]))
    else:
        bad = draw(st.sampled_from(["abc", "", "nan", "-3", "0", "1.5", "1e400"]))
    cells[row][column] = bad
    return cells, row, column


@given(table_with_one_bad_cell())
def test_any_single_bad_cell_is_reported_at_its_line_and_field(case) -> None:
    cells, row, column = case
    header = ["arrival_s", "prompt_tokens", "output_tokens"]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.csv"
        path.write_text(",".join(header) + "\n" + "\n".join(",".join(r) for r in cells) + "\n")
        with pytest.raises(WorkloadError) as info:
            workloads.load(path)
        assert info.value.row == row + 2 and info.value.field == header[column]
        assert str(info.value).startswith(f"{path}: row {row + 2}, field '{header[column]}': ")
        skipped = workloads.load(path, on_bad_row="skip") if len(cells) > 1 else None
        if skipped is not None:
            assert skipped.attrs["skipped_rows"] >= 1 and len(skipped) + skipped.attrs["skipped_rows"] == len(
                cells
            )


@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(1, 3000), st.integers(1, 3000), st.integers(1, 4096)),
        min_size=1,
        max_size=20,
    )
)
def test_generic_csv_round_trips(rows) -> None:
    gaps, prompt, output, limit = zip(*rows, strict=True)
    arrival = np.cumsum(np.array(gaps) / 8.0)
    text = "arrival_s,prompt_tokens,output_tokens,max_tokens\n" + "\n".join(
        f"{float(a)!r},{p},{o},{m}" for a, p, o, m in zip(arrival, prompt, output, limit, strict=True)
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.csv"
        path.write_text(text)
        df = workloads.load(path)
    np.testing.assert_allclose(df["arrival_s"], arrival - arrival[0])
    assert df["prompt_tokens"].tolist() == list(prompt) and df["max_tokens"].tolist() == list(limit)
