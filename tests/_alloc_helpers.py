"""Test helpers for allocators: an independent model of token content and the invariant checks.

Why a separate model: the allocators count duplication through a ledger of content keys; the tests
instead label every token (shared prefixes get shared labels, everything else a unique label, forks
copy their parent's labels) and count distinct labels in what is physically stored. The two must
agree, and shared blocks must hold identical labels for every holder.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from allocators import SeqSpec
from allocators.contiguous import SlabAllocator
from allocators.paged import PagedAllocator
from allocators.placement import Buddy

# Shared content the generators draw from: prefix groups with a fixed prefix length, and
# hash chains (ids of HASH_TOKENS-token blocks) that share leading blocks.
PREFIX_GROUP_TOKENS: dict[int, int] = {0: 24, 1: 40}
HASH_TOKENS = 8
HASH_CHAINS: tuple[tuple[int, ...], ...] = ((11, 12, 13, 14), (11, 12, 23), (31, 32))


def chain_ids(block_hashes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Model-side identity of hash block j: the whole tuple of ids up to j (no hashing needed)."""
    return [tuple(block_hashes[: j + 1]) for j in range(len(block_hashes))]


def prompt_labels(seq: SeqSpec) -> list[Hashable]:
    """One label per prompt token: equal labels mean identical KV."""
    labels: list[Hashable] = []
    named = 0
    if seq.block_hashes:
        for chain in chain_ids(seq.block_hashes):
            labels.extend(("h", chain, offset) for offset in range(seq.block_hash_tokens))
        del labels[seq.prompt_tokens :]  # the last hash block may be partial (Mooncake)
        named = len(labels)
    elif seq.prefix_group >= 0 and seq.prefix_tokens > 0:
        labels.extend(("g", seq.prefix_group, pos) for pos in range(seq.prefix_tokens))
        named = len(labels)
    labels.extend(("u", seq.seq_id, pos) for pos in range(named, seq.prompt_tokens))
    return labels


@dataclass
class ContentModel:
    """What each live sequence holds, token by token, plus the true final lengths."""

    labels: dict[int, list[Hashable]] = field(default_factory=dict)
    final_tokens: dict[int, int] = field(default_factory=dict)
    prompt_tokens: dict[int, int] = field(default_factory=dict)

    def admit(self, seq: SeqSpec) -> None:
        self.labels[seq.seq_id] = prompt_labels(seq)
        self.final_tokens[seq.seq_id] = seq.final_tokens
        self.prompt_tokens[seq.seq_id] = seq.prompt_tokens

    def grow(self, seq_id: int, num_tokens: int) -> None:
        held = self.labels[seq_id]
        start = len(held)
        held.extend(("u", seq_id, pos) for pos in range(start, start + num_tokens))

    def fork(self, parent_id: int, child: SeqSpec) -> None:
        self.labels[child.seq_id] = list(self.labels[parent_id])
        self.final_tokens[child.seq_id] = child.final_tokens
        self.prompt_tokens[child.seq_id] = child.prompt_tokens

    def release(self, seq_id: int) -> None:
        del self.labels[seq_id]
        del self.final_tokens[seq_id]
        del self.prompt_tokens[seq_id]

    def length(self, seq_id: int) -> int:
        return len(self.labels[seq_id])


def check_contiguous(alloc: SlabAllocator, model: ContentModel, next_demand_tokens: int) -> None:
    """Slabs and holes tile the address space exactly; lengths, duplicates and external match the model."""
    layout = alloc.layout()
    assert sorted(layout.seq_ids.tolist()) == sorted(model.labels)
    for sid, length in zip(layout.seq_ids.tolist(), layout.lengths_tokens.tolist(), strict=True):
        assert length == model.length(sid)
    pieces = [
        (int(o), int(r), "slab") for o, r in zip(layout.offsets_tokens, layout.reserved_tokens, strict=True)
    ]
    if isinstance(alloc.placement, Buddy):
        pieces += [(off, size, "hole") for off, size in alloc.placement.free_blocks()]
    else:
        holes = zip(
            alloc.placement.hole_offsets().tolist(), alloc.placement.hole_sizes().tolist(), strict=True
        )
        pieces += [(off, size, "hole") for off, size in holes]
        hole_list = [p for p in sorted(pieces) if p[2] == "hole"]
        for left, right in zip(hole_list, hole_list[1:], strict=False):
            assert left[0] + left[1] < right[0], "adjacent free holes were not coalesced"
    cursor = 0
    for offset, size, _ in sorted(pieces):  # no slot owned twice, none lost
        assert size > 0 and offset == cursor, f"gap or overlap at {cursor}: {sorted(pieces)}"
        cursor = offset + size
    assert cursor == alloc.capacity_tokens
    for sid, length, slab in zip(layout.seq_ids, layout.lengths_tokens, layout.reserved_tokens, strict=True):
        assert 0 <= length <= slab, (sid, length, slab)

    parts = alloc.breakdown(next_demand_tokens)
    stored = sum(model.length(sid) for sid in model.labels)
    distinct = len({label for held in model.labels.values() for label in held})
    assert parts.token_states == distinct
    assert parts.duplicated == stored - distinct
    assert parts.reservation + parts.internal == int(layout.reserved_tokens.sum()) - stored
    expected_reservation = sum(
        min(int(slab), max(model.final_tokens[int(sid)], int(length))) - int(length)
        for sid, length, slab in zip(
            layout.seq_ids, layout.lengths_tokens, layout.reserved_tokens, strict=True
        )
    )
    assert parts.reservation == expected_reservation
    if next_demand_tokens <= 0:
        assert parts.external == 0
    else:
        slab = alloc.placement.slab_tokens(next_demand_tokens)
        assert parts.external == sum(size for _, size, kind in pieces if kind == "hole" and size < slab)
    assert parts.free + parts.external == alloc.placement.free_tokens()


