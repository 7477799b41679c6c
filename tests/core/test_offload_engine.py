"""The CPU tier through the engine and the commands: hits, PCIe time in the step, the summary, run,
`--set`, sweeps and bad values (docs/metrics.md "CPU tier", docs/engines.md "CPU tier")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _cli_helpers import run_cli

import sim
from sim.core.metrics import cpu_tier_metrics
from sim.scenario.scenario import Scenario
from sim.sweeps.runner import sweep

HASH_TOKENS = 128
TIER_METRICS = (
    "prefix_hit_gpu_pct",
    "prefix_hit_cpu_pct",
    "kv_offload_loaded_bytes",
    "kv_offload_stored_bytes",
)


def two_rounds() -> pd.DataFrame:
    """40 conversations of 4 named 128-token blocks, each asked twice, 30 s apart: the GPU cache
    (2 GiB, ~4 prompts) has evicted the first round's prefixes when the second round comes."""
    num = 40
    first = np.arange(num) * 0.5
    table = pd.DataFrame(
        {
            "request_id": np.arange(2 * num),
            "arrival_s": np.concatenate([first, 30.0 + first]),
            "prompt_tokens": np.full(2 * num, 600),
            "output_tokens": np.full(2 * num, 20),
            "max_tokens": np.full(2 * num, 20),
            "block_hashes": [[10 * (i % num) + j for j in range(4)] for i in range(2 * num)],
        }
    )
    table.attrs["block_hash_tokens"] = HASH_TOKENS
    return table


def scenario(kv_offloading_size: float | None) -> Scenario:
    return Scenario(
        engine="vllm-v1",
        model="OPT-13B",
        gpu="A100-40GB",
        kv_cache_memory="2GiB",
        max_model_len=2048,
        num_prompts=80,
        kv_offloading_size=kv_offloading_size,
    )


@pytest.fixture(scope="module")
def runs() -> dict[float | None, sim.Run]:
    requests = two_rounds()
    return {size: sim.simulate(scenario(size), workload=requests) for size in (None, 0, 32)}


def test_without_a_tier_the_summary_is_as_before(runs: dict) -> None:
    off = runs[None].summary
    assert "kv_offloading_size" not in off["scenario"]
    assert not any(key in off["metrics"] for key in TIER_METRICS)


def test_a_zero_tier_measures_hits_and_changes_nothing_else(runs: dict) -> None:
    off, zero = runs[None], runs[0]
    pd.testing.assert_frame_equal(off.requests, zero.requests, check_exact=True)
    metrics = zero.summary["metrics"]
    assert metrics["prefix_hit_cpu_pct"] == 0.0 and metrics["kv_offload_stored_bytes"] == 0
    # without preemptions every prompt is looked up once, and the GPU hits are the requests table's
    assert metrics["preemptions"] == 0
    assert metrics["prefix_queried_tokens"] == int(zero.requests["prompt_tokens"].sum())
    gpu_hits = 100.0 * zero.requests["prefix_hit_tokens"].sum() / metrics["prefix_queried_tokens"]
    assert metrics["prefix_hit_gpu_pct"] == pytest.approx(gpu_hits)


def test_cpu_hits_replace_prefill_compute_and_their_loads_enter_the_steps(runs: dict) -> None:
    zero, tier = runs[0], runs[32]
    m0, m1 = zero.summary["metrics"], tier.summary["metrics"]
    assert m0["preemptions"] == m1["preemptions"] == 0
    bytes_per_token = m1["kv_bytes_per_token"]
    cpu_hit_tokens = m1["prefix_hit_cpu_pct"] / 100.0 * m1["prefix_queried_tokens"]
    assert cpu_hit_tokens == pytest.approx(m1["kv_offload_loaded_bytes"] / bytes_per_token)
    # the second round's 512 named tokens minus the GPU's hits, less one block per prompt at most
    assert cpu_hit_tokens >= 30 * 496
    assert m0["total_prefill_tokens"] - m1["total_prefill_tokens"] == pytest.approx(cpu_hit_tokens)
    # every full 16-token block is stored once, as computed (vLLM stores prompt and decode blocks):
    # a first-round request fills 620 // 16 = 38 blocks (608 tokens); a second-round one shares the
    # 32 named prefix blocks and adds 6 of its own (prompt tail and decode: 96 tokens)
    assert m1["kv_offload_stored_bytes"] == 40 * (608 + 96) * bytes_per_token
    assert m1["kv_offload_transfer_s"] > 0
    assert 0 < m1["kv_offload_mean_used_pct"] <= m1["kv_offload_peak_used_pct"] <= 100.0
    second = tier.requests["request_id"] >= 40
    assert (tier.requests.loc[second, "prefix_hit_tokens"] >= 496).all()


