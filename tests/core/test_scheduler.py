"""The scheduler on its own: admission order, token budget, max_num_seqs, chunked prefill, preemption
order, and the head of the queue that does not fit.

Why without the engine: these are the policy decisions of `sim.core.scheduler.Scheduler` (vLLM's
FCFS continuous batching); driving `enqueue` / `schedule` / `complete` by hand pins each one down
without time, costs or SimPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _engine_helpers import FakePaged, FakeSlab, make_requests

from sim.core.metrics import RequestLog
from sim.core.scheduler import RequestInfo, Scheduler
from sim.engines import VllmV0Policy


def _scheduler(requests: Any, allocator: Any, **limits: Any) -> Scheduler:
    config = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 1000,
        "max_model_len": 1000,
        "enable_chunked_prefill": False,
        "preemption_mode": "recompute",
    }
    config.update(limits)
    info = RequestInfo(requests, config["max_model_len"])
    return Scheduler(info, allocator, RequestLog(len(requests)), **config)


def _admitted(plan: Any) -> list[int]:
    """Request ids of the prefill chunks in a plan, in plan order."""
    return [group.item.req for group, _ in plan.chunks]


def _enqueue_all(sched: Scheduler, count: int) -> None:
    for req in range(count):
        sched.enqueue(req, 0.0)


def test_admission_is_first_come_first_served() -> None:
    requests = make_requests([0.0] * 4, [30, 20, 10, 40], [5, 5, 5, 5])
    sched = _scheduler(requests, FakeSlab(10_000))
    _enqueue_all(sched, 4)
    assert _admitted(sched.schedule(0.0)) == [0, 1, 2, 3]


def test_the_token_budget_stops_admission_and_keeps_order() -> None:
    # 400 + 400 fit in 1000 tokens, the third 400 does not: it waits for the next step.
    requests = make_requests([0.0] * 3, [400, 400, 400], [5, 5, 5])
    sched = _scheduler(requests, FakeSlab(10_000), max_num_batched_tokens=1000)
    _enqueue_all(sched, 3)
    plan = sched.schedule(0.0)
    assert _admitted(plan) == [0, 1] and plan.prefill_tokens == 800
    assert [item.req for item in sched.waiting] == [2]
    sched.complete(1, plan, 0.1)
    assert _admitted(sched.schedule(0.1)) == [2]


def test_max_num_seqs_caps_the_running_batch() -> None:
    requests = make_requests([0.0] * 5, [10] * 5, [50] * 5)
    sched = _scheduler(requests, FakeSlab(10_000), max_num_seqs=3)
    _enqueue_all(sched, 5)
    plan = sched.schedule(0.0)
    assert _admitted(plan) == [0, 1, 2]
    sched.complete(1, plan, 0.1)
    assert _admitted(sched.schedule(0.1)) == []  # three decoding: nobody else gets in
    assert sched.num_seqs == 3 and sched.queue_length == 2


def test_parallel_samples_count_against_max_num_seqs_all_or_nothing() -> None:
    requests = make_requests([0.0] * 2, [10, 10], [5, 5], n=[2, 3])
    sched = _scheduler(requests, FakeSlab(10_000), max_num_seqs=4)
    _enqueue_all(sched, 2)
    plan = sched.schedule(0.0)
    assert _admitted(plan) == [0]  # 2 + 3 > 4: the second request waits whole
    assert sched.num_seqs == 2


def test_chunked_prefill_splits_a_long_prompt_over_steps_within_the_budget() -> None:
    requests = make_requests([0.0], [250], [5])
    sched = _scheduler(requests, FakeSlab(10_000), max_num_batched_tokens=100, enable_chunked_prefill=True)
    sched.enqueue(0, 0.0)
    chunks = []
    now = 0.0
    for _ in range(3):
        plan = sched.schedule(now)
        chunks.append(plan.prefill_tokens)
        now += 0.1
        sched.complete(1, plan, now)
    assert chunks == [100, 100, 50]
    assert len(sched.decode) == 1  # the prompt is done: the sequence decodes


def test_without_chunked_prefill_a_prompt_over_the_budget_is_refused_at_arrival() -> None:
    requests = make_requests([0.0], [250], [5])
    sched = _scheduler(requests, FakeSlab(10_000), max_num_batched_tokens=100)
    sched.enqueue(0, 0.0)
    assert "max_num_batched_tokens" in sched.log.rejection_reason(0)
    assert sched.queue_length == 0


def test_the_head_of_the_queue_that_does_not_fit_blocks_those_behind_it() -> None:
    # FCFS with head-of-line blocking (vLLM's waiting queue is served in order): request 1 needs
    # 600 + 300 slots while only 800 are free, so it waits, and the small request 2 behind it (15 slots,
    # which would fit) is not admitted past it. Once request 0 ends, both get in.
    requests = make_requests([0.0] * 3, [100, 600, 10], [1, 300, 5], max_tokens=[100, 300, 5])
    sched = _scheduler(requests, FakeSlab(1000))
    _enqueue_all(sched, 3)
    plan = sched.schedule(0.0)
    assert _admitted(plan) == [0]
    assert [item.req for item in sched.waiting] == [1, 2]
    assert sched.next_demand_tokens() == 900  # the head's demand is what the taxonomy's external uses
    sched.complete(1, plan, 0.1)  # request 0 samples its one token and finishes
    assert _admitted(sched.schedule(0.1)) == [1, 2]


def test_a_request_larger_than_the_whole_cache_is_refused_at_arrival() -> None:
    # Demand above capacity can never be served: refused with a reason instead of blocking the queue.
    requests = make_requests([0.0, 0.0], [30, 10], [100, 5])
    sched = _scheduler(requests, FakeSlab(100))
    _enqueue_all(sched, 2)
    assert "more than the cache's 100" in sched.log.rejection_reason(0)
    assert _admitted(sched.schedule(0.0)) == [1]


def test_preemption_takes_the_newest_sequence_first() -> None:
    # Three sequences on a paged cache of 4 blocks of 4 tokens: when growth runs out of blocks the
    # newest admitted one is preempted (vLLM: running queue popped from the back) and requeued first.
    requests = make_requests([0.0] * 3, [4, 4, 4], [20, 20, 20])
    sched = _scheduler(requests, FakePaged(16, block_size=4))
    _enqueue_all(sched, 3)
    now = 0.0
    plan = sched.schedule(now)
    assert _admitted(plan) == [0, 1, 2]
    preempted: list[int] = []
    for _ in range(10):
        now += 0.1
        sched.complete(1, plan, now)
        preempted = [int(r) for r in np.flatnonzero(sched.log.preemptions)]
        if preempted:
            break
        plan = sched.schedule(now)
    assert preempted == [2]
    assert sched.waiting[0].req == 2 and sched.waiting[0].readmission


def test_the_plan_carries_the_decode_part_and_a_paused_step_leaves_the_decodes() -> None:
    # The engine prices what the plan says decodes: all running sequences, or none when the policy
    # paused them (v0's prefill-only step); a paused step neither advances the counter nor grows them.
    requests = make_requests([0.0, 0.0], [10, 30], [50, 5])
    sched = _scheduler(requests, FakePaged(1000, block_size=4), policy=VllmV0Policy())
    sched.enqueue(0, 0.0)
    plan = sched.schedule(0.0)
    assert (plan.decodes_run, plan.decode_seqs) == (False, 0)  # a prompt alone
    sched.complete(1, plan, 0.1)
    plan = sched.schedule(0.1)
    assert (plan.decodes_run, plan.decode_seqs, plan.decode_context_tokens) == (True, 1, 11)
    sched.complete(1, plan, 0.2)
    it, context = sched.it, sched.decode_context_tokens()
    sched.enqueue(1, 0.2)
    plan = sched.schedule(0.2)  # request 1 is admitted: its prompt runs alone, request 0 waits
    assert _admitted(plan) == [1] and (plan.decodes_run, plan.decode_seqs) == (False, 0)
    sched.complete(1, plan, 0.3)
    assert sched.it == it  # the paused decode did not advance
    assert sched.decode_context_tokens() == context + 31  # only the new sequence joined (30 + 1)


def test_the_default_policy_has_no_auto_preemption_mode() -> None:
    # "auto" is vLLM v0's own choice (sim/engines/vllm_v0.py); the core's default policy refuses it.
    requests = make_requests([0.0], [10], [5])
    with pytest.raises(ValueError, match="preemption_mode must be one of recompute, swap"):
        _scheduler(requests, FakeSlab(1000), preemption_mode="auto")


def test_decode_ids_follow_the_decode_set_through_finishes_and_preemptions() -> None:
    # Compiled, `decode_ids` copies ids kept in step with `decode` (`_ids_append` / `_ids_remove`); as
    # Python it reads the dict. Either way: the dict's keys in its order, a new array when the set
    # changes, through starts, finishes (in `complete`) and preemptions (`_stop_decode`), with seq ids reused.
    rng = np.random.default_rng(7)
    count = 40
    requests = make_requests(
        [0.0] * count, rng.integers(4, 40, count).tolist(), rng.integers(1, 30, count).tolist()
    )
    sched = _scheduler(requests, FakePaged(320, block_size=4), max_num_seqs=12)
    _enqueue_all(sched, count)
    now, preempted, previous = 0.0, 0, None
    while not sched.idle:
        plan = sched.schedule(now)
        now += 0.1
        sched.complete(1, plan, now)
        preempted += sched.preempted
        ids = sched.decode_ids()
        assert ids.dtype == np.int64 and ids.tolist() == list(sched.decode)
        if previous is not None and previous.tolist() != ids.tolist():
            assert ids is not previous and not np.shares_memory(ids, previous)
        previous = ids
    assert preempted > 0  # the small cache preempted someone: `_stop_decode` ran


def test_decode_ids_past_the_kept_buffer() -> None:
    # more decoding sequences than the compiled scheduler's first id buffer (256) holds: it grows in place
    count = 300
    requests = make_requests([0.0] * count, [4] * count, [3 + req % 5 for req in range(count)])
    sched = _scheduler(requests, FakeSlab(100_000), max_num_seqs=count, max_num_batched_tokens=10_000)
    _enqueue_all(sched, count)
    now = 0.0
    while not sched.idle:
        plan = sched.schedule(now)
        now += 0.1
        sched.complete(1, plan, now)
        assert sched.decode_ids().tolist() == list(sched.decode)
    assert sched.decode_ids().size == 0
