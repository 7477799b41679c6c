"""Jump-equals-stepping for SGLang: the radix allocator under the sglang policy, both ways.

The house rule (tests/core/test_engine_jumps.py): multi-iteration decode jumps must give the tables
and the time-weighted taxonomy that stepping one iteration at a time gives. Here with what SGLang
adds: a radix tree whose cached leaves are evicted LRU while decodes grow (the jump stops before an
eviction), pages of 1 and 16 tokens (the exact page integral), prefill steps without decodes, the
new-token-ratio gate (no jump while it refuses) and retraction under a small cache.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from _engine_helpers import LinearCost, random_requests
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine_jumps import assert_same_requests, assert_same_taxonomy

from allocators.radix import RadixAllocator
from sim.core.engine import EngineConfig, EngineResult, run_engine
from sim.engines import engine_policy


def run_both_ways(
    requests: pd.DataFrame, capacity: int, page: int, engine: str = "sglang", **config: int
) -> tuple[EngineResult, EngineResult]:
    """(jumped, stepped) over fresh radix allocators; everything is released at the end of each."""
    knobs = {"max_num_seqs": 24, "max_num_batched_tokens": 64, "max_model_len": 1024, **config}
    results = []
    for multi_step in (True, False):
        alloc = RadixAllocator(capacity, page)
        engine_config = EngineConfig(
            multi_step=multi_step,
            enable_chunked_prefill=True,
            preemption_mode="recompute",
            policy=engine_policy(engine),
            **knobs,
        )
        results.append(run_engine(requests, alloc, LinearCost(0.01, 1e-5, 2e-7), engine_config))
        parts = alloc.breakdown(0)
        assert parts.token_states == 0 and alloc.tree.protected_tokens == 0  # all released
    return results[0], results[1]


def shared_prefix_requests(seed: int, num: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    requests = random_requests(rng, num, rate=40.0, mean_prompt=90, mean_output=80)
    requests["prefix_group"] = rng.integers(0, 3, len(requests))
    requests["prefix_tokens"] = np.minimum(40, requests["prompt_tokens"].to_numpy())
    return requests


def test_radix_jumps_equal_stepping_with_eviction_and_retraction() -> None:
    requests = shared_prefix_requests(11, 200)
    for page, engine in ((1, "sglang"), (16, "sglang"), (1, "sglang-fcfs")):
        jumped, stepped = run_both_ways(requests, 1600, page, engine)
        assert_same_requests(jumped.requests, stepped.requests)
        assert_same_taxonomy(jumped, stepped)
        assert jumped.totals["turns"] < stepped.totals["turns"]
        assert jumped.requests["preemptions"].sum() > 0  # retraction happened
        assert jumped.requests["prefix_hit_tokens"].sum() > 0  # the tree served shared prefixes
        assert jumped.totals["cached_token_s"] > 0  # leaves were kept as cached


@settings(max_examples=25)
@given(
    seed=st.integers(0, 2**31 - 1),
    num=st.integers(1, 30),
    capacity=st.integers(200, 2500),
    page=st.sampled_from([1, 4, 16]),
    seqs=st.integers(1, 12),
)
def test_radix_jumps_equal_stepping_property(
    seed: int, num: int, capacity: int, page: int, seqs: int
) -> None:
    requests = shared_prefix_requests(seed, num)
    jumped, stepped = run_both_ways(requests, capacity, page, max_num_seqs=seqs)
    assert_same_requests(jumped.requests, stepped.requests)
    assert_same_taxonomy(jumped, stepped)


def test_real_scenario_sglang_jumps_equal_stepping() -> None:
    """sim.simulate with --engine sglang and the radix allocator on the chat-system-prompt workload."""
    from sim.api import simulate
    from sim.scenario.scenario import default_scenario

    scenario = default_scenario().with_overrides(
        engine="sglang",
        allocator="radix",
        num_prompts=120,
        kv_cache_memory="2GiB",
        **{"workload.source": "chat-system-prompt", "workload.request_rate": 6.0},
    )
    workload = scenario.load_workload()
    jumped = simulate(scenario, workload=workload)
    stepped = simulate(scenario, workload=workload, multi_step=False)
    assert_same_requests(jumped.requests, stepped.requests)
    for part in ("token_states", "internal", "external", "free", "cached"):
        a, b = jumped.metrics[f"kv_{part}_pct"], stepped.metrics[f"kv_{part}_pct"]
        assert abs(a - b) <= 1e-9, part
    assert jumped.metrics["engine_turns"] < stepped.metrics["engine_turns"]
