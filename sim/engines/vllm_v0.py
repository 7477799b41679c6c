"""`vllm-v0`: the engine of the vLLM paper (SOSP 2023; vLLM releases v0.2-v0.6).

Each rule and default names its source in vllm-project/vllm (`vllm/core/scheduler.py`,
`vllm/config.py`, `vllm/engine/arg_utils.py` of those releases); docs/engines.md has the table.
"""

from __future__ import annotations

from collections.abc import Mapping

from sim.core.policy import ContinuousBatchingPolicy, StepPlan
from sim.core.scheduler import Scheduler
from sim.engines.base import unsupported_preemption_mode


class VllmV0Policy(ContinuousBatchingPolicy):
    """Prefill-only steps without chunked prefill; swap, recompute, or v0's own choice ("auto").

    With chunked prefill (v0.4+, `Scheduler._schedule_chunked_prefill`) v0 mixes prefills and decodes
    too and is modelled by the shared mixed-step plan, the whole prompt allocated at admission
    (`vllm/core/block_manager_v1.py` `BlockSpaceManager.allocate` took the whole prompt when the
    group was first scheduled).
    """

    name = "vllm-v0"
    preemption_modes = ("recompute", "swap", "auto")
    # The paper's engine had neither chunked prefill nor automatic prefix caching (both came later,
    # v0.4); v0 chooses the preemption mode itself when --preemption-mode is unset ("auto").
    preset_flags: Mapping[str, object] = {
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
        "preemption_mode": "auto",
    }
    # The vLLM paper's Orca re-implementation (SOSP 2023, section 6.1: "we use the buddy allocation
    # algorithm to determine the memory address to store KV cache").
    compare_placement = "buddy"
    framework_overhead = "vllm-v0"
    # The paper-era stack: NCCL all-reduce and Ray workers, whose cost the preset's measured overhead
    # includes (sim/cost/overhead.py); `AsyncLLMEngine` runs its engine loop in the API server's event
    # loop (vllm/engine/async_llm_engine.py `run_engine_loop`), so request handling and steps take turns.
    serving_stack: Mapping[str, bool] = {
        "custom_all_reduce": False,
        "ray_workers": True,
        "frontend_in_engine_process": True,
        # Prefills and decodes in separate kernels (vllm/attention/backends/flash_attn.py
        # `FlashAttentionImpl.forward`: `flash_attn_varlen_func` for prefill_meta,
        # `flash_attn_with_kvcache` for decode_meta): no query-tile padding for decodes.
        "one_attention_call": False,
    }

    def plan_step(self, batch: Scheduler, now_s: float) -> StepPlan:
        """vLLM v0 `vllm/core/scheduler.py` `Scheduler._schedule` (v0.1-v0.3): with nothing swapped
        out, waiting prompts are scheduled first within the whole token budget; if any were, the
        step runs only them and the running decodes wait for the next step. Otherwise the step
        swaps in and decodes, and admits nobody (admission was tried, or swapped requests come first).
        """
        if batch.chunked:
            return super().plan_step(batch, now_s)
        plan = StepPlan()
        if not batch.swapped:
            batch.admit_waiting(plan, batch.max_num_batched_tokens, now_s)
            if plan.chunks:
                batch.pause_decodes(plan)
                batch.add_swap_outs(plan)
                return plan
        if batch.swapped:
            batch.swap_in(plan, now_s)
        batch.add_swap_outs(plan)
        # no partial prefills to continue: without chunked prefill every prompt runs whole in one step
        return plan

    def swaps_out(self, batch: Scheduler, req: int) -> bool:
        """ "auto" is vLLM v0's choice when --preemption-mode is unset (vllm/core/scheduler.py
        `Scheduler._preempt`, `preemption_mode is None`): recompute a sequence group with a single
        running sequence (cheaper, "recomputation incurs lower overhead"), swap groups with several
        (parallel samples, beams), which recompute cannot restore. kvsim preempts per sample: a sample
        of a request with more than one unfinished sample swaps.
        """
        if batch.preemption_mode == "auto":
            return batch.unfinished_samples(req) > 1
        return super().swaps_out(batch, req)

    def default_budgets(
        self, *, max_model_len: int, chunked: bool, gpu_name: str, gpu_memory_bytes: int
    ) -> tuple[int, int]:
        """`vllm/config.py` `SchedulerConfig.__init__` (v0.2-v0.6): `max(max_model_len, 2048)` tokens
        without chunked prefill, 512 with it (v0.4+); `max_num_seqs` 256 (`EngineArgs`)."""
        return (512 if chunked else max(max_model_len, 2048)), 256

    def preemption_mode_problem(self, mode: str) -> str | None:
        return unsupported_preemption_mode(self, mode)
