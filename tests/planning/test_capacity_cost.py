"""Money lines (issue 14): USD per 1M output tokens, per 1k requests and per month, checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.errors import KvsimError
from sim.planning.money import HOURS_PER_MONTH, check_gpu_hour_cost, cost_lines, row_costs


def plan_row(**extra: object) -> dict:
    row = {
        "allocator": "paged",
        "max_model_len": 2048,
        "tensor_parallel_size": 2,
        "max_rate_req_s": 4.0,
        # the probe at the max rate: 4 req/s and 1000 output tok/s -> 250 output tokens per request
        "max_rate_runs": [
            {"request_rate": 8.0, "request_throughput": 5.0, "output_throughput": 2000.0},
            {"request_rate": 4.0, "request_throughput": 4.0, "output_throughput": 1000.0},
        ],
    }
    row.update(extra)
    return row


def test_costs_by_hand() -> None:
    costs = row_costs(plan_row(gpus_needed=6), gpu_hour_cost=2.5)
    # 2 GPUs x $2.5/h = $5/h = $1/720 per s; 1000 output tok/s -> $1.3889 per 1M tokens
    assert costs["usd_per_million_output_tokens"] == pytest.approx(5.0 / 3600 / 1000 * 1e6)
    assert costs["usd_per_thousand_requests"] == pytest.approx(5.0 / 3600 / 4.0 * 1000)
    assert costs["usd_per_month_at_target"] == pytest.approx(6 * 2.5 * 730)
    assert HOURS_PER_MONTH == 730


def test_no_rate_no_cost_and_lines() -> None:
    row = plan_row(max_rate_req_s=None, max_rate_runs=[])
    assert row_costs(row, 2.5)["usd_per_million_output_tokens"] is None
    lines = cost_lines([plan_row(gpus_needed=6), row], 2.5, target_rate=20.0)
    assert lines[0].startswith("paged 2048/TP2: $1.389 per 1M output tokens, $0.347 per 1k requests")
    assert "$10,950/month for 20 req/s (6 GPUs)" in lines[0]
    assert "no sustainable rate" in lines[1]
    assert cost_lines([plan_row()], None, None) == []


@pytest.mark.parametrize("price", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_price_is_one_line(price: float) -> None:
    with pytest.raises(KvsimError, match="argument 'gpu_hour_cost': must be a finite number > 0"):
        check_gpu_hour_cost(price)


def test_report_shows_usd_per_million_output_tokens(tmp_path: Path) -> None:
    from _report_helpers import write_fake_run

    from sim.reports.publish import report

    run_dir = write_fake_run(tmp_path / "run")
    metrics = json.loads((run_dir / "summary.json").read_text())["metrics"]
    path = report([run_dir], tmp_path / "out", gpu_hour_cost=3.0)
    expected = 3.0 / 3600 / metrics["output_throughput"] * 1e6
    markdown = (path.parent / "report.md").read_text()
    assert "USD / 1M output tok." in markdown and f"{expected:.3f}" in markdown
    plain = report([run_dir], tmp_path / "plain")
    assert "USD / 1M" not in (plain.parent / "report.md").read_text()


def test_cli_capacity_prints_cost_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A server of known speed: one sequence at a time, 10 steps of 10 ms per request -> 10 req/s."""
    import re

    from sim.cli import main
    from sim.scenario.scenario import Scenario

    known = {
        "name": "known",
        "kv_cache_memory": 800 * 1024 * 4096,
        "max_model_len": 2048,
        "max_num_seqs": 1,
        "constant_step_s": 0.01,
        "num_prompts": 100,
        "workload": {
            "source": "sharegpt",
            "arrival": "constant",
            "max_tokens_policy": "exact",
            "params": {"prompt_len": "fixed(20)", "output_len": "fixed(10)"},
        },
    }
    scenario_file = tmp_path / "known.toml"
    scenario_file.write_text(Scenario.from_dict(known).to_toml())
    args = ["capacity", "--config", str(scenario_file), "--allocators", "paged", "--max-model-lens", "2K"]
    args += ["--slo-ttft-p99", "15ms", "--target-rate", "25", "--rate-min", "2", "--rate-max", "40"]
    args += ["--rate-tol", "0.02", "--jobs", "1", "--gpu-hour-cost", "2.5"]
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0, out
    found = re.search(r"paged 2048/TP1: \$([\d.]+) per 1M output tokens, \$([\d.]+) per 1k requests", out)
    assert found, out
    # ~10 req/s x 10 output tokens = 100 tok/s on one GPU at $2.5/h: 2.5 / 3600 / 100 x 1e6 = $6.94
    assert float(found.group(1)) == pytest.approx(6.944, rel=0.03)
    assert float(found.group(2)) == pytest.approx(0.0694, rel=0.03)
    assert "$5,475/month for 25 req/s (3 GPUs)" in out  # 3 x 2.5 x 730
