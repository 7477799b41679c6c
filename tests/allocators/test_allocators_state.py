"""Hypothesis state machines: random admit / grow / release / fork on every allocator and placement.

After every step: the taxonomy parts sum to capacity (MemoryBreakdown checks it on construction);
no slot or block has two owners unless shared with a matching refcount; refcounts are never
negative; duplication matches an independent token-label model; a refused admit or fork changed
nothing; max_uniform_growth is exact. At teardown every sequence is released and everything must be
free, except what the prefix cache keeps by design.

The number of examples comes from the hypothesis profile (tests/conftest.py: dev 50, ci 300, long 10,000).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from _alloc_helpers import (
    HASH_CHAINS,
    HASH_TOKENS,
    PREFIX_GROUP_TOKENS,
    ContentModel,
    check_all_free,
    check_contiguous,
    check_paged,
)
from _window_helpers import (
    check_hybrid,
    check_hybrid_all_free,
    check_hybrid_caching,
    check_hybrid_caching_all_free,
    no_release_blocks,
    no_release_cap,
)
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from allocators import SeqSpec, make_allocator
from allocators.contiguous import SlabAllocator

MAX_MODEL_LEN = 96

PLACEMENTS = ("first_fit", "best_fit", "buddy")

# One state machine per allocator; each example draws the allocator's configuration, so every
# placement, reservation policy and paged mode is exercised within the profile's example budget.
PARAM_STRATEGIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "contiguous": st.fixed_dictionaries(
        {"max_model_len": st.just(MAX_MODEL_LEN), "placement": st.sampled_from(PLACEMENTS)}
    ),
    "request_limit": st.fixed_dictionaries(
        {
            "max_model_len": st.sampled_from([MAX_MODEL_LEN, None]),
            "placement": st.sampled_from(PLACEMENTS),
            "reservation": st.sampled_from(["limit", "oracle", "pow2"]),
        }
    ),
    "paged": st.one_of(
        st.fixed_dictionaries(
            {"block_size": st.sampled_from([1, 4, 5, 16]), "enable_prefix_caching": st.booleans()}
        ),
        st.fixed_dictionaries(
            {
                "block_size": st.sampled_from([3, 16]),
                "share_prefixes": st.just(False),
                "max_model_len": st.just(MAX_MODEL_LEN),
            }
        ),
    ),
    "virtual": st.fixed_dictionaries(
        {
            "max_model_len": st.just(MAX_MODEL_LEN),
            "page_bytes": st.sampled_from([24, 48, 64]),
            "bytes_per_token_per_layer": st.just(4),
        }
    ),
    # SGLang's page size: 1 (its default) and whole pages (machine in test_radix_state.py)
    "radix": st.fixed_dictionaries(
        {
            "block_size": st.sampled_from([1, 1, 4, 16]),
            "max_model_len": st.sampled_from([None, MAX_MODEL_LEN]),
        }
    ),
    # layer counts with gcd 1, so a block is block_size layer-slots (the refusal check below)
    "hybrid": st.fixed_dictionaries(
        {
            "block_size": st.sampled_from([1, 4, 5]),
            "max_model_len": st.sampled_from([MAX_MODEL_LEN, None]),
            "num_layers": st.just(3),
            "num_window_layers": st.sampled_from([1, 2]),
            "window_tokens": st.integers(1, 40),
        }
    ),
}


@st.composite
def _spec_fields(draw: st.DrawFn) -> dict[str, Any]:
    """A request's fields (all but seq_id): plain, in a prefix group, or with a hash chain."""
    kind = draw(st.sampled_from(["plain", "group", "hashes"]))
    group, prefix, hashes = -1, 0, ()
    minimum_prompt = 1
    if kind == "group":
        group = draw(st.sampled_from(sorted(PREFIX_GROUP_TOKENS)))
        prefix = PREFIX_GROUP_TOKENS[group]
        minimum_prompt = prefix
    elif kind == "hashes":
        chain = draw(st.sampled_from(HASH_CHAINS))
        hashes = chain[: draw(st.integers(1, len(chain)))]
        minimum_prompt = len(hashes) * HASH_TOKENS
    return {
        "prompt_tokens": draw(st.integers(minimum_prompt, minimum_prompt + 30)),
        "max_tokens": draw(st.integers(1, 60)),
        "output_tokens": draw(st.integers(1, 70)),
        "prefix_group": group,
        "prefix_tokens": prefix,
        "block_hashes": hashes,
        "block_hash_tokens": HASH_TOKENS if hashes else 0,
    }


