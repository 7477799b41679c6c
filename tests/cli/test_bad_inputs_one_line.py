"""Issue 11, part 3: one line, exit 2, for every bad input; Ctrl-C says what was written and exits 130.

Each case was a traceback (exit 1) or a wrong message before: the file, the 1-based file line and the
field must be named, with no RuntimeWarning on the way.
"""

from __future__ import annotations

import json
import re
import signal
import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _signal_helpers import signal_when, slow_sweep_spec

import workloads
from sim.cli import main
from sim.cost.limits import MAX_STEP_S
from sim.errors import ScenarioError
from sim.scenario.scenario import Scenario, default_scenario
from workloads.errors import WorkloadError

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERIC_HEADER = "arrival_s,prompt_tokens,output_tokens\n"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning on the way is a defect
        with pytest.raises(SystemExit) as info:
            main(args)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


def assert_one_line(capsys: pytest.CaptureFixture[str], args: list[str], expected: str) -> None:
    code, _, err = run_cli(args, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.strip() == f"error: {expected}"


# ------------------------------------------------------------------------------------- trace readers


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


CASES = {
    "jsonl list value": (
        "t.jsonl",
        '{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 2}\n'
        '{"arrival_s": 1, "prompt_tokens": [1, 2], "output_tokens": 2}\n',
        "row 2, field 'prompt_tokens': not a number ([1, 2])",
    ),
    "jsonl list value in every row": (
        "t.jsonl",
        '{"arrival_s": 0, "prompt_tokens": [1, 2], "output_tokens": 2}\n'
        '{"arrival_s": 1, "prompt_tokens": [3, 4], "output_tokens": 2}\n',
        "row 1, field 'prompt_tokens': not a number ([1, 2])",
    ),
    "mooncake list value": (
        "m.jsonl",
        '{"timestamp": 0, "input_length": [1, 2], "output_length": 5, "hash_ids": [1]}\n',
        "row 1, field 'input_length': not a number ([1, 2])",
    ),
    "mooncake block id beyond int64": (
        "m.jsonl",
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
        '{"timestamp": 1, "input_length": 10, "output_length": 5, "hash_ids": [' + str(10**30) + "]}\n",
        "row 2, field 'hash_ids': block ids must fit in 64 bits ([1000000000000000000000000000000])",
    ),
    "azure naive after aware": (
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900+00:00,100,10\n"
        "2023-11-16 18:15:47.6805900,100,10\n",
        "row 3, field 'TIMESTAMP': '2023-11-16 18:15:47.6805900' has no time zone, unlike the first "
        "timestamp ('2023-11-16 18:15:46.6805900+00:00')",
    ),
    "azure aware after naive": (
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,100,10\n\n"
        "2023-11-16T18:15:47Z,100,10\n",
        "row 4, field 'TIMESTAMP': '2023-11-16T18:15:47Z' has a time zone, unlike the first timestamp "
        "('2023-11-16 18:15:46.6805900')",
    ),
    "azure centuries": (
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n1700-11-16 18:15:46,100,10\n2200-11-16 18:15:47,100,10\n",
        "row 3, field 'TIMESTAMP': 1.57785e+10 s after the first request: a trace spans at most 366 days",
    ),
    "deeply nested first line": (
        "d.jsonl",
        '{"a":' * 100_000 + "1" + "}" * 100_000 + "\n",
        "row 1: not a request record (JSON nested too deeply)",
    ),
    "deeply nested later line": (
        "d.jsonl",
        '{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 2}\n\n'
        + '{"a":' * 100_000
        + "}" * 100_000
        + "\n",
        "row 3: not a request record (JSON nested too deeply)",
    ),
    "1e30 at file line 6": (
        "b.csv",
        GENERIC_HEADER + "0,1,1\n1,2,2\n2,3,3\n3,4,4\n4,1e30,5\n5,6,6\n",
        "row 6, field 'prompt_tokens': too large (got 1e+30; at most 2**53)",
    ),
    "2**63": (
        "b.csv",
        GENERIC_HEADER + "0,1,1\n1,9223372036854775808,2\n",
        "row 3, field 'prompt_tokens': too large (got 9.22337e+18; at most 2**53)",
    ),
    "json 1e23": (
        "b.jsonl",
        '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1}\n'
        '{"arrival_s": 1, "prompt_tokens": 1e23, "output_tokens": 1}\n',
        "row 2, field 'prompt_tokens': too large (got 1e+23; at most 2**53)",
    ),
    "json integer of 400 digits": (
        "b.jsonl",
        '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": ' + "9" * 400 + "}\n",
        "row 1, field 'output_tokens': not finite (inf)",
    ),
    "duplicated header": (
        "h.csv",
        "arrival_s,prompt_tokens,output_tokens,prompt_tokens\n0,1,1,5\n1,2,2,6\n",
        "row 1, field 'prompt_tokens': column name appears twice in the header",
    ),
    "trace centuries long": (
        "c.csv",
        GENERIC_HEADER + "0,1,1\n1e13,2,2\n",
        "row 3, field 'arrival_s': 1e+13 s after the first request: a trace spans at most 366 days",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_trace_is_one_line_naming_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    name, text, where = CASES[case]
    path = write(tmp_path / name, text)
    assert_one_line(capsys, ["workload", "describe", str(path)], f"{path}: {where}")


def parquet(path: Path, **columns: pa.Array) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_parquet_list_column_and_uint64_max_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lists = parquet(
        tmp_path / "l.parquet", prompt_tokens=pa.array([[1, 2], [3]]), output_tokens=pa.array([1, 2])
    )
    assert_one_line(
        capsys,
        ["workload", "describe", str(lists)],
        f"{lists}: row 1, field 'prompt_tokens': not a number (array([1, 2]))",
    )
    huge = parquet(
        tmp_path / "u.parquet",
        arrival_s=pa.array([0.0, 1.0]),
        prompt_tokens=pa.array([5, 2**64 - 1], pa.uint64()),
        output_tokens=pa.array([1, 2]),
    )
    assert_one_line(
        capsys,
        ["workload", "describe", str(huge)],
        f"{huge}: row 2, field 'prompt_tokens': too large (got 1.84467e+19; at most 2**53)",
    )


def test_skip_drops_lengths_too_big_for_int64_and_far_timestamps(tmp_path: Path) -> None:
    path = write(
        tmp_path / "b.csv",
        GENERIC_HEADER + "0,1,1\n1,1e30,1\n2,9223372036854775808,2\n3,3,18446744073709551615\n4,4,4\n",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = workloads.load(path, on_bad_row="skip")
    assert table["prompt_tokens"].tolist() == [1, 4] and table.attrs["skipped_rows"] == 3
    far = write(tmp_path / "far.csv", GENERIC_HEADER + "0,1,1\n5,2,2\n1e13,3,3\n2e13,4,4\n")
    table = workloads.load(far, on_bad_row="skip")
    assert table["prompt_tokens"].tolist() == [1, 2] and table.attrs["skipped_rows"] == 2


def test_a_mistyped_stamp_inside_a_trace_is_still_reported_as_unsorted(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", GENERIC_HEADER + "0,1,1\n1e13,2,2\n2,3,3\n")
    with pytest.raises(WorkloadError, match=r"row 4, field 'arrival_s': timestamps not sorted"):
        workloads.load(path)


def test_azure_zoned_stamps_with_different_offsets_are_one_clock(tmp_path: Path) -> None:
    path = write(
        tmp_path / "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.5Z,100,10\n"
        "2023-11-16 19:15:47.5+01:00,100,10\n"
        "2023-11-16 13:15:48.5-0500,100,10\n",
    )
    table = workloads.load(path)
    assert table["arrival_s"].tolist() == [0.0, 1.0, 2.0]


def test_azure_stamps_keep_their_100_ns_resolution(tmp_path: Path) -> None:
    path = write(
        tmp_path / "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,100,10\n"
        "2023-11-16 18:15:46.6806901,100,10\n",
    )
    assert workloads.load(path)["arrival_s"].tolist() == [0.0, pytest.approx(1.001e-4, abs=1e-12)]


# ------------------------------------------------------------------------------------ scenario types


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('enable_prefix_caching = "yes"', "field 'enable_prefix_caching': must be true or false (got 'yes')"),
        ("block_size = true", "field 'block_size': must be an integer (got True)"),
        ("block_size = 16.0", "field 'block_size': must be an integer (got 16.0)"),
        ('max_num_seqs = "64"', "field 'max_num_seqs': must be an integer (got '64')"),
        ('[workload]\nclip = "no"', "field 'workload.clip': must be true or false (got 'no')"),
    ],
)
def test_scenario_types_are_strict_in_toml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], toml: str, message: str
) -> None:
    config = write(tmp_path / "s.toml", toml + "\n")
    assert_one_line(capsys, ["run", "--config", str(config), "--num-prompts", "5"], f"{config}: {message}")
    assert not (tmp_path / "results").exists()


def test_set_flag_is_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert_one_line(
        capsys,
        ["run", "--set", "block_size=true", "--num-prompts", "5", "--output", str(out)],
        "field 'block_size': must be an integer (got True)",
    )
    assert not out.exists()


def test_documented_string_forms_still_read() -> None:
    scenario = Scenario(
        kv_cache_memory="12GiB",
        allocator="request_limit:pow2:best_fit",
        duration_s="10s",
        workload={"source": "sharegpt", "request_rate": "inf"},
        gpu_memory_utilization=1,  # an integer is a valid float
    )
    assert scenario.kv_cache_memory == 12 * 1024**3 and scenario.allocator.params["reservation"] == "pow2"
    assert scenario.duration_s == 10.0 and scenario.workload.request_rate == float("inf")
    assert Scenario.from_dict(json.loads(json.dumps(scenario.to_dict()))) == scenario


# ------------------------------------------------------------------------------------ step costs


@pytest.mark.parametrize(
    ("override", "term"),
    [
        ({"step_overhead_s": 1e300}, "step_overhead_s"),
        ({"constant_step_s": 1e306}, "constant_step_s"),
        ({"gpu.hbm_bandwidth_bytes_per_s": 1e-300}, "memory"),
        ({"gpu.peak_flops": 1e-300}, "compute"),
        ({"gpu.pcie_bandwidth_bytes_per_s": 1e-300}, "swap"),
    ],
)
def test_step_costs_that_overflow_are_refused(override: dict, term: str) -> None:
    from sim.cost.model import CostModel

    scenario = default_scenario().with_overrides(**override)
    with pytest.raises(ScenarioError, match=rf"^step cost: the {term}\b.* \(at most {MAX_STEP_S:g} s\)"):
        CostModel.from_scenario(scenario)


def test_step_cost_overflow_is_one_line_in_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        ["run", "--set", "gpu.peak_flops=1e-300", "--num-prompts", "5", "--output", str(tmp_path / "o")],
        capsys,
    )
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: step cost: the compute"), err


