"""Hypothesis state machine for the radix allocator (allocators/radix.py): the house pattern of
test_allocators_state.py with checks of the tree instead of block tables.

After every step: every tree node's lock_ref equals the number of live sequences whose locked path
holds it (no node owned without a reference, none over-counted, never negative); sequences sharing
a node hold identical tokens there (the independent token-label model of tests/_alloc_helpers.py);
pages are conserved (free + tree + private pages = all pages, no slot owned twice); the taxonomy
matches the model (token states = distinct labels held at page size 1); a refused admit or fork
changed nothing; max_uniform_growth is the largest growth free pages serve. At teardown every
sequence is released: nothing is held, what the tree keeps is cached (free, evictable).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import numpy as np
from _alloc_helpers import ContentModel, prompt_labels
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule
from test_allocators_state import SPEC_FIELDS, AllocatorMachine

from allocators import SeqSpec
from allocators.radix import RadixAllocator


def locked_paths(alloc: RadixAllocator) -> dict[int, list]:
    """Live seq id -> the tree nodes it locks (its last node up to the root's child)."""
    paths: dict[int, list] = {}
    for sid, content in alloc._content.items():
        nodes, node = [], content.node
        while node is not alloc.tree.root:
            nodes.append(node)
            node = node.parent
        paths[sid] = nodes
    return paths


def check_radix(alloc: RadixAllocator, model: ContentModel) -> None:
    """Locks, shared content, page conservation and the taxonomy against the label model."""
    page = alloc.page_tokens
    live = sorted(int(s) for s in np.flatnonzero(alloc.live))
    assert live == sorted(model.labels)
    paths = locked_paths(alloc)
    holders: Counter[int] = Counter()
    content: dict[int, list] = {}
    for sid, nodes in paths.items():
        depth = int(alloc.depth_tokens[sid])
        assert depth % page == 0 and depth <= model.length(sid)
        assert int(alloc.lengths_tokens[sid]) == model.length(sid)
        assert (nodes[0].end if nodes else 0) == depth, "the locked path does not end at the depth"
        for node in nodes:
            holders[node.uid] += 1
            held = model.labels[sid][node.start : node.end]
            if node.uid in content:
                assert content[node.uid] == held, "a node shared by sequences holding different tokens"
            content[node.uid] = held
    nodes = alloc.tree.nodes()
    for node in nodes:
        assert node.lock_ref >= 0, "negative lock_ref"
        assert node.lock_ref == holders[node.uid], "lock_ref differs from the sequences using the node"
        assert node.num_tokens > 0 and node.num_tokens % page == 0
        for child in node.children.values():
            assert child.parent is node and child.start == node.end
    tree_tokens = sum(node.num_tokens for node in nodes)
    assert tree_tokens == alloc.tree.total_tokens
    assert sum(n.num_tokens for n in nodes if n.lock_ref) == alloc.tree.protected_tokens
    private_tokens = sum(model.length(sid) - int(alloc.depth_tokens[sid]) for sid in live)
    private_pages = sum(-(-(model.length(sid) - int(alloc.depth_tokens[sid])) // page) for sid in live)
    assert alloc.free_pages >= 0
    assert alloc.free_pages + tree_tokens // page + private_pages == alloc.num_pages, (
        "pages lost or owned twice"
    )

    parts = alloc.breakdown(0)
    stored = sum(model.length(sid) for sid in live)
    distinct = len({label for held in model.labels.values() for label in held})
    assert parts.token_states == alloc.tree.protected_tokens + private_tokens
    if page == 1:
        assert parts.token_states == distinct, "identical tokens stored twice at page size 1"
    else:
        assert distinct <= parts.token_states <= stored
    assert parts.internal == private_pages * page - private_tokens
    assert parts.cached == tree_tokens - alloc.tree.protected_tokens
    assert parts.free == alloc.free_pages * page + parts.cached
    assert parts.external == alloc.capacity_tokens % page
    assert parts.reservation == parts.duplicated == 0
    for sid in live:
        assert 0 <= alloc.prefix_hit_tokens(sid) <= model.prompt_tokens[sid]


class ChunkedContentModel(ContentModel):
    """The label model with chunked prefill: growth continues the prompt before it generates."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: dict[int, list] = {}  # seq id -> labels of its whole prompt

    def admit(self, seq: SeqSpec, held_tokens: int | None = None) -> None:
        """Hold the first `held_tokens` of the prompt (all by default); the rest comes by growth."""
        super().admit(seq)
        self.prompts[seq.seq_id] = prompt_labels(seq)
        del self.labels[seq.seq_id][seq.prompt_tokens if held_tokens is None else held_tokens :]

    def grow(self, seq_id: int, num_tokens: int) -> None:
        held, prompt = self.labels[seq_id], self.prompts.get(seq_id, [])
        start = len(held)
        held.extend(
            prompt[p] if p < len(prompt) else ("u", seq_id, p) for p in range(start, start + num_tokens)
        )

    def release(self, seq_id: int) -> None:
        super().release(seq_id)
        self.prompts.pop(seq_id, None)


class RadixMachine(AllocatorMachine):
    """The house machine (build, fork, release, uniform_jump) with radix checks."""

    allocator_name = "radix"

    def __init__(self) -> None:
        super().__init__()
        self.model = ChunkedContentModel()

    @rule(fields=SPEC_FIELDS, chunk=st.sampled_from([0, 0, 5, 17]))
    def admit(self, fields: dict[str, Any], chunk: int) -> None:
        seq = SeqSpec(seq_id=self.next_id, **fields, first_chunk_tokens=chunk)
        self.next_id += 1
        before = self.alloc.state_snapshot()
        available_pages = self.alloc.available_tokens() // self.alloc.page_tokens
        expected_hit = self.alloc.cached_prefix_tokens(seq)
        if self.alloc.admit(seq):
            hit = self.alloc.prefix_hit_tokens(seq.seq_id)
            assert hit == expected_hit, "the admission matched another prefix than the peek"
            held = seq.prompt_tokens if chunk == 0 else min(seq.prompt_tokens, hit + chunk)
            self.model.admit(seq, held)
            event("admit: prefix hit" if hit else "admit: no hit")
            return
        event("admit: refused")
        assert self.alloc.state_snapshot() == before, "a refused admit changed state"
        held = seq.prompt_tokens if chunk == 0 else min(seq.prompt_tokens, expected_hit + chunk)
        need = -(-(held - expected_hit) // self.alloc.page_tokens)
        # its own match is locked before anything is evicted, so a cached match is not available to it
        hit_pages = expected_hit // self.alloc.page_tokens
        too_long = self.alloc.max_model_len is not None and seq.prompt_tokens > self.alloc.max_model_len
        assert too_long or need > available_pages - hit_pages, "refused although the pages were there"

    @precondition(lambda self: self.model.labels)
    @rule(data=st.data(), num_tokens=st.integers(1, 20))
    def grow(self, data: st.DataObject, num_tokens: int) -> None:
        live = self._live()
        chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))
        ids = np.array(chosen, dtype=np.int64)
        uniform = self.alloc.max_uniform_growth(ids, num_tokens)
        assert 0 <= uniform <= num_tokens
        if uniform < num_tokens:  # maximal among growths that free pages serve without eviction
            probe = copy.deepcopy(self.alloc)
            cached_before = probe.tree.evictable_tokens
            if probe.grow(ids, uniform + 1).size == 0:
                assert probe.tree.evictable_tokens < cached_before, "max_uniform_growth is not maximal"
        failed = set(self.alloc.grow(ids, num_tokens).tolist())
        event("grow: some failed" if failed else "grow: all grew")
        assert failed <= set(chosen)
        if uniform == num_tokens:
            assert not failed
        for sid in chosen:
            if sid not in failed:
                self.model.grow(sid, num_tokens)

    @invariant()
    def consistent(self) -> None:
        if self.alloc is not None:
            check_radix(self.alloc, self.model)

    def teardown(self) -> None:
        if self.alloc is None:
            return
        for sid in self._live():
            self.alloc.release(sid)
            self.model.release(sid)
        check_radix(self.alloc, self.model)
        parts = self.alloc.breakdown(0)
        assert parts.token_states == parts.internal == self.alloc.tree.protected_tokens == 0
        assert parts.free + parts.external == self.alloc.capacity_tokens
        # everything left in the tree is evictable: evicting it all returns every page
        self.alloc.tree.evict(self.alloc.capacity_tokens)
        assert self.alloc.tree.total_tokens == 0 and not self.alloc.tree.root.children


RadixMachine.TestCase.settings = settings(settings(), stateful_step_count=40)
TestRadixMachine = RadixMachine.TestCase
