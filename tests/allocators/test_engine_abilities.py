"""What an allocator declares for the engine: its swap unit and whether its cache names content.

Why: the engine once asked `allocator.name == "paged"` to decide both; now each allocator declares
`swap_block_tokens` and `content_identity` (allocators/base.py), so a wrapper or a new family gets
them right without an edit in `sim/`.
"""

from __future__ import annotations

import pytest

from sim.scenario import Scenario, default_scenario


@pytest.mark.parametrize(("caching", "block"), [(False, 16), (True, 16), (True, 8)])
def test_paged_swaps_whole_blocks_and_names_content_with_caching(caching: bool, block: int) -> None:
    scenario = default_scenario().with_overrides(block_size=block, enable_prefix_caching=caching)
    alloc = scenario.make_allocator()
    assert alloc.swap_block_tokens == block
    assert alloc.content_identity is caching


@pytest.mark.parametrize("name", ["contiguous", "request_limit:oracle", "virtual"])
def test_slabs_and_pages_swap_tokens_and_name_nothing(name: str) -> None:
    alloc = default_scenario().with_overrides(allocator=name, enable_prefix_caching=True).make_allocator()
    assert alloc.swap_block_tokens == 1
    assert alloc.content_identity is False


def _gemma(**overrides: object) -> Scenario:
    """A sliding-window model (Gemma 3: window layers) in a small cache, block 32."""
    base = {"model": "Gemma-3-27B", "gpu": "H200-141GB", "kv_cache_memory": "4GiB", "block_size": 32}
    return default_scenario().with_overrides(**{**base, **overrides})


def test_the_window_wrapper_declares_what_its_paged_cache_declares() -> None:
    alloc = _gemma(enable_prefix_caching=True).make_allocator()
    assert type(alloc).__name__ == "UniformWindowAccounting"
    assert (alloc.swap_block_tokens, alloc.content_identity) == (32, True)


@pytest.mark.parametrize("caching", [False, True])
def test_hybrid_swaps_whole_blocks_and_names_content_with_caching(caching: bool) -> None:
    """The hybrid manager's blocks move and are cached like paged's (a fix of issue 22 §1: the engine
    once gave both to `paged` by name only)."""
    alloc = _gemma(allocator="hybrid", enable_prefix_caching=caching).make_allocator()
    assert (alloc.swap_block_tokens, alloc.content_identity) == (32, caching)
