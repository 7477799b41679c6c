"""Invariants of the hybrid paged allocator (allocators/hybrid.py), shared by its property tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from allocators.hybrid import HybridPagedAllocator


def check_hybrid(alloc: HybridPagedAllocator, lengths: dict[int, int] | None = None) -> None:
    """Blocks conserved, one owner per block, window groups hold exactly the blocks still read, and the
    layer-slot taxonomy covers exactly the held blocks (MemoryBreakdown checks the sum itself)."""
    live = alloc.live_seq_ids().tolist()
    if lengths is not None:
        assert sorted(live) == sorted(lengths)
    owners = [alloc.held_blocks(sid) for sid in live]
    held = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    assert np.unique(held).size == held.size, "a block has two owners"
    assert held.size + alloc.pool.num_free == alloc.num_blocks, "blocks are not conserved"
    assert np.all(alloc.pool.refcount[held] == 1)
    assert not alloc.pool.queue.in_queue[held].any(), "a held block is in the free queue"
    parts = alloc.breakdown()
    used = parts.token_states + parts.reservation + parts.internal + parts.out_of_window
    assert used == held.size * alloc.block_slots
    assert parts.free == alloc.pool.num_free * alloc.block_slots
    for sid in live:
        length = int(alloc.lengths_tokens[sid])
        if lengths is not None:
            assert length == lengths[sid]
        blocks = int(alloc.num_seq_blocks[sid])
        assert blocks == -(-length // alloc.block_size)
        first = int(alloc.first_window_block[sid])
        skipped = max(0, length - alloc.plan.window_tokens + 1)
        assert first <= skipped // alloc.block_size, "a block the window still reads was freed"
        assert len(alloc._full[sid]) == blocks and len(alloc._window[sid]) == blocks - first


def check_hybrid_all_free(alloc: HybridPagedAllocator) -> None:
    parts = alloc.breakdown()
    assert parts.token_states == parts.reservation == parts.internal == parts.out_of_window == 0
    assert parts.free + parts.external == parts.capacity
    assert alloc.pool.num_free == alloc.num_blocks and (alloc.pool.refcount == 0).all()


def check_hybrid_caching(alloc: Any, lengths: dict[int, int], specs: dict[int, Any]) -> None:
    """The hybrid allocator with prefix caching: every live block's refcount is its number of holders
    (a block is shared, never owned twice), held + free blocks are all the blocks, cached blocks are
    free ones still named, and `duplicated` is the full-group content held by two physical blocks.

    `specs[sid]` is the SeqSpec a sequence was admitted with (None for a fork: its copies are unnamed).
    """
    from allocators.prefix_keys import sequence_block_keys

    live = alloc.live_seq_ids().tolist()
    assert sorted(live) == sorted(lengths)
    owners = [alloc.held_blocks(sid) for sid in live]
    for blocks in owners:
        assert np.unique(blocks).size == blocks.size, "a sequence holds one block twice"
    held = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    physical, holders = np.unique(held, return_counts=True)
    pool = alloc.pool
    assert np.array_equal(pool.refcount[physical], holders), "a refcount is not the number of holders"
    assert physical.size + pool.num_free == alloc.num_blocks, "blocks are not conserved"
    assert int((pool.refcount > 0).sum()) == physical.size
    assert not pool.queue.in_queue[physical].any(), "a held block is in the free queue"
    cached = pool.cached_blocks()
    assert pool.queue.in_queue[cached].all() and cached.size == pool.num_cached
    content: dict[Any, set[int]] = {}
    bs = alloc.block_size
    for sid in live:
        length = int(alloc.lengths_tokens[sid])
        assert length == lengths[sid]
        blocks = int(alloc.num_seq_blocks[sid])
        assert blocks == -(-length // bs)
        first = int(alloc.first_window_block[sid])
        assert first <= max(0, length - alloc.plan.window_tokens + 1) // bs, "a block still read was freed"
        assert len(alloc._full[sid]) == blocks and len(alloc._window[sid]) == blocks - first
        spec = specs[sid]
        if spec is None:
            continue
        hit = alloc.prefix_hit_tokens(sid)
        assert hit % bs == 0 and hit <= (spec.prompt_tokens - 1) // bs * bs
        keys = sequence_block_keys(spec, bs)
        for index, key in enumerate(keys[:blocks]):
            for group, block in enumerate(alloc._full[sid][index].tolist()):
                content.setdefault((key, group), set()).add(block)
    duplicated = sum(len(copies) - 1 for copies in content.values()) * alloc.block_slots
    parts = alloc.breakdown()
    assert parts.duplicated == duplicated
    used = parts.token_states + parts.reservation + parts.internal + parts.out_of_window + parts.duplicated
    assert used == physical.size * alloc.block_slots
    assert parts.free == pool.num_free * alloc.block_slots
    assert parts.cached == pool.num_cached * alloc.block_slots <= parts.free


def check_hybrid_caching_all_free(alloc: Any) -> None:
    """After every release: nothing held, every block free, the named ones cached (evictable)."""
    parts = alloc.breakdown()
    assert parts.token_states == parts.reservation == parts.internal == parts.out_of_window == 0
    assert parts.duplicated == 0 and alloc._ledger.is_empty()
    assert parts.free + parts.external == parts.capacity
    assert alloc.pool.num_free == alloc.num_blocks and (alloc.pool.refcount == 0).all()
    assert (
        parts.cached
        == alloc.pool.num_cached * alloc.block_slots
        == int(alloc.pool.has_key.sum()) * alloc.block_slots
    )


def no_release_cap(alloc, seq_ids) -> int | None:
    """Tokens the sequences may still grow within max_model_len (None: no cap)."""
    if alloc.max_model_len is None:
        return None
    return int(alloc.max_model_len - alloc.lengths_tokens[seq_ids].max())


def no_release_blocks(alloc, seq_ids, k: int) -> int:
    """Blocks a hybrid allocator takes to grow `seq_ids` by k tokens with no release credited.

    A memory-freeing allocator's `max_uniform_growth` is the largest k whose blocks fit in the free
    pool by this count (the bound a jump and one-iteration stepping both reach).
    """
    groups = alloc.num_full_groups + alloc.num_window_groups
    lengths, held = alloc.lengths_tokens[seq_ids], alloc.num_seq_blocks[seq_ids]
    return int((-(-(lengths + k) // alloc.block_size) - held).sum()) * groups
