"""The engine's side of a CPU tier under the prefix cache: PCIe time per step and occupancy over time.

Why here and not in the allocator: the tier (allocators/cpu_tier.py) counts blocks moved and holds
no time; the engine knows each step's duration. Once per turn it takes the tokens the tier moved
since the last turn, has the cost model price them into the step (`StepCostModel.offload_step_s`),
and integrates the tier's occupancy over the turn, so the summary gets a time-weighted mean.

A step that moves KV over PCIe is never part of a multi-iteration jump, and the tier changes only at
admission and release (events a jump never crosses), so jumping and stepping give the same results.
"""

from __future__ import annotations

from typing import Any

from allocators.base import OffloadTier
from sim.core.protocols import StepCostModel


class OffloadLedger:
    """Per-run accounting of one CPU tier: transfer time added to steps, occupancy x time."""

    def __init__(self, tier: OffloadTier) -> None:
        self.tier = tier
        self.used_token_s = 0.0  # integral of the tier's occupancy (token slots) over simulated time
        self.transfer_s = 0.0  # step time added by PCIe transfers, summed over steps
        self.load_tokens = 0  # taken by `take` this turn and not yet priced
        self.store_tokens = 0

    def take(self) -> bool:
        """Take the tokens moved since the last turn; True when this turn moves any."""
        self.load_tokens, self.store_tokens = self.tier.take_transfers()
        return bool(self.load_tokens or self.store_tokens)

    def drop(self) -> None:
        """An idle turn: stores queued before it complete while nothing runs (no step pays them)."""
        self.load_tokens = self.store_tokens = 0

    def price(self, cost: StepCostModel, compute_s: float) -> float:
        """The step's duration with this turn's transfers (the cost model's rule); records the added time."""
        duration_s = cost.offload_step_s(compute_s, self.load_tokens, self.store_tokens)
        self.transfer_s += duration_s - compute_s
        self.load_tokens = self.store_tokens = 0
        return duration_s

    def hold(self, duration_s: float) -> None:
        """The tier holds what it holds now for `duration_s` (it changes only between turns)."""
        self.used_token_s += self.tier.used_tokens * duration_s

    def totals(self) -> dict[str, Any]:
        """The tier's counters and this ledger's integrals, for `summarize` (token slots, seconds)."""
        return {
            **self.tier.totals(),
            "capacity_tokens": self.tier.capacity_tokens,
            "used_token_s": self.used_token_s,
            "transfer_s": self.transfer_s,
        }
