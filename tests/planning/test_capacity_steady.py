"""Issue 20 §2: a reported rate holds in steady state (and the planner's flags around it).

Small, hand-checkable scenarios (fixed lengths, a constant 10 ms step): each test takes seconds.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from _capacity_helpers import KNOWN, SMALL
from _cli_helpers import run_cli_output

from sim.planning.capacity import capacity, row_scenario
from sim.planning.jobs import saturated_throughput_req_s
from sim.planning.search import find_max_rate
from sim.planning.sizing import ProbeSizing
from sim.planning.slo import Slo, in_system_slope_req_s, judge_run
from sim.scenario.scenario import Scenario

# The known server of the capacity tests, on the paged allocator.
ONE_AT_A_TIME = {**KNOWN, "name": "one-at-a-time", "allocator": "paged"}


def _requests(arrival_s: np.ndarray, finish_s: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"arrival_s": arrival_s, "finish_s": finish_s, "admitted_s": arrival_s})


def test_in_system_slope_sees_a_batch_that_grows_while_nobody_waits() -> None:
    arrival_s = np.arange(0.0, 100.0, 0.1)  # 10 req/s
    steady = _requests(arrival_s, arrival_s + 1.0)  # each leaves after 1 s: 10 in the system
    assert in_system_slope_req_s(steady, 50.0, 100.0) == pytest.approx(0.0, abs=0.05)
    # every other request stays (the batch absorbs it): the system grows by 5 req/s
    growing = _requests(arrival_s, np.where(np.arange(arrival_s.size) % 2 == 0, arrival_s + 1.0, np.nan))
    assert in_system_slope_req_s(growing, 50.0, 100.0) == pytest.approx(5.0, rel=0.02)


def test_a_growing_batch_fails_the_probe_as_not_settled() -> None:
    """The waiting queue stays empty (the backlog hides in the running batch): bbd53f5 passed this run."""
    arrival_s = np.arange(0.0, 100.0, 0.1)
    finish_s = np.where(np.arange(arrival_s.size) % 2 == 0, arrival_s + 1.0, np.nan)
    steps = pd.DataFrame({"time_s": arrival_s, "duration_s": 0.1, "queue_length": 0})
    metrics = {"mean_e2el_ms": 1000.0, "p99_ttft_ms": 10.0, "p99_tpot_ms": 5.0, "completed": 500}
    run = SimpleNamespace(summary={"metrics": metrics}, requests=_requests(arrival_s, finish_s), steps=steps)
    ok, evidence = judge_run(run, 10.0, Slo(ttft_p99_s=1.0))
    assert not ok and evidence["too_short"]  # a longer run must decide
    assert evidence["queue_slope_req_s"] == 0.0
    assert evidence["reason"].startswith("running batch grows: 5")


def test_search_never_probes_above_the_ceiling_and_reuses_known_verdicts() -> None:
    probed: list[float] = []

    def evaluate(rate: float) -> tuple[bool, None]:
        probed.append(rate)
        return rate <= 100.0, None  # a finite run "passes" far above the ceiling

    search = find_max_rate(evaluate, low=1.0, high=50.0, ceiling=20.0)
    assert max(probed) == 20.0 and search.max_rate_req_s == 20.0 and search.status == "at_ceiling"
    probed.clear()
    search = find_max_rate(evaluate, low=5.0, high=20.0, known={20.0: False, 5.0: True}, rel_tol=0.5)
    assert 20.0 not in probed and 5.0 not in probed and search.status == "converged"


def test_saturated_throughput_skips_the_first_batch_and_the_drain() -> None:
    # 4 sequences at a time, each 1 s: 4 req/s while saturated; the drain after the last admission
    # (t = 9) and the first batch's completions are left out
    finish_s = np.array([1.0, 1.0, 1.0, 1.0, *np.repeat(np.arange(2.0, 11.0), 4)])
    admitted_s = np.concatenate([[0.0] * 4, np.repeat(np.arange(1.0, 10.0), 4)])
    requests = pd.DataFrame({"finish_s": finish_s, "admitted_s": admitted_s})
    assert saturated_throughput_req_s(requests, full_batch=4.0) == pytest.approx(4.0)


def test_probe_size_is_the_largest_of_the_count_the_p99_floor_and_the_batch_rule() -> None:
    sizing = ProbeSizing()
    assert sizing.probe_prompts(1, full_batch=1.0) == 1000  # --num-prompts 1 cannot make a p99
    assert sizing.probe_prompts(500, full_batch=1014.0) == 8112  # 8 turnovers of vLLM v1's 1,024 batch
    assert sizing.probe_prompts(20_000, full_batch=10.0) == 20_000  # the user may ask for more
    assert sizing.confirm_prompts(8112) == 81_120


@pytest.fixture(scope="module")
def loose_plan():
    """A loose SLO (TTFT 10 s): bbd53f5 passed rates up to 0.05 x rate of queue growth above the
    server's 10 req/s (10.5 req/s: the queue grows 0.5 req/s, 50 requests wait by the end)."""
    return capacity(
        Scenario.from_dict(ONE_AT_A_TIME),
        slo=Slo(ttft_p99_s=10.0),
        allocators=["paged"],
        max_model_lens=[2048],
        rate_bracket=(2.0, 40.0),
        jobs=1,
        sizing=SMALL,
    )


