"""The SimPy serving engine: arrivals and an iteration-level continuous-batching loop.

Why SimPy plus jumps: SimPy gives the arrival process and the server honest simulated time, but one
SimPy event per serving iteration (~1M for 100k requests) would be slow. So the serving loop wakes
only when something happens. Between events, every running sequence decodes one token per
iteration and nothing else changes, so k iterations are taken at once, exactly:

    k = min(iterations until the next sequence finishes   (heap of finish iterations),
            iterations that start before the next arrival (closed-form step times, searched),
            1 + allocator.max_uniform_growth(running, k-1)  (memory runs out))

then `allocator.grow(running, k-1)` once, one timeout of the exact total duration, and the last
iteration is finished like a normal step (finishers released, survivors grown, failures preempted).
`EngineConfig(multi_step=False)` steps one iteration at a time through the same code; a test checks
both give the same tables.

Nor does a turn need a SimPy event of its own when nothing else can happen before it ends: the
server moves the clock itself then (`EngineClock.advance_to`), and in an open loop, where the
arrival process's wake-ups are known in advance, the server takes them itself at the point SimPy
would have run them (`_arrival_wake_up`; a test checks it against the SimPy process, ties included).

The engine sees requests, an allocator (Protocol in allocators/base.py) and a cost model; it does
not import the scenario, so tests can drive it with small fakes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import simpy

from allocators.base import Allocator, Layout
from sim.core.arrivals import ArrivalSource
from sim.core.metrics import RequestLog, StepRecorder, TimeIntegrals
from sim.core.offload import OffloadLedger
from sim.core.policy import ContinuousBatchingPolicy, SchedulePolicy
from sim.core.protocols import StepCostModel
from sim.core.scheduler import RequestInfo, Scheduler

try:
    import cython
except ImportError:  # Cython is a build requirement, not a runtime one (docs/compiled_core.md)
    from allocators import cython_shim as cython

REQUIRED_COLUMNS: tuple[str, ...] = (
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
)


class EngineClock(simpy.Environment):
    """A SimPy environment whose clock the serving loop may move itself while nothing else is due.

    Why: a serving turn whose end comes before every other scheduled event (the next arrival's
    wake-up, a closed-loop push) would be one timeout that SimPy schedules, pops and resumes for
    nothing: no other process can run in between. `advance_to` moves the clock to the turn's end
    instead, to the same float SimPy would have computed (`now + duration`), and refuses whenever
    another event is due at or before it, so that SimPy still orders every interaction (issue 24).
    Its one assumption about SimPy: the clock is `Environment._now` (SimPy 4: `now`, `schedule`).
    """

    def advance_to(self, at_s: float) -> bool:
        """Move the clock to `at_s` (>= now) if no event is scheduled at or before it; True if moved."""
        if self.peek() <= at_s:
            return False
        self._now = at_s
        return True

    def move_to(self, at_s: float) -> None:
        """Move the clock to `at_s` (>= now), unchecked: for a caller that schedules no SimPy events at
        all (the server of an open loop, `Engine._arrival_wake_up`), where `advance_to`'s look at the
        queue is a call per turn for nothing."""
        self._now = at_s


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine knobs (vLLM names) plus how much to record. Built from a Scenario by sim.api."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 2048
    enable_chunked_prefill: bool = False
    preemption_mode: str = "recompute"  # one of the policy's preemption_modes (v0 adds "auto")
    swap_space_tokens: int | None = None  # CPU swap bound in token slots (None: unbounded)
    # The engine's step planning (sim/core/policy.py; the presets are in sim/engines/). Default: mixed
    # steps, the plan the presets share.
    policy: SchedulePolicy = field(default_factory=ContinuousBatchingPolicy)
    multi_step: bool = True  # exact multi-iteration jumps over decode-only stretches
    max_step_rows: int = 200_000  # steps table bound before downsampling
    export_layouts_every: int | None = None  # iterations between layout snapshots (None: off)
    progress_every_turns: int = 2048

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "max_step_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1 (got {getattr(self, name)})")
        if self.preemption_mode not in self.policy.preemption_modes:
            raise ValueError(
                f"EngineConfig.preemption_mode must be {'|'.join(self.policy.preemption_modes)} for engine "
                f"{self.policy.name} (got {self.preemption_mode!r})"
            )


@dataclass(slots=True)
class LayoutSnapshot:
    """One exported layout (docs/architecture.md `--export-layouts`)."""

    step: int
    time_s: float
    layout: Layout
    predicted_kv_read_s: float
    predicted_step_s: float


@dataclass(slots=True)
class EngineResult:
    """Raw engine output: the two tables, exact totals for the summary, optional layouts."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    totals: dict[str, Any]
    layouts: list[LayoutSnapshot] = field(default_factory=list)


