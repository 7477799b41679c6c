"""The hybrid allocator with prefix caching in the engine (issue 14): Gemma-3-27B on a shared system prompt.

A run through `sim.simulate` must hit the cache (the 900-token system prompt: 56 whole blocks of 16,
found in the full groups from block 0 and in the window groups, whose window of 1024 tokens reads
all of them), and the engine's multi-step jumps must give what stepping gives: with cached blocks in
the free queue, the order of releases and evictions decides later hits (hybrid_caching.py `grow`).
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.api import simulate
from sim.scenario.scenario import default_scenario


def gemma_scenario(caching: bool, **overrides: object):
    return default_scenario().with_overrides(
        model="Gemma-3-27B",
        gpu="H100",
        allocator="hybrid",
        enable_prefix_caching=caching,
        max_model_len=8192,
        num_prompts=120,
        **{"workload.source": "chat-system-prompt", "workload.request_rate": 6.0},
        **overrides,
    )


def test_gemma_hybrid_with_prefix_caching_hits_the_shared_system_prompt() -> None:
    cached = simulate(gemma_scenario(True))
    plain = simulate(gemma_scenario(False))
    hits = cached.requests["prefix_hit_tokens"].to_numpy()
    assert hits.max() == 896  # 900 tokens, whole blocks of 16
    assert (hits > 0).mean() > 0.5  # 80 % of requests carry the system prompt
    assert plain.requests["prefix_hit_tokens"].sum() == 0
    # the hit tokens are not prefilled again, and the shared blocks are stored once
    assert cached.metrics["total_recomputed_tokens"] == 0  # no preemption: then every prompt once
    prompts = int(cached.requests["prompt_tokens"].sum())
    assert cached.metrics["total_prefill_tokens"] == prompts - int(hits.sum())
    assert cached.metrics["kv_token_states_pct"] < plain.metrics["kv_token_states_pct"]
    assert cached.metrics["kv_cached_pct"] > 0 == plain.metrics["kv_cached_pct"]


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize(
    ("engine", "memory"), [("vllm-v0", "8GiB"), ("vllm-v1", "8GiB"), ("vllm-v0", "2GiB"), ("vllm-v1", "2GiB")]
)
def test_hybrid_jumps_equal_stepping_under_a_small_cache(engine: str, memory: str, caching: bool) -> None:
    """Preemptions and evictions (a cache of a few requests) with both presets' rules.

    At 2 GiB this failed before sliding-window frees were declared (`frees_while_growing`): a jump
    credited blocks that later sequences free, and a waiting request was admitted later than stepping
    admits it once a window slides.
    """
    scenario = gemma_scenario(caching, engine=engine, kv_cache_memory=memory)
    workload = scenario.load_workload()
    jumped = simulate(scenario, workload=workload)
    stepped = simulate(scenario, workload=workload, multi_step=False)
    for column in jumped.requests.columns:
        a, b = jumped.requests[column], stepped.requests[column]
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-9, equal_nan=True, err_msg=column)
        else:
            assert a.tolist() == b.tolist(), column
    assert jumped.metrics["engine_turns"] < stepped.metrics["engine_turns"]
    assert (jumped.requests["prefix_hit_tokens"].sum() > 0) == caching
    assert jumped.requests["preemptions"].sum() > 0
