"""The CPU tier under the paged prefix cache (allocators/cpu_tier.py), rule by rule, with worked examples.

Each rule is vLLM's KV-offloading connector's (vllm/v1/kv_offload/lru_manager.py
`LRUOffloadingManager`; offloading_connector.py `OffloadingConnectorScheduler`); the hand-computed
answers below follow them.
"""

from __future__ import annotations

import pytest

from allocators import AllocatorConfigError, SeqSpec, make_allocator
from allocators.cpu_tier import CpuTier


def test_store_evicts_least_recently_used_and_touch_keeps_a_prefix_head_longest() -> None:
    tier = CpuTier(capacity_blocks=3, block_size=4)
    assert tier.store(["a", "b", "c"]) == 3
    tier.touch(["c", "a"])  # reversed walk (LRUOffloadingManager.touch): "c" ends most recent
    assert tier.store(["d"]) == 1  # evicts the least recent: "b"
    assert "b" not in tier and all(key in tier for key in "acd")
    assert tier.store(["e", "f"]) == 2  # evicts "a", then "c"
    assert [key in tier for key in "acdef"] == [False, False, True, True, True]
    counters = tier.counters
    assert (counters.stored_tokens, counters.evicted_tokens, counters.peak_used_tokens) == (24, 12, 12)
    assert tier.take_transfers() == (0, 24) and tier.take_transfers() == (0, 0)


def test_store_skips_held_blocks_and_is_all_or_nothing_beyond_capacity() -> None:
    tier = CpuTier(capacity_blocks=2, block_size=1)
    assert tier.store(["a", "a", "b"]) == 2  # a key is held once
    assert tier.store(["a", "b"]) == 0  # already held: nothing moves
    assert tier.store(["x", "y", "z"]) == 0  # more than the tier holds: prepare_store returns None
    assert "a" in tier and "b" in tier and tier.counters.evicted_tokens == 0
    assert CpuTier(0, 16).store(["a"]) == 0


def test_run_length_counts_consecutive_held_keys_from_the_start() -> None:
    tier = CpuTier(capacity_blocks=8, block_size=16)
    tier.store(["k0", "k1", "k3"])
    assert tier.run_length(["k0", "k1", "k2", "k3"], 0) == 2
    assert tier.run_length(["k0", "k1", "k2", "k3"], 1) == 1
    assert tier.run_length(["k0", "k1", "k2", "k3"], 2) == 0
    assert tier.run_length(["k0", "k1", "k2", "k3"], 3) == 1


def _tiered(capacity_tokens: int = 100, tier_tokens: int = 96) -> object:
    return make_allocator(
        "paged",
        capacity_tokens=capacity_tokens,
        block_size=8,
        enable_prefix_caching=True,
        cpu_tier_tokens=tier_tokens,
    )


def _group_prompt(seq_id: int, prompt: int = 30) -> SeqSpec:
    return SeqSpec(seq_id, prompt, 5, 5, prefix_group=0, prefix_tokens=24)


def _flush_gpu(alloc: object, seq_id: int) -> None:
    """A plain request takes every free block and leaves: the GPU prefix cache is emptied."""
    assert alloc.admit(SeqSpec(seq_id, alloc.pool.num_free * alloc.block_size, 1, 1))  # type: ignore[attr-defined]
    assert alloc.pool.num_cached == 0  # type: ignore[attr-defined]
    alloc.release(seq_id)  # type: ignore[attr-defined]


def test_a_prefix_evicted_from_the_gpu_is_loaded_from_the_cpu_tier() -> None:
    alloc = _tiered()
    tier = alloc.cpu_tier
    # 30-token prompt, block 8, shared prefix 24 tokens: 3 full named blocks, computed and stored
    assert alloc.admit(_group_prompt(0)) and alloc.prefix_hit_tokens(0) == 0
    assert tier.used_blocks == 3 and tier.take_transfers() == (0, 24)
    alloc.release(0)
    _flush_gpu(alloc, 1)
    # the same prefix again: no GPU hit, the 3 blocks come back from the CPU tier (24 tokens loaded)
    assert alloc.admit(_group_prompt(2))
    assert alloc.prefix_hit_tokens(2) == 24
    assert tier.take_transfers() == (24, 0)  # already held: nothing stored again
    counters = tier.counters
    assert (counters.gpu_hit_tokens, counters.cpu_hit_tokens) == (0, 24)
    assert counters.queried_tokens == 30 + 96 + 30  # every admission's prompt is a lookup
    # and they are GPU cache blocks again: a third request hits them on the GPU, loading nothing
    assert alloc.admit(_group_prompt(3)) and alloc.prefix_hit_tokens(3) == 24
    assert tier.take_transfers() == (0, 0) and tier.counters.gpu_hit_tokens == 24


