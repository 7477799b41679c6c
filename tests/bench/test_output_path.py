"""vLLM v1's API-server loop: a burst taken in together, and outputs that wait for the loop
(sim/cost/server.py `interleaved_leave_s`, sim/cost/output_path.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _bench_helpers import bench_document, small_scenario, write_json

from sim.bench.replay import replay
from sim.bench.results_file import read_bench_file
from sim.cost.output_path import apply_output_path, fifo_finish_s, intake_jobs, loop_work, visible_s
from sim.cost.server import (
    PROFILE_KIND,
    PROFILE_SCHEMA,
    ServerTerms,
    busy_period_ends_s,
    frontend_arrivals,
    frontend_queue_s,
    intake_turn_share,
    interleaved_leave_s,
    load_profile_terms,
)


def test_fifo_finish_is_the_single_server_recurrence() -> None:
    rng = np.random.default_rng(7)
    arrival = np.sort(rng.uniform(0.0, 1.0, 200))
    work = rng.uniform(0.0, 0.01, 200)
    expected, free = [], -np.inf
    for a, w in zip(arrival, work, strict=True):
        free = max(free, a) + w
        expected.append(free)
    assert fifo_finish_s(arrival, work) == pytest.approx(expected, abs=1e-12)


def test_turn_share_spans_fifo_and_busy_period_end() -> None:
    send = np.array([0.0, 0.0, 0.0, 0.0, 10.0, 10.0])
    leave = frontend_queue_s(send, 1.0)
    assert np.array_equal(interleaved_leave_s(send, leave, 1.0, 1.0), leave)
    assert np.array_equal(interleaved_leave_s(send, leave, 1.0, 0.0), busy_period_ends_s(send, leave))
    # a burst of 4 at 1 s each, a quarter of it in the last turn: the last turns run from 3 s to 4 s
    assert interleaved_leave_s(send, leave, 1.0, 0.25)[:4] == pytest.approx([3.25, 3.5, 3.75, 4.0])


def test_front_end_in_the_engine_process_reads_a_turn_share_below_one_as_v1_does() -> None:
    """v0: the neutral share 1 keeps the whole busy period together (the rule before the share
    existed); a share below 1 interleaves the burst as in v1 (sim/cost/server.py intake_turn_share)."""
    assert intake_turn_share(True, 1.0) == 0.0
    assert intake_turn_share(True, 0.25) == 0.25
    assert intake_turn_share(False, 1.0) == 1.0
    table = pd.DataFrame({"request_id": np.arange(5), "arrival_s": [0.0, 0.0, 0.0, 0.0, 10.0]})
    send = table["arrival_s"].to_numpy()
    leave = frontend_queue_s(send, 1.0)
    whole, _ = frontend_arrivals(table, 1.0, blocking=True, turn_share=1.0)
    assert np.array_equal(whole["arrival_s"].to_numpy(), busy_period_ends_s(send, leave))
    for blocking in (True, False):
        shared, _ = frontend_arrivals(table, 1.0, blocking=blocking, turn_share=0.25)
        assert np.array_equal(shared["arrival_s"].to_numpy(), interleaved_leave_s(send, leave, 1.0, 0.25))


def test_intake_jobs_split_each_request_into_earlier_and_last_turns() -> None:
    send = np.zeros(4)
    leave = interleaved_leave_s(send, frontend_queue_s(send, 1.0), 1.0, 0.25)
    times, work = intake_jobs(send, leave, 1.0, 0.25)
    assert work.sum() == pytest.approx(4.0)  # the intake's whole work, once
    assert fifo_finish_s(np.sort(times), work[np.argsort(times, kind="stable")])[-1] == pytest.approx(4.0)


def _steps(rows: list[tuple[float, float, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["time_s", "duration_s", "iterations", "generated_tokens"])


def test_a_jump_row_spreads_its_outputs_over_its_iterations() -> None:
    times, work = loop_work(_steps([(0.0, 0.3, 3, 30)]), 1, 0.001)
    assert times == pytest.approx([0.1, 0.2, 0.3])
    assert work == pytest.approx([0.01, 0.01, 0.01])
    assert visible_s(np.array([0.2]), times, fifo_finish_s(times, work)) == pytest.approx([0.21])


def _requests(first: list[float], finish: list[float], tokens: list[int]) -> pd.DataFrame:
    first_s, finish_s = np.array(first), np.array(finish)
    gaps = np.array(tokens, dtype=np.float64) - 1.0
    return pd.DataFrame(
        {
            "first_token_s": first_s,
            "finish_s": finish_s,
            "generated_tokens": tokens,
            "ttft_ms": first_s * 1e3,
            "e2el_ms": finish_s * 1e3,
            "tpot_ms": (finish_s - first_s) * 1e3 / gaps,
            "itl_ms": (finish_s - first_s) * 1e3 / gaps,
        }
    )


def test_outputs_behind_the_loop_reach_the_client_late_and_merged() -> None:
    """Two requests, 3 tokens each over three 10 ms steps; the loop is busy with intake until 50 ms,
    then does the three steps' outputs in order (2 ms each): the first chunk at 52 ms, the last at
    56 ms, so the client's TPOT is 2 ms where the engine's is 10 ms (the tokens between merge)."""
    requests = _requests([0.01, 0.01], [0.03, 0.03], [3, 3])
    steps = _steps([(0.0, 0.01, 1, 2), (0.01, 0.01, 1, 2), (0.02, 0.01, 1, 2)])
    totals = {"duration_s": 0.03, "step_rows_stride": 1}
    intake = (np.zeros(1), np.array([0.05]))
    apply_output_path(requests, steps, totals, 0.001, intake)
    assert requests["ttft_ms"].to_numpy() == pytest.approx([52.0, 52.0])
    assert requests["e2el_ms"].to_numpy() == pytest.approx([56.0, 56.0])
    assert requests["tpot_ms"].to_numpy() == pytest.approx([2.0, 2.0])
    assert totals["duration_s"] == pytest.approx(0.056)


def test_an_idle_loop_adds_only_its_own_work() -> None:
    requests = _requests([0.01], [0.05], [5])
    steps = _steps([(0.0, 0.01, 1, 1), (0.01, 0.04, 4, 4)])
    totals = {"duration_s": 0.05, "step_rows_stride": 1}
    apply_output_path(requests, steps, totals, 0.0005)
    assert requests["ttft_ms"].to_numpy() == pytest.approx([10.5])
    assert requests["e2el_ms"].to_numpy() == pytest.approx([50.5])
    assert requests["tpot_ms"].to_numpy() == pytest.approx([10.0])  # the shift cancels


def test_neutral_loop_terms_change_nothing(tmp_path: Path) -> None:
    bench = read_bench_file(write_json(tmp_path / "r.json", bench_document([64] * 30, [6] * 30)))
    base = ServerTerms(frontend_s=0.01, frontend_service_s=0.004)
    plain = replay(bench, small_scenario(), base).simulated
    same = replay(
        bench,
        small_scenario(),
        ServerTerms(frontend_s=0.01, frontend_service_s=0.004, frontend_turn_share=1.0),
    ).simulated
    assert same == plain


def test_an_interleaved_burst_starts_later_and_the_loop_delays_its_outputs(tmp_path: Path) -> None:
    bench = read_bench_file(write_json(tmp_path / "r.json", bench_document([64] * 40, [4] * 40)))
    one_by_one = replay(bench, small_scenario(), ServerTerms(frontend_service_s=0.005)).simulated
    together = replay(
        bench, small_scenario(), ServerTerms(frontend_service_s=0.005, frontend_turn_share=0.25)
    ).simulated
    looped = replay(
        bench,
        small_scenario(),
        ServerTerms(frontend_service_s=0.005, frontend_turn_share=0.25, output_service_s=0.002),
    ).simulated
    assert together["mean_ttft_ms"] > one_by_one["mean_ttft_ms"]
    assert looped["mean_ttft_ms"] > together["mean_ttft_ms"]
    assert looped["request_throughput"] < together["request_throughput"]


def test_a_profile_written_before_the_loop_terms_loads_with_neutral_values(tmp_path: Path) -> None:
    terms = {
        "frontend_s": 0.01,
        "frontend_service_s": 0.002,
        "flops_efficiency_scale": 1.0,
        "overhead_scale": 1.0,
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"kind": PROFILE_KIND, "schema": PROFILE_SCHEMA, "terms": terms, "stack": {}}))
    loaded = load_profile_terms(path)
    assert loaded.frontend_turn_share == 1.0
    assert loaded.output_service_s == 0.0
