"""Who runs next: FCFS admission, the running batch, preemption -- through the allocator Protocol only.

Why a separate module: the serving loop (sim/core/engine.py) owns time, cost and SimPy; this module owns
the *state* of the batch and its mechanics (FCFS admission with head-of-line blocking within
`max_num_seqs` and a token budget, chunked prefill, swap-in, newest-first preemption, completion).
What goes into each step is the engine's policy (`sim/core/policy.py` `SchedulePolicy`, one class per
engine in `sim/engines/`), which composes the public mechanics below. It never looks inside an
allocator: it calls `demand_tokens`, `admit`, `fork`, `grow`, `release` and `prefix_hit_tokens`, and
reads its declared abilities, nothing else.

Why this state layout: decoding sequences all advance one token per iteration, so each one is
stored as offsets against the global iteration counter `it` (emitted = em_off + it,
KV length = kv_off + it) and its finishing iteration sits in a heap. Nothing is touched per
iteration; the sum of context lengths is `kv_off_sum + num_decode * it`. Python work happens only
when something changes (admission, finish, preemption).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

import numpy as np
import pandas as pd

from allocators.base import Allocator, SeqSpec
from sim.core.metrics import FINISH_KV_EXHAUSTED, FINISH_LENGTH, FINISH_STOP, RequestLog
from sim.core.policy import ContinuousBatchingPolicy, SchedulePolicy, StepPlan

try:
    import cython
except ImportError:  # Cython is a build requirement, not a runtime one (docs/compiled_core.md)
    from allocators import cython_shim as cython


@cython.cclass
class WorkItem:
    """A queued unit of work: a fresh request (sample == -1, all n samples) or one resumed sample.

    An extension type compiled (its fields in a C struct, read by the Scheduler without a lookup; as
    Python a plain class): see `Scheduler`.
    """

    req = cython.declare(cython.longlong, visibility="public")
    sample = cython.declare(cython.longlong, visibility="public")
    emitted = cython.declare(cython.longlong, visibility="public")
    enqueued_s = cython.declare(cython.double, visibility="public")
    readmission = cython.declare(cython.bint, visibility="public")
    swapped = cython.declare(cython.bint, visibility="public")
    demand_tokens = cython.declare(cython.longlong, visibility="public")
    swap_slots = cython.declare(cython.longlong, visibility="public")

    def __init__(
        self, req: int, sample: int, emitted: int, enqueued_s: float, readmission: bool, swapped: bool
    ):
        self.req = req
        self.sample = sample
        self.emitted = emitted
        self.enqueued_s = enqueued_s
        self.readmission = readmission
        self.swapped = swapped
        self.demand_tokens = -1  # cached allocator.demand_tokens, -1 = not asked yet
        self.swap_slots = 0  # CPU swap space it holds while swapped out (token slots, whole blocks)


@cython.cclass
class PrefillGroup:
    """An admitted item still computing its prompt (parent + forked samples share one prefill).

    An extension type compiled, as `WorkItem`.
    """

    item = cython.declare(WorkItem, visibility="public")
    seq_ids = cython.declare(list, visibility="public")
    compute_left = cython.declare(cython.longlong, visibility="public")
    context_tokens = cython.declare(cython.longlong, visibility="public")
    stamp = cython.declare(cython.longlong, visibility="public")
    prompt_tokens = cython.declare(cython.longlong, visibility="public")
    per_chunk = cython.declare(cython.bint, visibility="public")

    def __init__(
        self, item: WorkItem, seq_ids: list[int], compute_left: int, context_tokens: int, stamp: int
    ):
        self.item = item
        self.seq_ids = seq_ids
        self.compute_left = compute_left
        self.context_tokens = context_tokens
        self.stamp = stamp
        self.prompt_tokens = 0
        self.per_chunk = False  # the allocator holds only what has been scheduled (grown per chunk)


# `RequestInfo.spec` builds SeqSpecs by position, in this order.
_SPEC_FIELDS: tuple[str, ...] = (
    "seq_id",
    "prompt_tokens",
    "max_tokens",
    "output_tokens",
    "prefix_group",
    "prefix_tokens",
    "block_hashes",
    "block_hash_tokens",
    "content_key",
    "content_prompt_tokens",
    "sample",
    "first_chunk_tokens",
)
if SeqSpec._fields != _SPEC_FIELDS:
    raise AssertionError(f"RequestInfo.spec builds SeqSpec by position: its fields are now {SeqSpec._fields}")

# Decode record: a list for cheap field access. Indices (C constants compiled: a list index in C):
_REQ = cython.declare(cython.Py_ssize_t, 0)
_SAMPLE = cython.declare(cython.Py_ssize_t, 1)
_EM_OFF = cython.declare(cython.Py_ssize_t, 2)
_KV_OFF = cython.declare(cython.Py_ssize_t, 3)
_TARGET = cython.declare(cython.Py_ssize_t, 4)
_STAMP = cython.declare(cython.Py_ssize_t, 5)

# `SeqSpec(...)` runs the NamedTuple's generated `__new__`, a Python function of 12 arguments; the tuple
# constructor it ends in, called directly with the same values in field order, builds the same SeqSpec
# without that frame (~2,000 instructions less per spec, two specs per request; callgrind).
_tuple_new = tuple.__new__


def _int64_column(requests: pd.DataFrame, name: str) -> np.ndarray:
    """A column as a contiguous int64 array: the table's own memory when it already is one."""
    return np.ascontiguousarray(requests[name].to_numpy(np.int64))