def validate_requests(requests: pd.DataFrame) -> None:
    """The engine's own minimal check (workloads.validate does the full one at the boundary)."""
    missing = [c for c in REQUIRED_COLUMNS if c not in requests.columns]
    if missing:
        raise ValueError(f"request table is missing column(s) {', '.join(missing)}")
    if len(requests) and not np.all(np.diff(requests["arrival_s"].to_numpy(np.float64)) >= 0):
        raise ValueError("request table: arrival_s must be non-decreasing")
    for name in ("prompt_tokens", "output_tokens", "max_tokens"):
        values = requests[name].to_numpy(np.int64)
        if len(values) and values.min() < 1:
            row = int(np.argmin(values))
            raise ValueError(f"request table row {row}: field {name!r} must be >= 1 (got {values[row]})")


@cython.cclass
class Engine:
    """One simulation run: build it, call `run()`, read the EngineResult.

    An extension type compiled (docs/compiled_core.md "Extension types"): the serving loop reads its
    own fields every turn, and its per-turn helpers (`_jump_length`, `_arrival_wake_up`) are C calls.
    The Scheduler and the other objects it holds are declared `object`: their types live in other
    modules, whose C layout this one cannot see without a `.pxd`.
    """

    requests = cython.declare(object, visibility="public")
    alloc = cython.declare(object, visibility="public")
    cost = cython.declare(object, visibility="public")
    config = cython.declare(object, visibility="public")
    progress = cython.declare(object, visibility="public")
    kv_read_time_s = cython.declare(object, visibility="public")
    env = cython.declare(object, visibility="public")
    log = cython.declare(object, visibility="public")
    source = cython.declare(object, visibility="public")
    own_arrivals = cython.declare(cython.bint, visibility="public")
    sched = cython.declare(object, visibility="public")
    recorder = cython.declare(object, visibility="public")
    integrals = cython.declare(object, visibility="public")
    layouts = cython.declare(list, visibility="public")
    turns = cython.declare(cython.longlong, visibility="public")
    _idle = cython.declare(object, visibility="public")
    _arrival_sleep = cython.declare(object, visibility="public")
    _arrivals_proc = cython.declare(object, visibility="public")
    _arrival_wake_s = cython.declare(cython.double, visibility="public")
    _next_export = cython.declare(cython.longlong, visibility="public")
    offload = cython.declare(object, visibility="public")

    def __init__(
        self,
        requests: pd.DataFrame,
        allocator: Allocator,
        cost_model: StepCostModel,
        config: EngineConfig,
        *,
        progress: Callable[[float, int, int], None] | None = None,
        kv_read_time_s: Callable[[int, int], float] | None = None,
        emulate_open_loop: bool = True,
    ) -> None:
        """`emulate_open_loop=False` runs an open loop's arrival process as a SimPy process of its own,
        the reference that the server's emulation of it (`_arrival_wake_up`) is tested against."""
        validate_requests(requests)
        self.requests = requests
        self.alloc = allocator
        self.cost = cost_model
        self.config = config
        self.progress = progress
        self.kv_read_time_s = kv_read_time_s
        self.env = EngineClock()
        self.log = RequestLog(len(requests))
        self.source = ArrivalSource(requests)
        # open loop: the server takes the arrival process's wake-ups itself (`_arrival_start`)
        self.own_arrivals = emulate_open_loop and not self.source.closed
        self.sched = Scheduler(
            # the allocator says whether its cache needs every request's tokens named (prefix caching)
            RequestInfo(requests, config.max_model_len, allocator.content_identity),
            allocator,
            self.log,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            preemption_mode=config.preemption_mode,
            # only a closed loop reacts to a finish (`ArrivalSource.request_done` returns at once in an
            # open loop): no call per finished request for nothing
            on_request_done=self.source.request_done if self.source.closed else None,
            swap_space_tokens=config.swap_space_tokens,
            policy=config.policy,
        )
        self.recorder = StepRecorder(config.max_step_rows)
        self.integrals = TimeIntegrals()
        self.layouts = []  # of LayoutSnapshot
        self.turns = 0
        self._idle = None  # simpy.Event while the server sleeps
        self._arrival_sleep = None  # (simpy.Process, wake-up time) while the arrival process sleeps
        self.source.on_push = self._on_push
        self._arrivals_proc = None  # simpy.Process
        self._arrival_wake_s = math.inf  # the emulated open-loop arrival process's next wake-up
        self._next_export = 0  # iteration at which the next layout snapshot is due
        # the allocator's CPU tier, if it has one: PCIe time per step and occupancy (sim/core/offload.py)
        self.offload = None if allocator.cpu_tier is None else OffloadLedger(allocator.cpu_tier)

    # -- SimPy processes -----------------------------------------------------------------------------------

    @cython.cfunc
    def _release_due(self, now_s: float) -> None:
        if self.source.next_s > now_s:  # the common case: nothing due
            return
        enqueue = self.sched.enqueue
        for arrival_s, req in self.source.pop_due(now_s):
            enqueue(req, arrival_s)

    @cython.cfunc
    def _wake_server(self) -> None:
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _arrivals(self):  # a SimPy generator
        """Arrival process: sleep until the next arrival, release it into the queue, wake an idle server."""
        env, source = self.env, self.source
        if not source.closed:
            # Open loop (one wake per request): nothing pushes arrivals (request_done does only in a
            # closed loop), so the sleep is never interrupted and needs none of the bookkeeping below.
            enqueue = self.sched.enqueue
            while not source.exhausted:
                next_s = source.next_s
                if next_s > env.now:
                    yield env.timeout(next_s - env.now)
                for arrival_s, req in source.pop_due(env.now):
                    enqueue(req, arrival_s)
                self._wake_server()
            return
        while not source.exhausted:
            next_s = source.next_s
            if next_s == math.inf:  # closed loop: nobody sends until a request ends
                self._arrival_sleep = (self._arrivals_proc, math.inf)
                try:
                    yield env.event()
                except simpy.Interrupt:
                    pass
                self._arrival_sleep = None
                continue
            if next_s > env.now:
                self._arrival_sleep = (self._arrivals_proc, next_s)
                try:
                    yield env.timeout(next_s - env.now)
                except simpy.Interrupt:  # an earlier closed-loop arrival was pushed
                    self._arrival_sleep = None
                    continue
                self._arrival_sleep = None
            self._release_due(env.now)
            self._wake_server()

    @cython.cfunc
    def _arrival_start(self) -> None:
        """The open-loop arrival process (`_arrivals`) as it starts at time 0, before the server.

        Why emulated: in an open loop nothing but the server interacts with the arrival process, and
        its wake-ups are known in advance (the table's times), so the server takes each one itself,
        at the point of its own loop where SimPy would have run it, instead of paying a SimPy event
        per arrival and per step (issue 24). What a wake-up does, and when, is unchanged: it releases
        the requests due at its own clock (whose allocator-dependent admission checks see the same
        state as before) and wakes an idle server; the clock lands on the same floats.
        """
        source = self.source
        self._arrival_wake_s = math.inf
        if source.exhausted:
            return
        if source.next_s > 0.0:
            self._arrival_wake_s = 0.0 + (source.next_s - 0.0)  # `env.timeout(next_s - env.now)` at 0
        else:
            self._arrival_wake_s = 0.0
            self._arrival_wake_up()

    @cython.cfunc
    @cython.locals(idle=cython.bint)
    def _arrival_wake_up(self, idle: bool = False) -> None:
        """One wake-up of the emulated open-loop arrival process at `_arrival_wake_s`: release what is
        due at its clock, then sleep until the next arrival (`_arrivals`, open loop, step by step).

        `idle`: the server is asleep waiting for it, and wakes at that time (SimPy runs the server
        after the arrival process, at the same time).
        """
        at_s = self._arrival_wake_s
        if at_s == math.inf:  # SimPy's own complaint when the server would wait forever
            raise RuntimeError('No scheduled events left but "until" event was not triggered')
        if idle and not self.env.advance_to(at_s):
            raise AssertionError("an open-loop engine has no other SimPy events")
        source = self.source
        if source.next_s <= at_s:
            enqueue = self.sched.enqueue
            for arrival_s, req in source.pop_due(at_s):
                enqueue(req, arrival_s)
        if source.exhausted:
            self._arrival_wake_s = math.inf
        else:  # next_s > at_s: everything due was released just now
            self._arrival_wake_s = at_s + (source.next_s - at_s)

    def _on_push(self, at_s: float) -> None:
        sleeping = self._arrival_sleep
        if sleeping is not None and at_s < sleeping[1] and sleeping[0] is not None and sleeping[0].is_alive:
            self._arrival_sleep = None
            sleeping[0].interrupt()

    def _serve(self):  # a SimPy generator; the hot loop is kept in one place
        """The serving loop: one turn = one step, or one exact jump over decode-only iterations."""
        env, sched, alloc, cost, config = self.env, self.sched, self.alloc, self.cost, self.config
        integrals, recorder = self.integrals, self.recorder
        multi_step = config.multi_step
        export_every = config.export_layouts_every
        progress_every = config.progress_every_turns
        # alloc.breakdown_integral: exact sum_i d_i x parts(i) over a jump for allocators whose parts
        # are step functions of growth (blocks, pages); None (the default) when they change linearly.
        exact_integral = alloc.breakdown_integral
        offload = self.offload
        source = self.source
        advance_to, move_to = env.advance_to, env.move_to
        own_arrivals = self.own_arrivals
        if own_arrivals:
            self._arrival_start()
        while True:
            # the clock as SimPy keeps it (`EngineClock`): `env.now` is a Python property call per read
            now = env._now
            if source.next_s <= now:  # an arrival is due (most turns have none: no call)
                self._release_due(now)
            plan = sched.schedule(now)
            moves_kv = offload is not None and offload.take()  # KV to or from the CPU tier this turn
            if sched.num_seqs == 0:
                if self.source.exhausted and sched.idle:
                    return
                # Idle time is part of the taxonomy's span (docs/metrics.md): the memory as the
                # allocator holds it while nothing runs (free, and any cached prefix blocks).
                idle_parts = alloc.breakdown(
                    sched.next_demand_tokens() if sched.waiting or sched.swapped else 0
                )
                if own_arrivals:  # asleep until the arrival process's next wake-up, which wakes it
                    self._arrival_wake_up(idle=True)
                else:
                    self._idle = env.event()
                    yield self._idle
                    self._idle = None
                integrals.add_constant(idle_parts, env.now - now)
                if offload is not None:
                    offload.drop()
                    offload.hold(env.now - now)
                continue

            self.turns += 1
            n_dec, ctx0 = plan.decode_seqs, plan.decode_context_tokens  # what decodes in this step
            it0 = sched.it
            iterations, step_durations = 1, None
            # plan.decode_only, and no rule holding admission back for just this step
            if (
                multi_step
                and not plan.chunks
                and not plan.swap_tokens
                and not plan.single_step
                and not moves_kv
            ):
                iterations, step_durations = self._jump_length(now, n_dec, ctx0)
            # nobody queued (most turns): no head-of-queue demand, without the call
            demand = sched.next_demand_tokens() if sched.waiting or sched.swapped else 0
            first = alloc.breakdown(demand)
            if step_durations is None:
                duration = cost.step_time_s(plan.prefill_tokens, n_dec, ctx0, plan.prefill_context_tokens)
                if plan.swap_tokens:
                    duration += cost.swap_time_s(plan.swap_tokens)
                if moves_kv:
                    duration = offload.price(cost, duration)  # type: ignore[union-attr]
                integrals.add_constant(first, duration)
            else:
                duration = float(np.add.reduce(step_durations))  # = .sum(), without its Python wrapper
                sums = exact_integral(
                    sched.decode_ids(), step_durations, demand, first=first, total_s=duration
                )
                if sums is not None:
                    integrals.add_sums(sums)
                    sched.grow_uniform(iterations - 1)
                else:
                    index_weighted = float(np.dot(np.arange(iterations, dtype=np.float64), step_durations))
                    sched.grow_uniform(iterations - 1)
                    last = alloc.breakdown(demand)
                    integrals.add_linear(first, last, iterations, duration, index_weighted)
            num_seqs = sched.num_seqs
            integrals.add_running(num_seqs, duration)
            if offload is not None:
                offload.hold(duration)
            if recorder.seen % recorder.stride == 0:
                # a flat record in metrics.RECORD_ORDER: metrics.RECORD_HEAD's numbers, then the breakdown
                recorder.offer_record(
                    (
                        now,
                        duration,
                        it0,  # step
                        n_dec + len(plan.chunks),  # batch_size
                        num_seqs,  # num_running
                        len(sched.waiting) + len(sched.swapped),  # queue_length
                        plan.prefill_tokens,
                        n_dec * iterations,  # decode_tokens
                        iterations,
                        n_dec * iterations + plan.first_tokens,  # generated_tokens
                    )
                    + first
                )
            else:
                recorder.skip()
            if export_every is not None and it0 >= self._next_export:
                self._export_layout(it0, now, n_dec, ctx0, duration / iterations)
                self._next_export = (it0 // export_every + 1) * export_every
            if progress_every and self.progress is not None and self.turns % progress_every == 0:
                self.progress(now, self.log.num_done, len(self.requests))
            if duration > 0:
                end = now + duration  # the float SimPy's timeout would land on
                if own_arrivals:
                    # The arrival process's wake-ups during the step, in SimPy's order: before its
                    # end, or at its end when scheduled before the step's timeout was (`_arrival_wake_up`).
                    wake_s, late = self._arrival_wake_s, False
                    while wake_s < end or (wake_s == end and not late):
                        self._arrival_wake_up()
                        wake_s, late = self._arrival_wake_s, True
                    move_to(end)
                elif not advance_to(end):  # without SimPy when no other event comes first
                    yield env.timeout(duration)
            sched.complete(iterations, plan, env._now)

    @cython.cfunc
    def _jump_length(self, now: float, n_dec: int, ctx0: int) -> tuple[int, np.ndarray | None]:
        """How many decode-only iterations to take at once (>= 1), and their durations when > 1.

        One vectorised call prices the candidate iterations; the next arrival is seen at the first
        iteration that starts at or after it, so iterations starting before it are counted with a
        search over the cumulative durations.
        """
        sched = self.sched
        limit = sched.iterations_to_next_finish()
        if self.config.export_layouts_every is not None:  # stop where the next snapshot is due
            limit = min(limit, max(1, self._next_export - sched.it))
        if limit <= 1:
            return 1, None
        if self.alloc.frees_while_growing and (sched.waiting or sched.swapped):
            # Growth frees memory here (sliding windows), so the blocked head of the queue may fit
            # after any iteration, as it would when stepping: no jump while someone waits.
            return 1, None
        gap_s = math.inf
        if not sched.waiting and not sched.swapped:
            # Nobody waits, so the next arrival would be admitted; with a blocked head of queue,
            # arrivals change nothing until something is released (a finish, which bounds k anyway).
            gap_s = self.source.next_s - now
            first_s = self.cost.step_time_s(0, n_dec, ctx0)
            if first_s > 0 and gap_s < math.inf:  # durations never shrink: T(i) >= i * first_s
                limit = min(limit, int(gap_s / first_s) + 1)
                if limit <= 1:
                    return 1, None
        grow = int(self.alloc.max_uniform_growth(sched.decode_ids(), limit - 1))
        limit = min(limit, 1 + grow)
        if limit <= 1:
            return 1, None
        if gap_s < math.inf:
            # Iteration i (i >= 1) starts at T(i) = sum(durations[:i]); it is decode-only if T(i) < gap.
            limit = self.cost.decode_steps_starting_before(n_dec, ctx0, limit, gap_s)
            if limit <= 1:
                return 1, None
        return limit, self.cost.decode_step_durations_s(n_dec, ctx0, limit)

    @cython.cfunc
    def _export_layout(self, step: int, now: float, n_dec: int, ctx0: int, step_s: float) -> None:
        kv_read_s = math.nan
        if self.kv_read_time_s is not None:
            kv_read_s = float(self.kv_read_time_s(n_dec, ctx0))
        self.layouts.append(LayoutSnapshot(step, now, self.alloc.layout(), kv_read_s, step_s))

    # -- the run ---------------------------------------------------------------------------------------------

    def run(self) -> EngineResult:
        wall_start = time.perf_counter()
        env = self.env
        if not self.own_arrivals:  # else the arrival process runs inside the server (`_arrival_wake_up`)
            self._arrivals_proc = env.process(self._arrivals())
        server = env.process(self._serve())
        env.run(until=server)
        wall_s = time.perf_counter() - wall_start
        sched, log = self.sched, self.log
        del sched.info  # its per-request columns are done with: free them before the tables are built
        if log.num_done != len(self.requests):
            raise AssertionError(
                f"engine stopped with {len(self.requests) - log.num_done} requests unfinished"
            )
        requests = log.to_frame(self.requests)
        totals: dict[str, Any] = {
            "duration_s": float(env.now),
            "wall_s": wall_s,
            "iterations": sched.it,
            "turns": self.turns,
            "generated_tokens": log.total_generated_tokens,
            "prefill_tokens": log.total_prefill_tokens,
            "queue_request_s": sched.queue_request_s,
            "max_queue_length": sched.max_queue_length,
            "step_rows_seen": self.recorder.seen,
            "step_rows_stride": self.recorder.stride,
        }
        totals.update(self.integrals.as_dict())
        if self.offload is not None:
            totals["cpu_tier"] = self.offload.totals()
        if self.progress is not None:
            self.progress(env.now, log.num_done, len(self.requests))
        return EngineResult(requests, self.recorder.to_frame(), totals, self.layouts)


def run_engine(
    requests: pd.DataFrame,
    allocator: Allocator,
    cost_model: StepCostModel,
    config: EngineConfig,
    *,
    progress: Callable[[float, int, int], None] | None = None,
    kv_read_time_s: Callable[[int, int], float] | None = None,
) -> EngineResult:
    """Simulate serving `requests` with `allocator`, pricing steps with `cost_model`."""
    return Engine(
        requests, allocator, cost_model, config, progress=progress, kv_read_time_s=kv_read_time_s
    ).run()