def test_the_gpu_hit_comes_first_and_the_cpu_run_continues_after_it() -> None:
    """Blocks [0, 1] stay on the GPU (a live holder), block 2 only in the CPU tier: 2 hit on the
    GPU, 1 is loaded (get_num_new_matched_tokens looks up from num_computed_tokens on)."""
    alloc = make_allocator(
        "paged", capacity_tokens=64, block_size=8, enable_prefix_caching=True, cpu_tier_tokens=64
    )
    long_chain = SeqSpec(0, 25, 5, 5, block_hashes=(1, 2, 3), block_hash_tokens=8)
    assert alloc.admit(long_chain)
    alloc.release(0)
    short_chain = SeqSpec(1, 17, 5, 5, block_hashes=(1, 2), block_hash_tokens=8)
    assert alloc.admit(short_chain) and alloc.prefix_hit_tokens(1) == 16  # holds blocks 0 and 1 live
    _flush_gpu(alloc, 2)  # evicts the cached block 2 only
    alloc.cpu_tier.take_transfers()
    assert alloc.admit(SeqSpec(3, 25, 5, 5, block_hashes=(1, 2, 3), block_hash_tokens=8))
    assert alloc.prefix_hit_tokens(3) == 24
    assert alloc.cpu_tier.take_transfers() == (8, 0)


def test_the_last_prompt_token_is_always_computed_so_a_whole_prompt_hit_loads_one_block_less() -> None:
    alloc = _tiered()
    whole = SeqSpec(0, 24, 5, 5, prefix_group=0, prefix_tokens=24)  # exactly the 3 named blocks
    assert alloc.admit(whole)
    alloc.release(0)
    _flush_gpu(alloc, 1)
    alloc.cpu_tier.take_transfers()
    assert alloc.admit(SeqSpec(2, 24, 5, 5, prefix_group=0, prefix_tokens=24))
    assert alloc.prefix_hit_tokens(2) == 16  # (24 - 1) // 8 = 2 blocks count as hits
    assert alloc.cpu_tier.take_transfers() == (16, 0)


def test_decode_filled_blocks_reach_the_tier_at_release() -> None:
    alloc = _tiered()
    spec = SeqSpec(0, 8, 20, 20, content_key=("r", 0), content_prompt_tokens=8)
    assert alloc.admit(spec)
    assert alloc.cpu_tier.take_transfers() == (0, 8)  # the prompt's one full block
    assert alloc.grow([0], 17).size == 0  # 25 tokens: 3 full blocks
    alloc.release(0)
    assert alloc.cpu_tier.take_transfers() == (0, 16)  # blocks 1 and 2, the prompt's block held already
    assert alloc.cpu_tier.used_blocks == 3


def test_a_zero_size_tier_stores_nothing_and_still_counts_lookups() -> None:
    alloc = _tiered(tier_tokens=0)
    assert alloc.admit(_group_prompt(0))
    assert alloc.cpu_tier.used_blocks == 0 and alloc.cpu_tier.take_transfers() == (0, 0)
    assert alloc.cpu_tier.counters.queried_tokens == 30


def test_a_tier_needs_prefix_caching_and_a_whole_number_of_tokens() -> None:
    with pytest.raises(AllocatorConfigError, match="needs enable_prefix_caching"):
        make_allocator("paged", capacity_tokens=64, block_size=8, cpu_tier_tokens=64)
    with pytest.raises(AllocatorConfigError, match="cpu_tier_tokens must be an integer >= 0"):
        make_allocator("paged", capacity_tokens=64, enable_prefix_caching=True, cpu_tier_tokens=-8)
    assert make_allocator("paged", capacity_tokens=64).cpu_tier is None
    assert make_allocator("contiguous", capacity_tokens=64, max_model_len=64).cpu_tier is None


def test_a_chunked_prompt_reaches_the_tier_chunk_by_chunk() -> None:
    """Per-chunk admission (vLLM v1): each chunk's full blocks are stored in the step that computes
    them (`_get_reqs_to_store`), not when the sequence is released."""
    alloc = _tiered()
    tier = alloc.cpu_tier
    spec = SeqSpec(0, 40, 5, 5, content_key=("r", 0), content_prompt_tokens=40, first_chunk_tokens=12)
    assert alloc.admit(spec) and alloc.lengths_tokens[0] == 12
    assert tier.take_transfers() == (0, 8)  # block 0 is full
    assert alloc.grow([0], 12).size == 0  # 24 tokens: blocks 1 and 2 full
    assert tier.take_transfers() == (0, 16)
    assert alloc.grow([0], 16).size == 0  # the whole 40-token prompt: blocks 3 and 4
    assert tier.take_transfers() == (0, 16) and tier.used_blocks == 5
    assert alloc.grow([0], 8).size == 0  # decoding: stored at release
    assert tier.take_transfers() == (0, 0)
    alloc.release(0)
    assert tier.take_transfers() == (0, 8) and tier.used_blocks == 6