class _NoHashes:
    """`block_hashes` of a table without the column: () for every request, in no memory per request."""

    __slots__ = ()

    def __getitem__(self, req: int) -> tuple[int, ...]:
        return ()


@cython.cclass
class RequestInfo:
    """The request table's columns for scalar reads, plus the engine's effective limits.

    Why memoryviews of NumPy arrays: indexing one returns a plain Python int as fast as a list
    does, but costs 8 bytes a request (1 for the defaults) instead of a list's pointer plus a boxed
    int, and the table's own int64 columns are read in place without a copy (issue 16: 1M requests
    in <= 400 MB; measured with benchmarks/engine.py --num-prompts 1000000).

    An extension type compiled, as `Scheduler`. The four int64 columns the Scheduler reads per
    request have a typed view each as well (`_prompt`, ...: the same memory, read as C integers
    compiled; as Python the same memoryviews); the public memoryviews stay what readers get.
    """

    num_requests = cython.declare(cython.longlong, visibility="public")
    prompt_tokens = cython.declare(object, visibility="public")
    output_tokens = cython.declare(object, visibility="public")
    max_tokens_eff = cython.declare(object, visibility="public")
    target_tokens = cython.declare(object, visibility="public")
    n = cython.declare(object, visibility="public")
    prefix_group = cython.declare(object, visibility="public")
    prefix_tokens = cython.declare(object, visibility="public")
    block_hashes = cython.declare(object, visibility="public")  # list[tuple[int, ...]] | _NoHashes
    has_block_hashes = cython.declare(cython.bint, visibility="public")
    block_hash_tokens = cython.declare(object, visibility="public")
    content_keys = cython.declare(list, visibility="public")  # tuple | None per request
    _prompt = cython.declare(cython.const_longlong[:])
    _output = cython.declare(cython.const_longlong[:])
    _max_eff = cython.declare(cython.const_longlong[:])
    _target = cython.declare(cython.const_longlong[:])

    def __init__(self, requests: pd.DataFrame, max_model_len: int, content_identity: bool = False) -> None:
        num = len(requests)
        self.num_requests = num
        prompt = _int64_column(requests, "prompt_tokens")
        output = _int64_column(requests, "output_tokens")
        max_tokens = requests["max_tokens"].to_numpy(np.int64)
        self.prompt_tokens = memoryview(prompt)
        self.output_tokens = memoryview(output)
        # vLLM stops a sequence at max_model_len: the effective client limit is capped by it.
        max_tokens_eff = np.minimum(max_tokens, max_model_len - prompt)
        self.max_tokens_eff = memoryview(max_tokens_eff)
        self.target_tokens = memoryview(np.minimum(output, max_tokens_eff))
        self._prompt = self.prompt_tokens
        self._output = self.output_tokens
        self._max_eff = self.max_tokens_eff
        self._target = self.target_tokens
        self.n = memoryview(_int64_column(requests, "n") if "n" in requests else np.ones(num, np.int8))
        self.prefix_group = memoryview(
            _int64_column(requests, "prefix_group")
            if "prefix_group" in requests
            else np.full(num, -1, np.int8)
        )
        self.prefix_tokens = memoryview(
            _int64_column(requests, "prefix_tokens")
            if "prefix_tokens" in requests
            else np.zeros(num, np.int8)
        )
        self.has_block_hashes = "block_hashes" in requests  # without: spec() makes no lookup call
        if self.has_block_hashes:
            self.block_hashes = [
                tuple(int(h) for h in hashes) if hashes is not None and len(hashes) else ()
                for hashes in requests["block_hashes"].tolist()
            ]
        else:
            self.block_hashes = _NoHashes()
        self.block_hash_tokens = int(requests.attrs.get("block_hash_tokens", 0) or 0)
        # Content identity of every request's own tokens (SeqSpec.content_key), for prefix caching of
        # full blocks beyond the named prefix: prompt tails and decode-filled blocks, so a resumed
        # request hits its own blocks. A session turn's tokens continue its session's stream (its
        # next turn's prefix is this turn's prompt + output: workloads/sharing.py session_history),
        # named like the stream's prefix group; any other request's tokens are its own.
        self.content_keys = [None] * num
        if content_identity:
            sessions = (
                requests["session_id"].to_numpy(np.int64).tolist() if "session_id" in requests else [-1] * num
            )
            self.content_keys = [
                ("g", group) if session >= 0 and group >= 0 else ("r", req)
                for req, (session, group) in enumerate(zip(sessions, self.prefix_group, strict=True))
            ]

    @cython.ccall
    @cython.locals(
        req=cython.longlong,
        seq_id=cython.longlong,
        emitted=cython.longlong,
        sample=cython.longlong,
        first_chunk=cython.longlong,
        prompt=cython.longlong,
    )
    def spec(self, req: int, seq_id: int, emitted: int, sample: int = 0, first_chunk: int = 0) -> SeqSpec:
        """The allocator's view of sample `sample` of `req` having already generated `emitted` tokens.

        A resumed sample (recompute or swap) looks like a new sequence whose prompt includes
        what it generated, with correspondingly fewer tokens to go.
        """
        prompt = self._prompt[req]
        # by position, in _SPEC_FIELDS order (checked at import): a quarter of a microsecond less than by
        # keyword, twice per request; through the tuple constructor (`_tuple_new`), not SeqSpec's __new__
        return _tuple_new(
            SeqSpec,
            (
                seq_id,
                prompt + emitted,  # prompt_tokens
                self._max_eff[req] - emitted,  # max_tokens
                self._output[req] - emitted,  # output_tokens
                self.prefix_group[req],
                self.prefix_tokens[req],
                self.block_hashes[req] if self.has_block_hashes else (),
                self.block_hash_tokens,
                self.content_keys[req],  # content_key
                prompt,  # content_prompt_tokens
                sample,
                first_chunk,  # first_chunk_tokens
            ),
        )