SPEC_FIELDS = _spec_fields()


class AllocatorMachine(RuleBasedStateMachine):
    """Drives one allocator; subclasses set `allocator_name` and `params`."""

    allocator_name = ""

    def __init__(self) -> None:
        super().__init__()
        self.alloc: Any = None
        self.model = ContentModel()
        self.next_id = 0
        self.demand = 0

    @initialize(capacity=st.integers(60, 700), data=st.data())
    def build(self, capacity: int, data: st.DataObject) -> None:
        params = data.draw(PARAM_STRATEGIES[self.allocator_name], label="params")
        self.alloc = make_allocator(self.allocator_name, capacity_tokens=capacity, **params)

    def _live(self) -> list[int]:
        return sorted(self.model.labels)

    @rule(fields=SPEC_FIELDS)
    def admit(self, fields: dict[str, Any]) -> None:
        seq = SeqSpec(seq_id=self.next_id, **fields)
        self.next_id += 1
        before = self.alloc.state_snapshot()
        demand = self.alloc.demand_tokens(seq)
        self.demand = demand
        cached_before = self.alloc.breakdown(0).cached
        if self.alloc.admit(seq):
            self.model.admit(seq)
            hit = self.alloc.prefix_hit_tokens(seq.seq_id)
            assert hit <= seq.prompt_tokens
            event("admit: prefix hit" if hit else "admit: no hit")
            if self.alloc.breakdown(0).cached < cached_before:
                event("admit: cached block revived or evicted")
            return
        event("admit: refused")
        assert self.alloc.state_snapshot() == before, "a refused admit changed state"
        # refused only when it had to be
        if isinstance(self.alloc, SlabAllocator):
            fits_policy = seq.prompt_tokens <= self.alloc.reservation_tokens(seq)
            assert not fits_policy or self.alloc.hole_stats()["max_tokens"] < demand
        else:
            too_long = self.alloc.max_model_len is not None and seq.prompt_tokens > self.alloc.max_model_len
            assert too_long or demand > self.alloc.pool.num_free * self.alloc.block_size

    @precondition(lambda self: self.model.labels)
    @rule(data=st.data(), num_tokens=st.integers(1, 20))
    def grow(self, data: st.DataObject, num_tokens: int) -> None:
        live = self._live()
        chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))
        ids = np.array(chosen, dtype=np.int64)
        uniform = self.alloc.max_uniform_growth(ids, num_tokens)
        assert 0 <= uniform <= num_tokens
        if uniform < num_tokens and not self.alloc.frees_while_growing:  # exact: one more token fails
            probe = copy.deepcopy(self.alloc)
            assert probe.grow(ids, uniform + 1).size > 0, "max_uniform_growth is not maximal"
        elif uniform < num_tokens and uniform != no_release_cap(self.alloc, ids):
            # growth frees memory: exact for the bound that credits no release
            assert no_release_blocks(self.alloc, ids, uniform + 1) > self.alloc.pool.num_free
        before = {sid: self.model.length(sid) for sid in chosen}
        if self.alloc.breakdown(0).duplicated:
            event("grow: with duplicated content")
        failed = set(self.alloc.grow(ids, num_tokens).tolist())
        event("grow: some failed" if failed else "grow: all grew")
        assert failed <= set(chosen)
        if uniform == num_tokens:
            assert not failed, "grow failed although max_uniform_growth allowed it"
        for sid in chosen:
            if sid not in failed:
                self.model.grow(sid, num_tokens)
        lengths = self.alloc.lengths_tokens
        for sid in chosen:
            assert lengths[sid] == before[sid] + (0 if sid in failed else num_tokens)

    @precondition(lambda self: self.model.labels)
    @rule(data=st.data(), limit=st.integers(1, 200))
    def uniform_jump(self, data: st.DataObject, limit: int) -> None:
        """The engine's multi-iteration jump: grow by exactly max_uniform_growth, which must succeed."""
        live = self._live()
        chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))
        ids = np.array(chosen, dtype=np.int64)
        k = self.alloc.max_uniform_growth(ids, limit)
        if k == 0:
            return
        assert self.alloc.grow(ids, k).size == 0
        for sid in chosen:
            self.model.grow(sid, k)

    @precondition(lambda self: self.model.labels)
    @rule(pick=st.integers(0, 10**6))
    def release(self, pick: int) -> None:
        live = self._live()
        sid = live[pick % len(live)]
        self.alloc.release(sid)
        self.model.release(sid)

    @precondition(lambda self: self.model.labels)
    @rule(pick=st.integers(0, 10**6), max_tokens=st.integers(1, 60), output=st.integers(1, 70))
    def fork(self, pick: int, max_tokens: int, output: int) -> None:
        live = self._live()
        parent = live[pick % len(live)]
        child = SeqSpec(
            seq_id=self.next_id,
            prompt_tokens=self.model.prompt_tokens[parent],
            max_tokens=max_tokens,
            output_tokens=output,
        )
        self.next_id += 1
        before = self.alloc.state_snapshot()
        if self.alloc.fork(parent, child):
            self.model.fork(parent, child)
            event("fork: ok")
        else:
            event("fork: refused")
            assert self.alloc.state_snapshot() == before, "a refused fork changed state"

    @rule(demand=st.integers(0, 120))
    def set_next_demand(self, demand: int) -> None:
        self.demand = demand

    @invariant()
    def consistent(self) -> None:
        if self.alloc is None:
            return
        if isinstance(self.alloc, SlabAllocator):
            check_contiguous(self.alloc, self.model, self.demand)
        else:
            check_paged(self.alloc, self.model)

    def teardown(self) -> None:
        if self.alloc is None:
            return
        for sid in self._live():
            self.alloc.release(sid)
            self.model.release(sid)
        check_all_free(self.alloc)