# ------------------------------------------------------------------------------------ kvsim report


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "r1"
    main(["run", "--num-prompts", "20", "--output", str(out), "--quiet"])
    assert (out / "summary.json").is_file()
    return out


def copy_run(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


def test_report_refuses_a_string_metric_in_one_line(
    good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(good_run, tmp_path / "r")
    summary = json.loads((run / "summary.json").read_text())
    summary["metrics"]["waste_pct"] = "x"
    (run / "summary.json").write_text(json.dumps(summary))
    assert_one_line(
        capsys,
        ["report", str(run), "--output", str(tmp_path / "rep")],
        f"{run / 'summary.json'}: metric 'waste_pct' must be a number or null (got 'x')",
    )


@pytest.mark.parametrize(("file", "column"), [("steps.parquet", "time_s"), ("requests.parquet", "ttft_ms")])
def test_report_refuses_a_string_column_in_one_line(
    good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], file: str, column: str
) -> None:
    run = copy_run(good_run, tmp_path / "r")
    table = pd.read_parquet(run / file)
    table[column] = table[column].astype(str)
    table.to_parquet(run / file)
    first = table[column].iloc[0]
    code, _, err = run_cli(["report", str(run), "--output", str(tmp_path / "rep")], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {run / file}: column '{column}' must hold numbers (row 1 holds {first!r})")


# ------------------------------------------------------------------------------------ Ctrl-C


def test_ctrl_c_before_anything_is_written_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sim.api

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.api, "simulate", interrupted)
    code, _, err = run_cli(["run", "--num-prompts", "5", "--output", str(tmp_path / "o")], capsys)
    assert code == 130
    assert err.strip() == "interrupted: nothing was written (no output is left half-written)"
    assert not (tmp_path / "o").exists()


def test_ctrl_c_during_compare_names_the_runs_already_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sim.reports.publish

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.reports.publish, "report", interrupted)
    out = tmp_path / "cmp"
    code, _, err = run_cli(
        ["compare", "--allocators", "paged,contiguous", "--num-prompts", "5", "--output", str(out)], capsys
    )
    assert code == 130 and "Traceback" not in err
    written = [p for p in out.iterdir() if (p / "summary.json").is_file()]
    assert len(written) == 2
    line = err.strip()
    assert line.startswith("interrupted: written: ") and "\n" not in line, err
    assert line.endswith(" (2 complete); nothing else was written (no output is left half-written)")
    assert all(str(path.resolve()) in line for path in written), line


def test_ctrl_c_in_a_sweep_counts_the_saved_cells_and_exits_130(tmp_path: Path) -> None:
    spec = slow_sweep_spec(tmp_path)
    out = tmp_path / "out"
    returncode, err = signal_when(
        ["sweep", str(spec), "--jobs", "1", "--output", str(out), "--no-progress"],
        ready=lambda: bool(list((out / "cells").glob("*/summary.json"))),
        signum=signal.SIGINT,  # Ctrl-C reaches the whole process group
        what="no cell finished",
    )
    assert returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    match = re.fullmatch(
        rf"interrupted: {re.escape(str(out.resolve()))}: (\d) of 4 cells saved \(rerun the same command to "
        r"resume\), sweep\.parquet not written; nothing else was written \(no output is left half-written\)",
        lines[0],
    )
    assert match, lines[0]
    on_disk = len(list((out / "cells").glob("*/summary.json")))
    assert int(match.group(1)) <= on_disk <= int(match.group(1)) + 1  # one cell may commit meanwhile
    assert not (out / "sweep.parquet").exists()
