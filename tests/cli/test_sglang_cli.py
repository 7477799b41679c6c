"""`--engine sglang` through the commands: run, compare, sweep and capacity, and its bad values.

The preset picks SGLang's own memory (the radix allocator, page size 1), chunked prefill and the
radix cache; every bad value is one line on stderr and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from _cli_helpers import run_cli

from sim.scenario.scenario import default_scenario

SMALL = ["--num-prompts", "30", "--workload", "chat-system-prompt"]


def test_preset_defaults_and_explicit_flags_override_them() -> None:
    scenario = default_scenario().with_overrides(engine="sglang")
    assert scenario.allocator.name == "radix" and scenario.block_size == 1
    assert scenario.enable_chunked_prefill and scenario.enable_prefix_caching
    assert scenario.max_num_seqs == 2048
    mine = default_scenario().with_overrides(engine="sglang", allocator="paged", block_size=16)
    assert (mine.allocator.name, mine.block_size) == ("paged", 16)
    fcfs = default_scenario().with_overrides(engine="sglang-fcfs")
    assert fcfs.engine_policy().schedule_policy == "fcfs"


def test_run_writes_a_radix_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert run_cli(["run", "--engine", "sglang", *SMALL, "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario"]["engine"] == "sglang"
    assert summary["scenario"]["allocator"]["name"] == "radix"
    metrics = summary["metrics"]
    assert metrics["completed"] == 30
    assert metrics["kv_internal_pct"] == 0.0  # page size 1: no internal fragmentation
    assert metrics["kv_cached_pct"] > 0  # finished requests stay in the tree as cached leaves
    requests = pd.read_parquet(out / "requests.parquet")
    assert requests["prefix_hit_tokens"].sum() > 0  # the shared system prompt is matched in the tree


def test_compare_vllm_v1_and_sglang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for engine, allocator in (("vllm-v1", "paged"), ("sglang", "radix")):
        out = tmp_path / engine
        args = ["compare", "--engine", engine, "--allocators", allocator, *SMALL, "--output", str(out)]
        assert run_cli(args) == 0
        assert (out / allocator / "summary.json").is_file()
    printed = capsys.readouterr().out
    assert "radix" in printed and "paged" in printed


def test_sweep_over_engines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "engines.toml"
    spec.write_text(
        'name = "engines"\n[base]\nnum_prompts = 20\n[base.workload]\nsource = "chat-system-prompt"\n'
        '[grid]\nengine = ["vllm-v1", "sglang"]\n'
    )
    assert run_cli(["sweep", str(spec), "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    table = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    assert sorted(table["engine"]) == ["sglang", "vllm-v1"]


def test_capacity_with_sglang(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["capacity", "--engine", "sglang", "--allocators", "radix", "--num-prompts", "40"]
    args += ["--slo-ttft-p99", "2s", "--rate-min", "1", "--rate-max", "4", "--rate-tol", "0.5"]
    assert run_cli(args) == 0
    assert "radix" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--engine", "sglang", "--preemption-mode", "swap"], "retract_decode"),
        (["--engine", "sglang-lof"], "unknown engine"),
        (["--engine", "sglang", "--block-size", "0"], "block-size"),
        (["--engine", "sglang", "--model", "Gemma-3-27B", "--gpu", "H200-141GB"], "sliding-window"),
    ],
)
def test_bad_values_are_one_line_exit_2(
    args: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["run", *args, "--num-prompts", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and names in err and "Traceback" not in err


def test_export_layouts_with_radix_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The radix model has no physical slot ids: `--export-layouts` used to end in a traceback."""
    out = tmp_path / "r"
    code = run_cli(
        ["run", "--engine", "sglang", "--num-prompts", "20", "--export-layouts", "5", "-o", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--export-layouts" in err, err
    assert not out.exists()