def _machine_test(name: str) -> type:
    machine = type(f"Machine_{name}", (AllocatorMachine,), {"allocator_name": name})
    machine.TestCase.settings = settings(settings(), stateful_step_count=40)
    return machine.TestCase


TestContiguousMachine = _machine_test("contiguous")
TestRequestLimitMachine = _machine_test("request_limit")
TestPagedMachine = _machine_test("paged")
TestVirtualMachine = _machine_test("virtual")


class _HybridMachine(AllocatorMachine):
    """The hybrid allocator (issue 14): the same rules, its own block invariants (_window_helpers.py)."""

    allocator_name = "hybrid"

    @invariant()
    def consistent(self) -> None:
        if self.alloc is None:
            return
        check_hybrid(self.alloc, {sid: self.model.length(sid) for sid in self.model.labels})

    def teardown(self) -> None:
        if self.alloc is None:
            return
        for sid in self._live():
            self.alloc.release(sid)
            self.model.release(sid)
        check_hybrid_all_free(self.alloc)


_HybridMachine.TestCase.settings = settings(settings(), stateful_step_count=40)
TestHybridMachine = _HybridMachine.TestCase


class _HybridCachingMachine(AllocatorMachine):
    """The hybrid allocator with prefix caching (vLLM's hit rule under sliding windows): blocks shared
    with refcounts, conservation, the taxonomy with `duplicated` and `cached` exact, and at teardown
    every block free, the named ones cached and evictable (_window_helpers.check_hybrid_caching)."""

    allocator_name = "hybrid"

    def __init__(self) -> None:
        super().__init__()
        self.specs: dict[int, SeqSpec | None] = {}

    @initialize(capacity=st.integers(60, 700), data=st.data())
    def build(self, capacity: int, data: st.DataObject) -> None:
        params = data.draw(PARAM_STRATEGIES["hybrid"], label="params")
        self.alloc = make_allocator("hybrid", capacity_tokens=capacity, enable_prefix_caching=True, **params)

    @rule(fields=SPEC_FIELDS)
    def admit(self, fields: dict[str, Any]) -> None:
        seq = SeqSpec(seq_id=self.next_id, **fields)
        super().admit(fields)
        if seq.seq_id in self.model.labels:
            self.specs[seq.seq_id] = seq

    @precondition(lambda self: self.model.labels)
    @rule(data=st.data(), num_tokens=st.integers(1, 20))
    def grow(self, data: st.DataObject, num_tokens: int) -> None:
        """As for every allocator, except that max_uniform_growth is a lower bound here: with cached
        blocks a jump stops before a named block is released or a cached one evicted."""
        live = self._live()
        chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))
        ids = np.array(chosen, dtype=np.int64)
        uniform = self.alloc.max_uniform_growth(ids, num_tokens)
        assert 0 <= uniform <= num_tokens
        probe = copy.deepcopy(self.alloc)
        assert probe.grow(ids, uniform).size == 0, "grow fails where max_uniform_growth allows it"
        failed = set(self.alloc.grow(ids, num_tokens).tolist())
        event("grow: some failed" if failed else "grow: all grew")
        assert failed <= set(chosen)
        for sid in chosen:
            if sid not in failed:
                self.model.grow(sid, num_tokens)

    @precondition(lambda self: self.model.labels)
    @rule(pick=st.integers(0, 10**6), max_tokens=st.integers(1, 60), output=st.integers(1, 70))
    def fork(self, pick: int, max_tokens: int, output: int) -> None:
        child_id = self.next_id
        super().fork(pick, max_tokens, output)
        if child_id in self.model.labels:
            self.specs[child_id] = None

    @invariant()
    def consistent(self) -> None:
        if self.alloc is None:
            return
        lengths = {sid: self.model.length(sid) for sid in self.model.labels}
        check_hybrid_caching(self.alloc, lengths, self.specs)
        hits = [self.alloc.prefix_hit_tokens(sid) for sid in lengths]
        event("a live sequence hit the cache" if any(hits) else "no live hit")
        if self.alloc.breakdown().duplicated:
            event("a live block duplicates another's content")

    def teardown(self) -> None:
        if self.alloc is None:
            return
        for sid in self._live():
            self.alloc.release(sid)
            self.model.release(sid)
        check_hybrid_caching_all_free(self.alloc)