def test_jumping_and_stepping_agree_with_a_tier() -> None:
    requests = two_rounds()
    jumped = sim.simulate(scenario(32), workload=requests)
    stepped = sim.simulate(scenario(32), workload=requests, multi_step=False)
    for column in ("prefix_hit_tokens", "generated_tokens", "preemptions"):
        assert (jumped.requests[column] == stepped.requests[column]).all(), column
    for column in ("first_token_s", "finish_s"):
        np.testing.assert_allclose(jumped.requests[column], stepped.requests[column], rtol=1e-9, atol=0)
    for key in (*TIER_METRICS, "kv_offload_transfer_s", "kv_offload_mean_used_pct"):
        assert jumped.summary["metrics"][key] == pytest.approx(stepped.summary["metrics"][key], rel=1e-9), key


def test_metrics_are_shares_of_the_lookups_and_bytes_of_the_tokens() -> None:
    tier = {
        "queried_tokens": 1000,
        "gpu_hit_tokens": 300,
        "cpu_hit_tokens": 200,
        "loaded_tokens": 200,
        "stored_tokens": 640,
        "evicted_tokens": 320,
        "peak_used_tokens": 320,
        "capacity_tokens": 400,
        "used_token_s": 2400.0,
        "transfer_s": 0.5,
    }
    metrics = cpu_tier_metrics(tier, duration_s=10.0, kv_bytes_per_token=2)
    assert (metrics["prefix_hit_gpu_pct"], metrics["prefix_hit_cpu_pct"]) == (30.0, 20.0)
    assert (metrics["kv_offload_loaded_bytes"], metrics["kv_offload_stored_bytes"]) == (400, 1280)
    assert metrics["kv_offload_mean_used_pct"] == 60.0 and metrics["kv_offload_peak_used_pct"] == 80.0


SMALL_RUN = [
    "run",
    "--engine",
    "vllm-v1",
    "--kv-cache-memory",
    "2GiB",
    "--max-model-len",
    "2048",
    "--workload",
    "chat-system-prompt",
    "--num-prompts",
    "30",
    "--quiet",
]


