"""How many prompts each run of a capacity-plan row gets: probes sized by the batch, not a fixed count.

Why its own module: the sizing rule is what makes a probe long enough to show steady state (issue 20
§2); it is pure arithmetic, stated once, and printed under the plan's table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProbeSizing:
    """How many prompts each kind of run of a plan row gets (docs/capacity.md, section 1, step 2).

    Why sized by the batch and not a fixed count: a probe must fill the running batch and then watch
    it turn over several times, or an overloaded server hides its backlog in the batch (vLLM v1 runs
    up to 1,024 sequences on an H100) and a short probe passes a rate that a long run does not.

    - `min_prompts`: a p99 needs at least 10 requests above it, so 1,000 prompts (`--num-prompts`
      raises it, never lowers it);
    - `batch_turnovers`: a probe holds this many times the full batch (the concurrency the saturation
      throughput run sustained with the scenario's own `max_num_seqs`); at a rate near saturation a
      request then lives about (full batch / rate) seconds, so the arrivals span this many lifetimes
      and the second half, which is judged, starts after the batch had time to fill;
    - `confirm_factor`, `confirm_cap_prompts`: the one long run that confirms a row's answer has this
      many times a probe's prompts (at most the cap).
    """

    min_prompts: int = 1000
    batch_turnovers: float = 8.0
    confirm_factor: float = 10.0
    confirm_cap_prompts: int = 200_000

    def probe_prompts(self, num_prompts: int | None, full_batch: float) -> int:
        """Prompts per rate probe: the largest of the user's count, `min_prompts` and the batch rule."""
        return max(int(num_prompts or 0), self.min_prompts, math.ceil(self.batch_turnovers * full_batch))

    def confirm_prompts(self, probe_prompts: int) -> int:
        longer = math.ceil(self.confirm_factor * probe_prompts)
        return max(probe_prompts, min(self.confirm_cap_prompts, longer))

    def describe_rule(self) -> str:
        """The probe-size rule in a few words."""
        return (
            f"max of --num-prompts, {self.min_prompts:,} for a p99 and {self.batch_turnovers:g} x the full "
            "running batch, to fill the batch and reach steady state"
        )

    def describe(self) -> str:
        """One line for the table caption: how the probes were sized."""
        return (
            f"probes: max(--num-prompts, {self.min_prompts:,}, {self.batch_turnovers:g} x the full running "
            f"batch) prompts each; the answer is confirmed by one run of {self.confirm_factor:g} x that "
            f"(at most {self.confirm_cap_prompts:,})"
        )