_HybridCachingMachine.TestCase.settings = settings(settings(), stateful_step_count=40)
TestHybridCachingMachine = _HybridCachingMachine.TestCase


class _PagedTierMachine(AllocatorMachine):
    """Paged with prefix caching and a CPU tier (--kv-offloading-size, allocators/cpu_tier.py): the same
    rules and GPU invariants as paged, and the tier never holds more blocks than its capacity, holds
    each key once, and its counters agree (stored - evicted = held; every CPU hit was one load)."""

    allocator_name = "paged"

    # small GPU caches, so cached prefixes are evicted from the GPU and come back from the CPU tier
    @initialize(capacity=st.integers(48, 160), data=st.data())
    def build(self, capacity: int, data: st.DataObject) -> None:
        block_size = data.draw(st.sampled_from([1, 4, 8]), label="block_size")
        tier_blocks = data.draw(st.sampled_from([0, 1, 3, 12, 60]), label="tier_blocks")
        self.alloc = make_allocator(
            "paged",
            capacity_tokens=capacity,
            block_size=block_size,
            enable_prefix_caching=True,
            cpu_tier_tokens=tier_blocks * block_size,
        )

    @rule(fields=SPEC_FIELDS)
    def admit(self, fields: dict[str, Any]) -> None:
        loaded_before = self.alloc.cpu_tier.counters.loaded_tokens
        super().admit(fields)
        if self.alloc.cpu_tier.counters.loaded_tokens > loaded_before:
            event("admit: loaded from the CPU tier")

    @rule(prompt=st.integers(1, 70), first_chunk=st.integers(1, 40), output=st.integers(1, 30))
    def admit_chunked(self, prompt: int, first_chunk: int, output: int) -> None:
        """vLLM v1's per-chunk admission of a prompt named by its own request (content_key): the
        rest of the prompt arrives through `grow`, and the tier stores each chunk's full blocks."""
        sid = self.next_id
        self.next_id += 1
        seq = SeqSpec(
            sid,
            prompt,
            output,
            output,
            content_key=("r", sid),
            content_prompt_tokens=prompt,
            first_chunk_tokens=first_chunk,
        )
        stored_before = self.alloc.cpu_tier.counters.stored_tokens
        before = self.alloc.state_snapshot()
        if not self.alloc.admit(seq):
            event("admit chunked: refused")
            assert self.alloc.state_snapshot() == before, "a refused admit changed state"
            assert self.alloc.cpu_tier.counters.stored_tokens == stored_before
            return
        self.model.admit(seq)
        held = int(self.alloc.lengths_tokens[sid])
        assert held == min(prompt, first_chunk)
        del self.model.labels[sid][held:]  # the model holds what the allocator holds: the first chunk
        if held < prompt:
            event("admit chunked: more chunks to come")
        if self.alloc.cpu_tier.counters.stored_tokens > stored_before:
            event("admit chunked: stored")

    @rule()
    def flush_gpu_cache(self) -> None:
        """A plain request that takes every free block and leaves: the GPU's cached blocks are evicted,
        so the next request with a cached prefix can only find it in the CPU tier."""
        free_tokens = self.alloc.pool.num_free * self.alloc.block_size
        if free_tokens == 0:
            return
        seq = SeqSpec(seq_id=self.next_id, prompt_tokens=free_tokens, max_tokens=1, output_tokens=1)
        self.next_id += 1
        assert self.alloc.admit(seq)
        assert self.alloc.pool.num_cached == 0
        self.alloc.release(seq.seq_id)

    @invariant()
    def tier_within_capacity(self) -> None:
        if self.alloc is None:
            return
        tier = self.alloc.cpu_tier
        assert 0 <= tier.used_blocks <= tier.capacity_blocks
        counters = tier.counters
        assert counters.stored_tokens - counters.evicted_tokens == tier.used_tokens
        assert counters.cpu_hit_tokens == counters.loaded_tokens
        assert counters.gpu_hit_tokens + counters.cpu_hit_tokens <= counters.queried_tokens
        assert tier.used_tokens <= counters.peak_used_tokens <= tier.capacity_tokens
        load_tokens, store_tokens = tier.take_transfers()
        assert load_tokens % tier.block_size == 0 and store_tokens % tier.block_size == 0
        assert tier.take_transfers() == (0, 0)


