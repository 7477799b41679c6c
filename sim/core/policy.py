"""What the batch asks of an engine: each step's plan (`SchedulePolicy`), and the plan itself (`StepPlan`).

Why a policy object: engines differ in *what* goes into a step (vLLM v0 runs newly admitted prompts
alone; vLLM v1 mixes them with the running decodes in one token budget and admits nobody in a step
that preempted), not in *how* a batch is kept. The batch state and its mechanics (queues, decode
offsets, ids, admission and preemption, completion) live in `sim/core/scheduler.py` `Scheduler`; a
policy composes them into one step through the Scheduler's public mechanics (`swap_in`,
`add_swap_outs`, `continue_prefills`, `admit_waiting`, `pause_decodes`) and reads its state
(`waiting`, `swapped`, `preempted`, `chunked`, ...). Nothing else in the core knows an engine.

The engine presets (`vllm-v0`, `vllm-v1`, ...) are classes in `sim/engines/`, registered by name;
`ContinuousBatchingPolicy` here is the plan they share, and the one the core runs when it is given
none (tests drive the core with it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sim.core.scheduler import PrefillGroup, Scheduler

try:
    import cython
except ImportError:  # Cython is a build requirement, not a runtime one (docs/compiled_core.md)
    from allocators import cython_shim as cython


@cython.cclass
class StepPlan:
    """What one step runs (the policy fills it through the Scheduler; the engine prices and records it).

    The decode part is the batch's own: `decode_seqs` running sequences with `decode_context_tokens`
    tokens of context, filled in by `Scheduler.schedule` after the policy planned; a policy that runs
    a step without them calls `Scheduler.pause_decodes` (then they emit nothing and the decode
    iteration counter stays).

    Why an extension type with its own `__init__` (keyword arguments, the defaults it had as a
    dataclass): a plan is built every turn (issue 24), and a `dataclass`'s generated `__init__` is
    Python code made at import, interpreted even where this module is compiled; as an extension type
    its fields are a C struct (docs/compiled_core.md "Extension types"), public for the engine, the
    Scheduler and the policies, which read and write them by name.
    """

    chunks = cython.declare(list, visibility="public")  # of (PrefillGroup, chunk tokens)
    prefill_tokens = cython.declare(cython.longlong, visibility="public")
    prefill_context_tokens = cython.declare(cython.longlong, visibility="public")
    # swapped in this step plus swapped out after the previous step
    swap_tokens = cython.declare(cython.longlong, visibility="public")
    # samples whose prefill completes in this step (each samples its 1st token)
    first_tokens = cython.declare(cython.longlong, visibility="public")
    decodes_run = cython.declare(cython.bint, visibility="public")  # the running decodes take part
    decode_seqs = cython.declare(cython.longlong, visibility="public")  # running sequences decoding now
    # their context tokens (what their attention reads)
    decode_context_tokens = cython.declare(cython.longlong, visibility="public")
    # admission was held back by a rule, not by memory: no multi-step jump
    single_step = cython.declare(cython.bint, visibility="public")

    def __init__(
        self,
        chunks: list[tuple[PrefillGroup, int]] | None = None,
        prefill_tokens: int = 0,
        prefill_context_tokens: int = 0,
        swap_tokens: int = 0,
        first_tokens: int = 0,
        decodes_run: bool = True,
        decode_seqs: int = 0,
        decode_context_tokens: int = 0,
        single_step: bool = False,
    ) -> None:
        """The plan's fields by keyword, as the dataclass it was took them."""
        self.chunks = [] if chunks is None else chunks
        self.prefill_tokens = prefill_tokens
        self.prefill_context_tokens = prefill_context_tokens
        self.swap_tokens = swap_tokens
        self.first_tokens = first_tokens
        self.decodes_run = decodes_run
        self.decode_seqs = decode_seqs
        self.decode_context_tokens = decode_context_tokens
        self.single_step = single_step


class SchedulePolicy(Protocol):
    """One engine's step planning; registered by name in `sim/engines/` (docs/engines.md)."""

    name: str
    # --preemption-mode values this engine has (vLLM v1 only recomputes; v0 also swaps, or chooses)
    preemption_modes: tuple[str, ...]

    def plan_step(self, batch: Scheduler, now_s: float) -> StepPlan:
        """The next step's plan, built with the batch's mechanics; called when anything but the
        running decodes could join the step (something waits, is swapped, prefills or swapped out)."""
        ...

    def swaps_out(self, batch: Scheduler, req: int) -> bool:
        """Whether preempting a sample of `req` swaps it to CPU memory (else it is recomputed later)."""
        ...

    def preemption_victim(self, batch: Scheduler) -> tuple[int, PrefillGroup | None]:
        """Which running unit to preempt when memory runs out (`Scheduler.newest_unit`'s form)."""
        ...


class ContinuousBatchingPolicy:
    """Iteration-level scheduling with mixed steps: every step runs the running decodes, swaps in what
    was swapped out, continues partial prefills and admits waiting requests FCFS in the token budget
    left, with head-of-line blocking.

    Sources: Orca (Yu et al., OSDI 2022: iteration-level scheduling, FCFS) and vLLM's schedulers that
    mix prefill and decode (v1 `vllm/v1/core/sched/scheduler.py`
    `Scheduler.schedule`: RUNNING loop, then WAITING loop with `token_budget`; v0
    `_schedule_chunked_prefill`, swapped before waiting). Preemption recomputes or swaps as the
    `preemption_mode` says (vLLM v0 `Scheduler._preempt` with an explicit mode).
    """

    name = "continuous-batching"
    preemption_modes: tuple[str, ...] = ("recompute", "swap")

    def plan_step(self, batch: Scheduler, now_s: float) -> StepPlan:
        plan = StepPlan()
        if batch.swapped:
            batch.swap_in(plan, now_s)
        batch.add_swap_outs(plan)
        budget = batch.max_num_batched_tokens - batch.num_decode
        budget = batch.continue_prefills(plan, budget, now_s)
        self.admit(batch, plan, budget, now_s)
        return plan

    def admit(self, batch: Scheduler, plan: StepPlan, budget: int, now_s: float) -> None:
        """Waiting requests FCFS within `budget`; none while a swapped-out one waits to come back
        (vLLM v0 `_schedule`: the swapped queue is served before the waiting one)."""
        if not batch.swapped:
            batch.admit_waiting(plan, budget, now_s)

    def swaps_out(self, batch: Scheduler, req: int) -> bool:
        return batch.preemption_mode == "swap"

    def preemption_victim(self, batch: Scheduler) -> tuple[int, PrefillGroup | None]:
        """Newest first (vLLM v0 `_schedule` and v1 `schedule`: `self.running.pop()`)."""
        return batch.newest_unit()
