"""`kvsim run`, `kvsim compare`, `kvsim presets` through sim.cli.main: outputs, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli_helpers import run_cli


def test_run_writes_results_and_prints_summary(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r"
    code = run_cli(
        ["run", "--num-prompts", "40", "--allocator", "request_limit:oracle", "--output", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert "TTFT" in printed and "request_limit:oracle" in printed
    assert printed.strip().splitlines()[-1] == f"results written to {out}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario"]["num_prompts"] == 40
    assert summary["allocator"] == "request_limit:oracle"


def test_run_reads_a_config_and_flags_override_it(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text(
        'name = "cfg"\nmodel = "OPT-13B"\ngpu = "A100-40GB"\nkv_cache_memory = "4GiB"\n'
        "max_model_len = 2048\nnum_prompts = 25\nseed = 5\n"
    )
    out = tmp_path / "r"
    assert run_cli(["run", "--config", str(config), "--seed", "6", "--quiet", "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == 6 and summary["scenario"]["name"] == "cfg"
    assert summary["metrics"]["kv_capacity_tokens"] == 4 * 1024**3 // (800 * 1024)


def test_compare_writes_one_folder_per_allocator_and_ends_with_where(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cmp"
    code = run_cli(
        ["compare", "--num-prompts", "30", "--allocators", "paged,contiguous", "--output", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert (out / "paged" / "summary.json").is_file() and (out / "contiguous" / "summary.json").is_file()
    assert printed.strip().splitlines()[-1].startswith(f"results written to {out}")


def test_presets_lists_models_and_gpus(capsys) -> None:
    assert run_cli(["presets"]) == 0
    printed = capsys.readouterr().out
    for name in ("OPT-13B", "LLaMA-2-7B", "A100-40GB", "H100-80GB"):
        assert name in printed


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--block-size", "0"], "block_size"),
        (["run", "--allocator", "bogus"], "bogus"),
        (["run", "--config", "/nonexistent/s.toml"], "not found"),
        (["run", "--preemption-mode", "teleport"], "preemption_mode"),
        (["run", "--max-num-seqs", "-3"], "max_num_seqs"),
        (["compare", "--allocators", ","], "allocators"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str, capsys, tmp_path: Path) -> None:
    code = run_cli([*args, "--output", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and needle in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_output_folder_is_checked_before_simulating(tmp_path: Path, capsys, monkeypatch) -> None:
    """A foreign --output folder is refused before any simulation runs (run and compare)."""
    import sim.api

    def must_not_run(*args, **kwargs):
        raise AssertionError("simulated although the output folder is refused")

    monkeypatch.setattr(sim.api, "simulate", must_not_run)
    monkeypatch.setattr(sim.api, "compare", must_not_run)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert run_cli(["run", "--num-prompts", "10", "--output", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: results folder {foreign}: exists and is not a kvsim folder (holds notes.txt); "
        "choose another --output\n"
    )
    (foreign / "paged").mkdir()
    (foreign / "paged" / "notes.txt").write_text("keep me too")
    args = ["compare", "--num-prompts", "10", "--allocators", "contiguous,paged", "--output", str(foreign)]
    assert run_cli(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: compare folder {foreign}: exists and is not a kvsim folder (holds notes.txt, paged)"
    )
    assert err.count("\n") == 1
    assert sorted(p.name for p in foreign.rglob("*")) == ["notes.txt", "notes.txt", "paged"]


def test_vllm_workload_flags_and_generic_set_reach_the_scenario(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,50,10\n1,oops,10\n2,40,10\n4,30,10\n")
    out = tmp_path / "r"
    args = [
        "run",
        *("--workload", str(trace), "--format", "csv", "--on-bad-row", "skip", "--time-scale", "0.5"),
        *("--swap-space", "2", "--name", "flagged", "--quiet", "--output", str(out)),
        *("--set", "hbm_efficiency=0.7", "--set", "workload.params.max_tokens_policy=exact"),
        *("--set", "enable_chunked_prefill=true", "--set", "kv_cache_memory=2GiB"),
    ]
    assert run_cli(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    scenario = summary["scenario"]
    assert scenario["name"] == "flagged" and scenario["swap_space"] == 2 * 1024**3  # GiB, as vLLM
    assert scenario["hbm_efficiency"] == 0.7 and scenario["enable_chunked_prefill"] is True
    assert scenario["kv_cache_memory"] == 2 * 1024**3
    workload = scenario["workload"]
    assert (workload["fmt"], workload["on_bad_row"], workload["time_scale"]) == ("csv", "skip", 0.5)
    assert workload["request_rate"] is None  # a time scale replays the trace's own timestamps
    assert workload["params"] == {"max_tokens_policy": "exact"}
    assert summary["metrics"]["num_requests"] == 3  # the bad row was skipped


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.7", 0.7),
        ("3", 3),
        ("true", True),
        ("[1, 2]", [1, 2]),
        ('"x y"', "x y"),
        ("paged", "paged"),
        ("12GiB", "12GiB"),
        ("gamma(cv=3)", "gamma(cv=3)"),
        ("2024-01-01", "2024-01-01"),
    ],
)
def test_set_values_are_toml_literals_or_text(text: str, value: object) -> None:
    from sim.cli.scenario_flags import parse_set_value

    assert parse_set_value(text) == value


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--set", "hbm_efficency=0.7"],
            "error: unknown scenario field 'hbm_efficency' (valid: name, model,",
        ),
        (["--set", "novalue"], "error: --set: expected KEY=VALUE"),
        (["--seed", "3", "--set", "seed=4"], "error: --set seed: already given by its own flag"),
        (["--set", "hbm_efficiency=7"], "error: field 'hbm_efficiency': must be <= 1"),
        # a field set by its flag is named by the flag, with the field for --config users
        (["--on-bad-row", "ignore"], "error: --on-bad-row (field 'workload.on_bad_row'): must be one of"),
    ],
)
def test_bad_set_and_flags_are_one_line(args: list[str], expected: str, tmp_path: Path, capsys) -> None:
    assert run_cli(["run", "--num-prompts", "5", *args, "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_errors_name_the_flag_the_user_typed_and_the_field_otherwise() -> None:
    from sim.cli.app import in_flag_words

    message = "field 'max_num_seqs': must be >= 1 (got 0)"
    assert in_flag_words(message, ["run", "--max-num-seqs", "0"]).startswith(
        "--max-num-seqs (field 'max_num_seqs')"
    )
    assert in_flag_words(message, ["run", "--config", "s.toml"]) == message  # set in the file: its field
    assert in_flag_words("field '--rate-tol': bad", []) == "--rate-tol: bad"
    assert in_flag_words("argument 'jobs': must be >= 1", ["sweep", "--jobs=0"]) == "--jobs: must be >= 1"