def test_max_rate_is_never_above_the_measured_saturation_throughput(loose_plan) -> None:
    [row] = loose_plan.rows
    assert row["saturation_throughput_req_s"] == pytest.approx(10.0)
    assert row["max_rate_req_s"] <= row["saturation_throughput_req_s"]
    assert all(run["request_rate"] <= row["saturation_throughput_req_s"] for run in row["max_rate_runs"])
    # confirmed by one run of 10 x a probe, its p99s beside the answer
    assert row["confirmed"] and row["confirmation_num_prompts"] == 1000
    assert row["confirmation_p99_ttft_ms"] == pytest.approx(10.0)
    assert [run["purpose"] for run in row["confirmation_runs"]] == ["confirmation"]


def test_saturation_rate_without_an_slo() -> None:
    plan = capacity(
        Scenario.from_dict(ONE_AT_A_TIME),
        slo=None,
        allocators=["paged"],
        max_model_lens=[2048],
        jobs=1,
        sizing=SMALL,
    )
    [row] = plan.rows
    # the saturation throughput itself passed; the answer is one 5 % tolerance step below it
    assert row["rate_status"] == "at_ceiling"
    assert row["max_rate_req_s"] == pytest.approx(row["saturation_throughput_req_s"] / 1.05)
    assert row["saturation_throughput_req_s"] == pytest.approx(10.0)
    assert plan.slo_text() == "none (saturation rate)" and plan.to_dict()["slo"] is None


def test_rows_that_do_not_fit_are_skipped_with_their_reason() -> None:
    """LLaMA-2-13B's weights (~24.2 GiB) do not fit an L4 (22 GiB) at TP 1: bbd53f5 refused the whole plan."""
    base = Scenario.from_dict(
        {**ONE_AT_A_TIME, "model": "LLaMA-2-13B", "gpu": "L4", "tensor_parallel_size": 2}
    )
    skipped, reason = row_scenario(base, "paged", 2048, 1)
    assert skipped is None and "weights need" in reason and "tensor_parallel_size=1" in reason
    # vLLM's start-up check: a KV cache of 1,000 tokens cannot hold one 2,048-token request
    small_kv = Scenario.from_dict({**ONE_AT_A_TIME, "kv_cache_memory": 800 * 1024 * 1000})
    refused, why = row_scenario(small_kv, "paged", 2048, 1)
    assert refused is None and why.startswith("vLLM would refuse to start: its KV cache holds 1,000 tokens")
    plan = capacity(
        base,
        slo=Slo(ttft_p99_s=10.0),
        allocators=["paged"],
        max_model_lens=[],
        tensor_parallel_sizes=[1, 2],
        jobs=1,
        sizing=SMALL,
    )
    assert [r["tensor_parallel_size"] for r in plan.rows] == [2]
    assert (
        list(plan.skipped_rows) == ["paged 2048/TP1"]
        and "weights need" in plan.skipped_rows["paged 2048/TP1"]
    )


