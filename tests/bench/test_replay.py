"""Replaying a result file: exact requests, the front end's place; a file kvsim wrote is matched exactly."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from _bench_helpers import bench_document, simulated_file, small_scenario, write_json

from sim.bench.replay import MAPE_METRICS, replay
from sim.bench.results_file import BenchFileError, read_bench_file
from sim.cost.model import CostModel
from sim.cost.server import ServerTerms


def test_a_file_written_by_kvsim_replays_with_zero_error(tmp_path: Path) -> None:
    scenario = small_scenario()
    terms = ServerTerms(frontend_s=0.04, flops_efficiency_scale=0.7, overhead_scale=0.5)
    bench = read_bench_file(simulated_file(tmp_path / "own.json", scenario, terms))
    result = replay(bench, scenario, terms)
    for metric in MAPE_METRICS:
        assert result.error_pct(metric) == pytest.approx(0.0, abs=1e-9), metric
    assert result.mape_pct() == pytest.approx(0.0, abs=1e-9)


def test_front_end_adds_to_ttft_and_e2e_only(tmp_path: Path) -> None:
    """Open loop: the front end delays what the client sees, not the engine (TPOT, throughput unchanged)."""
    scenario = small_scenario()
    bench = read_bench_file(
        write_json(tmp_path / "r.json", bench_document([50, 300, 120, 80], [10, 40, 3, 25]))
    )
    plain = replay(bench, scenario, ServerTerms.neutral()).simulated
    fronted = replay(bench, scenario, ServerTerms(frontend_s=0.060)).simulated
    for stem in ("ttft_ms", "e2el_ms"):
        for stat in ("mean", "median", "p99"):
            key = f"{stat}_{stem}"
            assert fronted[key] == pytest.approx(plain[key] + 60.0, abs=1e-9)
    for key in ("mean_tpot_ms", "p99_tpot_ms", "request_throughput", "output_throughput"):
        assert fronted[key] == plain[key]


def test_closed_loop_front_end_slows_the_loop(tmp_path: Path) -> None:
    """max_concurrency 1: each next request waits for the previous one plus the front end."""
    scenario = small_scenario()
    doc = bench_document([40] * 6, [8] * 6, max_concurrency=1)
    bench = read_bench_file(write_json(tmp_path / "r.json", doc))
    plain = replay(bench, scenario, ServerTerms.neutral()).simulated
    fronted = replay(bench, scenario, ServerTerms(frontend_s=0.1)).simulated
    expected_duration = 6 / plain["request_throughput"] + 5 * 0.1  # five gaps between six requests
    assert 6 / fronted["request_throughput"] == pytest.approx(expected_duration, rel=1e-9)


def test_slower_flops_slow_prefill_and_overhead_slows_decode() -> None:
    scenario = small_scenario()
    base = CostModel.from_scenario(scenario, server=ServerTerms.neutral())
    slow = CostModel.from_scenario(scenario, server=ServerTerms(flops_efficiency_scale=0.5))
    heavy = CostModel.from_scenario(scenario, server=ServerTerms(overhead_scale=2.0))
    assert slow.flops_per_s == pytest.approx(base.flops_per_s * 0.5)
    assert slow.step_time_s(8192, 0, 0, 8192 * 8193 // 2) > 1.5 * base.step_time_s(
        8192, 0, 0, 8192 * 8193 // 2
    )
    assert heavy.overhead_time_s(64) == pytest.approx(2.0 * base.overhead_time_s(64))
    assert heavy.hbm_bytes_per_s == base.hbm_bytes_per_s


def test_neutral_terms_leave_the_cost_model_unchanged() -> None:
    """No bench profile: the same coefficients as before the server terms existed (results unchanged)."""
    scenario = small_scenario()
    default = CostModel.from_scenario(scenario)
    neutral = CostModel.from_scenario(scenario, server=ServerTerms.neutral())
    assert default == neutral and default.frontend_s == 0.0


def test_failed_run_and_unrunnable_requests_are_one_line(tmp_path: Path) -> None:
    failed = bench_document([10] * 10, [5] * 10, completed=2)
    with pytest.raises(BenchFileError, match="only 2 of 10 requests completed"):
        replay(read_bench_file(write_json(tmp_path / "f.json", failed)), small_scenario())
    too_long = bench_document([10, 4000], [5, 5])
    with pytest.raises(BenchFileError, match="1 of 2 requests cannot run"):
        replay(read_bench_file(write_json(tmp_path / "l.json", too_long)), small_scenario())


def test_replay_is_deterministic(tmp_path: Path) -> None:
    doc = bench_document([30, 200, 90] * 10, [20, 5, 60] * 10, request_rate=8.0)
    bench = read_bench_file(write_json(tmp_path / "r.json", doc))
    first = replay(bench, small_scenario(seed=3)).simulated
    again = replay(bench, small_scenario(seed=3)).simulated
    assert first.keys() == again.keys()
    for key, value in first.items():
        assert value == again[key] or (math.isnan(value) and math.isnan(again[key])), key


def test_frontend_queue_is_a_fifo_single_server() -> None:
    from sim.cost.server import busy_period_ends_s, frontend_queue_s

    send = np.array([0.0, 0.0, 0.0, 1.0, 1.001, 5.0])
    leave = frontend_queue_s(send, 0.01)
    expected, last = [], -np.inf
    for t in send:  # the recurrence, one request at a time
        last = max(t, last) + 0.01
        expected.append(last)
    assert leave == pytest.approx(expected, abs=1e-12)
    # busy periods: {0,1,2} ends at 0.03, {3,4} at 1.02, {5} at 5.01
    assert busy_period_ends_s(send, leave) == pytest.approx([0.03, 0.03, 0.03, 1.02, 1.02, 5.01])
    assert np.array_equal(frontend_queue_s(send, 0.0), send)


def test_front_end_in_the_engine_process_delays_a_burst_until_it_is_handled(tmp_path: Path) -> None:
    """v0: all 40 requests of a burst reach the engine after 40 x 5 ms; v1 (own process): one by one."""
    bench = read_bench_file(write_json(tmp_path / "r.json", bench_document([64] * 40, [4] * 40)))
    blocking = replay(
        bench, small_scenario(), ServerTerms(frontend_service_s=0.005, frontend_in_engine_process=True)
    )
    pipelined = replay(
        bench, small_scenario(), ServerTerms(frontend_service_s=0.005, frontend_in_engine_process=False)
    )
    assert blocking.simulated["median_ttft_ms"] > pipelined.simulated["median_ttft_ms"]
    assert blocking.simulated["mean_ttft_ms"] >= 200.0  # nobody's first token before the burst is handled
