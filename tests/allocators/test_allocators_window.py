"""Sliding-window allocators (issue 14): hybrid paged, windowed contiguous, uniform paged accounting.

Hand-computed breakdowns for small cases, then hypothesis property tests of the hybrid allocator:
blocks are conserved, no block has two owners, the layer-slot taxonomy sums to capacity, and
everything is free once every sequence is released.
"""

from __future__ import annotations

import numpy as np
import pytest
from _window_helpers import check_hybrid, check_hybrid_all_free, no_release_blocks, no_release_cap
from hypothesis import given
from hypothesis import strategies as st

from allocators import AllocatorConfigError, SeqSpec, make_allocator
from allocators.hybrid import HybridPagedAllocator
from allocators.hybrid_caching import HybridPrefixCachingAllocator
from allocators.windowed import LayerPlan

# A Gemma-3-like miniature: 6 layers, 5 windowed (window 8 tokens), 1 full; blocks of 4 tokens.
PLAN = {"num_layers": 6, "num_window_layers": 5, "window_tokens": 8}


def seq(seq_id: int, prompt: int, output: int = 100, max_tokens: int = 100) -> SeqSpec:
    return SeqSpec(seq_id=seq_id, prompt_tokens=prompt, max_tokens=max_tokens, output_tokens=output)


def test_hybrid_frees_blocks_that_slide_out_of_the_window() -> None:
    alloc = make_allocator("hybrid", capacity_tokens=100, block_size=4, **PLAN)
    assert isinstance(alloc, HybridPagedAllocator)
    assert alloc.capacity_tokens == 600  # layer-slots: 100 tokens x 6 layers
    assert (alloc.group_layers, alloc.num_full_groups, alloc.num_window_groups) == (1, 1, 5)
    assert alloc.admit(seq(0, prompt=20))
    # the whole prompt in every layer at admission: 5 blocks x 6 groups
    assert alloc.num_blocks - alloc.pool.num_free == 30
    parts = alloc.breakdown()
    # next token (position 20) reads positions 13..20: 13 tokens skipped in 5 window layers
    assert parts.out_of_window == 5 * 13
    assert parts.token_states == 1 * 20 + 5 * 7
    assert alloc.grow(np.array([0]), 1).size == 0  # length 21: skipped 14 -> blocks 0..2 freed
    held_window_blocks = alloc.num_seq_blocks[0] - alloc.first_window_block[0]
    assert (alloc.num_seq_blocks[0], alloc.first_window_block[0]) == (6, 3)
    assert alloc.num_blocks - alloc.pool.num_free == 6 + 5 * held_window_blocks
    parts = alloc.breakdown()
    assert parts.out_of_window == 5 * (14 - 12)  # positions 12, 13 of block 3
    assert parts.token_states == 21 + 5 * 7
    assert sum(parts.as_dict()[p] for p in ("token_states", "reservation", "internal", "out_of_window")) == (
        1 * 6 * 4 + 5 * 3 * 4  # full: 6 blocks of 4 tokens; window: blocks 3..5
    )
    alloc.release(0)
    assert alloc.pool.num_free == alloc.num_blocks


def test_chunked_prefill_admits_only_the_last_chunks_window() -> None:
    alloc = make_allocator("hybrid", capacity_tokens=100, block_size=4, prefill_chunk_tokens=8, **PLAN)
    # prompt 40, last chunk [32, 40) reads back to 32 - 8 + 1 = 25: window groups hold blocks 6..9
    assert alloc.demand_tokens(seq(0, prompt=40)) == (1 * 10 + 5 * 4) * 4
    assert alloc.admit(seq(0, prompt=40))
    assert alloc.first_window_block[0] == 6
    assert alloc.breakdown().out_of_window == 5 * (33 - 24)  # positions 24..32 of blocks 6..8
    assert alloc.admit(seq(1, prompt=8))  # a prompt within one chunk: every block, as without chunks
    assert alloc.first_window_block[1] == 0


def test_windowed_contiguous_reserves_the_window_on_window_layers() -> None:
    alloc = make_allocator("contiguous", capacity_tokens=200, max_model_len=32, **PLAN)
    # slab: 1 full layer x 32 + 5 window layers x 8 = 72 layer-slots
    assert alloc.demand_tokens(seq(0, prompt=10, output=5)) == 72
    assert alloc.admit(seq(0, prompt=10, output=5))
    parts = alloc.breakdown()
    assert parts.token_states == 10 + 5 * 8
    assert parts.reservation == 5  # full layer: 5 more tokens; window layers already full
    assert parts.internal == 72 - 15 - 40
    assert parts.out_of_window == 0
    assert alloc.grow(np.array([0]), 22).size == 0  # up to 32 = max_model_len
    assert alloc.grow(np.array([0]), 1).size == 1  # the slab ends at max_model_len on full layers


