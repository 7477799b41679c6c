"""Multi-iteration jumps must give what stepping one iteration at a time gives.

Requests tables: integers exactly, times to 1e-9 relative. Time-weighted taxonomy: exact (1e-9) for
slab allocators (parts linear inside a jump, interpolated by the engine: FakeSlab, contiguous,
request_limit) and for block allocators, which all have the exact `breakdown_integral` hook
(FakePaged here; paged and virtual).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _engine_helpers import FakePaged, FakeSlab, LinearCost, random_requests
from hypothesis import given
from hypothesis import strategies as st

from sim.core.engine import EngineConfig, EngineResult, run_engine
from sim.core.metrics import INTEGRATED_PARTS
from sim.engines import engine_policy


def preset_config(engine: str, config: dict) -> dict:
    """EngineConfig knobs of an engine preset's policy on top of `config` (v1 never swaps: None)."""
    if engine == "mixed":  # the engine's own default policy (no preset): mixed steps
        return dict(config)
    mode = config.get("preemption_mode")
    if engine == "vllm-v1" and mode == "swap":
        return None
    if engine == "vllm-v0" and mode is None:
        mode = "auto"
    return {
        **config,
        "preemption_mode": mode or "recompute",
        "policy": engine_policy(engine),
    }


ENGINES = ("mixed", "vllm-v0", "vllm-v1")


def assert_same_requests(jumped: pd.DataFrame, stepped: pd.DataFrame) -> None:
    assert list(jumped.columns) == list(stepped.columns)
    for column in jumped.columns:
        a, b = jumped[column], stepped[column]
        if a.dtype.kind == "f":
            np.testing.assert_allclose(
                a.to_numpy(), b.to_numpy(), rtol=1e-9, atol=0, equal_nan=True, err_msg=column
            )
        else:
            assert a.tolist() == b.tolist(), column


def assert_same_taxonomy(jumped: EngineResult, stepped: EngineResult) -> None:
    for part in INTEGRATED_PARTS:
        a, b = jumped.totals[f"{part}_token_s"], stepped.totals[f"{part}_token_s"]
        assert a == pytest.approx(b, rel=1e-9, abs=1e-6), part
    for key in ("running_seq_s", "queue_request_s", "generated_tokens", "prefill_tokens", "iterations"):
        assert jumped.totals[key] == pytest.approx(stepped.totals[key], rel=1e-9), key


def both_ways(requests: pd.DataFrame, make_alloc, cost, **config) -> tuple[EngineResult, EngineResult]:
    results = []
    for multi_step in (True, False):
        alloc = make_alloc()
        results.append(run_engine(requests, alloc, cost, EngineConfig(multi_step=multi_step, **config)))
        assert alloc.in_use() == 0
    return results[0], results[1]


CASES = {
    "slab": (lambda: FakeSlab(4000), {}),
    "paged-recompute": (lambda: FakePaged(2500, 16), {}),
    "paged-swap": (lambda: FakePaged(2500, 16), {"preemption_mode": "swap"}),
    "paged-chunked": (
        lambda: FakePaged(2500, 16),
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 96},
    ),
    "paged-tiny": (lambda: FakePaged(480, 16), {}),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", list(CASES))
def test_jumps_equal_stepping(case: str, engine: str) -> None:
    make_alloc, extra = CASES[case]
    requests = random_requests(np.random.default_rng(3), 250, rate=30.0, mean_prompt=120, mean_output=100)
    config = preset_config(
        engine, {"max_num_seqs": 40, "max_num_batched_tokens": 2048, "max_model_len": 2048, **extra}
    )
    if config is None:
        pytest.skip("vllm-v1 never swaps")
    jumped, stepped = both_ways(requests, make_alloc, LinearCost(0.01, 1e-5, 2e-7), **config)
    assert_same_requests(jumped.requests, stepped.requests)
    assert_same_taxonomy(jumped, stepped)
    assert jumped.totals["turns"] < stepped.totals["turns"]  # the jumps did happen


@pytest.mark.parametrize("engine", ENGINES)
def test_jumps_equal_stepping_with_forks_and_closed_loop(engine: str) -> None:
    rng = np.random.default_rng(5)
    requests = random_requests(rng, 120, rate=30.0, mean_prompt=80, mean_output=60)
    requests["n"] = rng.integers(1, 4, len(requests))
    requests["arrival_s"] = 0.0
    requests.attrs["closed_loop"] = {"users": 10, "think_s": 0.3}
    config = preset_config(
        engine, {"max_num_seqs": 32, "max_num_batched_tokens": 1024, "max_model_len": 1024}
    )
    jumped, stepped = both_ways(requests, lambda: FakePaged(3000, 16), LinearCost(0.02, 1e-5, 1e-7), **config)
    assert_same_requests(jumped.requests, stepped.requests)
    assert_same_taxonomy(jumped, stepped)


