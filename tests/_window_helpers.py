"""Invariants of the hybrid paged allocator (allocators/hybrid.py), shared by its property tests."""

from __future__ import annotations

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