def test_run_takes_vllm_s_flag_in_gib_and_set_takes_a_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = tmp_path / "flag"
    assert run_cli([*SMALL_RUN, "--kv-offloading-size", "4", "--output", str(flag)]) == 0
    printed = capsys.readouterr().out
    assert "prefix hits on GPU / CPU (% tokens)" in printed and "CPU tier mean / peak used (%)" in printed
    by_set = tmp_path / "set"
    assert run_cli([*SMALL_RUN, "--set", 'kv_offloading_size="4GiB"', "--output", str(by_set)]) == 0
    first = json.loads((flag / "summary.json").read_text())
    second = json.loads((by_set / "summary.json").read_text())
    assert first["scenario"]["kv_offloading_size"] == second["scenario"]["kv_offloading_size"] == 4.0
    assert first["metrics"]["kv_offload_capacity_bytes"] == 4 * 1024**3 // (16 * 819200) * 16 * 819200
    for key in TIER_METRICS:
        assert first["metrics"][key] == second["metrics"][key]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--kv-offloading-size", "-1"], "kv_offloading_size"),
        (["--kv-offloading-size", "lots"], "kv_offloading_size"),
        (["--kv-offloading-size", "inf"], "kv_offloading_size"),
        (["--kv-offloading-size", "4", "--no-enable-prefix-caching"], "enable_prefix_caching"),
        (["--kv-offloading-size", "4", "--engine", "vllm-v0", "--enable-prefix-caching"], "recompute"),
        (["--set", "kv_offloading_size=true"], "kv_offloading_size"),
    ],
)
def test_bad_sizes_are_one_line_and_exit_2(
    args: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli([*SMALL_RUN, *args, "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "kv-offloading-size" in err or expected in err
    assert not (tmp_path / "out").exists()


def test_a_sweep_grid_over_the_tier_size(tmp_path: Path) -> None:
    spec = {
        "name": "tier",
        "base": {
            "engine": "vllm-v1",
            "model": "OPT-13B",
            "gpu": "A100-40GB",
            "kv_cache_memory": "2GiB",
            "max_model_len": 2048,
            "num_prompts": 30,
            "workload": {"source": "chat-system-prompt"},
        },
        "grid": {"kv_offloading_size": [0, "4GiB"]},
    }
    table = sweep(spec, jobs=1, output_dir=tmp_path / "tier", progress=False)
    assert list(table["status"]) == ["ok", "ok"]
    assert list(table["kv_offloading_size"]) == [0.0, 4.0]
    assert table["kv_offload_capacity_bytes"].iloc[0] == 0 and table["kv_offload_capacity_bytes"].iloc[1] > 0


def test_the_report_adds_the_tier_columns_only_for_runs_with_a_tier(runs: dict) -> None:
    from types import SimpleNamespace

    from sim.reports.render import CPU_TIER_COLUMNS, TABLE_COLUMNS, format_value, table_columns

    without = SimpleNamespace(summary=runs[None].summary)
    with_tier = SimpleNamespace(summary=runs[32].summary)
    assert table_columns([without]) == TABLE_COLUMNS
    assert table_columns([without, with_tier]) == (*TABLE_COLUMNS, *CPU_TIER_COLUMNS)
    assert format_value(3 * 1024**3, "gib") == "3.0"


def test_compare_gives_the_tier_to_the_allocators_that_have_one(tmp_path: Path) -> None:
    """As --enable-prefix-caching, --kv-offloading-size reaches the allocators that take it; the
    others run as they would without it (and the report shows '–' in their tier columns)."""
    args = [word for word in SMALL_RUN if word != "run"]
    out = tmp_path / "compare"
    assert (
        run_cli(
            [
                "compare",
                *args,
                "--allocators",
                "paged,contiguous",
                "--kv-offloading-size",
                "4",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    paged = json.loads((out / "paged" / "summary.json").read_text())["metrics"]
    contiguous = json.loads((out / "contiguous" / "summary.json").read_text())["metrics"]
    assert paged["kv_offload_capacity_bytes"] > 0
    assert not any(key in contiguous for key in TIER_METRICS)
    assert "CPU hit % tok." in (out / "report.md").read_text()


def test_capacity_searches_with_the_tier(tmp_path: Path) -> None:
    """`kvsim capacity` takes the same scenario flags: every probe runs with the CPU tier."""
    plan_path = tmp_path / "plan.json"
    args = [word for word in SMALL_RUN if word not in ("run", "--quiet")]
    code = run_cli(
        [
            "capacity",
            *args,
            "--allocators",
            "paged",
            "--rate-tol",
            "0.5",
            "--slo-ttft-p99",
            "2s",
            "--kv-offloading-size",
            "4",
            "--output",
            str(plan_path),
        ]
    )
    assert code == 0
    plan = json.loads(plan_path.read_text())
    assert plan["scenario"]["kv_offloading_size"] == 4.0
    assert plan["rows"][0]["allocator"] == "paged" and plan["rows"][0]["max_rate_runs"]
