"""The paged allocators' exact jump integral (`breakdown_integral`) against stepping one token at a time."""

from __future__ import annotations

import numpy as np
import pytest

from allocators import SeqSpec, make_allocator
from allocators.jump_integral import INTEGRATED_PARTS, _stepped_integral

CONFIGS = [
    ("paged", {"block_size": 16}),
    ("paged", {"block_size": 5, "enable_prefix_caching": True}),
    ("paged", {"block_size": 1}),
    ("paged", {"block_size": 8, "share_prefixes": False}),
    ("virtual", {"max_model_len": 4000, "page_bytes": 96, "bytes_per_token_per_layer": 8}),
]


def _loaded(name: str, params: dict, rng: np.random.Generator, fork: bool) -> tuple[object, np.ndarray]:
    """An allocator with live, released (cached) and optionally forked sequences."""
    alloc = make_allocator(name, capacity_tokens=int(rng.integers(2000, 5000)), **params)
    live: list[int] = []
    for seq_id in range(40):
        prompt = int(rng.integers(1, 120))
        group = int(rng.integers(-1, 3))
        spec = SeqSpec(
            seq_id,
            prompt + (50 if group >= 0 else 0),
            max_tokens=500,
            output_tokens=int(rng.integers(1, 300)),
            prefix_group=group,
            prefix_tokens=50 if group >= 0 else 0,
        )
        if alloc.admit(spec):
            live.append(seq_id)
        if live and rng.random() < 0.3:
            alloc.release(live.pop(int(rng.integers(len(live)))))
    if fork and live:
        child = SeqSpec(1000, 10, max_tokens=500, output_tokens=400)
        if alloc.fork(live[0], child):
            live.append(1000)
    return alloc, np.array(live, dtype=np.int64)


@pytest.mark.parametrize("name, params", CONFIGS)
@pytest.mark.parametrize("seed", range(6))
def test_closed_form_equals_stepping(name: str, params: dict, seed: int) -> None:
    rng = np.random.default_rng(seed)
    alloc, live = _loaded(name, params, rng, fork=seed % 3 == 0)
    if live.size == 0:
        pytest.skip("nothing admitted")
    ids = live[rng.random(live.size) < 0.8]
    to_final = int((alloc.final_tokens[ids] - alloc.lengths_tokens[ids]).min()) if ids.size else 60
    steps = 1 + alloc.max_uniform_growth(ids, max(0, min(60, to_final)))
    durations = rng.uniform(0.01, 0.05, size=steps)
    demand = int(rng.integers(0, 200))
    exact = alloc.breakdown_integral(ids, durations, demand)
    stepped = _stepped_integral(alloc, ids, durations, demand)
    for part in INTEGRATED_PARTS:
        assert exact[part] == pytest.approx(stepped[part], rel=1e-9, abs=1e-9), part
    before = alloc.breakdown(demand)
    assert alloc.breakdown(demand) == before  # the hook grows nothing


def test_cached_blocks_evicted_during_a_jump_are_integrated() -> None:
    alloc = make_allocator("paged", capacity_tokens=8 * 4, block_size=4, enable_prefix_caching=True)
    assert alloc.admit(SeqSpec(0, 16, 1, 1, prefix_group=1, prefix_tokens=16))
    alloc.release(0)  # 4 cached blocks at the queue tail
    assert alloc.admit(SeqSpec(1, 4, 100, 100))  # pops one uncached block
    ids = np.array([1])
    steps = 1 + alloc.max_uniform_growth(ids, 100)
    assert steps == 29  # 7 free blocks -> up to 32 tokens
    durations = np.linspace(0.1, 0.2, steps)
    exact = alloc.breakdown_integral(ids, durations, 0)
    stepped = _stepped_integral(alloc, ids, durations, 0)
    assert exact["cached"] == pytest.approx(stepped["cached"]) and exact["cached"] < 16 * durations.sum()