def test_progress_reports_rows_and_simulations(tmp_path: Path) -> None:
    calls: list[tuple[int, int, int]] = []
    tally = tmp_path / "tally"
    tally.touch()
    plan = capacity(
        Scenario.from_dict(ONE_AT_A_TIME),
        slo=Slo(ttft_p99_s=10.0),
        allocators=["paged"],
        max_model_lens=[1024, 2048],
        rate_bracket=(5.0, 10.0),
        rel_tol=0.5,
        jobs=1,
        sizing=SMALL,
        progress=lambda *args: calls.append(args),
        tally_path=str(tally),
    )
    from sim.planning.capacity import count_simulations

    simulations = sum(count_simulations(r) for r in plan.rows)
    assert calls[0] == (0, 2, 0) and [c[0] for c in calls] == [0, 1, 2]
    assert calls[-1] == (2, 2, simulations) and simulations > 4
    # the worker processes counted every simulation in the tally file, one byte each, as they ran
    assert tally.stat().st_size == simulations


def test_progress_display_counts_the_tally_and_removes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.cli.capacity_setup import CapacityProgress

    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    with CapacityProgress(True) as show:
        assert show.tally_path is not None and show.simulations() == 0
        Path(show.tally_path).write_bytes(b"...")
        show(1, 4, 3)
        assert show.simulations() == 3
        show(2, 4, 7)  # rows finished on workers that could not write the tally still count
        assert show.simulations() == 7
        path = Path(show.tally_path)
    assert not path.exists() and show.tally_path is None
    with CapacityProgress(False) as quiet:  # --no-progress: no file at all
        assert quiet.tally_path is None


def _table_text(rows: list[dict], width: int, *, wide: bool = False) -> str:
    from rich.console import Console

    from sim.planning.plan_table import plan_table

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(plan_table(rows, "capacity", "caption", wide=wide))
    return console.export_text()


WIDE_ROW = {
    "allocator": "request_limit:oracle",
    "max_model_len": 131072,
    "tensor_parallel_size": 8,
    "kv_capacity_tokens": 1_033_456,
    "vllm_max_concurrency_x": 7.88,
    "max_concurrency": 2_345,
    "sustained_concurrency": 1_343.8,
    "saturation_throughput_req_s": 32.7,
    "max_rate_req_s": 32.7,
    "rate_status": "at_ceiling",
    "confirmation_p99_ttft_ms": 367_000.0,
    "confirmation_p99_tpot_ms": 108.7,
    "gpus_needed": 128,
}


def test_table_fits_80_columns_without_cutting_a_number() -> None:
    """bbd53f5 cut `request_limit:oracle` to `requ…` and `1,033,456` to `1,033,4…` at 80 columns."""
    from sim.planning.plan_table import needed_width

    assert needed_width([WIDE_ROW]) <= 80
    text = _table_text([WIDE_ROW], 80)
    assert all(len(line) <= 80 for line in text.splitlines()) and "…" not in text
    for cell in ("request_limit:oracle", "131072", "1,343.8", "32.7 (sat)", "367,000", "108.7", "128"):
        assert cell in text, cell
    wide = _table_text([WIDE_ROW], needed_width([WIDE_ROW], wide=True), wide=True)
    assert "1,033,456" in wide and "2,345" in wide and "…" not in wide
    # figures too long for 80 columns make the table wider (the CLI widens its console), never cut
    huge = {**WIDE_ROW, "confirmation_p99_ttft_ms": 123_456_789_012.0, "gpus_needed": 1_000_000}
    text = _table_text([huge], max(80, needed_width([huge])))
    assert "123,456,789,012" in text and "1000000" in text and "…" not in text