@cython.cclass
class Scheduler:
    """The batch of one run over one allocator, planned step by step by an engine policy.

    Mechanics for policies (`sim/core/policy.py`): `swap_in`, `add_swap_outs`, `continue_prefills`,
    `admit_waiting`, `pause_decodes`; state they read: `waiting`, `swapped`, `num_decode`,
    `num_seqs`, `preempted`, `chunked`, `max_num_batched_tokens`, `preemption_mode`,
    `unfinished_samples`.

    Why an extension type (`@cython.cclass`, attributes declared below): compiled, every `self.x` of a
    plain class is a dictionary lookup, and `complete` alone made ~169,000 instructions of them per
    request on the jump workload; declared, they are fields of a C struct, the counters C integers
    (docs/compiled_core.md "Extension types"). As Python the declarations are class attributes that
    `__init__` shadows, and the class is the plain class it was. `public`: policies and tests read
    and set them by name.
    """

    policy = cython.declare(object, visibility="public")
    info = cython.declare(RequestInfo, visibility="public")
    alloc = cython.declare(object, visibility="public")
    log = cython.declare(object, visibility="public")
    max_num_seqs = cython.declare(cython.longlong, visibility="public")
    max_num_batched_tokens = cython.declare(cython.longlong, visibility="public")
    max_model_len = cython.declare(cython.longlong, visibility="public")
    chunked = cython.declare(cython.bint, visibility="public")
    preemption_mode = cython.declare(object, visibility="public")
    _can_allocate_per_chunk = cython.declare(cython.bint, visibility="public")
    swap_space_tokens = cython.declare(object, visibility="public")  # int or None
    swap_block_tokens = cython.declare(cython.longlong, visibility="public")
    swap_used_tokens = cython.declare(cython.longlong, visibility="public")
    swap_fallbacks = cython.declare(cython.longlong, visibility="public")
    preempted = cython.declare(cython.bint, visibility="public")
    on_request_done = cython.declare(object, visibility="public")
    capacity_tokens = cython.declare(cython.longlong, visibility="public")
    waiting = cython.declare(object, visibility="public")  # deque
    swapped = cython.declare(object, visibility="public")  # deque
    prefilling = cython.declare(list, visibility="public")
    decode = cython.declare(dict, visibility="public")
    finish_heap = cython.declare(list, visibility="public")
    kv_off_sum = cython.declare(cython.longlong, visibility="public")
    num_seqs = cython.declare(cython.longlong, visibility="public")
    it = cython.declare(cython.longlong, visibility="public")
    pending_swap_out_tokens = cython.declare(cython.longlong, visibility="public")
    queue_request_s = cython.declare(cython.double, visibility="public")
    max_queue_length = cython.declare(cython.longlong, visibility="public")
    _free_ids = cython.declare(list, visibility="public")
    _next_id = cython.declare(cython.longlong, visibility="public")
    _stamp = cython.declare(cython.longlong, visibility="public")
    _ids_cache = cython.declare(object, visibility="public")
    # compiled: the keys of `decode`, in its order, kept in step with it (`decode_ids`): an int64 array,
    # its typed view and how many entries are keys
    _ids_buffer = cython.declare(object)
    _ids_view = cython.declare(cython.longlong[:])
    _ids_count = cython.declare(cython.Py_ssize_t)
    # weak references to it (sim/engines/sglang.py keys its per-batch state by the batch, weakly)
    __weakref__ = cython.declare(object)

    def __init__(
        self,
        info: RequestInfo,
        allocator: Allocator,
        log: RequestLog,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool,
        preemption_mode: str,
        on_request_done: Callable[[int, float], None] | None = None,
        swap_space_tokens: int | None = None,
        policy: SchedulePolicy | None = None,
    ) -> None:
        self.policy = ContinuousBatchingPolicy() if policy is None else policy
        if preemption_mode not in self.policy.preemption_modes:
            raise ValueError(
                f"preemption_mode must be one of {', '.join(self.policy.preemption_modes)} for engine "
                f"{self.policy.name} (got {preemption_mode!r})"
            )
        self.info = info
        self.alloc = allocator
        self.log = log
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.chunked = enable_chunked_prefill
        self.preemption_mode = preemption_mode
        # a prompt can be allocated chunk by chunk only under chunked prefill and by an allocator that can
        self._can_allocate_per_chunk = enable_chunked_prefill and allocator.allocates_per_chunk
        self.swap_space_tokens = swap_space_tokens
        # swap space is held in the allocator's own unit (whole blocks for a paged cache)
        self.swap_block_tokens = max(1, int(allocator.swap_block_tokens))
        self.swap_used_tokens = 0
        self.swap_fallbacks = 0  # swap-outs turned into recompute for lack of swap space
        self.preempted = False  # a preemption since the last step was planned (v1 admits nothing then)
        self.on_request_done = on_request_done
        self.capacity_tokens = int(allocator.capacity_tokens)

        self.waiting = deque()  # of WorkItem
        self.swapped = deque()  # of WorkItem
        self.prefilling = []  # of PrefillGroup
        self.decode = {}  # seq id -> decode record (list[int])
        self.finish_heap = []  # (finish_it, stamp, seq_id)
        self.kv_off_sum = 0  # sum of kv_off over decode seqs: context tokens = kv_off_sum + n * it
        self.num_seqs = 0  # decode seqs + sequences of prefill groups (what max_num_seqs limits)
        self.it = 0  # completed iterations
        self.pending_swap_out_tokens = 0
        self.queue_request_s = 0.0  # integral of queue length over time (exact, from enqueue times)
        self.max_queue_length = 0

        self._free_ids = []
        self._next_id = 0
        self._stamp = 0
        self._ids_cache = None  # np.ndarray of the decode ids, or None
        self._ids_buffer = np.zeros(256, dtype=np.int64)
        self._ids_view = self._ids_buffer
        self._ids_count = 0

    # -- queue -------------------------------------------------------------------------------------------

    @property
    def queue_length(self) -> int:
        return len(self.waiting) + len(self.swapped)

    @cython.cfunc
    def _note_queue(self) -> None:
        q = len(self.waiting) + len(self.swapped)
        if q > self.max_queue_length:
            self.max_queue_length = q

    @cython.cfunc
    @cython.locals(now_s=cython.double, item=WorkItem)
    def _dequeue(self, queue: deque[WorkItem], now_s: float) -> WorkItem:
        item = queue.popleft()
        self.queue_request_s += now_s - item.enqueued_s
        return item

    @cython.locals(
        req=cython.longlong, now_s=cython.double, prompt=cython.longlong, n=cython.longlong, info=RequestInfo
    )
    def enqueue(self, req: int, now_s: float) -> None:
        """A request arrives: refuse it now if it can never run (with a reason), else queue it FCFS."""
        info, log = self.info, self.log
        log.arrival_s[req] = now_s
        prompt = info._prompt[req]
        n = info.n[req]
        reason = ""
        if prompt >= self.max_model_len:
            reason = (
                f"prompt_tokens {prompt} leaves no room to generate within max_model_len {self.max_model_len}"
            )
        elif n > self.max_num_seqs:
            reason = f"n {n} parallel samples > max_num_seqs {self.max_num_seqs}"
        elif not self.chunked and prompt > self.max_num_batched_tokens:
            reason = (
                f"prompt_tokens {prompt} > max_num_batched_tokens {self.max_num_batched_tokens} "
                "without chunked prefill"
            )
        else:
            spec = info.spec(req, 0, 0)
            demand = int(self.alloc.demand_tokens(spec))
            if demand > self.capacity_tokens:
                reason = (
                    self.alloc.rejection_reason(spec)
                    or f"needs {demand} KV tokens, more than the cache's {self.capacity_tokens}"
                )
        if reason:
            log.reject(req, now_s, reason)
            if self.on_request_done is not None:
                self.on_request_done(req, now_s)
            return
        self.waiting.append(WorkItem(req, -1, 0, now_s, False, False))
        self._note_queue()

    @cython.locals(item=WorkItem)
    def next_demand_tokens(self) -> int:
        """Demand of the head of the queue (swapped first, as they are served first); 0 if none waits."""
        queue = self.swapped if self.swapped else self.waiting
        if not queue:
            return 0
        item = queue[0]
        if item.demand_tokens < 0:
            item.demand_tokens = int(self.alloc.demand_tokens(self.info.spec(item.req, 0, item.emitted)))
        return item.demand_tokens

    # -- ids -----------------------------------------------------------------------------------------------

    @cython.cfunc
    @cython.returns(cython.longlong)
    def _new_id(self) -> int:
        if self._free_ids:
            return self._free_ids.pop()
        self._next_id += 1
        return self._next_id - 1

    def decode_ids(self) -> np.ndarray:
        """Ids of decoding sequences as an array, cached: a new array each time the set changes.

        Why kept in step (compiled): `np.fromiter` over the dict converts each key through NumPy's
        generic item setter (~9,000 instructions for a batch of 40), and filling a new `np.empty`
        through a typed view still walked the dict and acquired the view (~7,600 a call, 7,091 calls on
        the jump workload's 5,000 prompts; callgrind). `_ids_append` and `_ids_remove` keep the keys, in
        the dict's order, in a buffer whose typed view is a C field, as the dict changes; this copies
        its first entries: the same values in a new array that nothing else writes. As Python it stays
        `np.fromiter` (the buffer is allocated, as the class declares it, but never written).
        """
        if self._ids_cache is None:
            if not cython.compiled:
                self._ids_cache = np.fromiter(self.decode, dtype=np.int64, count=len(self.decode))
            else:
                self._ids_cache = self._ids_buffer[: self._ids_count].copy()
        return self._ids_cache

    @cython.cfunc
    @cython.locals(seq_id=cython.longlong, count=cython.Py_ssize_t)
    def _ids_append(self, seq_id: int) -> None:
        """`seq_id` joined `decode` (at its end): at the end of the kept ids too (compiled only)."""
        if not cython.compiled:
            return
        count = self._ids_count
        if count == self._ids_view.shape[0]:
            buffer = np.zeros(2 * count, dtype=np.int64)
            buffer[:count] = self._ids_buffer
            self._ids_buffer = buffer
            self._ids_view = buffer
        self._ids_view[count] = seq_id
        self._ids_count = count + 1

    @cython.cfunc
    @cython.locals(seq_id=cython.longlong, count=cython.Py_ssize_t, index=cython.Py_ssize_t)
    def _ids_remove(self, seq_id: int) -> None:
        """`seq_id` left `decode`: out of the kept ids too, the others keeping their order (compiled only)."""
        if not cython.compiled:
            return
        count = self._ids_count
        index = 0
        while index < count and self._ids_view[index] != seq_id:
            index += 1
        if index == count:
            raise AssertionError(f"decode id {seq_id} is not among the kept ids")
        count -= 1
        while index < count:
            self._ids_view[index] = self._ids_view[index + 1]
            index += 1
        self._ids_count = count

    @property
    def num_decode(self) -> int:
        return len(self.decode)

    def decode_context_tokens(self) -> int:
        return self.kv_off_sum + len(self.decode) * self.it

    def iterations_to_next_finish(self) -> int:
        """Iterations until (and including) the one in which the next decode sequence finishes."""
        heap, decode = self.finish_heap, self.decode
        while heap:
            finish_it, stamp, seq_id = heap[0]
            rec = decode.get(seq_id)
            if rec is not None and rec[_STAMP] == stamp:
                return finish_it - self.it
            heapq.heappop(heap)
        return 1 << 62

    # -- one step ------------------------------------------------------------------------------------------

    def schedule(self, now_s: float) -> StepPlan:
        """The next step's plan: the policy's, with the running decodes' part filled in."""
        if not (self.waiting or self.swapped or self.prefilling or self.pending_swap_out_tokens):
            # Nothing to add (the jump turns between arrivals): a decode-only plan, without the policy.
            plan = StepPlan()
        else:
            plan = self.policy.plan_step(self, now_s)
        self.preempted = False
        if plan.decodes_run:
            num = len(self.decode)
            plan.decode_seqs = num
            plan.decode_context_tokens = self.kv_off_sum + num * self.it
        return plan

    # -- mechanics a policy composes a step of ----------------------------------------------------------

    def decode_progress(self) -> tuple[list[int], list[int]]:
        """(tokens generated, the client's limit) of each running decode sequence, for engines whose
        admission estimates the decode tokens still to come (SGLang's new_token_ratio)."""
        it, info = self.it, self.info
        generated = [rec[_EM_OFF] + it for rec in self.decode.values()]
        limits = [info.max_tokens_eff[rec[_REQ]] for rec in self.decode.values()]
        return generated, limits

    def decode_sequences(self) -> list[tuple[int, int, int]]:
        """(seq id, request, tokens generated) of each running decode sequence, oldest first."""
        it = self.it
        return [(seq_id, rec[_REQ], rec[_EM_OFF] + it) for seq_id, rec in self.decode.items()]

    def unfinished_samples(self, req: int) -> int:
        """Samples of `req` not finished yet (parallel sampling: n of them at admission)."""
        return int(self.log.samples_left[req])

    def pause_decodes(self, plan: StepPlan) -> None:
        """Run this step without the running decodes: they emit nothing and do not grow."""
        plan.decodes_run = False

    def add_swap_outs(self, plan: StepPlan) -> None:
        """Charge this step with the swap-outs of the previous step's preemptions."""
        plan.swap_tokens += self.pending_swap_out_tokens
        self.pending_swap_out_tokens = 0

    @cython.locals(group=PrefillGroup)
    def continue_prefills(self, plan: StepPlan, budget: int, now_s: float) -> int:
        """The next chunk of each partly prefilled group, oldest first, within `budget` tokens;
        returns the budget left. A chunk that the allocator cannot hold preempts (`_grow_chunk`)."""
        for group in list(self.prefilling):  # partially prefilled groups (chunked prefill only)
            if budget <= 0:
                break
            if group not in self.prefilling:  # preempted for an older group's chunk
                continue
            chunk = min(group.compute_left, budget)
            if group.per_chunk and not self._grow_chunk(group, chunk, now_s):
                continue
            self._add_chunk(plan, group, chunk)
            budget -= chunk
        return budget

    @cython.locals(admitted=PrefillGroup)
    def admit_waiting(
        self,
        plan: StepPlan,
        budget: int,
        now_s: float,
        *,
        per_chunk: bool = False,
        gate: Callable[[WorkItem], bool] | None = None,
    ) -> int:
        """FCFS admissions from the waiting queue within `budget` tokens; returns the budget left.

        `per_chunk`: the admitted prompt holds blocks for its hits and first chunk only, the rest
        is allocated chunk by chunk (vLLM v1 `kv_cache_manager.py` `allocate_slots` with
        `num_new_tokens`), where chunked prefill is on and the allocator can.
        `gate`: the engine's own admission test, asked for the head of the queue before the
        allocator; False stops admission there (head-of-line blocking, as a memory refusal does).
        """
        per_chunk = per_chunk and self._can_allocate_per_chunk
        if not self.swapped:
            while self.waiting:
                if gate is not None and not gate(self.waiting[0]):
                    break
                admitted = self._try_admit(self.waiting[0], budget, now_s, per_chunk)
                if admitted is None:
                    if self.num_seqs == 0:  # cannot fit even alone: refuse instead of livelocking
                        self._drop_unfittable(self._dequeue(self.waiting, now_s), now_s)
                        continue
                    break
                self._dequeue(self.waiting, now_s)
                chunk = admitted.compute_left if not self.chunked else min(admitted.compute_left, budget)
                self._add_chunk(plan, admitted, chunk)
                budget -= chunk
        return budget

    @cython.cfunc
    @cython.locals(chunk=cython.longlong, group=PrefillGroup)
    def _add_chunk(self, plan: StepPlan, group: PrefillGroup, chunk: int) -> None:
        plan.chunks.append((group, chunk))
        plan.prefill_tokens += chunk
        # Causal (query, key) pairs, as sim.cost.model.prefill_attention_pairs (inlined: runs per chunk).
        plan.prefill_context_tokens += chunk * group.context_tokens + chunk * (chunk + 1) // 2
        if chunk == group.compute_left:
            plan.first_tokens += len(group.seq_ids)

    @cython.locals(item=WorkItem, dropped=WorkItem, info=RequestInfo)
    def swap_in(self, plan: StepPlan, now_s: float) -> None:
        """Bring swapped-out samples back FCFS while `max_num_seqs` and memory allow."""
        info = self.info
        while self.swapped:
            item = self.swapped[0]
            if self.num_seqs + 1 > self.max_num_seqs:
                return
            seq_id = self._new_id()
            if not self.alloc.admit(info.spec(item.req, seq_id, item.emitted, item.sample)):
                self._free_ids.append(seq_id)
                if self.num_seqs == 0:
                    dropped = self._dequeue(self.swapped, now_s)
                    self.swap_used_tokens -= dropped.swap_slots
                    self._drop_unfittable(dropped, now_s)
                    continue
                return
            self._dequeue(self.swapped, now_s)
            self.swap_used_tokens -= item.swap_slots
            item.swap_slots = 0
            self._stamp += 1
            self._start_decode(seq_id, item.req, item.sample, item.emitted, self._stamp)
            plan.swap_tokens += info._prompt[item.req] + item.emitted - 1

    @cython.cfunc
    @cython.locals(
        budget=cython.longlong,
        now_s=cython.double,
        per_chunk=cython.bint,
        req=cython.longlong,
        num=cython.longlong,
        prompt=cython.longlong,
        seq_id=cython.longlong,
        child=cython.longlong,
        first_chunk=cython.longlong,
        hits=cython.longlong,
        compute=cython.longlong,
        item=WorkItem,
        group=PrefillGroup,
        info=RequestInfo,
    )
    def _try_admit(self, item: WorkItem, budget: int, now_s: float, per_chunk: bool) -> PrefillGroup | None:
        """Admit `item` if limits and memory allow (all-or-nothing for its samples); None if blocked."""
        info, alloc = self.info, self.alloc
        req = item.req
        num = info.n[req] if item.sample < 0 else 1
        if self.num_seqs + num > self.max_num_seqs:
            return None
        prompt = info._prompt[req] + item.emitted
        if budget <= 0 or (not self.chunked and prompt > budget):
            return None
        seq_id = self._new_id()
        first_chunk = budget if per_chunk and num == 1 else 0
        if not alloc.admit(info.spec(req, seq_id, item.emitted, max(item.sample, 0), first_chunk)):
            self._free_ids.append(seq_id)
            return None
        seq_ids = [seq_id]
        for _ in range(num - 1):
            child = self._new_id()
            if not alloc.fork(seq_id, info.spec(req, child, item.emitted, len(seq_ids))):
                self._free_ids.append(child)
                for sid in reversed(seq_ids):
                    alloc.release(sid)
                    self._free_ids.append(sid)
                return None
            seq_ids.append(child)
        hits = int(alloc.prefix_hit_tokens(seq_id))
        compute = max(1, prompt - hits)  # a full hit still computes the last token (as vLLM)
        self._stamp += 1
        group = PrefillGroup(item, seq_ids, compute, prompt - compute, self._stamp)
        group.prompt_tokens = prompt
        group.per_chunk = first_chunk > 0
        self.prefilling.append(group)
        self.num_seqs += num
        log = self.log
        if math.isnan(log.admitted_s[req]):
            log.admitted_s[req] = now_s
            log.prefix_hit_tokens[req] = hits
            log.samples_left[req] = num
        return group

    @cython.cfunc
    @cython.locals(now_s=cython.double, item=WorkItem)
    def _drop_unfittable(self, item: WorkItem, now_s: float) -> None:
        """The livelock guard at admission: an item that fails on an empty engine will never fit."""
        req = item.req
        if item.sample < 0 and item.emitted == 0 and math.isnan(self.log.admitted_s[req]):
            demand = self.alloc.demand_tokens(self.info.spec(req, 0, 0))
            self.log.reject(req, now_s, f"does not fit in the empty KV cache (demand {demand} tokens)")
            if self.on_request_done is not None:
                self.on_request_done(req, now_s)
            return
        samples = self.info.n[req] if item.sample < 0 else 1
        for _ in range(samples):
            self._finish_sample(req, item.emitted, FINISH_KV_EXHAUSTED, now_s)

    # -- after the step ------------------------------------------------------------------------------------

    @cython.cfunc
    @cython.locals(
        seq_id=cython.longlong,
        req=cython.longlong,
        sample=cython.longlong,
        emitted=cython.longlong,
        stamp=cython.longlong,
        it=cython.longlong,
        kv_off=cython.longlong,
        target=cython.longlong,
    )
    def _start_decode(self, seq_id: int, req: int, sample: int, emitted: int, stamp: int) -> None:
        it = self.it
        kv_off = self.info._prompt[req] + emitted - it
        target = self.info._target[req]
        self.decode[seq_id] = [req, sample, emitted - it, kv_off, target, stamp]
        self._ids_append(seq_id)
        self.kv_off_sum += kv_off
        self._ids_cache = None
        heapq.heappush(self.finish_heap, (target - emitted + it, stamp, seq_id))
        self.num_seqs += 1

    @cython.cfunc
    @cython.locals(seq_id=cython.longlong)
    def _stop_decode(self, seq_id: int) -> list[int]:
        rec = self.decode.pop(seq_id)
        self._ids_remove(seq_id)
        self.kv_off_sum -= rec[_KV_OFF]
        self._ids_cache = None
        self.num_seqs -= 1
        self.alloc.release(seq_id)
        self._free_ids.append(seq_id)
        return rec

    @cython.cfunc
    @cython.locals(req=cython.longlong, emitted=cython.longlong, now_s=cython.double)
    def _finish_sample(self, req: int, emitted: int, reason: str, now_s: float) -> None:
        if reason == FINISH_STOP and emitted < self.info._output[req]:
            reason = FINISH_LENGTH
        if self.log.finish_sample(req, now_s, emitted, reason) and self.on_request_done is not None:
            self.on_request_done(req, now_s)

    def grow_uniform(self, num_tokens: int) -> None:
        """Grow every decode sequence by `num_tokens` (a jump's inner iterations); must not fail."""
        if num_tokens <= 0 or not self.decode:
            return
        failed = self.alloc.grow(self.decode_ids(), num_tokens)
        if len(failed):
            raise AssertionError(f"grow({num_tokens}) failed after max_uniform_growth allowed it: {failed}")

    @cython.locals(
        iterations=cython.longlong,
        now_s=cython.double,
        it=cython.longlong,
        decoded=cython.bint,
        group=PrefillGroup,
        output_tokens=cython.const_longlong[:],
        req=cython.longlong,
        emitted=cython.longlong,
    )
    def complete(self, iterations: int, plan: StepPlan, now_s: float) -> None:
        """The step (or the last iteration of a jump) ended at `now_s`: emit, finish, grow, preempt.

        The iteration counter `it` counts iterations of the running decodes, so a step that ran
        without them (`pause_decodes`) leaves it, and their offsets, as they were; only the sequences
        that start decoding now grow then.
        """
        log = self.log
        decoded = plan.decodes_run
        if decoded:
            self.it += iterations
            log.total_generated_tokens += len(self.decode) * iterations
        it = self.it
        # Prefill chunks: groups that completed sample their first token now (none in a decode-only step).
        completed: list[PrefillGroup] | None = None
        if plan.chunks:
            completed = []
            for group, chunk in plan.chunks:
                group.compute_left -= chunk
                group.context_tokens += chunk
                log.total_prefill_tokens += chunk
                if group.item.readmission:
                    log.recomputed_tokens[group.item.req] += chunk
                if group.compute_left == 0:
                    completed.append(group)
        # Decode sequences whose last token was sampled in this iteration. `_stop_decode` and
        # `_finish_sample` written out (same steps, same order): one finish ends most jump turns, and
        # a method call per step cost more than the step (callgrind, benchmarks/README.md).
        heap = self.finish_heap
        if decoded and heap and heap[0][0] <= it:
            decode, alloc, free_ids = self.decode, self.alloc, self._free_ids
            output_tokens, on_done = self.info._output, self.on_request_done
            while heap and heap[0][0] <= it:
                finish_it, stamp, seq_id = heapq.heappop(heap)
                rec = decode.get(seq_id)
                if rec is None or rec[_STAMP] != stamp:
                    continue
                # _stop_decode(seq_id)
                del decode[seq_id]
                self._ids_remove(seq_id)
                self.kv_off_sum -= rec[_KV_OFF]
                self._ids_cache = None
                self.num_seqs -= 1
                alloc.release(seq_id)
                free_ids.append(seq_id)
                # _finish_sample(req, emitted, FINISH_STOP, now_s)
                req = rec[_REQ]
                emitted = rec[_EM_OFF] + it
                reason = FINISH_LENGTH if emitted < output_tokens[req] else FINISH_STOP
                if log.finish_sample(req, now_s, emitted, reason) and on_done is not None:
                    on_done(req, now_s)
        if completed:
            # the sequences that start decoding now, in the order they join `decode` (no scan of the batch)
            started: list[int] = []
            self.prefilling = [g for g in self.prefilling if g.compute_left > 0]
            for group in completed:
                self._complete_prefill(group, now_s, started)
            if not decoded and started:
                self._grow_one(now_s, np.asarray(started, dtype=np.int64))
        if decoded and self.decode:
            # _grow_one(now_s)'s common case written out: every decode grows by one and none fails
            ids = self._ids_cache
            if ids is None:
                ids = self.decode_ids()
            failed_arr = self.alloc.grow(ids, 1)
            if len(failed_arr):
                self._preempt_failed(failed_arr, now_s)

    @cython.cfunc
    @cython.locals(
        now_s=cython.double,
        req=cython.longlong,
        emitted=cython.longlong,
        target=cython.longlong,
        j=cython.Py_ssize_t,
        seq_id=cython.longlong,
        sample=cython.longlong,
        group=PrefillGroup,
        item=WorkItem,
    )
    def _complete_prefill(self, group: PrefillGroup, now_s: float, started: list[int] | None = None) -> None:
        """A group's prompt is done: each sample emits its first token; appends to `started` the
        seq ids that go on decoding (in the order they join `decode`)."""
        item, log = group.item, self.log
        req = item.req
        emitted = item.emitted + 1
        log.total_generated_tokens += len(group.seq_ids)
        if math.isnan(log.first_token_s[req]):
            log.first_token_s[req] = now_s
        self.num_seqs -= len(group.seq_ids)
        target = self.info._target[req]
        for j, seq_id in enumerate(group.seq_ids):
            sample = item.sample if item.sample >= 0 else j
            if emitted >= target:
                self.alloc.release(seq_id)
                self._free_ids.append(seq_id)
                self._finish_sample(req, emitted, FINISH_STOP, now_s)
            else:
                self._start_decode(seq_id, req, sample, emitted, group.stamp)
                if started is not None:
                    started.append(seq_id)

    @cython.cfunc
    def _grow_one(self, now_s: float, seq_ids: np.ndarray | None = None) -> None:
        """The post-step grow: one slot for every decoding sequence (or just `seq_ids`); failures
        preempt newest first."""
        if not self.decode:
            return
        failed_arr = self.alloc.grow(self.decode_ids() if seq_ids is None else seq_ids, 1)
        if len(failed_arr):
            self._preempt_failed(failed_arr, now_s)

    @cython.cfunc
    def _preempt_failed(self, failed_arr: np.ndarray, now_s: float) -> None:
        """Sequences in `failed_arr` could not grow: preempt newest first until all of them have."""
        failed = set(int(x) for x in failed_arr)
        while failed:
            victim_id, victim_group = self.policy.preemption_victim(self)
            if self.num_seqs == len(self.decode) and len(self.decode) == 1:
                # Livelock guard: the only sequence cannot grow with everything else gone. Truncate it.
                rec = self._stop_decode(victim_id)
                failed.discard(victim_id)
                self._finish_sample(rec[_REQ], rec[_EM_OFF] + self.it, FINISH_KV_EXHAUSTED, now_s)
                continue
            if victim_group is not None:
                self._preempt_group(victim_group, now_s)
            else:
                self._preempt_decode(victim_id, victim_id in failed, now_s)
                failed.discard(victim_id)
            if failed:
                retry = np.fromiter(sorted(failed), dtype=np.int64, count=len(failed))
                failed = set(int(x) for x in self.alloc.grow(retry, 1))

    @cython.locals(group=PrefillGroup)
    def newest_unit(self) -> tuple[int, PrefillGroup | None]:
        """The newest running unit: (decode seq id, None), or (-1 or a seq id, the prefill group) when
        a partly prefilled group is newer; vLLM preempts it first (`self.running.pop()`)."""
        best_stamp, best_id, best_group = -1, -1, None
        for seq_id, rec in self.decode.items():
            key = rec[_STAMP]
            if key > best_stamp or (key == best_stamp and seq_id > best_id):
                best_stamp, best_id = key, seq_id
        for group in self.prefilling:
            if group.stamp > best_stamp:
                best_stamp, best_group = group.stamp, group
        return best_id, best_group

    @cython.cfunc
    @cython.locals(item=WorkItem)
    def _preempt_decode(self, seq_id: int, grow_failed: bool, now_s: float) -> None:
        rec = self._stop_decode(seq_id)
        req = rec[_REQ]
        emitted = rec[_EM_OFF] + self.it
        self.log.preemptions[req] += 1
        self.preempted = True
        swap_tokens = self.info._prompt[req] + emitted - (1 if grow_failed else 0)
        swap_slots = -(-swap_tokens // self.swap_block_tokens) * self.swap_block_tokens
        swaps = self.policy.swaps_out(self, req)
        if swaps and not self._swap_space_allows(swap_slots):
            self.swap_fallbacks += 1
        elif swaps:
            self.pending_swap_out_tokens += swap_tokens
            item = WorkItem(req, rec[_SAMPLE], emitted, now_s, True, True)
            item.swap_slots = swap_slots
            self.swap_used_tokens += swap_slots
            self.swapped.appendleft(item)
            self._note_queue()
            return
        self.waiting.appendleft(WorkItem(req, rec[_SAMPLE], emitted, now_s, True, False))
        self._note_queue()

    @cython.cfunc
    @cython.locals(group=PrefillGroup)
    def _grow_chunk(self, group: PrefillGroup, chunk: int, now_s: float) -> bool:
        """Allocate the next chunk of a partly prefilled prompt; preempt newest first when memory is short.

        vLLM v1 (vllm/v1/core/sched/scheduler.py Scheduler.schedule, RUNNING loop): when
        `allocate_slots` fails, the lowest-priority (newest) running request is preempted and the
        allocation retried; if that request is this one, it is preempted itself. False then.
        """
        seq_id = group.seq_ids[0]
        ids = np.asarray([seq_id], dtype=np.int64)
        while len(self.alloc.grow(ids, chunk)):
            victim_id, victim_group = self.policy.preemption_victim(self)
            if victim_group is group:
                self._preempt_group(group, now_s)
                return False
            if victim_group is not None:
                self._preempt_group(victim_group, now_s)
            elif victim_id >= 0:
                self._preempt_decode(victim_id, False, now_s)
            else:  # nothing else to preempt (cannot happen: the prompt fits an empty cache)
                self._preempt_group(group, now_s)
                return False
        return True

    @cython.cfunc
    def _swap_space_allows(self, slots: int) -> bool:
        """--swap-space as a bound (vLLM v0 BlockSpaceManager.can_swap_out: enough free CPU blocks).

        vLLM v0 aborts the engine when it cannot swap out ("Aborted due to the lack of CPU swap
        space"); kvsim recomputes the sequence instead and counts it (`swap_fallbacks`).
        """
        return self.swap_space_tokens is None or self.swap_used_tokens + slots <= self.swap_space_tokens

    @cython.cfunc
    @cython.locals(group=PrefillGroup, item=WorkItem)
    def _preempt_group(self, group: PrefillGroup, now_s: float) -> None:
        for seq_id in reversed(group.seq_ids):
            self.alloc.release(seq_id)
            self._free_ids.append(seq_id)
        self.num_seqs -= len(group.seq_ids)
        self.prefilling = [g for g in self.prefilling if g is not group]
        item = group.item
        self.log.preemptions[item.req] += 1
        self.preempted = True
        item.readmission = True
        item.enqueued_s = now_s
        item.demand_tokens = -1
        self.waiting.appendleft(item)
        self._note_queue()

    @property
    def idle(self) -> bool:
        return self.num_seqs == 0 and not self.waiting and not self.swapped
