"""What the scenario and the CLI ask of an engine preset, on top of its step planning.

Why one object: an engine is a named policy with its own defaults (DESIGN.md "Engines are classes,
like allocators"). The core asks it only `SchedulePolicy` (sim/core/policy.py); the scenario also
asks it what vLLM fills in when a flag is not given, which preemption modes it has, which
placement `kvsim compare` gives the contiguous family, and which framework overhead its steps pay.
Adding an engine is one class that answers these and one `register_engine` call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from sim.core.policy import SchedulePolicy


class EnginePolicy(SchedulePolicy, Protocol):
    """A registered engine: its step planning plus the defaults of its preset (docs/engines.md)."""

    # Scenario fields the preset fills when the user did not set them (Scenario._apply_engine_preset).
    preset_flags: Mapping[str, object]
    # Placement of the contiguous family in `kvsim compare` when none is given (None: the allocator's).
    compare_placement: str | None
    # The sim/cost/overhead.py ENGINE_OVERHEADS entry whose per-step CPU overhead this engine pays.
    framework_overhead: str
    # The serving stack around the engine, when no bench profile sets it (sim/cost/server.py
    # `ServerTerms.stack_settings`): keys `custom_all_reduce` (vLLM's own all-reduce on NVLink, else
    # NCCL), `ray_workers` (TP workers driven over Ray: the preset's measured multi-GPU overhead),
    # `frontend_in_engine_process` (the API server shares the engine's event loop) and
    # `one_attention_call` (prefills and decodes share one attention call per layer, so decodes pay
    # the kernel's query-tile padding: sim/cost/attention_tiles.py).
    serving_stack: Mapping[str, bool]

    def default_budgets(
        self, *, max_model_len: int, chunked: bool, gpu_name: str, gpu_memory_bytes: int
    ) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) the engine picks when neither is given."""
        ...

    def preemption_mode_problem(self, mode: str) -> str | None:
        """Why this engine cannot run `--preemption-mode mode` (one line, with its source), or None."""
        ...


def unsupported_preemption_mode(policy: SchedulePolicy, mode: str) -> str | None:
    """The plain refusal: the modes the engine has, when `mode` is not one of them."""
    if mode in policy.preemption_modes:
        return None
    return f"{policy.name} supports {' | '.join(policy.preemption_modes)} (got {mode!r})"
