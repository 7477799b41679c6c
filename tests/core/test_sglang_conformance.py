"""SGLang conformance: rules of the radix cache and the scheduler, translated from SGLang's tests and code.

Each test names its source in sgl-project/sglang. Token ids become runs (allocators/radix_content.py):
token t at position p is the stream ("tok", extra_key, t), so two keys share a prefix exactly where
their token ids (and extra keys) agree, as in SGLang's `RadixKey`.
"""

from __future__ import annotations

import math
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest
from _engine_helpers import LinearCost, make_requests

from allocators import SeqSpec
from allocators.radix import RadixAllocator
from allocators.radix_tree import RadixTree
from sim.core.engine import EngineConfig, run_engine
from sim.engines import engine_policy
from sim.engines.sglang import (
    CLIP_MAX_NEW_TOKENS,
    INIT_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY_STEPS,
    NewTokenRatio,
    SglangPolicy,
    chunked_prefill_size,
)

GIB = 1024**3


def key(tokens: list[int], extra: object = None) -> list:
    """SGLang's RadixKey(token_ids, extra_key) as runs."""
    return [(("tok", extra, token), position, position + 1) for position, token in enumerate(tokens)]


def insert_unlocked(tree: RadixTree, tokens: list[int], extra: object = None) -> int:
    """RadixCache.insert of a key: returns the prefix that existed (the tree keeps it, unlocked)."""
    return tree.insert(key(tokens, extra), len(tokens))[1]


# -- radix cache: test/srt/test_radix_cache_unit.py (TestRadixCache) ---------------------------------


def test_insert_and_match_basic() -> None:
    """`test_insert_and_match_basic`: insert [1, 2, 3] -> prefix 0, total 3, evictable 3; the whole
    key matches 3 tokens, the key [1, 2] matches 2."""
    tree = RadixTree(1)
    assert insert_unlocked(tree, [1, 2, 3]) == 0
    assert tree.total_tokens == 3 and tree.evictable_tokens == 3
    assert tree.match_prefix(key([1, 2, 3]), 3)[1] == 3
    assert tree.match_prefix(key([1, 2]), 2)[1] == 2


def test_total_size() -> None:
    """`test_total_size`: [1, 2, 3] then [4, 5] hold 5 tokens."""
    tree = RadixTree(1)
    insert_unlocked(tree, [1, 2, 3])
    insert_unlocked(tree, [4, 5])
    assert tree.total_tokens == 5


def test_extra_key_isolation() -> None:
    """`test_extra_key_isolation`: the same tokens under different extra keys never match each other."""
    tree = RadixTree(1)
    for extra in ("key1", "key2", None):
        assert insert_unlocked(tree, [1, 2, 3], extra) == 0
    for extra in ("key1", "key2", None):
        assert tree.match_prefix(key([1, 2, 3], extra), 3)[1] == 3
    assert tree.match_prefix(key([1, 2, 3], "nonexistent"), 3)[1] == 0
    assert tree.total_tokens == 9


def test_lock_ref_operations() -> None:
    """`test_lock_ref_operations`: locking the matched node moves its 3 tokens from evictable to
    protected; unlocking moves them back."""
    tree = RadixTree(1)
    insert_unlocked(tree, [1, 2, 3])
    node, _ = tree.match_prefix(key([1, 2, 3]), 3)
    evictable, protected = tree.evictable_tokens, tree.protected_tokens
    tree.inc_lock_ref(node)
    assert (tree.protected_tokens, tree.evictable_tokens) == (protected + 3, evictable - 3)
    tree.dec_lock_ref(node)
    assert (tree.protected_tokens, tree.evictable_tokens) == (protected, evictable)


def test_evict_functionality() -> None:
    """`test_evict_functionality`: evict(2) over [1, 2] and [3, 4] frees a whole leaf."""
    tree = RadixTree(1)
    insert_unlocked(tree, [1, 2])
    insert_unlocked(tree, [3, 4])
    assert tree.evict(2) == 2
    assert tree.total_tokens == 2


@pytest.mark.parametrize(("page", "length"), [(1, 5), (2, 5), (4, 6)])
def test_page_alignment_boundary(page: int, length: int) -> None:
    """`test_page_alignment_boundary`: with page_size p, inserting and matching `length` tokens
    matches a non-empty multiple of p."""
    tree = RadixTree(page)
    tokens = list(range(length))
    tree.insert(key(tokens), length)
    matched = tree.match_prefix(key(tokens), length)[1]
    assert matched > 0 and matched % page == 0
    assert matched == length // page * page


# -- radix cache: python/sglang/srt/mem_cache/radix_cache.py ---------------------------------------------