def check_paged(alloc: PagedAllocator, model: ContentModel) -> None:
    """Every block's holders = its refcount and hold identical labels; free blocks are unowned."""
    bs = alloc.block_size
    layout = alloc.layout()
    assert sorted(layout.seq_ids.tolist()) == sorted(model.labels)
    holders: Counter[int] = Counter()
    content: dict[int, list[Hashable]] = {}
    for row, sid in enumerate(layout.seq_ids.tolist()):
        length = model.length(sid)
        assert layout.lengths_tokens[row] == length
        count = int(alloc.num_seq_blocks[sid])
        assert count == -(-length // bs), f"seq {sid}: {count} blocks for {length} tokens"
        table = layout.block_table[row]
        assert (table[:count] >= 0).all() and (table[count:] == -1).all()
        for index, block in enumerate(table[:count].tolist()):
            holders[block] += 1
            held = model.labels[sid][index * bs : (index + 1) * bs]
            if block in content:
                assert content[block] == held, f"block {block} shared by sequences holding different tokens"
            content[block] = held
    refcount = alloc.pool.refcount
    assert (refcount >= 0).all(), "negative refcount"
    expected = np.zeros(alloc.num_blocks, dtype=np.int64)
    for block, count in holders.items():
        expected[block] = count
    assert (refcount == expected).all(), "refcount differs from the number of block-table owners"
    in_use = refcount > 0
    assert not (alloc.pool.queue.in_queue & in_use).any(), "a block in use is in the free queue"
    assert int((~in_use).sum()) == alloc.pool.num_free == int(alloc.pool.queue.in_queue.sum())
    cached = alloc.pool.cached_blocks()
    assert cached.size == alloc.pool.num_cached
    if not alloc.enable_prefix_caching:
        assert cached.size == 0

    parts = alloc.breakdown(0)
    stored = sum(len(held) for held in content.values())
    distinct = len({label for held in content.values() for label in held})
    assert parts.token_states == distinct
    assert parts.duplicated == stored - distinct
    assert parts.reservation + parts.internal == len(content) * bs - stored
    assert parts.free == alloc.pool.num_free * bs
    assert parts.external == alloc.capacity_tokens % bs
    assert parts.cached == cached.size * bs <= parts.free
    for sid in model.labels:
        assert 0 <= alloc.prefix_hit_tokens(sid) <= max(model.prompt_tokens[sid], model.length(sid))


def check_all_free(alloc: SlabAllocator | PagedAllocator) -> None:
    """After every sequence is released: nothing but free (and cached, and the paged remainder)."""
    parts = alloc.breakdown(0)
    assert parts.token_states == parts.reservation == parts.internal == parts.duplicated == 0
    assert parts.free + parts.external == alloc.capacity_tokens
    assert alloc._ledger.is_empty()
    if isinstance(alloc, SlabAllocator):
        assert parts.external == 0
        expected_holes = bin(alloc.capacity_tokens).count("1") if isinstance(alloc.placement, Buddy) else 1
        assert alloc.hole_stats()["count"] == expected_holes, "free space did not coalesce"
    else:
        assert (alloc.pool.refcount == 0).all()
        assert alloc.pool.num_free == alloc.num_blocks
        assert parts.external == alloc.capacity_tokens % alloc.block_size