@given(
    seed=st.integers(0, 2**31 - 1),
    num=st.integers(1, 25),
    capacity=st.integers(40, 1500),
    block=st.sampled_from([1, 4, 16]),
    slab=st.booleans(),
    swap=st.booleans(),
    chunked=st.booleans(),
    engine=st.sampled_from(ENGINES),
)
def test_jumps_equal_stepping_property(
    seed: int, num: int, capacity: int, block: int, slab: bool, swap: bool, chunked: bool, engine: str
) -> None:
    rng = np.random.default_rng(seed)
    requests = random_requests(rng, num, rate=float(rng.uniform(1, 50)), mean_prompt=30, mean_output=40)
    make_alloc = (lambda: FakeSlab(capacity)) if slab else (lambda: FakePaged(capacity, block))
    config = {
        "max_num_seqs": int(rng.integers(1, 12)),
        "max_num_batched_tokens": 64 if chunked else 512,
        "max_model_len": 512,
        "preemption_mode": "swap" if swap else "recompute",
        "enable_chunked_prefill": chunked,
    }
    config = preset_config(engine, config) or preset_config("vllm-v0", config)  # v1 never swaps
    cost = LinearCost(float(rng.uniform(0.005, 0.05)), 1e-5, float(rng.uniform(0, 1e-5)))
    jumped, stepped = both_ways(requests, make_alloc, cost, **config)
    assert_same_requests(jumped.requests, stepped.requests)
    assert_same_taxonomy(jumped, stepped)
    table = jumped.requests
    assert int(table["generated_tokens"].sum()) == jumped.totals["generated_tokens"]
    assert table["finish_reason"].isin(["stop", "length", "kv_exhausted", "rejected"]).all()


@pytest.mark.parametrize("allocator", ["paged", "contiguous", "request_limit:oracle", "virtual"])
def test_real_allocators_jumps_equal_stepping(allocator: str) -> None:
    """The real allocators and cost model through sim.simulate, both ways, on a loaded small cache."""
    from sim.api import simulate
    from sim.scenario.scenario import default_scenario

    scenario = default_scenario().with_overrides(
        allocator=allocator, num_prompts=120, kv_cache_memory="3GiB", **{"workload.request_rate": 8.0}
    )
    workload = scenario.load_workload()
    jumped = simulate(scenario, workload=workload)
    stepped = simulate(scenario, workload=workload, multi_step=False)
    assert_same_requests(jumped.requests, stepped.requests)
    if allocator in ("paged", "virtual"):  # block allocators: exact only through the integral hook
        from allocators.base import AllocatorBase

        assert type(scenario.make_allocator()).breakdown_integral is not AllocatorBase.breakdown_integral
    for part in ("token_states", "reservation", "internal", "external", "free"):
        a, b = jumped.metrics[f"kv_{part}_pct"], stepped.metrics[f"kv_{part}_pct"]
        assert abs(a - b) <= 1e-9, part  # percentage points: exact for every shipped allocator
    assert jumped.metrics["engine_turns"] < stepped.metrics["engine_turns"]


@pytest.mark.parametrize(("engine", "tp"), [("vllm-v0", 1), ("vllm-v0", 2), ("vllm-v1", 1), ("vllm-v1", 4)])
def test_real_cost_model_jumps_equal_stepping_per_engine_and_tp(engine: str, tp: int) -> None:
    """The fitted cost model (overhead by batch size, smooth-max linear layers, TP all-reduce) keeps
    the jump exact: all of its batch-dependent parts are constant while a decode jump runs."""
    from sim.cost.model import CostModel
    from sim.scenario.scenario import default_scenario

    scenario = default_scenario().with_overrides(tensor_parallel_size=tp)
    cost = CostModel.from_scenario(scenario, engine=engine)
    assert cost.engine == engine and (cost.all_reduce is not None) == (tp > 1)
    requests = random_requests(np.random.default_rng(11), 150, rate=20.0, mean_prompt=120, mean_output=100)
    config = {"max_num_seqs": 32, "max_num_batched_tokens": 2048, "max_model_len": 2048}
    jumped, stepped = both_ways(requests, lambda: FakePaged(2500, 16), cost, **config)
    assert_same_requests(jumped.requests, stepped.requests)
    assert_same_taxonomy(jumped, stepped)
    assert jumped.totals["turns"] < stepped.totals["turns"]


@pytest.mark.parametrize("engine", ["vllm-v0", "vllm-v1"])
def test_jumps_equal_stepping_with_the_real_paged_allocator_and_prefix_caching(engine: str) -> None:
    """Both presets' rules with the real allocator: per-chunk allocation (v1), cached decode blocks
    (content identity), shared prefixes and preemption under a small cache."""
    from allocators.paged import PagedAllocator

    rng = np.random.default_rng(11)
    requests = random_requests(rng, 200, rate=40.0, mean_prompt=90, mean_output=80)
    requests["prefix_group"] = rng.integers(0, 3, len(requests))
    requests["prefix_tokens"] = np.minimum(40, requests["prompt_tokens"].to_numpy())
    chunked = engine == "vllm-v1"
    config = preset_config(
        engine,
        {
            "max_num_seqs": 24,
            "max_num_batched_tokens": 64 if chunked else 1024,
            "max_model_len": 1024,
            "enable_chunked_prefill": chunked,  # v1 then allocates per chunk (VllmV1Policy)
        },
    )
    results = []
    for multi_step in (True, False):
        alloc = PagedAllocator("paged", 1600, 16, enable_prefix_caching=True, share_prefixes=True)
        results.append(
            run_engine(
                requests, alloc, LinearCost(0.01, 1e-5, 2e-7), EngineConfig(multi_step=multi_step, **config)
            )
        )
        assert alloc.pool.num_free == alloc.num_blocks  # everything released
    jumped, stepped = results
    assert_same_requests(jumped.requests, stepped.requests)
    assert_same_taxonomy(jumped, stepped)
    assert jumped.totals["turns"] < stepped.totals["turns"]
    assert jumped.requests["preemptions"].sum() > 0
    assert jumped.requests["prefix_hit_tokens"].sum() > 0