def test_partial_match_splits_the_node_and_insert_reports_the_existing_prefix() -> None:
    """`_match_prefix_helper` / `_split_node`: matching [1, 2, 4] against [1, 2, 3] splits the node
    after 2 tokens; `insert` returns the 2 tokens that existed and adds only [4]."""
    tree = RadixTree(1)
    insert_unlocked(tree, [1, 2, 3])
    node, matched = tree.match_prefix(key([1, 2, 4]), 3)
    assert matched == 2 and node.num_tokens == 2 and len(node.children) == 1
    assert insert_unlocked(tree, [1, 2, 4]) == 2
    assert tree.total_tokens == 4 and len(node.children) == 2


def test_evict_is_lru_and_skips_locked_leaves() -> None:
    """`evict`: a heap of leaves by last access time; locked leaves (lock_ref > 0) are skipped and a
    parent left childless becomes a candidate."""
    tree = RadixTree(1)
    insert_unlocked(tree, [1, 2, 3])  # oldest
    insert_unlocked(tree, [7, 8])
    insert_unlocked(tree, [1, 2, 5])  # splits [1, 2] | [3], adds [5]
    tree.match_prefix(key([1, 2, 3]), 3)  # touches [1, 2] and [3]: [7, 8] is now the least recent
    assert tree.evict(1) == 2 and tree.match_prefix(key([7, 8]), 2)[1] == 0
    locked, _ = tree.match_prefix(key([1, 2, 3]), 3)
    tree.inc_lock_ref(locked)
    assert tree.evict(10) == 1  # only [5]; [3] and its parent [1, 2] are locked
    assert tree.match_prefix(key([1, 2, 3]), 3)[1] == 3
    tree.dec_lock_ref(locked)
    assert tree.evict(10) == 3  # [3], then its parent [1, 2] once childless
    assert tree.total_tokens == 0


def test_allocator_evicts_cached_leaves_only_when_the_pool_is_short() -> None:
    """mem_cache/common.py `alloc_token_slots`: eviction runs only when `available_size` is short,
    and a finished request's KV stays cached (`cache_finished_req`) until then."""
    alloc = RadixAllocator(100)
    assert alloc.admit(SeqSpec(0, 60, 10, 10, content_key=("r", 0), content_prompt_tokens=60))
    alloc.release(0)
    parts = alloc.breakdown(0)
    assert (parts.cached, parts.free, parts.token_states) == (60, 100, 0)
    assert alloc.admit(SeqSpec(1, 30, 10, 10, content_key=("r", 1), content_prompt_tokens=30))
    assert alloc.breakdown(0).cached == 60  # 40 free slots were enough
    assert alloc.admit(SeqSpec(2, 50, 10, 10, content_key=("r", 2), content_prompt_tokens=50))
    parts = alloc.breakdown(0)
    assert parts.cached == 0 and parts.token_states == 80  # the whole 60-token leaf went


def test_resumed_request_matches_its_own_tokens() -> None:
    """`cache_finished_req` inserts prompt and output: a request resumed with its generated tokens
    (recompute) matches all of them while they are cached."""
    alloc = RadixAllocator(500)
    spec = SeqSpec(
        0, 40, 100, 100, prefix_group=3, prefix_tokens=16, content_key=("r", 7), content_prompt_tokens=40
    )
    assert alloc.admit(spec)
    assert not alloc.grow(np.array([0]), 25).size
    alloc.release(0)
    resumed = spec._replace(seq_id=1, prompt_tokens=65, max_tokens=75, output_tokens=75)
    assert alloc.admit(resumed)
    assert alloc.prefix_hit_tokens(1) == 65


# -- scheduler: managers/ and server_args.py --------------------------------------------------------------


def test_new_token_ratio_decays_to_its_minimum_in_600_decode_steps() -> None:
    """new_token_ratio_tracker.py `NewTokenRatioTracker.from_server_args` / `decay_step`: init 0.7,
    min 0.7 x 0.14, decay (init - min) / 600 per decode step; `reset` returns to init."""
    ratio = NewTokenRatio()
    assert ratio.current(0) == INIT_NEW_TOKEN_RATIO
    assert math.isclose(ratio.min, 0.098)
    assert math.isclose(ratio.current(300), (0.7 + 0.098) / 2)
    assert math.isclose(ratio.current(NEW_TOKEN_RATIO_DECAY_STEPS), 0.098)
    assert ratio.current(10 * NEW_TOKEN_RATIO_DECAY_STEPS) == ratio.min
    ratio.reset(5000)
    assert ratio.current(5000) == INIT_NEW_TOKEN_RATIO


def test_retraction_sets_the_ratio_to_the_batch_estimate() -> None:
    """schedule_batch.py `retract_decode`: new ratio = (decoded + 20 x requests) / sum max_new_tokens,
    at most 1.0; it then decays from there."""
    ratio = NewTokenRatio()
    ratio.after_retraction([10, 30], [100, 100], iteration=50)
    assert math.isclose(ratio.current(50), (40 + 2 * 20) / 200)
    ratio.after_retraction([90, 95], [100, 100], iteration=60)
    assert ratio.current(60) == 1.0


