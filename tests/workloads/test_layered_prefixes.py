"""Issue 21 §4: layered prefixes in generic traces -- per-request block content ids at a stated block size.

"A system prompt shared by a group, plus each user's repeated history" written as `block_hashes`
(Mooncake's `hash_ids`) in CSV ("1 2 3"), Parquet (a list column) and JSON lines (a list), with the
block size in `block_hash_tokens`. The same table from each format, one-line errors for bad ids, and
the engine's prefix cache hitting exactly the shared full blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sim
import workloads
from sim.scenario.scenario import Scenario
from workloads.errors import WorkloadError

# Group 0's system prompt is blocks 1, 2 (32 tokens at 16 per block); user A's history continues with
# block 3; user B has its own block 7. A's second turn repeats 1, 2, 3 and adds 4, 5.
ROWS = [
    (0.0, 40, 10, "1 2 3"),
    (0.5, 40, 12, "1 2 7"),
    (2.0, 70, 9, "1 2 3 4 5"),
    (3.0, 20, 5, "1 9"),
]
HEADER = "arrival_s,prompt_tokens,output_tokens,block_hashes,block_hash_tokens\n"


def write_csv(folder: Path, rows: list[tuple] = ROWS, block: str = "16") -> Path:
    path = folder / "layered.csv"
    path.write_text(HEADER + "".join(f"{a},{p},{o},{h},{block}\n" for a, p, o, h in rows))
    return path


def test_csv_parquet_and_jsonl_give_the_same_table(tmp_path: Path) -> None:
    from_csv = workloads.load(write_csv(tmp_path))
    ids = [[int(x) for x in h.split()] for *_, h in ROWS]
    table = pa.table(
        {
            "arrival_s": [r[0] for r in ROWS],
            "prompt_tokens": [r[1] for r in ROWS],
            "output_tokens": [r[2] for r in ROWS],
            "block_hashes": pa.array(ids, pa.list_(pa.int64())),
            "block_hash_tokens": [16] * len(ROWS),
        }
    )
    pq.write_table(table, tmp_path / "layered.parquet")
    (tmp_path / "layered.jsonl").write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    assert from_csv["block_hashes"].tolist() == ids and from_csv.attrs["block_hash_tokens"] == 16
    for name in ("layered.parquet", "layered.jsonl"):
        other = workloads.load(tmp_path / name)
        pd.testing.assert_frame_equal(other, from_csv, check_exact=True)
        assert other.attrs["block_hash_tokens"] == 16
    # hits: B's 1, 2 (32 tokens); A's second turn 1, 2, 3 (48); the last request's 1 (16): 96 of 170
    assert workloads.describe(from_csv)["prefix_hit_ratio"] == pytest.approx(96 / 170)


BH, BT = "row 2, field 'block_hashes'", "row 2, field 'block_hash_tokens'"
BAD_IDS = [
    ([(0, 40, 10, "1 2 3"), (1, 40, 10, "1 x")], "16",
     "row 3, field 'block_hashes': not a list of integer block ids ('1 x')"),
    ([(0, 40, 10, "1 2")], "16",
     f"{BH}: 2 block ids cover less than prompt_tokens (40) at 16 tokens per block (needs 3)"),
    ([(0, 40, 10, "1 2 3 4")], "16",
     f"{BH}: 4 block ids cover more than prompt_tokens (40) at 16 tokens per block"),
    ([(0, 40, 10, "")], "16", f"{BH}: missing value"),
    ([(0, 40, 10, "1 99999999999999999999 3")], "16",
     f"{BH}: block ids must fit in 64 bits ('1 99999999999999999999 3')"),
    ([(0, 40, 10, "1 2 3")], "0", f"{BT}: must be a whole number of tokens >= 1 (got 0)"),
]  # fmt: skip


@pytest.mark.parametrize(("rows", "block", "expected"), BAD_IDS)
def test_bad_block_ids_are_one_line_naming_row_and_field(
    tmp_path: Path, rows: list[tuple], block: str, expected: str
) -> None:
    path = write_csv(tmp_path, rows, block)
    with pytest.raises(WorkloadError) as caught:
        workloads.load(path)
    assert str(caught.value) == f"{path}: {expected}"


def test_one_block_size_per_file_and_it_must_be_stated(tmp_path: Path) -> None:
    path = tmp_path / "sizes.csv"
    path.write_text(HEADER + "0,40,10,1 2 3,16\n1,40,10,1 2 3,32\n")
    with pytest.raises(
        WorkloadError, match="row 3, field 'block_hash_tokens': differs from the first row's 16"
    ):
        workloads.load(path)
    skipped = workloads.load(path, on_bad_row="skip")
    assert len(skipped) == 1 and skipped.attrs["skipped_rows"] == 1
    path.write_text("arrival_s,prompt_tokens,output_tokens,block_hashes\n0,40,10,1 2 3\n")
    with pytest.raises(WorkloadError, match="field 'block_hash_tokens': missing column"):
        workloads.load(path)


def test_the_engine_caches_exactly_the_shared_full_blocks(tmp_path: Path) -> None:
    """With prefix caching (vllm-v1) a request reuses the full blocks an earlier one computed: B its
    group's 1, 2; A's second turn 1, 2 (its block 3 held only 8 tokens, never full, never cached)."""
    scenario = Scenario(
        model="Llama-3-8B",
        gpu="H100-80GB",
        engine="vllm-v1",
        workload=str(write_csv(tmp_path)),
        block_size=16,
    )
    run = sim.simulate(scenario)
    assert run.requests.sort_values("request_id")["prefix_hit_tokens"].tolist() == [0, 32, 32, 16]
