"""The server's emulation of the open-loop arrival process gives what the SimPy process gives.

Why a test of its own (issue 24): the engine takes an open loop's arrival wake-ups inside its own loop
instead of as SimPy events, and must reproduce SimPy's order exactly, ties included: a wake-up at the
very end of a step runs before the step completes when it was scheduled before the step was, after
it otherwise; releasing a request before or after the step completes can change its admission check
under prefix caching. Times on a coarse grid with constant step times make such ties common.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _engine_helpers import FakePaged, LinearCost, make_requests, random_requests

from allocators.paged import PagedAllocator
from sim.core.engine import Engine, EngineConfig, EngineResult
from sim.engines import engine_policy


def _run(requests: pd.DataFrame, make_alloc, cost, config: EngineConfig, emulate: bool) -> EngineResult:
    return Engine(requests, make_alloc(), cost, config, emulate_open_loop=emulate).run()


def _assert_identical(a: EngineResult, b: EngineResult) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    for key, value in a.totals.items():
        if key != "wall_s":
            assert value == b.totals[key], key


def _grid_requests(rng: np.random.Generator, num: int) -> pd.DataFrame:
    """Arrivals on a 0.25 s grid (several at once, many on step ends) with prompts about the size of
    the cache: whether one is refused at arrival depends on whether its group's 256-token prefix is
    held at that moment (prefix caching), so releasing it before or after a step completes shows.
    (Checked: taking tied wake-ups always first, or always last, changes most of these runs.)"""
    arrival = np.cumsum(rng.integers(0, 3, num)) * 0.25
    prompt = rng.integers(560, 700, num)
    output = rng.integers(1, 6, num)
    requests = make_requests(arrival.tolist(), prompt.tolist(), output.tolist())
    requests["prefix_group"] = rng.integers(0, 2, num)
    requests["prefix_tokens"] = np.full(num, 256)
    return requests


@pytest.mark.parametrize("engine", ["vllm-v0", "vllm-v1"])
@pytest.mark.parametrize("seed", range(4))
def test_emulated_arrivals_match_the_simpy_process(engine: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    chunked = engine == "vllm-v1"
    config = EngineConfig(
        max_num_seqs=16,
        max_num_batched_tokens=128 if chunked else 1024,
        max_model_len=1024,
        enable_chunked_prefill=chunked,
        preemption_mode="recompute",
        policy=engine_policy(engine),
    )
    cases = [
        # ties everywhere: steps of exactly 0.25 s, arrivals on the same grid, refusals by cache state
        (
            _grid_requests(rng, 60),
            lambda: PagedAllocator("paged", 640, 16, enable_prefix_caching=True, share_prefixes=True),
            LinearCost(base_s=0.25),
        ),
        # continuous times, memory pressure (preemptions), idle gaps
        (
            random_requests(rng, 150, rate=8.0, mean_prompt=60, mean_output=50),
            lambda: FakePaged(40, 16),
            LinearCost(0.01, 1e-5, 2e-7),
        ),
    ]
    for requests, make_alloc, cost in cases:
        emulated = _run(requests, make_alloc, cost, config, emulate=True)
        reference = _run(requests, make_alloc, cost, config, emulate=False)
        _assert_identical(emulated, reference)