def test_uniform_paged_reports_out_of_window_in_layer_slots() -> None:
    alloc = make_allocator("paged", capacity_tokens=100, block_size=4, **PLAN)
    assert alloc.capacity_tokens == 600
    assert alloc.demand_tokens(seq(0, prompt=20)) == 6 * 20
    assert alloc.admit(seq(0, prompt=20))
    parts = alloc.breakdown()
    assert parts.capacity == 600
    assert parts.out_of_window == 5 * 13  # uniform paging never frees them
    alloc.grow(np.array([0]), 30)
    assert alloc.breakdown().out_of_window == 5 * (50 - 8 + 1)


def test_hybrid_needs_window_layers_and_caches_prefixes_when_asked() -> None:
    with pytest.raises(AllocatorConfigError, match="no sliding-window layers"):
        make_allocator("hybrid", capacity_tokens=100, num_layers=4, num_window_layers=0, window_tokens=8)
    cached = make_allocator("hybrid", capacity_tokens=100, enable_prefix_caching=True, **PLAN)
    assert isinstance(cached, HybridPrefixCachingAllocator) and cached.pool.enable_caching
    plain = make_allocator("hybrid", capacity_tokens=100, **PLAN)
    assert not isinstance(plain, HybridPrefixCachingAllocator) and not plain.pool.enable_caching
    with pytest.raises(AllocatorConfigError, match="num_window_layers must be <="):
        make_allocator("hybrid", capacity_tokens=100, num_layers=2, num_window_layers=3, window_tokens=8)


def test_group_size_is_the_gcd_of_the_layer_counts() -> None:
    gemma = HybridPagedAllocator(1000, 16, LayerPlan(62, 52, 1024))
    assert (gemma.group_layers, gemma.num_full_groups, gemma.num_window_groups) == (2, 5, 26)
    oss = HybridPagedAllocator(1000, 16, LayerPlan(36, 18, 128))
    assert (oss.group_layers, oss.num_full_groups, oss.num_window_groups) == (18, 1, 1)


# ---- property tests --------------------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(1, 40), st.integers(1, 40)),
        st.tuples(st.just("grow"), st.integers(1, 9), st.integers(0, 0)),
        st.tuples(st.just("jump"), st.integers(1, 30), st.integers(0, 0)),
        st.tuples(st.just("release"), st.integers(0, 50), st.integers(0, 0)),
        st.tuples(st.just("fork"), st.integers(0, 50), st.integers(0, 0)),
    ),
    max_size=60,
)


@given(
    ops=operations,
    window=st.integers(1, 20),
    block_size=st.sampled_from([1, 2, 4, 8]),
    layers=st.sampled_from([(6, 5), (4, 2), (3, 3), (36, 18)]),
    capacity=st.integers(20, 200),
    chunk=st.sampled_from([None, 1, 8, 16]),
)
def test_hybrid_properties(
    ops: list[tuple[str, int, int]],
    window: int,
    block_size: int,
    layers: tuple[int, int],
    capacity: int,
    chunk: int | None,
) -> None:
    plan = LayerPlan(layers[0], layers[1], window)
    if capacity * plan.num_layers < block_size * np.gcd(plan.num_full_layers, plan.num_window_layers):
        return
    alloc = HybridPagedAllocator(capacity, block_size, plan, max_model_len=64, prefill_chunk_tokens=chunk)
    next_id = 0
    for op, a, b in ops:
        live = alloc.live_seq_ids()
        if op == "admit":
            alloc.admit(seq(next_id, prompt=a, output=b))
            next_id += 1
        elif op == "grow" and live.size:
            before = {int(s): int(alloc.lengths_tokens[s]) for s in live}
            failed = set(alloc.grow(live, a).tolist())
            for sid, length in before.items():
                assert alloc.lengths_tokens[sid] == (length if sid in failed else length + a)
        elif op == "jump" and live.size:
            k = alloc.max_uniform_growth(live, a)
            if k < a and k != no_release_cap(alloc, live):
                # exact for the contract of a memory-freeing allocator (frees_while_growing): k is
                # the largest growth whose new blocks fit with no release credited, the bound that a
                # jump and one-iteration stepping both reach (tests/core/test_hybrid_prefix_caching.py)
                assert no_release_blocks(alloc, live, k + 1) > alloc.pool.num_free
                assert no_release_blocks(alloc, live, k) <= alloc.pool.num_free
            assert alloc.grow(live, k).size == 0
        elif op == "release" and live.size:
            alloc.release(int(live[a % live.size]))
        elif op == "fork" and live.size:
            alloc.fork(int(live[a % live.size]), seq(next_id, prompt=1))
            next_id += 1
        check_hybrid(alloc)
    for sid in alloc.live_seq_ids().tolist():
        alloc.release(sid)
    check_hybrid_all_free(alloc)
