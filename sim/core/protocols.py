"""What the serving core asks of the things it drives: an allocator and a step-time cost model.

Why declared here: the engine never discovers abilities with `getattr` or signature inspection. The
allocator's contract (with defaults for its optional abilities) lives in `allocators.base`, which may
not import `sim`; it is re-exported here so the core's two contracts can be read in one place.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from allocators.base import Allocator, AllocatorBase

__all__ = ["Allocator", "AllocatorBase", "StepCostModel"]


class StepCostModel(Protocol):
    """What the engine asks of a step-time model (sim.cost.model.CostModel; tests use small fakes)."""

    def step_time_s(
        self,
        prefill_tokens: int,
        num_decode_seqs: int,
        decode_context_tokens: int,
        prefill_context_tokens: int = 0,
    ) -> float: ...

    def decode_step_durations_s(self, num_decode_seqs: int, context_tokens_sum: int, k: int) -> np.ndarray:
        """Durations of k decode-only iterations; iteration i has context_tokens_sum + i x num_decode_seqs.

        The engine's exact multi-iteration jump prices its iterations with this one call.
        """
        ...

    def decode_steps_starting_before(
        self, num_decode_seqs: int, context_tokens_sum: int, k: int, gap_s: float
    ) -> int:
        """1 + how many of iterations 1..k-1 start before `gap_s`, iteration i starting at the sum of
        the first i of `decode_step_durations_s(..., k)` (summed left to right): where the next arrival
        cuts a jump. Same as `1 + searchsorted(cumsum(durations[:-1]), gap_s, side="left")`.
        """
        ...

    def swap_time_s(self, tokens: int) -> float: ...

    def offload_step_s(self, compute_s: float, load_tokens: int, store_tokens: int) -> float:
        """A step's duration when it also moves KV to (store) and from (load) a CPU tier over PCIe."""
        ...
