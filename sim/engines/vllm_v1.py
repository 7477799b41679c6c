"""`vllm-v1`: today's vLLM engine (v0.8 and later).

Each rule and default names its source in vllm-project/vllm (`vllm/v1/core/sched/scheduler.py`,
`vllm/v1/core/kv_cache_manager.py`, `vllm/engine/arg_utils.py`); docs/engines.md has the table.
"""

from __future__ import annotations

from collections.abc import Mapping

from sim.core.policy import ContinuousBatchingPolicy, StepPlan
from sim.core.scheduler import Scheduler

GIB = 1024**3
# vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (v0.9-v0.11): GPUs with >= 70 GiB that are
# not A100s get the larger defaults (PR #17885 measured a regression with large budgets on A100).
V1_LARGE_GPU_MIN_BYTES = 70 * GIB


def v1_large_gpu(gpu_name: str, memory_bytes: int) -> bool:
    """vLLM v1's test for its larger budgets: >= 70 GiB of device memory and not an A100."""
    return memory_bytes >= V1_LARGE_GPU_MIN_BYTES and "a100" not in gpu_name.lower()


class VllmV1Policy(ContinuousBatchingPolicy):
    """Mixed steps in one token budget, per-chunk allocation, no admission after a preemption,
    recompute only."""

    name = "vllm-v1"
    preemption_modes = ("recompute",)
    # vllm/engine/arg_utils.py `_set_default_args_v1` / `_set_default_args`: chunked prefill and prefix
    # caching on for generative models; v1 only recomputes (vllm/v1/core/sched/scheduler.py
    # `_preempt_request` frees the request's blocks and puts it back in the waiting queue).
    preset_flags: Mapping[str, object] = {
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "preemption_mode": "recompute",
    }
    compare_placement = None  # the Orca baselines are the paper's, not today's engine's: first fit
    framework_overhead = "vllm-v1"
    # vLLM's custom all-reduce on NVLink (vllm/distributed/device_communicators/custom_all_reduce.py),
    # multiprocess workers without Ray (vllm/v1/executor/multiproc_executor.py), and the engine core in
    # its own process (vllm/v1/engine/core_client.py): the front end does not hold steps back.
    serving_stack: Mapping[str, bool] = {
        "custom_all_reduce": True,
        "ray_workers": False,
        "frontend_in_engine_process": False,
        # One FlashAttention varlen call per layer over prefill chunks and decodes together
        # (vllm/v1/attention/backends/flash_attn.py `FlashAttentionImpl.forward`): a decode in a
        # mixed step pays the kernel's query-tile padding (sim/cost/attention_tiles.py).
        "one_attention_call": True,
    }

    def admit(self, batch: Scheduler, plan: StepPlan, budget: int, now_s: float) -> None:
        """vLLM v1 `vllm/v1/core/sched/scheduler.py` `Scheduler.schedule`: waiting requests are
        scheduled only `if not preempted_reqs`, so a step that preempted admits nobody (and the
        engine does not jump past it). Admitted prompts hold blocks per scheduled chunk
        (`vllm/v1/core/kv_cache_manager.py` `KVCacheManager.allocate_slots(request, num_new_tokens,
        ...)`, called per step), not the whole prompt at admission."""
        if batch.preempted and batch.num_seqs > 0:
            plan.single_step = bool(batch.waiting)
        elif not batch.swapped:
            batch.admit_waiting(plan, budget, now_s, per_chunk=True)

    def default_budgets(
        self, *, max_model_len: int, chunked: bool, gpu_name: str, gpu_memory_bytes: int
    ) -> tuple[int, int]:
        """`vllm/engine/arg_utils.py` `EngineArgs.get_batch_defaults`, usage context
        OPENAI_API_SERVER (`vllm serve`): 8192 tokens and 1024 sequences on GPUs with >= 70 GiB that
        are not A100s (H100, H200), else 2048 and 256. Without chunked prefill v1 also needs the
        budget to hold a whole prompt, so it is raised to max_model_len (`SchedulerConfig`)."""
        large = v1_large_gpu(gpu_name, gpu_memory_bytes)
        tokens, seqs = (8192, 1024) if large else (2048, 256)
        if not chunked:
            tokens = max(tokens, max_model_len)
        return tokens, seqs

    def preemption_mode_problem(self, mode: str) -> str | None:
        if mode in self.preemption_modes:
            return None
        return (
            f"vllm-v1 only recomputes (vllm/v1/core/sched/scheduler.py _preempt_request) "
            f'(got {mode!r}); use engine = "vllm-v0" to swap'
        )
