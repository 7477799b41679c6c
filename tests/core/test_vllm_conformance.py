"""Conformance with vLLM: each test states one vLLM rule and cites where vLLM has it.

v1 sources are files of vllm-project/vllm `vllm/v1/core/` (block_pool.py, kv_cache_manager.py,
kv_cache_utils.py, sched/scheduler.py) and the tests in `tests/v1/core/`; v0 sources are
`vllm/core/scheduler.py` and `vllm/config.py` of the v0.2-v0.6 releases. docs/engines.md lists them.
The tests are kvsim's own (small hand-worked cases), not copies of vLLM's.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cli_helpers import run_cli
from _engine_helpers import FakePaged, LinearCost, make_requests

from allocators.base import SeqSpec
from allocators.block_pool import BlockPool
from allocators.paged import PagedAllocator
from sim.core.engine import EngineConfig, run_engine
from sim.engines import VllmV0Policy, VllmV1Policy, engine_policy
from sim.errors import ScenarioError
from sim.scenario.scenario import Scenario

BLOCK = 16


def paged(num_blocks: int, caching: bool = True, share: bool | None = None) -> PagedAllocator:
    return PagedAllocator(
        "paged",
        num_blocks * BLOCK,
        BLOCK,
        enable_prefix_caching=caching,
        share_prefixes=caching if share is None else share,
    )


def hashed(seq_id: int, prompt_tokens: int, hashes: tuple[int, ...], output_tokens: int = 1) -> SeqSpec:
    """A prompt named by one hash id per block of BLOCK tokens (Mooncake-style hash_ids)."""
    return SeqSpec(
        seq_id, prompt_tokens, output_tokens, output_tokens, block_hashes=hashes, block_hash_tokens=BLOCK
    )


def plain(seq_id: int, prompt_tokens: int, output_tokens: int = 1) -> SeqSpec:
    return SeqSpec(seq_id, prompt_tokens, output_tokens, output_tokens)


def engine_config(engine: str, **knobs: object) -> EngineConfig:
    return EngineConfig(policy=engine_policy(engine), **knobs)


# --- prefix caching: kv_cache_manager.get_computed_blocks / block_pool ------------------------------


def test_shared_prefix_hits_whole_common_blocks() -> None:
    """Rule: a request hits every leading full block whose chained hash is cached, live or free.

    Source: vllm/v1/core/kv_cache_manager.py `KVCacheManager.get_computed_blocks`; mirrors
    tests/v1/core/test_prefix_caching.py `test_prefill` (a second request sharing the prefix hits it).
    """
    alloc = paged(16)
    assert alloc.admit(hashed(0, 40, (1, 2, 3)))
    assert alloc.prefix_hit_tokens(0) == 0
    assert alloc.admit(hashed(1, 40, (1, 2, 7)))  # shares blocks 0 and 1, block 2 differs
    assert alloc.prefix_hit_tokens(1) == 32
    assert alloc.block_table_of(1)[:2].tolist() == alloc.block_table_of(0)[:2].tolist()
    alloc.release(0)
    assert alloc.admit(hashed(2, 40, (1, 2, 3)))  # cached after release: still a hit
    assert alloc.prefix_hit_tokens(2) == 32


def test_full_hit_is_capped_at_prompt_minus_one_in_whole_blocks() -> None:
    """Rule: hits are capped at prompt - 1 tokens, rounded down to whole blocks, so a fully cached
    block-aligned prompt recomputes its whole last block: a 48-token prompt at block 16 hits 32.

    Source: vllm/v1/core/kv_cache_manager.py `get_computed_blocks` (max_cache_hit_length =
    request.num_tokens - 1, then `find_longest_cache_hit` in whole blocks); mirrors
    tests/v1/core/test_prefix_caching.py `test_prefill` ("the last block is recomputed" case).
    """
    alloc = paged(16)
    assert alloc.admit(hashed(0, 48, (1, 2, 3)))
    alloc.release(0)
    assert alloc.admit(hashed(1, 48, (1, 2, 3)))
    assert alloc.prefix_hit_tokens(1) == 32
    assert alloc.admit(hashed(2, 49, (1, 2, 3, 4)))  # one more token: all three blocks hit
    assert alloc.prefix_hit_tokens(2) == 48


def test_full_hit_cap_reaches_the_engine_prefill_work() -> None:
    """Rule (same cap, seen from the scheduler): a fully cached 48-token prompt computes 16 tokens.

    Source: vllm/v1/core/sched/scheduler.py `Scheduler.schedule` (num_new_tokens = num_tokens -
    num_computed_tokens) with the cap of `get_computed_blocks`.
    """
    requests = make_requests([0.0, 5.0], [48, 48], [2, 2])
    requests["block_hashes"] = [[1, 2, 3], [1, 2, 3]]
    requests.attrs["block_hash_tokens"] = BLOCK
    result = run_engine(requests, paged(16), LinearCost(0.01), engine_config("vllm-v1"))
    assert result.requests["prefix_hit_tokens"].tolist() == [0, 32]
    assert result.totals["prefill_tokens"] == 48 + 16


def test_chained_hashes_stop_at_the_first_miss() -> None:
    """Rule: a block's hash chains its parent's, so the hit stops at the first missing block even if
    a later block id matches.

    Source: vllm/v1/core/kv_cache_utils.py `hash_block_tokens` (parent_block_hash in the hash) and
    `find_longest_cache_hit` (breaks at the first miss); mirrors tests/v1/core/test_kv_cache_utils.py
    `test_hash_block_tokens` / test_prefix_caching.py `test_prefill` (partial match).
    """
    alloc = paged(16)
    assert alloc.admit(hashed(0, 64, (1, 2, 3, 4)))
    assert alloc.admit(hashed(1, 64, (1, 9, 3, 4)))
    assert alloc.prefix_hit_tokens(1) == 16


def test_free_queue_puts_uncached_blocks_first_and_cached_tail_first_last() -> None:
    """Rule: freed blocks without a hash go to the front of the free queue (reused first); cached
    blocks go to the back, a request's tail block first, so a cached prefix is evicted last.

    Source: vllm/v1/core/block_pool.py `BlockPool.free_blocks` (prepend_n(blocks_without_hash),
    append_n(blocks_with_hash)); single_type_kv_cache_manager.py `free` (reversed block order);
    mirrors tests/v1/core/test_prefix_caching.py eviction-order tests.
    """
    alloc = paged(4)
    assert alloc.admit(hashed(0, 32, (1, 2)))  # blocks 0, 1 named
    alloc.release(0)  # cached: back of the queue, tail first
    assert alloc.admit(plain(1, 32))  # takes the two never-used blocks 2, 3
    alloc.release(1)  # uncached: front of the queue
    assert alloc.pool.queue.peek(4).tolist() == [3, 2, 1, 0]
    assert alloc.admit(plain(2, 32))  # reuses the uncached blocks, the cached prefix survives
    assert sorted(alloc.block_table_of(2).tolist()) == [2, 3]
    alloc.release(2)
    assert alloc.admit(hashed(3, 48, (1, 2, 3)))
    assert alloc.prefix_hit_tokens(3) == 32  # the old rule (all to the back) evicted it: 0


def test_free_queue_appends_everything_with_caching_off() -> None:
    """Rule: with prefix caching off every freed block is appended (no split), for GPU locality.

    Source: vllm/v1/core/block_pool.py `BlockPool.free_blocks` (`block.block_hash is None and
    self.enable_caching` selects the front).
    """
    pool = BlockPool(4, enable_caching=False)
    first = pool.allocate(2)
    pool.release(first[::-1].copy())
    assert pool.queue.peek(4).tolist() == [2, 3, 1, 0]


def test_computed_blocks_of_an_admitted_request_are_not_evicted_under_it() -> None:
    """Rule: a request's cache hits are touched (taken out of the free queue) before its new blocks
    are popped, so allocating the rest of its prompt cannot evict its own hits.

    Source: vllm/v1/core/kv_cache_manager.py `KVCacheManager.allocate_slots` (touch(computed blocks)
    before `get_new_blocks`); mirrors tests/v1/core/test_prefix_caching.py
    `test_evict_with_... ` / `test_cache_blocks` (hit blocks removed from the free queue).
    """
    alloc = paged(4)
    assert alloc.admit(hashed(0, 32, (1, 2)))
    alloc.release(0)  # blocks 0, 1 cached at the back; 2, 3 never used in front
    assert alloc.admit(hashed(1, 64, (1, 2)))  # 2 hits + 2 new blocks: exactly the whole pool
    assert alloc.prefix_hit_tokens(1) == 32
    assert alloc.block_table_of(1)[:2].tolist() == [0, 1]
    assert alloc.pool.num_free == 0


def test_caching_disabled_means_no_hits_and_no_sharing_across_requests() -> None:
    """Rule: with prefix caching off, requests never share blocks (only forks of one request do).

    Source: vllm/v1/core/kv_cache_manager.py `get_computed_blocks` (returns no blocks when
    `enable_caching` is false); tests/v1/core/test_prefix_caching.py runs with caching on for hits.
    """
    scenario = Scenario()  # vllm-v0: prefix caching off
    assert scenario.allocator_params()["share_prefixes"] is False
    explicit = Scenario(allocator={"name": "paged", "params": {"share_prefixes": True}})
    assert explicit.allocator_params()["share_prefixes"] is True  # sharing asked for explicitly
    alloc = paged(16, caching=False)
    assert alloc.admit(hashed(0, 48, (1, 2, 3)))
    assert alloc.admit(hashed(1, 48, (1, 2, 3)))
    assert alloc.prefix_hit_tokens(1) == 0
    assert set(alloc.block_table_of(0).tolist()).isdisjoint(alloc.block_table_of(1).tolist())


# --- scheduling: sched/scheduler.py (v1), core/scheduler.py (v0) ----------------------------------


def test_v1_schedules_running_decodes_first_then_waiting_in_the_remaining_budget() -> None:
    """Rule (chunked prefill on): each step schedules the running requests first (one token per
    decode), then waiting prompts in what is left of max_num_batched_tokens, chunking the last one.

    Source: vllm/v1/core/sched/scheduler.py `Scheduler.schedule` (RUNNING loop, then WAITING loop with
    token_budget); mirrors tests/v1/core/test_scheduler.py `test_schedule_partial_requests`.
    """
    requests = make_requests([0.0, 0.005], [8, 100], [50, 3])
    config = engine_config(
        "vllm-v1", max_num_batched_tokens=32, max_model_len=256, enable_chunked_prefill=True
    )
    result = run_engine(requests, FakePaged(4096, BLOCK), LinearCost(0.01), config)
    steps = result.steps
    mixed = steps[(steps["decode_tokens"] > 0) & (steps["prefill_tokens"] > 0)]
    assert len(mixed) > 0
    assert (mixed["prefill_tokens"] <= 32 - mixed["batch_size"] + 1).all()
    assert mixed["prefill_tokens"].iloc[0] == 31  # 32 minus the one running decode


def test_v0_prefill_only_steps_pause_decodes_without_chunked_prefill() -> None:
    """Rule (v0, chunked prefill off): a step with newly admitted prompts runs only them; the running
    decodes wait for the next step.

    Source: vllm/core/scheduler.py `Scheduler._schedule` (v0.2: "Join waiting sequences if possible";
    if prompts were scheduled it returns SchedulerOutputs for them alone, before the running queue).
    """
    requests = make_requests([0.0, 0.005], [8, 100], [50, 3])
    config = engine_config("vllm-v0", max_num_batched_tokens=2048, max_model_len=256)
    result = run_engine(requests, FakePaged(4096, BLOCK), LinearCost(0.01), config)
    steps = result.steps
    assert not ((steps["decode_tokens"] > 0) & (steps["prefill_tokens"] > 0)).any()
    # the paused decode is one step later than under mixed steps
    mixed = run_engine(
        requests, FakePaged(4096, BLOCK), LinearCost(0.01), engine_config("vllm-v1", max_model_len=256)
    )
    assert result.requests["finish_s"].iloc[0] > mixed.requests["finish_s"].iloc[0]


def test_newest_request_is_preempted_first() -> None:
    """Rule: when a running request cannot get a block, the most recently scheduled one is preempted
    (recompute: it goes back to the front of the waiting queue).

    Source: vllm/v1/core/sched/scheduler.py `Scheduler.schedule` (`self.running.pop()` under FCFS);
    v0 vllm/core/scheduler.py `_schedule` (`self.running.pop()`); mirrors
    tests/v1/core/test_scheduler.py `test_preempt_during_execution`.
    """
    requests = make_requests([0.0, 0.001], [16, 16], [40, 40])
    for engine in ("vllm-v0", "vllm-v1"):
        config = engine_config(engine, max_model_len=256, preemption_mode="recompute")
        result = run_engine(requests, FakePaged(5 * BLOCK, BLOCK), LinearCost(0.01), config)
        assert result.requests["preemptions"].tolist()[0] == 0, engine
        assert result.requests["preemptions"].tolist()[1] >= 1, engine


def test_v1_admits_nobody_in_a_step_that_preempted() -> None:
    """Rule (v1): a step whose running requests had to preempt schedules no waiting request.

    Source: vllm/v1/core/sched/scheduler.py `Scheduler.schedule` (`if not preempted_reqs:` guards the
    WAITING loop).
    """
    requests = make_requests([0.0, 0.001, 0.002], [16, 16, 4], [40, 40, 2])
    knobs = {"max_model_len": 256, "preemption_mode": "recompute", "multi_step": False}
    held = run_engine(
        requests, FakePaged(5 * BLOCK, BLOCK), LinearCost(0.01), engine_config("vllm-v1", **knobs)
    )
    free = run_engine(requests, FakePaged(5 * BLOCK, BLOCK), LinearCost(0.01), EngineConfig(**knobs))
    assert held.requests["preemptions"].sum() >= 1
    assert held.requests["admitted_s"].iloc[2] >= free.requests["admitted_s"].iloc[2]


def test_v0_recomputes_single_sequences_and_swaps_parallel_samples() -> None:
    """Rule (v0, --preemption-mode unset): recompute a sequence group with one running sequence, swap
    a group with several (parallel samples, beams).

    Source: vllm/core/scheduler.py `Scheduler._preempt` (v0.2-v0.6: `if preemption_mode is None:
    if seq_group.get_max_num_running_seqs() == 1: RECOMPUTE else: SWAP`).
    """
    single = make_requests([0.0, 0.001], [16, 16], [40, 40])
    config = engine_config("vllm-v0", max_model_len=256, preemption_mode="auto")
    result = run_engine(single, FakePaged(5 * BLOCK, BLOCK), LinearCost(0.01), config)
    assert result.requests["preemptions"].sum() >= 1
    assert result.requests["recomputed_tokens"].sum() > 0  # recomputed, not swapped
    forked = make_requests([0.0, 0.001], [16, 16], [40, 40], n=[1, 2])
    result = run_engine(forked, FakePaged(6 * BLOCK, BLOCK), LinearCost(0.01), config)
    assert result.requests["preemptions"].iloc[1] >= 1
    assert result.requests["recomputed_tokens"].iloc[1] == 0  # its samples swapped out and back


def test_v0_swap_space_is_a_bound() -> None:
    """Rule (v0): a sequence is swapped out only if the CPU swap space has room for its blocks.

    Source: vllm/core/block_manager_v1.py `BlockSpaceManager.can_swap_out` and vllm/core/scheduler.py
    `_swap_out` (v0 aborts with "Aborted due to the lack of CPU swap space"; kvsim recomputes instead).
    """
    requests = make_requests([0.0, 0.001], [16, 16], [40, 40])
    knobs = {"max_model_len": 256, "preemption_mode": "swap"}  # FakePaged swaps whole blocks of BLOCK
    roomy = run_engine(
        requests, FakePaged(5 * BLOCK, BLOCK), LinearCost(0.01), engine_config("vllm-v0", **knobs)
    )
    assert roomy.requests["recomputed_tokens"].sum() == 0
    none = run_engine(
        requests,
        FakePaged(5 * BLOCK, BLOCK),
        LinearCost(0.01),
        engine_config("vllm-v0", swap_space_tokens=0, **knobs),
    )
    assert none.requests["preemptions"].sum() >= 1
    assert none.requests["recomputed_tokens"].sum() > 0  # no room: recomputed


# --- presets and figures ------------------------------------------------------------------------


def test_max_concurrency_rounds_each_request_up_to_whole_blocks() -> None:
    """Rule: "Maximum concurrency for N tokens per request" = whole cache blocks / cdiv(N, block_size).

    Source: vllm/v1/core/kv_cache_utils.py `get_max_concurrency_for_kv_cache_config`; mirrors
    tests/v1/core/test_kv_cache_utils.py `test_get_max_concurrency_for_kv_cache_config`.
    """
    scenario = Scenario(kv_cache_memory="12GiB", max_model_len=2048)  # OPT-13B: 15,728 slots = 983 blocks
    assert scenario.kv_capacity_tokens() == 15_728
    assert scenario.max_concurrency(2001) == pytest.approx(983 / 126)  # not 15,728 / 2,001
    assert scenario.max_concurrency() == pytest.approx(983 / 128)


def test_v1_defaults_depend_on_the_gpu_and_flags_override_them() -> None:
    """Rule: v1 turns chunked prefill and prefix caching on; `vllm serve` budgets are 8192 tokens and
    1024 sequences on >= 70 GiB GPUs that are not A100s, else 2048 and 256; v1 only recomputes.

    Source: vllm/engine/arg_utils.py `EngineArgs.get_batch_defaults` (UsageContext.OPENAI_API_SERVER)
    and `_set_default_args`; vllm/v1/core/sched/scheduler.py `_preempt_request`.
    """
    a100 = Scenario(engine="vllm-v1")
    assert (a100.enable_chunked_prefill, a100.enable_prefix_caching, a100.preemption_mode) == (
        True,
        True,
        "recompute",
    )
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)
    h100 = Scenario(engine="vllm-v1", model="Llama-3-8B", gpu="H100-80GB")
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    a100_80 = Scenario(engine="vllm-v1", model="Llama-3-8B", gpu="A100-80GB")
    assert (a100_80.max_num_batched_tokens, a100_80.max_num_seqs) == (2048, 256)
    own = Scenario(engine="vllm-v1", enable_prefix_caching=False, max_num_seqs=64)
    assert (own.enable_prefix_caching, own.max_num_seqs) == (False, 64)
    with pytest.raises(ScenarioError, match="vllm-v1 only recomputes"):
        Scenario(engine="vllm-v1", preemption_mode="swap")


def test_v0_defaults_are_the_paper_engine() -> None:
    """Rule (v0): no chunked prefill or prefix caching, max_num_seqs 256, max_num_batched_tokens
    max(max_model_len, 2048), the preemption mode chosen per group; switching engines re-derives.

    Source: vllm/config.py `SchedulerConfig.__init__` (v0.2) and vllm/engine/arg_utils.py `EngineArgs`.
    """
    v0 = Scenario()
    assert v0.engine == "vllm-v0"
    assert (v0.enable_chunked_prefill, v0.enable_prefix_caching, v0.preemption_mode) == (False, False, "auto")
    assert (v0.max_num_batched_tokens, v0.max_num_seqs) == (2048, 256)
    assert Scenario(model="Llama-3-8B").max_num_batched_tokens == 8192
    v1 = v0.with_overrides(engine="vllm-v1")
    assert (v1.enable_chunked_prefill, v1.max_num_batched_tokens, v1.preemption_mode) == (
        True,
        2048,
        "recompute",
    )


def test_v0_orca_baselines_use_buddy_placement() -> None:
    """Rule (paper): the Orca baselines place reservations with the buddy allocator.

    Source: Kwon et al., SOSP 2023, section 6.1 ("we use the buddy allocation algorithm to determine
    the memory address to store KV cache").
    """
    v0 = Scenario(allocator="request_limit:oracle")
    assert v0.allocator_params()["placement"] == "buddy"
    assert Scenario(allocator="contiguous:first_fit").allocator_params()["placement"] == "first_fit"
    assert "placement" not in Scenario(engine="vllm-v1", allocator="contiguous").allocator_params()


def test_engine_flag_errors_are_one_line() -> None:
    with pytest.raises(ScenarioError, match="field 'engine'"):
        Scenario(engine="vllm-v2")
    np.testing.assert_equal(Scenario(engine="vllm-v1").engine, "vllm-v1")


# --- decode-filled blocks: block_pool.cache_full_blocks --------------------------------------------


def test_decode_filled_blocks_become_hits_for_a_resumed_request() -> None:
    """Rule: every full block is hashed and cached, decode-filled ones too, so a request resumed after
    recompute preemption hits the blocks its prompt and its generated tokens filled.

    Source: vllm/v1/core/block_pool.py `BlockPool.cache_full_blocks` (called by kv_cache_manager.py
    `allocate_slots` for all computed tokens); mirrors tests/v1/core/test_prefix_caching.py
    `test_cache_blocks` / `test_prefill` (decode blocks cached once full).
    """
    alloc = paged(16)
    first = SeqSpec(0, 20, 30, 30, content_key=("r", 7), content_prompt_tokens=20)
    assert alloc.admit(first)
    assert len(alloc.grow(np.array([0]), 20)) == 0  # 40 tokens: blocks 0 and 1 full
    alloc.release(0)  # preempted (recompute)
    resumed = SeqSpec(1, 39, 11, 11, content_key=("r", 7), content_prompt_tokens=20)  # 20 + 19 emitted
    assert alloc.admit(resumed)
    assert alloc.prefix_hit_tokens(1) == 32
    other = SeqSpec(2, 39, 11, 11, content_key=("r", 8), content_prompt_tokens=20)
    assert alloc.admit(other)
    assert alloc.prefix_hit_tokens(2) == 0  # another request's tokens are other content


def test_a_sessions_next_turn_hits_the_previous_turns_output_blocks() -> None:
    """Rule: a follow-up turn whose prompt is the previous prompt + output hits the blocks decoding
    filled in the previous turn (kvsim names a session turn's tokens by its session stream).

    Source: vllm/v1/core/block_pool.py `BlockPool.cache_full_blocks` (decode blocks are hashed by
    their token ids, so equal text is an equal chain); the session rule is kvsim's
    (workloads/sharing.py session_history: next prompt = history + new text).
    """
    requests = make_requests([0.0, 10.0], [20, 60], [21, 2])
    requests["session_id"] = [0, 0]
    requests["prefix_group"] = [3, 3]
    requests["prefix_tokens"] = [0, 41]  # turn 2 starts with turn 1's 20 + 21 tokens
    config = engine_config("vllm-v1", max_model_len=256)
    cached = paged(32)
    assert cached.content_identity  # prefix caching declares that tokens need a content identity
    result = run_engine(requests, cached, LinearCost(0.01), config)
    assert result.requests["prefix_hit_tokens"].tolist() == [0, 32]  # 2 full blocks of turn 1's 41 tokens
    unnamed = paged(32)
    unnamed.content_identity = False  # only the prompts' own names (prefix_group), as before the rule
    anonymous = run_engine(requests, unnamed, LinearCost(0.01), config)
    assert anonymous.requests["prefix_hit_tokens"].tolist() == [0, 0]  # prompt-only naming: turn 1 held none


# --- chunked prefill allocation: kv_cache_manager.allocate_slots --------------------------------


def _scheduler(alloc: PagedAllocator, requests, **knobs):
    from sim.core.metrics import RequestLog
    from sim.core.scheduler import RequestInfo, Scheduler

    base = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 32,
        "max_model_len": 512,
        "enable_chunked_prefill": True,
        "preemption_mode": "recompute",
    }
    return Scheduler(RequestInfo(requests, 512), alloc, RequestLog(len(requests)), **{**base, **knobs})


def _v1_scheduler(alloc: PagedAllocator, requests, **knobs):
    """v1 allocates per scheduled chunk (VllmV1Policy.admit)."""
    return _scheduler(alloc, requests, policy=VllmV1Policy(), **knobs)


def test_chunked_prefill_allocates_blocks_per_scheduled_chunk() -> None:
    """Rule (v1): under chunked prefill a request holds blocks for the tokens scheduled so far (its
    cache hits plus each chunk), not for its whole prompt from admission on.

    Source: vllm/v1/core/kv_cache_manager.py `KVCacheManager.allocate_slots(request, num_new_tokens,
    ...)` called by vllm/v1/core/sched/scheduler.py `Scheduler.schedule` for each scheduled chunk;
    mirrors tests/v1/core/test_scheduler.py `test_schedule_partial_requests` (block counts per step).
    """
    requests = make_requests([0.0], [100], [3])
    alloc = paged(64, caching=False)
    sched = _v1_scheduler(alloc, requests)
    sched.enqueue(0, 0.0)
    held = []
    for step in range(4):
        plan = sched.schedule(float(step))
        held.append(int(alloc.num_seq_blocks[0]))
        sched.complete(1, plan, float(step) + 0.5)
    assert held == [2, 4, 6, 7]  # 32, 64, 96, 100 tokens scheduled
    whole = paged(64, caching=False)
    sched = _scheduler(whole, requests, policy=VllmV0Policy())  # v0: the whole prompt at once
    sched.enqueue(0, 0.0)
    sched.schedule(0.0)
    assert int(whole.num_seq_blocks[0]) == 7


def test_a_chunk_that_does_not_fit_preempts_the_newest_request() -> None:
    """Rule (v1): when the next chunk of a running request cannot get blocks, the newest running
    request is preempted (or the request itself, if it is the newest).

    Source: vllm/v1/core/sched/scheduler.py `Scheduler.schedule` (RUNNING loop: allocate_slots
    fails -> `self.running.pop()` preempted, retry).
    """
    requests = make_requests([0.0, 0.0], [60, 80], [30, 3])
    alloc = paged(6, caching=False)
    sched = _v1_scheduler(alloc, requests, max_num_batched_tokens=40)
    sched.enqueue(0, 0.0)
    sched.enqueue(1, 0.0)
    plan = sched.schedule(0.0)  # A: 40 tokens (3 blocks); no budget left for B
    assert [chunk for _, chunk in plan.chunks] == [40]
    sched.complete(1, plan, 0.5)
    plan = sched.schedule(1.0)  # A: last 20 (4 blocks); B: first 20 (2 blocks): the cache is full
    assert [chunk for _, chunk in plan.chunks] == [20, 20]
    sched.complete(1, plan, 1.5)
    plan = sched.schedule(2.0)  # B's next 39 tokens need 2 more blocks; B is the newest: itself
    assert list(sched.log.preemptions) == [0, 1]
    assert plan.chunks == [] and sched.num_decode == 1


# --- the flag -------------------------------------------------------------------------------------


def test_engine_flag_reaches_the_scenario_and_explicit_flags_win(tmp_path, capsys) -> None:
    import json

    out = tmp_path / "v1"
    args = ["run", "--engine", "vllm-v1", "--no-enable-prefix-caching", "--num-prompts", "30", "-o", str(out)]
    assert run_cli(args) == 0
    assert "vllm-v1" in capsys.readouterr().out
    scenario = json.loads((out / "summary.json").read_text())["scenario"]
    assert (scenario["engine"], scenario["enable_chunked_prefill"]) == ("vllm-v1", True)
    assert scenario["enable_prefix_caching"] is False  # the explicit flag beats the preset
    assert run_cli(["run", "--engine", "vllm-v2", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "field 'engine'" in err[0]
    assert not (tmp_path / "x").exists()


def test_a_sweep_grid_can_compare_the_two_engines() -> None:
    from sim.sweeps.spec import parse_spec

    spec = parse_spec({"base": {"num_prompts": 10}, "grid": {"engine": ["vllm-v0", "vllm-v1"]}})
    engines = [(cell.scenario.engine, cell.scenario.enable_chunked_prefill) for cell in spec.cells]
    assert engines == [("vllm-v0", False), ("vllm-v1", True)]


# --- prefix caching under sliding windows: the hybrid coordinator ---------------------------------
# vllm/v1/core/single_type_kv_cache_manager.py `FullAttentionManager.find_longest_cache_hit` (left to
# right, every block from the start), `SlidingWindowManager.find_longest_cache_hit` (right to left, the
# cdiv(sliding_window - 1, block_size) consecutive blocks ending at the hit, earlier ones null blocks;
# without such a run, the cached blocks from block 0), and vllm/v1/core/kv_cache_coordinator.py
# `HybridKVCacheCoordinator.find_longest_cache_hit` (full attention first, its hit the window groups'
# longest candidate: the hit is what every group serves). allocators/hybrid_caching.py.

WINDOW_PLAN = {"num_layers": 6, "num_window_layers": 5, "window_tokens": 8}  # 1 full, 5 window layers


def test_window_group_needs_only_the_blocks_its_window_reads() -> None:
    from allocators.hybrid_caching import (
        full_attention_hit_blocks,
        sliding_window_hit_blocks,
        window_needed_blocks,
    )

    # window 4, blocks of 2 tokens: the token after a hit reads 3 earlier tokens = cdiv(3, 2) blocks
    assert window_needed_blocks(4, 2) == 2 and window_needed_blocks(1024, 16) == 64
    cached = {0, 1, 3, 4}.__contains__  # blocks 0..6; 2, 5 and 6 evicted
    assert full_attention_hit_blocks(cached, 7) == 2  # full attention stops at the first miss
    assert sliding_window_hit_blocks(cached, 7, 2) == 5  # blocks 3, 4 end a run of 2: hit 5 blocks
    assert sliding_window_hit_blocks(cached, 7, 3) == 2  # no run of 3: the blocks from 0 (0, 1)
    # the coordinator: the window groups search within the full groups' hit; the hit is the min
    assert sliding_window_hit_blocks(cached, full_attention_hit_blocks(cached, 7), 2) == 2


def window_seq(seq_id: int, prompt: int, hashes: tuple[int, ...]) -> SeqSpec:
    return SeqSpec(seq_id, prompt, 50, 50, block_hashes=hashes, block_hash_tokens=4)


def test_hybrid_hit_survives_eviction_of_window_blocks_before_the_window() -> None:
    from allocators import make_allocator

    alloc = make_allocator(
        "hybrid", capacity_tokens=100, block_size=4, enable_prefix_caching=True, **WINDOW_PLAN
    )
    assert alloc.window_needed_blocks == 2  # cdiv(8 - 1, 4)
    prefix = (1, 2, 3, 4, 5, 6)  # 6 named blocks of 4 tokens
    assert alloc.admit(window_seq(0, 30, prefix))
    alloc.grow(np.array([0]), 1)  # length 31: window groups free blocks 0..5 (named: cached)
    assert alloc.pool.num_cached == 6 * 5
    # evict exactly the window groups' blocks 0..3 (least recently freed first)
    taken = alloc.pool.allocate(alloc.pool.num_free - alloc.pool.num_cached + 4 * 5)
    assert alloc.pool.num_cached == 2 * 5
    alloc.pool.release(taken[:12])  # room for the new blocks (rows 6, 7 in 6 groups), at the queue head
    taken = taken[12:]
    # full group: blocks 0..5 live in seq 0; window groups: blocks 4, 5 cached -> the hit is 6 blocks
    assert alloc.admit(window_seq(1, 30, prefix))
    assert alloc.prefix_hit_tokens(1) == 24
    assert alloc.first_window_block[1] == 4  # blocks 0..3 are null blocks in the window groups
    alloc.release(1)
    alloc.pool.release(taken)
    # evict one more window block (seq 1 freed its blocks 5, 4 in that order: block 5 of one group
    # goes first): no run of 2 cached blocks ends at 6, and block 0 is not cached: no hit
    extra = alloc.pool.allocate(alloc.pool.num_free - alloc.pool.num_cached + 1)
    alloc.pool.release(extra[:-1])
    assert alloc.pool.num_cached == 2 * 5 - 1
    assert alloc.admit(window_seq(2, 30, prefix))
    assert alloc.prefix_hit_tokens(2) == 0


def test_hybrid_hit_is_the_longest_every_group_serves() -> None:
    from allocators import make_allocator

    alloc = make_allocator(
        "hybrid", capacity_tokens=100, block_size=4, enable_prefix_caching=True, **WINDOW_PLAN
    )
    assert alloc.admit(window_seq(0, 24, (1, 2, 3, 4, 5, 6)))
    alloc.release(0)  # every named block cached, in every group
    # shares 3 blocks (full groups hit 3); the window groups have blocks 1, 2 cached: hit 3 blocks
    assert alloc.admit(window_seq(1, 24, (1, 2, 3, 9, 9, 9)))
    assert alloc.prefix_hit_tokens(1) == 12
    # the cap: prompt - 1 tokens in whole blocks, so a fully cached 24-token prompt hits 20
    assert alloc.admit(window_seq(2, 24, (1, 2, 3, 4, 5, 6)))
    assert alloc.prefix_hit_tokens(2) == 20
    # its recomputed block 5 takes over the name from the cached (free) copy: nothing duplicated
    assert alloc.breakdown().duplicated == 0
    # the same prompt again: block 5 is recomputed into a new block while seq 2's copy is live, so
    # one full-layer block (4 tokens x 1 layer) is duplicated (vLLM also keeps both copies)
    assert alloc.admit(window_seq(3, 24, (1, 2, 3, 4, 5, 6)))
    assert alloc.prefix_hit_tokens(3) == 20
    assert alloc.breakdown().duplicated == 4
    alloc.release(2)
    assert alloc.breakdown().duplicated == 0
    # hits are shared blocks: one physical copy, refcount = holders (full group, blocks 0..2)
    assert all(alloc.pool.refcount[alloc._full[1][row]].tolist() == [2] for row in range(3))