@pytest.fixture
def small_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("sim.planning.capacity.ProbeSizing", lambda: SMALL)
    path = tmp_path / "one.toml"
    path.write_text(Scenario.from_dict(ONE_AT_A_TIME).to_toml())
    return path


def test_cli_says_when_no_rate_meets_the_slo_and_how_probes_were_sized(
    small_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23 item 9: bbd53f5 printed "0 (<)" with no word, and ran probes of another size silently."""
    args = ["capacity", "--config", str(small_config), "--max-model-lens", "2K", "--jobs", "1"]
    code, out, _ = run_cli_output([*args, "--slo-ttft-p99", "1ns", "--num-prompts", "1"], capsys)
    flat = " ".join(out.split())
    assert code == 0
    assert "no rate meets the SLO for paged 2048/TP1: even at" in flat and "p99 TTFT 10 > 1e-06" in flat
    assert "--num-prompts 1: probes ran 100 prompts each (max of --num-prompts, 100 for a p99" in flat


def test_cli_slo_none_and_its_conflicts(small_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["capacity", "--config", str(small_config), "--max-model-lens", "2K", "--jobs", "1"]
    code, out, err = run_cli_output([*args, "--slo", "none", "--slo-ttft-p99", "2s"], capsys)
    assert code == 2 and "--slo none: give either --slo none or latency bounds" in err
    code, out, err = run_cli_output([*args, "--slo", "fast"], capsys)
    assert code == 2 and "--slo: only 'none' is accepted" in err
    code, out, _ = run_cli_output([*args, "--slo", "none"], capsys)
    assert code == 0 and "capacity · SLO: none (saturation rate)" in out and "9.52 (sat)" in out


def test_cli_plans_a_model_or_gpu_other_than_the_papers_on_vllm_v1() -> None:
    from sim.cli.capacity_setup import capacity_base_scenario

    base, notes = capacity_base_scenario({"model": "Llama-3-8B", "gpu": "H100-80GB"}, None)
    assert base.engine == "vllm-v1" and notes and notes[0].startswith("engine: vllm-v1 (today's vLLM)")
    base, notes = capacity_base_scenario({"model": "Llama-3-8B", "engine": "vllm-v0"}, None)
    assert base.engine == "vllm-v0" and notes == []
    base, notes = capacity_base_scenario({}, None)  # the paper's own setting keeps the paper's engine
    assert base.engine == "vllm-v0" and notes == []
    # a 70B model fits an H100 only from TP 2: the base scenario is the first TP that fits
    base, notes = capacity_base_scenario({"model": "Llama-3.1-70B", "gpu": "H100-80GB"}, [1, 2, 4])
    assert base.tensor_parallel_size == 2 and "first --tensor-parallel-size that fits" in notes[-1]
    assert not math.isnan(base.kv_capacity_tokens())


def test_an_unconfirmed_row_says_why_in_the_table_and_a_line() -> None:
    """Every long confirmation failed: the row's 0 is flagged and explained, not left bare."""
    from sim.planning.capacity import CapacityPlan
    from sim.planning.plan_table import RATE_FLAGS

    row = {
        "allocator": "paged",
        "max_model_len": 2048,
        "tensor_parallel_size": 1,
        "max_rate_req_s": 0.0,
        "rate_status": "unconfirmed",
        "confirmation_runs": [{"request_rate": 3.0, "reason": "p99 TTFT 9 s > 5 s"}],
    }
    plan = CapacityPlan(scenario={}, slo=None, target_rate_req_s=None, rows=[row])
    (line,) = plan.unmet_lines()
    assert "paged 2048/TP1" in line and "3 req/s" in line and "p99 TTFT 9 s > 5 s" in line
    assert "unconfirmed" in RATE_FLAGS
