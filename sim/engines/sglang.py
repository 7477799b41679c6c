"""`sglang`: SGLang's scheduler (sgl-project/sglang, python/sglang/srt/), over its radix cache.

Each rule and default names its source file and function; docs/engines.md has the table and says
where kvsim simplifies. Paths are relative to python/sglang/srt/.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from weakref import WeakKeyDictionary

from sim.core.policy import ContinuousBatchingPolicy, StepPlan
from sim.core.scheduler import PrefillGroup, Scheduler, WorkItem

GIB = 1024**3
# managers/schedule_policy.py CLIP_MAX_NEW_TOKENS (env SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION): the
# admission estimate counts at most this many future tokens per request.
CLIP_MAX_NEW_TOKENS = 4096
# environ.py defaults, used by managers/scheduler_components/new_token_ratio_tracker.py
# `NewTokenRatioTracker.from_server_args` (schedule_conservativeness 1.0):
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR: min ratio = init x this
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS: init -> min in this many decodes
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS: tokens assumed still to come after a retraction
# managers/schedule_policy.py `SchedulePolicy._determine_active_policy`: LPM falls back to FCFS
# when more requests wait than this (prefix matching every waiting request is too costly).
LPM_MAX_WAITING = 128
# model_runner.py `ModelRunner.init_memory_pool`: max running requests =
# min(max(max_total_num_tokens / context_len x 512, 2048), 4096); 2048 is its floor.
MAX_RUNNING_REQUESTS = 2048


def chunked_prefill_size(gpu_memory_bytes: int) -> int:
    """server_args.py `ServerArgs._handle_gpu_memory_settings`: 2048 tokens below 35 GiB (A10, L4,
    4090), 8192 below 160 GiB (A100, H100, H200), 16384 above (B200, MI300)."""
    if gpu_memory_bytes < 35 * GIB:
        return 2048
    if gpu_memory_bytes < 160 * GIB:
        return 8192
    return 16384


@dataclass
class NewTokenRatio:
    """The decode-token estimate of one run (managers/scheduler_components/new_token_ratio_tracker.py).

    SGLang lowers `current` by `decay` at every decode step (`decay_step`, called from
    managers/scheduler.py `Scheduler.update_running_batch`) down to `min`; after a retraction it is
    set to the retracted batch's own estimate (managers/schedule_batch.py
    `ScheduleBatch.retract_decode`), and it is reset to `init` when the server idles
    (`Scheduler.self_check_during_idle`). kvsim counts decode steps by the batch's iteration counter,
    so the value is the same whether the engine stepped or jumped.
    """

    init: float = INIT_NEW_TOKEN_RATIO
    set_value: float = INIT_NEW_TOKEN_RATIO
    set_iteration: int = 0

    @property
    def min(self) -> float:
        return min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)

    @property
    def decay(self) -> float:
        return (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS

    def current(self, iteration: int) -> float:
        """After `iteration - set_iteration` decode steps of decay."""
        return max(self.set_value - self.decay * (iteration - self.set_iteration), self.min)

    def reset(self, iteration: int) -> None:
        self.set_value, self.set_iteration = self.init, iteration

    def after_retraction(self, generated: list[int], limits: list[int], iteration: int) -> None:
        """schedule_batch.py `retract_decode`: (decoded + RETRACT_DECODE_STEPS x requests) / sum of
        max_new_tokens over the requests left running, at most 1."""
        total_limit = sum(limits)
        if total_limit <= 0:
            return
        estimate = (sum(generated) + RETRACT_DECODE_STEPS * len(generated)) / total_limit
        self.set_value, self.set_iteration = min(1.0, estimate), iteration


class _MemoryGate:
    """managers/schedule_policy.py `PrefillAdder`: admit while the request's prompt tokens still to
    compute plus its clipped max_new_tokens fit in `rem_total_tokens` = free + evictable tokens
    minus new_token_ratio x the clipped tokens the running requests may still decode
    (`_get_running_request_total_token_offset`), minus what this step admitted already
    (`_update_prefill_budget`); `add_one_req` refuses with NO_TOKEN when `total_tokens >= rem_total_tokens`.
    """

    def __init__(self, batch: Scheduler, ratio: float) -> None:
        self.batch = batch
        generated, limits = batch.decode_progress()
        running = sum(
            min(limit - done, CLIP_MAX_NEW_TOKENS) for done, limit in zip(generated, limits, strict=True)
        )
        self.remaining_tokens = batch.alloc.available_tokens() - running * ratio
        self.refused = False

    def __call__(self, item: WorkItem) -> bool:
        batch = self.batch
        spec = batch.info.spec(item.req, 0, item.emitted, max(item.sample, 0))  # the sample admission uses
        extend_tokens = spec.prompt_tokens - batch.alloc.cached_prefix_tokens(spec)
        samples = batch.info.n[item.req] if item.sample < 0 else 1
        total = extend_tokens + samples * min(spec.max_tokens, CLIP_MAX_NEW_TOKENS)
        # With nothing running or admitted the allocator decides alone: SGLang refuses a request
        # longer than the pool when it arrives (tokenizer_manager.py `_validate_one_request`),
        # which kvsim does at enqueue, so the head of an empty server is never held back.
        if total >= self.remaining_tokens and batch.num_seqs > 0:
            self.refused = True
            return False
        self.remaining_tokens -= total
        return True


class SglangPolicy(ContinuousBatchingPolicy):
    """Prefill steps and decode steps apart, chunked prefill, radix-cache-aware queue order,
    new-token-ratio admission, retraction (recompute) when decode runs out of memory."""

    preemption_modes = ("recompute",)
    # server_args.py ServerArgs: chunked prefill on (chunked_prefill_size set from GPU memory), the
    # radix cache on (disable_radix_cache False), page_size 1; retracted requests are recomputed
    # (their KV is freed and they go back to the waiting queue: schedule_batch.py `retract_decode`).
    preset_flags: Mapping[str, object] = {
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "preemption_mode": "recompute",
        "block_size": 1,
        "allocator": "radix",  # mem_cache/radix_cache.py RadixCache over a token pool (allocators/radix.py)
    }
    compare_placement = None
    # SGLang's overlap ("zero-overhead") scheduler hides the CPU work of a step under the GPU's, as
    # vLLM v1's async scheduling does (managers/scheduler.py `event_loop_overlap`): same preset.
    framework_overhead = "vllm-v1"
    # SGLang's own custom all-reduce on NVLink (python/sglang/srt/distributed/device_communicators/
    # custom_all_reduce.py), TP workers as subprocesses without Ray (srt/entrypoints/engine.py
    # `_launch_subprocesses`), and the scheduler in its own process apart from the TokenizerManager
    # (srt/managers/tokenizer_manager.py): the front end does not hold steps back.
    serving_stack: Mapping[str, bool] = {
        "custom_all_reduce": True,
        "ray_workers": False,
        "frontend_in_engine_process": False,
        # Prefill and decode batches run as separate steps (`plan_step`), so no attention call mixes
        # them (sim/cost/attention_tiles.py).
        "one_attention_call": False,
    }

    def __init__(self, schedule_policy: str = "lpm") -> None:
        if schedule_policy not in ("lpm", "fcfs"):
            raise ValueError(f"schedule_policy must be lpm or fcfs (got {schedule_policy!r})")
        self.schedule_policy = schedule_policy
        self.name = "sglang" if schedule_policy == "lpm" else f"sglang-{schedule_policy}"
        # one estimate per run (the policy object is shared by every run of the process)
        self._ratios: WeakKeyDictionary[Scheduler, NewTokenRatio] = WeakKeyDictionary()

    def new_token_ratio(self, batch: Scheduler) -> NewTokenRatio:
        """This run's estimate (created at init on first use)."""
        ratio = self._ratios.get(batch)
        if ratio is None:
            ratio = self._ratios[batch] = NewTokenRatio()
        return ratio

    def plan_step(self, batch: Scheduler, now_s: float) -> StepPlan:
        """managers/scheduler.py `Scheduler.get_next_batch_to_run`: a prefill batch when one can be
        formed (the chunked request first, then waiting requests), run without the decodes
        (`enable_mixed_chunk` is off by default); else the running batch decodes."""
        ratio = self.new_token_ratio(batch)
        if batch.preempted:
            generated, limits = batch.decode_progress()
            ratio.after_retraction(generated, limits, batch.it)
        elif batch.num_seqs == 0:
            ratio.reset(batch.it)
        plan = StepPlan()
        batch.add_swap_outs(plan)
        budget = batch.continue_prefills(plan, batch.max_num_batched_tokens, now_s)
        if batch.waiting and budget > 0:
            self.order_waiting(batch)
            gate = _MemoryGate(batch, ratio.current(batch.it))
            batch.admit_waiting(plan, budget, now_s, per_chunk=True, gate=gate)
            # the estimate decays with every decode step, so a refused request may fit after any of them
            plan.single_step = gate.refused
        if plan.chunks:
            batch.pause_decodes(plan)
        return plan

    def preemption_victim(self, batch: Scheduler) -> tuple[int, PrefillGroup | None]:
        """managers/schedule_batch.py `ScheduleBatch.retract_decode`: running requests sorted by
        (output tokens, -input tokens), descending and stably, and the last popped: the one that has
        decoded least, the longest prompt among those, the newest among equals. Only decoding
        requests are retracted; with none, the newest prefill (kvsim's mechanics)."""
        decoding = batch.decode_sequences()
        if not decoding:
            return batch.newest_unit()
        prompt = batch.info.prompt_tokens
        order = sorted(
            range(len(decoding)),
            key=lambda i: (decoding[i][2], -prompt[decoding[i][1]]),
            reverse=True,
        )
        return decoding[order[-1]][0], None

    def order_waiting(self, batch: Scheduler) -> None:
        """managers/schedule_policy.py `SchedulePolicy.calc_priority`: LPM sorts the waiting queue by
        the longest cached prefix (`_sort_by_longest_prefix`, a stable sort), unless more than
        LPM_MAX_WAITING wait (`_determine_active_policy`: FCFS then); FCFS keeps arrival order."""
        waiting = batch.waiting
        if self.schedule_policy != "lpm" or len(waiting) > LPM_MAX_WAITING or len(waiting) < 2:
            return
        info, alloc = batch.info, batch.alloc
        hits = {
            id(item): alloc.cached_prefix_tokens(info.spec(item.req, 0, item.emitted, max(item.sample, 0)))
            for item in waiting
        }
        ordered = sorted(waiting, key=lambda item: -hits[id(item)])
        waiting.clear()
        waiting.extend(ordered)

    def default_budgets(
        self, *, max_model_len: int, chunked: bool, gpu_name: str, gpu_memory_bytes: int
    ) -> tuple[int, int]:
        """A prefill step holds at most chunked_prefill_size tokens (`chunked_prefill_size`); without
        chunking, max_prefill_tokens (server_args.py, 16384) or a whole prompt. Max running requests:
        MAX_RUNNING_REQUESTS (the floor of model_runner.py's formula)."""
        tokens = chunked_prefill_size(gpu_memory_bytes) if chunked else max(16384, max_model_len)
        return tokens, MAX_RUNNING_REQUESTS

    def preemption_mode_problem(self, mode: str) -> str | None:
        if mode in self.preemption_modes:
            return None
        return (
            f"{self.name} only recomputes (SGLang's schedule_batch.py retract_decode frees the KV and "
            f"requeues the request) (got {mode!r})"
        )
