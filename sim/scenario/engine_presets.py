"""Engine presets: which vLLM engine a scenario models (`vllm-v0`, the paper's; `vllm-v1`, today's).

Why a preset and not a blend of flags: a capacity answer depends on *how the engine schedules*, and
vLLM's two engines schedule differently (prefill-only steps vs mixed steps, swap vs recompute, their
default budgets). A preset names one engine; it fills the scenario fields the user did not set and
fixes the scheduling rules the engine applies. Explicit flags still win (the Scenario keeps track of
them through pydantic's `model_fields_set`). Every rule and default names its vLLM source here and
in docs/engines.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EngineName = Literal["vllm-v0", "vllm-v1"]
ENGINE_NAMES: tuple[str, ...] = ("vllm-v0", "vllm-v1")
DEFAULT_ENGINE: EngineName = "vllm-v0"  # the vLLM paper's engine (SOSP 2023): kvsim's default setting

GIB = 1024**3
# vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (v0.9-v0.11): GPUs with >= 70 GiB that are
# not A100s get the larger defaults (PR #17885 measured a regression with large budgets on A100).
V1_LARGE_GPU_MIN_BYTES = 70 * GIB


@dataclass(frozen=True, slots=True)
class EngineRules:
    """The scheduling rules the engine applies (sim/core/scheduler.py reads them; sources in docs/engines.md).

    - `prefill_only_steps`: a step with newly admitted prompts runs them alone, decodes paused
      (vLLM v0 `vllm/core/scheduler.py` `Scheduler._schedule`, v0.1-v0.3: prompts are scheduled first
      and, if any were, the step returns without the running decodes).
    - `admit_after_preemption`: whether a step whose running requests had to preempt may still admit
      waiting ones (vLLM v1 `vllm/v1/core/sched/scheduler.py` `Scheduler.schedule`: `if not preempted_reqs`
      guards the waiting loop).
    - `allocate_per_chunk`: under chunked prefill, blocks are allocated for each scheduled chunk, not
      for the whole prompt at admission (vLLM v1 `vllm/v1/core/kv_cache_manager.py`
      `KVCacheManager.allocate_slots(request, num_new_tokens, ...)`, called per step by the scheduler;
      v0's BlockSpaceManager.allocate took the whole prompt when the group was first scheduled).
    - `v0_preemption_choice`: with no explicit mode, swap a sequence group with more than one running
      sequence and recompute a single one (vLLM v0 `Scheduler._preempt`, `preemption_mode is None`).
    """

    name: str
    prefill_only_steps: bool
    admit_after_preemption: bool
    v0_preemption_choice: bool
    allocate_per_chunk: bool = False


RULES: dict[str, EngineRules] = {
    "vllm-v0": EngineRules(
        "vllm-v0", prefill_only_steps=True, admit_after_preemption=True, v0_preemption_choice=True
    ),
    "vllm-v1": EngineRules(
        "vllm-v1",
        prefill_only_steps=False,
        admit_after_preemption=False,
        v0_preemption_choice=False,
        allocate_per_chunk=True,
    ),
}

# What each preset fills in when the field was not set explicitly (Scenario._apply_engine_preset).
# `max_num_batched_tokens` and `max_num_seqs` are computed by `default_budgets` below.
PRESET_FLAGS: dict[str, dict[str, object]] = {
    # The paper's engine had neither chunked prefill nor automatic prefix caching (both came later,
    # v0.4); v0 chooses the preemption mode itself when --preemption-mode is unset ("auto").
    "vllm-v0": {"enable_chunked_prefill": False, "enable_prefix_caching": False, "preemption_mode": "auto"},
    # vllm/engine/arg_utils.py `_set_default_args_v1` / `_set_default_args`: chunked prefill and prefix
    # caching on for generative models; v1 only recomputes (vllm/v1/core/sched/scheduler.py
    # `_preempt_request` frees the request's blocks and puts it back in the waiting queue).
    "vllm-v1": {
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "preemption_mode": "recompute",
    },
}


def rules_of(engine: str) -> EngineRules:
    """The rules of a preset name (ValueError naming the choices for anything else)."""
    try:
        return RULES[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(ENGINE_NAMES)})") from None


def v1_large_gpu(gpu_name: str, memory_bytes: int) -> bool:
    """vLLM v1's test for its larger budgets: >= 70 GiB of device memory and not an A100."""
    return memory_bytes >= V1_LARGE_GPU_MIN_BYTES and "a100" not in gpu_name.lower()


def default_budgets(
    engine: str, *, max_model_len: int, chunked: bool, gpu_name: str, gpu_memory_bytes: int
) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that vLLM picks when neither is given.

    vllm-v0 (`vllm/config.py` `SchedulerConfig.__init__`, v0.2-v0.6): `max(max_model_len, 2048)`
    tokens without chunked prefill, 512 with it (v0.4+); `max_num_seqs` 256 (`EngineArgs`).
    vllm-v1 (`vllm/engine/arg_utils.py` `EngineArgs.get_batch_defaults`, usage context
    OPENAI_API_SERVER, i.e. `vllm serve`): 8192 tokens and 1024 sequences on GPUs with >= 70 GiB
    that are not A100s (H100, H200), else 2048 and 256. Without chunked prefill v1 also needs the
    budget to hold a whole prompt, so it is raised to max_model_len (`SchedulerConfig`).
    """
    if engine == "vllm-v1":
        large = v1_large_gpu(gpu_name, gpu_memory_bytes)
        tokens, seqs = (8192, 1024) if large else (2048, 256)
        if not chunked:
            tokens = max(tokens, max_model_len)
        return tokens, seqs
    rules_of(engine)
    return (512 if chunked else max(max_model_len, 2048)), 256


def default_compare_placement(engine: str) -> str | None:
    """Placement of the contiguous family (the Orca baselines) when `kvsim compare` is not told one.

    vllm-v0: buddy, as the vLLM paper's Orca re-implementation (SOSP 2023, section 6.1: "we use the
    buddy allocation algorithm to determine the memory address to store KV cache"). vllm-v1: none
    (the allocator's own default, first fit): the baselines are the paper's, not today's engine's.
    """
    rules_of(engine)
    return "buddy" if engine == "vllm-v0" else None