@pytest.mark.parametrize(
    ("memory_gib", "tokens"), [(24, 2048), (40, 8192), (80, 8192), (141, 8192), (192, 16384)]
)
def test_chunked_prefill_size_by_gpu_memory(memory_gib: int, tokens: int) -> None:
    """server_args.py `ServerArgs._handle_gpu_memory_settings`: 2048 tokens below 35 GiB, 8192
    below 160 GiB, else 16384."""
    assert chunked_prefill_size(memory_gib * GIB) == tokens
    policy = engine_policy("sglang")
    budgets = policy.default_budgets(
        max_model_len=4096, chunked=True, gpu_name="X", gpu_memory_bytes=memory_gib * GIB
    )
    assert budgets == (tokens, 2048)


def _fake_batch(hits: list[int]) -> SimpleNamespace:
    # fresh requests (WorkItem.sample -1), and `spec` with RequestInfo.spec's sample argument
    items = [SimpleNamespace(req=req, emitted=0, sample=-1) for req in range(len(hits))]
    info = SimpleNamespace(spec=lambda req, seq_id, emitted, sample=0: req)
    alloc = SimpleNamespace(cached_prefix_tokens=lambda req: hits[req])
    return SimpleNamespace(waiting=deque(items), info=info, alloc=alloc)


def test_lpm_sorts_by_longest_cached_prefix_stably_and_fcfs_keeps_order() -> None:
    """schedule_policy.py `SchedulePolicy._sort_by_longest_prefix` (a stable sort by -prefix length)
    for "lpm"; "fcfs" leaves the queue in arrival order."""
    batch = _fake_batch([0, 32, 8, 32])
    SglangPolicy("lpm").order_waiting(batch)
    assert [item.req for item in batch.waiting] == [1, 3, 2, 0]
    batch = _fake_batch([0, 32, 8, 32])
    SglangPolicy("fcfs").order_waiting(batch)
    assert [item.req for item in batch.waiting] == [0, 1, 2, 3]


def test_lpm_falls_back_to_fcfs_above_128_waiting() -> None:
    """schedule_policy.py `SchedulePolicy._determine_active_policy`: LPM is FCFS when > 128 wait."""
    hits = list(range(129))
    batch = _fake_batch(hits)
    SglangPolicy("lpm").order_waiting(batch)
    assert [item.req for item in batch.waiting] == hits
    batch = _fake_batch(hits[:128])
    SglangPolicy("lpm").order_waiting(batch)
    assert [item.req for item in batch.waiting] == hits[:128][::-1]


def test_admission_waits_for_the_new_token_ratio_estimate() -> None:
    """schedule_policy.py `PrefillAdder`: with request 0 decoding, request 1 (100 prompt tokens,
    max_new_tokens 1500) is admitted at the first prefill step where 100 + 300 < free + evictable -
    ratio x (request 0's remaining max_new_tokens, clipped at 4096); vLLM v1 admits it at once.

    Every step costs 10 ms, so request 1's admission time counts the decode steps waited.
    """
    requests = make_requests([0.0, 0.0], [100, 100], [2000, 10], [2000, 1500])
    capacity = 3000

    def run(engine: str) -> float:
        config = EngineConfig(
            max_num_seqs=8,
            max_num_batched_tokens=512,
            max_model_len=4096,
            enable_chunked_prefill=True,
            policy=engine_policy(engine),
        )
        result = run_engine(requests, RadixAllocator(capacity), LinearCost(0.01, 0.0, 0.0), config)
        return float(result.requests["admitted_s"].iloc[1])

    assert run("vllm-v1") == 0.0
    # expected from SGLang's rule: before decode step j, request 0 has emitted 1 + j tokens, holds
    # 101 + j slots, and the ratio has decayed j steps (the prefill step does not decay it)
    ratio = NewTokenRatio()
    step = next(
        j
        for j in range(500)
        if 100 + 1500 < (capacity - 101 - j) - ratio.current(j) * min(2000 - (1 + j), CLIP_MAX_NEW_TOKENS)
    )
    assert step > 0
    assert run("sglang") == pytest.approx(0.01 * (1 + step), rel=1e-9)


def test_retraction_victim_has_decoded_least_then_the_longest_prompt() -> None:
    """schedule_batch.py `ScheduleBatch.retract_decode`: sort by (len(output_ids),
    -len(origin_input_ids)) in reverse, stably, and pop the last."""
    prompts = [100, 50, 200, 200]

    def victim(decoding: list[tuple[int, int, int]]) -> int:
        batch = SimpleNamespace(
            decode_sequences=lambda: decoding, info=SimpleNamespace(prompt_tokens=prompts)
        )
        seq_id, group = SglangPolicy().preemption_victim(batch)
        assert group is None
        return seq_id

    assert victim([(10, 0, 5), (11, 1, 3), (12, 2, 9)]) == 11  # fewest decoded tokens
    assert victim([(10, 0, 3), (11, 1, 3), (12, 2, 3)]) == 12  # then the longest prompt
    assert victim([(12, 2, 3), (13, 3, 3)]) == 13  # then the newest (last in running order)