_PagedTierMachine.TestCase.settings = settings(settings(), stateful_step_count=40)
TestPagedTierMachine = _PagedTierMachine.TestCase


def test_every_allocator_has_a_machine() -> None:
    from allocators import available

    assert set(PARAM_STRATEGIES) == set(available())


def test_ensure_rows_grows_every_named_array_together_with_its_fill() -> None:
    """The shared per-sequence array helper (allocators/seq_arrays.py) used by the contiguous family."""
    from types import SimpleNamespace

    from allocators.seq_arrays import ensure_rows

    owner = SimpleNamespace(live=np.zeros(0, dtype=bool), slot=np.zeros(0, dtype=np.int64))
    ensure_rows(owner, 20, {"live": False, "slot": -1})
    assert owner.live.shape == owner.slot.shape and owner.live.shape[0] >= 21
    assert not owner.live.any() and (owner.slot == -1).all()
    owner.live[3], owner.slot[3] = True, 7
    before = owner.slot
    ensure_rows(owner, 5, {"live": False, "slot": -1})
    assert owner.slot is before  # big enough: no copy
    ensure_rows(owner, 100, {"live": False, "slot": -1})
    assert owner.live[3] and owner.slot[3] == 7 and owner.slot[50] == -1 and owner.live.shape[0] >= 101
    alloc = make_allocator("contiguous", capacity_tokens=4096, max_model_len=64)
    assert isinstance(alloc, SlabAllocator)
    assert alloc.admit(SeqSpec(40, 10, 20, 20))  # a seq id far past the arrays' rows
    assert all(getattr(alloc, name).shape[0] >= 41 for name in SlabAllocator._ROW_FILLS)
    assert alloc.live[40] and not alloc.live[:40].any() and alloc.lengths_tokens[40] == 10
