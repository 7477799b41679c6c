"""Engine behaviour on hand-checkable scenarios: exact timings, conservation, livelock guard."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _engine_helpers import FakePaged, FakeSlab, LinearCost, make_requests, random_requests

from sim.core.engine import EngineClock, EngineConfig, run_engine

BIG = EngineConfig(max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=4096)


@pytest.mark.parametrize("multi_step", [True, False])
def test_three_requests_constant_step_exact_ttft(multi_step: bool) -> None:
    """Step = 1 s. A(t=0, prompt 10, 3 tokens), B(t=0.5, prompt 5, 2 tokens), C(t=2.5, prompt 4, 1 token).

    [0,1) prefill A -> A's 1st token at 1.  [1,2) decode A + prefill B (arrived 0.5) -> B's 1st at 2.
    [2,3) decode A (3rd, done) + B (2nd, done).  [3,4) prefill C (arrived 2.5) -> done at 4.
    """
    requests = make_requests([0.0, 0.5, 2.5], [10, 5, 4], [3, 2, 1])
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, multi_step=multi_step)
    result = run_engine(requests, FakeSlab(1000), LinearCost(base_s=1.0), config)
    table = result.requests
    assert table["first_token_s"].tolist() == [1.0, 2.0, 4.0]
    assert table["finish_s"].tolist() == [3.0, 3.0, 4.0]
    assert table["ttft_ms"].tolist() == [1000.0, 1500.0, 1500.0]
    assert table["e2el_ms"].tolist() == [3000.0, 2500.0, 1500.0]
    assert table["tpot_ms"].tolist()[:2] == [1000.0, 1000.0]
    assert math.isnan(table["tpot_ms"].iloc[2])
    assert table["normalized_latency_s_per_token"].tolist() == [1.0, 1.25, 1.5]
    assert table["admitted_s"].tolist() == [0.0, 1.0, 3.0]
    assert table["generated_tokens"].tolist() == [3, 2, 1]
    assert table["finish_reason"].tolist() == ["stop", "stop", "stop"]
    assert result.totals["duration_s"] == 4.0
    assert result.totals["iterations"] == 4
    steps = result.steps
    assert steps["batch_size"].tolist() == [1, 2, 2, 1]
    assert steps["prefill_tokens"].tolist() == [10, 5, 0, 4]
    assert steps["generated_tokens"].tolist() == [1, 2, 2, 1]
    # Token states during each step: [0,1) 10; [1,2) A 11 + B 5; [2,3) A 12 + B 6; [3,4) C 4.
    assert steps["token_states"].tolist() == [10, 16, 18, 4]
    assert result.totals["token_states_token_s"] == 10 + 16 + 18 + 4
    # B waited 0.5 s, C 0.5 s: mean queue length over 4 s is 0.25.
    assert result.totals["queue_request_s"] == pytest.approx(1.0)


def test_max_tokens_and_max_model_len_cap_generation() -> None:
    requests = make_requests([0.0, 0.0], [10, 60], [50, 50], max_tokens=[5, 50])
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=64)
    table = run_engine(requests, FakeSlab(1000), LinearCost(base_s=0.1), config).requests
    assert table["generated_tokens"].tolist() == [5, 4]  # max_tokens; 64 - 60 = 4 by max_model_len
    assert table["finish_reason"].tolist() == ["length", "length"]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize(
    "make_alloc", [lambda: FakePaged(2000, 16), lambda: FakeSlab(3000)], ids=["paged", "slab"]
)
def test_conservation_under_memory_pressure(mode: str, make_alloc) -> None:
    rng = np.random.default_rng(7)
    requests = random_requests(rng, 300, rate=40.0, mean_prompt=150, mean_output=120)
    alloc = make_alloc()
    config = EngineConfig(
        max_num_seqs=48, max_num_batched_tokens=2048, max_model_len=2048, preemption_mode=mode
    )
    result = run_engine(requests, alloc, LinearCost(0.01, 1e-5, 1e-7), config)
    table, steps = result.requests, result.steps
    assert alloc.in_use() == 0  # every sequence released
    assert int(steps["generated_tokens"].sum()) == int(table["generated_tokens"].sum())
    assert int(table["generated_tokens"].sum()) == result.totals["generated_tokens"]
    done = table[table["finish_reason"].isin(["stop", "length"])]
    assert (done["generated_tokens"] == np.minimum(done["output_tokens"], done["max_tokens"])).all()
    # Prefill compute = every admitted prompt once + whatever recompute re-prefilled.
    admitted = table[~table["rejected"]]
    expected_prefill = int(admitted["prompt_tokens"].sum()) + int(table["recomputed_tokens"].sum())
    assert int(steps["prefill_tokens"].sum()) == expected_prefill == result.totals["prefill_tokens"]
    if mode == "recompute":
        assert (table["recomputed_tokens"] > 0).sum() == (table["preemptions"] > 0).sum()
    else:
        assert table["recomputed_tokens"].sum() == 0
    if isinstance(alloc, FakePaged):  # slabs reserve up front: they queue instead of preempting
        assert table["preemptions"].sum() > 0
    assert result.totals["iterations"] == int(steps["iterations"].sum())


def test_tiny_cache_terminates_with_rejections_and_truncation() -> None:
    """64 slots: a 100-token prompt can never fit (rejected); long generations get truncated when alone."""
    requests = make_requests([0.0, 0.1, 0.2, 0.3], [20, 100, 30, 10], [200, 5, 300, 20])
    alloc = FakePaged(64, 16)
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=512)
    table = run_engine(requests, alloc, LinearCost(base_s=0.01), config).requests
    assert alloc.in_use() == 0
    assert table["rejected"].tolist() == [False, True, False, False]
    assert "100" in table["rejection_reason"].iloc[1] or "64" in table["rejection_reason"].iloc[1]
    assert table["finish_reason"].iloc[0] == "kv_exhausted"
    assert table["generated_tokens"].iloc[0] == 64 - 20 + 1  # filled the cache, plus the unstored last token
    assert table["finish_reason"].iloc[3] == "stop"
    assert np.isfinite(table.loc[~table["rejected"], "finish_s"]).all()


def test_unadmittable_prompt_and_batch_limits_are_rejected_with_reasons() -> None:
    requests = make_requests([0.0, 0.0, 0.0], [600, 300, 10], [5, 5, 5], n=[1, 1, 9])
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512)
    table = run_engine(requests, FakeSlab(10_000), LinearCost(), config).requests
    reasons = table["rejection_reason"].tolist()
    assert "max_model_len" in reasons[0]
    assert "max_num_batched_tokens" in reasons[1]
    assert "max_num_seqs" in reasons[2]
    assert table["rejected"].all()


def test_parallel_samples_fork_and_finish_together() -> None:
    requests = make_requests([0.0], [32], [10], n=[3])
    alloc = FakePaged(1000, 16)
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512)
    result = run_engine(requests, alloc, LinearCost(base_s=1.0), config)
    row = result.requests.iloc[0]
    assert row["generated_tokens"] == 30
    assert row["finish_s"] == 10.0 and row["first_token_s"] == 1.0
    assert row["tpot_ms"] == 1000.0
    assert result.steps["prefill_tokens"].sum() == 32  # one prefill for all samples
    assert alloc.in_use() == 0


def test_closed_loop_users_send_after_think_time() -> None:
    requests = make_requests([0.0] * 4, [8] * 4, [2] * 4)
    requests.attrs["closed_loop"] = {"users": 2, "think_s": 0.5}
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512)
    table = run_engine(requests, FakeSlab(1000), LinearCost(base_s=1.0), config).requests
    # Requests 0 and 1 run [0,2); each user thinks 0.5 s, so 2 and 3 arrive at 2.5 and, the server
    # being idle, run at once: [2.5, 4.5).
    assert table["arrival_s"].tolist() == [0.0, 0.0, 2.5, 2.5]
    assert table["finish_s"].tolist() == [2.0, 2.0, 4.5, 4.5]


def test_engine_clock_moves_itself_only_while_nothing_else_is_due() -> None:
    """The serving loop's own clock step (issue 24): refused at or past the next scheduled event, and
    a later timeout counts from the moved clock, as if SimPy had fired a timeout there."""
    env = EngineClock()
    env.timeout(2.0)  # another process's wake-up
    assert env.advance_to(1.5) and env.now == 1.5
    assert not env.advance_to(2.0) and not env.advance_to(2.5)  # SimPy must order that event first
    assert env.now == 1.5
    fired: list[float] = []

    def sleeper():  # a SimPy generator
        yield env.timeout(0.25)
        fired.append(env.now)

    env.process(sleeper())
    env.run()
    assert fired == [1.75] and env.now == 2.0
