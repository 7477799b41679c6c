"""Streaming metrics of one simulation: per-request log, bounded step table, exact time integrals.

Why streaming: a 100k-request run has ~1M serving iterations; keeping one row per iteration would
make memory grow with the trace. Per-request facts live in typed `array.array` columns (cheap scalar
writes, 8 bytes a request), steps are kept in a fixed-size table that halves itself when full, and
every time-weighted average is an exact running integral that does not depend on which rows were
kept. Definitions of every number live in docs/metrics.md.
"""

from __future__ import annotations

import math
import mmap
from array import array
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from allocators.base import BREAKDOWN_PARTS, MemoryBreakdown
from sim.core import taxonomy

try:
    import cython
except ImportError:  # Cython is a build requirement, not a runtime one (docs/compiled_core.md)
    from allocators import cython_shim as cython

# Parts integrated over time: the six taxonomy parts plus the informational `cached` (subset of free).
INTEGRATED_PARTS: tuple[str, ...] = (*BREAKDOWN_PARTS, "cached")
if INTEGRATED_PARTS != (
    "token_states",
    "reservation",
    "internal",
    "external",
    "duplicated",
    "out_of_window",
    "free",
    "cached",
):  # TimeIntegrals.add_constant and add_sums are unrolled in this order
    raise AssertionError(f"TimeIntegrals is unrolled for another INTEGRATED_PARTS order: {INTEGRATED_PARTS}")

REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id",
    "arrival_s",
    "admitted_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "output_tokens",
    "generated_tokens",
    "max_tokens",
    "preemptions",
    "prefix_hit_tokens",
    "rejected",
    "rejection_reason",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "e2el_ms",
    "normalized_latency_s_per_token",
    # Extensions of the contract (docs/metrics.md): how the request ended and what recompute cost.
    "n",
    "finish_reason",
    "recomputed_tokens",
)


class StepRow(NamedTuple):
    """One recorded step's integer columns, by name (`time_s` and `duration_s` travel beside it).

    Why a named structure: the engine fills it by field name, so its order can never drift from the
    steps table's columns; `STEP_COLUMNS` is built from it.
    """

    step: int  # iteration index of the row's first iteration
    batch_size: int  # sequences in the step: decoding ones plus prefill chunks
    num_running: int
    queue_length: int
    prefill_tokens: int
    decode_tokens: int  # over all of the row's iterations
    capacity: int
    token_states: int
    reservation: int
    internal: int
    external: int
    duplicated: int
    free: int
    cached: int
    iterations: int  # > 1 for a recorded multi-iteration jump
    generated_tokens: int  # tokens sampled in the row's iterations (decode tokens + first tokens of prefills)
    out_of_window: int  # slots held for tokens outside the sliding window (issue 14)


STEP_COLUMNS: tuple[str, ...] = ("step", "time_s", "duration_s", *StepRow._fields[1:])
# The order of `StepRecorder.offer_record`'s flat tuples: the step's own numbers (`RECORD_HEAD`, the
# order `Engine._serve` builds them in, by position), then the turn's `MemoryBreakdown` as it is (its
# fields are StepRow fields too), so the engine builds a record with one tuple concatenation.
RECORD_HEAD: tuple[str, ...] = (
    "time_s",
    "duration_s",
    "step",
    "batch_size",
    "num_running",
    "queue_length",
    "prefill_tokens",
    "decode_tokens",
    "iterations",
    "generated_tokens",
)
RECORD_ORDER: tuple[str, ...] = (*RECORD_HEAD, *MemoryBreakdown._fields)
if sorted(RECORD_ORDER) != sorted(STEP_COLUMNS):
    raise AssertionError("RECORD_ORDER must name every steps column once")

FINISH_STOP = "stop"  # reached its true output length
FINISH_LENGTH = "length"  # reached max_tokens (or max_model_len), vLLM's name
FINISH_KV_EXHAUSTED = "kv_exhausted"  # alone in the cache and could not grow: truncated (livelock guard)
FINISH_REJECTED = "rejected"
# RequestLog's finish-reason codes: 0 = not finished yet (""), then the reasons above.
REASON_NAMES: tuple[str, ...] = ("", FINISH_STOP, FINISH_LENGTH, FINISH_KV_EXHAUSTED, FINISH_REJECTED)
_KV_EXHAUSTED_CODE = REASON_NAMES.index(FINISH_KV_EXHAUSTED)
_INT32_MAX = cython.declare(cython.longlong, 2**31 - 1)  # RequestLog's int32 counters
_REJECTED_CODE = REASON_NAMES.index(FINISH_REJECTED)


@cython.cclass
class RequestLog:
    """What happened to each request, indexed by its position in the request table.

    Samples of a parallel-sampling request (n > 1) share one row: the request finishes when its last
    sample does; `generated_tokens` sums the samples' tokens.

    Why `array.array` columns: the scheduler writes one scalar at a time (an `array` store is as cheap
    as a list store), but a column costs 8 bytes per request instead of a list's pointer plus a boxed
    float or int (~32 bytes), and `to_frame` wraps the columns as NumPy arrays without copying them.
    Finish reasons are one byte codes (`REASON_NAMES`); rejection reasons, rare, live in a dict.
    Measured with benchmarks/engine.py --num-prompts 1000000 (issue 16: 1M requests in <= 400 MB).

    An extension type compiled (docs/compiled_core.md "Extension types": its fields in a C struct, the
    totals C integers); `finish_sample`, once per sample, reads the columns it updates through typed
    views of the same arrays (`_first_token`, ...; as Python the arrays themselves).
    """

    num_requests = cython.declare(cython.longlong, visibility="public")
    arrival_s = cython.declare(object, visibility="public")
    admitted_s = cython.declare(object, visibility="public")
    first_token_s = cython.declare(object, visibility="public")
    finish_s = cython.declare(object, visibility="public")
    generated_tokens = cython.declare(object, visibility="public")
    preemptions = cython.declare(object, visibility="public")
    prefix_hit_tokens = cython.declare(object, visibility="public")
    recomputed_tokens = cython.declare(object, visibility="public")
    samples_left = cython.declare(object, visibility="public")
    itl_span_s = cython.declare(object, visibility="public")
    itl_gaps = cython.declare(object, visibility="public")
    rejection_reasons = cython.declare(dict, visibility="public")
    finish_codes = cython.declare(object, visibility="public")
    reason_names = cython.declare(list, visibility="public")
    _reason_code = cython.declare(dict, visibility="public")
    num_done = cython.declare(cython.longlong, visibility="public")
    total_generated_tokens = cython.declare(cython.longlong, visibility="public")
    total_prefill_tokens = cython.declare(cython.longlong, visibility="public")
    _first_token = cython.declare(cython.double[:])
    _finish = cython.declare(cython.double[:])
    _generated = cython.declare(cython.longlong[:])
    _samples_left = cython.declare(cython.int[:])
    _itl_span = cython.declare(cython.double[:])
    _itl_gaps = cython.declare(cython.int[:])
    _finish_codes = cython.declare(cython.schar[:])

    def __init__(self, num_requests: int) -> None:
        nan_column = array("d", [math.nan])
        zero_column = array("q", [0])
        self.num_requests = num_requests
        self.arrival_s = nan_column * num_requests
        self.admitted_s = nan_column * num_requests
        self.first_token_s = nan_column * num_requests
        self.finish_s = nan_column * num_requests
        self.generated_tokens = zero_column * num_requests
        self.preemptions = zero_column * num_requests
        self.prefix_hit_tokens = zero_column * num_requests
        self.recomputed_tokens = zero_column * num_requests
        # Internal counters (not table columns): 4 bytes; an overflow would raise, never wrap.
        self.samples_left = array("i", [0]) * num_requests
        # Exact token-weighted ITL: sum over samples of (last token time - first token time), and of gaps.
        self.itl_span_s = array("d", [0.0]) * num_requests
        self.itl_gaps = array("i", [0]) * num_requests
        self.rejection_reasons = {}  # request -> why it was refused (few)
        self.finish_codes = array("b", [0]) * num_requests  # index into self.reason_names
        self.reason_names = list(REASON_NAMES)
        self._reason_code = {name: code for code, name in enumerate(self.reason_names)}
        self.num_done = 0
        self.total_generated_tokens = 0
        self.total_prefill_tokens = 0
        self._views()

    def _views(self) -> None:
        """Point the typed views at the columns (again after `to_frame` hands the counters back)."""
        self._first_token = self.first_token_s
        self._finish = self.finish_s
        self._generated = self.generated_tokens
        self._samples_left = self.samples_left
        self._itl_span = self.itl_span_s
        self._itl_gaps = self.itl_gaps
        self._finish_codes = self.finish_codes

    def _code(self, reason: str) -> int:
        """The byte code of a finish reason (a reason not in REASON_NAMES gets the next free code)."""
        code = self._reason_code.get(reason)
        if code is None:
            code = len(self.reason_names)
            self.reason_names.append(reason)
            self._reason_code[reason] = code
        return code

    def finish_reason(self, req: int) -> str:
        """How request `req` ended so far ("" while it runs)."""
        return self.reason_names[self.finish_codes[req]]

    def rejection_reason(self, req: int) -> str:
        return self.rejection_reasons.get(req, "")

    def reject(self, req: int, now_s: float, reason: str) -> None:
        self.rejection_reasons[req] = reason
        self.finish_codes[req] = _REJECTED_CODE
        self.num_done += 1

    @cython.locals(req=cython.Py_ssize_t, now_s=cython.double, emitted=cython.longlong, gaps=cython.longlong)
    def finish_sample(self, req: int, now_s: float, emitted: int, reason: str) -> bool:
        """One sample is done with `emitted` tokens; True when it was the request's last sample."""
        self._generated[req] += emitted
        if emitted > 1:
            self._itl_span[req] += now_s - self._first_token[req]
            gaps = self._itl_gaps[req] + (emitted - 1)
            if gaps > _INT32_MAX:  # the int32 counter: an overflow raises, never wraps (as the array's)
                raise OverflowError(f"request {req}: {gaps} ITL gaps overflow the int32 counter")
            self._itl_gaps[req] = gaps
        # The most telling reason wins: a truncated sample marks the whole request.
        if self._finish_codes[req] != _KV_EXHAUSTED_CODE:
            code = self._reason_code.get(reason)
            self._finish_codes[req] = self._code(reason) if code is None else code
        self._samples_left[req] -= 1
        if self._samples_left[req] == 0:
            self._finish[req] = now_s
            self.num_done += 1
            return True
        return False

    def to_frame(self, requests: pd.DataFrame) -> pd.DataFrame:
        """The requests table of docs/architecture.md (+ extensions), latencies derived here.

        Memory: the log's columns become the table's columns without a copy, the request table's
        int64 columns are shared (pandas copy-on-write keeps the two tables independent), and only
        the derived latencies are new arrays. The log's internal counters (ITL sums, samples left,
        finish codes) are dropped afterwards: call this once, at the end of the run.
        """
        num = self.num_requests
        arrival = np.frombuffer(self.arrival_s, dtype=np.float64)
        first = np.frombuffer(self.first_token_s, dtype=np.float64)
        finish = np.frombuffer(self.finish_s, dtype=np.float64)
        generated = np.frombuffer(self.generated_tokens, dtype=np.int64)
        n = requests["n"].to_numpy(np.int64) if "n" in requests else np.ones(num, np.int64)
        codes = np.frombuffer(self.finish_codes, dtype=np.int8)
        rejected = codes == _REJECTED_CODE
        # Derived columns are written into their own arrays (`out=`, `where=`): each element is the
        # same division as `np.where(cond, a / b, nan)`, without the full-size temporaries. Order:
        # ITL first, so that the counters it needs are handed back before the other columns exist.
        with np.errstate(divide="ignore", invalid="ignore"):
            # ITL is computed in the ITL-span column itself (the span is not needed afterwards).
            gaps = np.frombuffer(self.itl_gaps, dtype=np.int32).astype(np.float64)
            has_gaps = gaps > 0
            itl_ms = np.frombuffer(self.itl_span_s, dtype=np.float64)
            np.divide(itl_ms, gaps, out=itl_ms, where=has_gaps)
            itl_ms[~has_gaps] = np.nan
            del gaps, has_gaps
            # Hand the counters back (~8 bytes a request); a later write fails loudly (IndexError).
            self.itl_span_s, self.itl_gaps, self.samples_left = array("d"), array("i"), array("i")
            self._views()  # the typed views let go of the old columns too
            # generated / max(n, 1), element for element, without the max(n, 1) array.
            per_sample = generated.astype(np.float64)
            np.divide(per_sample, n, out=per_sample, where=n > 1)
            e2el_ms = finish - arrival
            ttft_ms = first - arrival
            normalized = np.divide(e2el_ms, per_sample, out=np.full(num, np.nan), where=generated > 0)
            tpot_ms = np.full(num, np.nan)
            has_gaps = per_sample > 1
            per_sample -= 1.0  # now (per_sample - 1): the TPOT denominator
            np.divide(finish - first, per_sample, out=tpot_ms, where=has_gaps)
            del per_sample, has_gaps
        # Seconds to milliseconds in place (the same multiply as `x * 1e3`, without a second array each).
        for column in (e2el_ms, ttft_ms, tpot_ms, itl_ms):
            column *= 1e3
        rejection_names = ["", *dict.fromkeys(self.rejection_reasons.values())]
        rejection_codes = np.zeros(num, np.int8 if len(rejection_names) <= 127 else np.int32)
        if self.rejection_reasons:
            name_code = {name: code for code, name in enumerate(rejection_names)}
            reqs = np.fromiter(self.rejection_reasons.keys(), np.int64, len(self.rejection_reasons))
            rejection_codes[reqs] = [name_code[r] for r in self.rejection_reasons.values()]
        table = pd.DataFrame(
            {
                "request_id": requests["request_id"].to_numpy(np.int64),
                "arrival_s": arrival,
                "admitted_s": np.frombuffer(self.admitted_s, dtype=np.float64),
                "first_token_s": first,
                "finish_s": finish,
                "prompt_tokens": requests["prompt_tokens"].to_numpy(np.int64),
                "output_tokens": requests["output_tokens"].to_numpy(np.int64),
                "generated_tokens": generated,
                "max_tokens": requests["max_tokens"].to_numpy(np.int64),
                "preemptions": np.frombuffer(self.preemptions, dtype=np.int64),
                "prefix_hit_tokens": np.frombuffer(self.prefix_hit_tokens, dtype=np.int64),
                "rejected": rejected,
                "rejection_reason": _string_column(rejection_codes, rejection_names),
                "ttft_ms": ttft_ms,
                "tpot_ms": tpot_ms,
                "itl_ms": itl_ms,
                "e2el_ms": e2el_ms,
                "normalized_latency_s_per_token": normalized,
                "n": n,
                "finish_reason": _string_column(codes, self.reason_names),
                "recomputed_tokens": np.frombuffer(self.recomputed_tokens, dtype=np.int64),
            },
            copy=False,
        )
        del codes
        self.finish_codes = array("b")
        self._views()
        return table


def _string_column(codes: np.ndarray, names: list[str]) -> Any:
    """The column `names[codes]` in the dtype pandas gives a column of Python strings.

    Why not an object array: pandas converts one to its (pyarrow) string dtype through temporaries
    of ~50 bytes a row; with pyarrow storage the strings are built by an Arrow `take` instead, into
    the very same dtype and values (benchmarks/results_identity.py checks the tables stay identical).
    """
    dtype = pd.Series(np.array(names[:1], dtype=object)).dtype
    if isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow":
        import pyarrow as pa

        strings = pa.array(names, type=pa.large_string()).take(pa.array(codes))
        return pd.array(strings, dtype=dtype)
    return pd.array(np.array(names, dtype=object)[codes], dtype=object)


# Kept step rows buffered before one write into the columns (StepRecorder.offer): ~0.5 MB of Python
# objects at most, and a block large enough that the per-block NumPy calls do not count.
_FLUSH_ROWS = 1024


@cython.locals(
    start=cython.Py_ssize_t,
    time_s=cython.double[:],
    duration_s=cython.double[:],
    ints=cython.longlong[:, :],
    columns=cython.longlong[:],
    num_columns=cython.Py_ssize_t,
    row=cython.Py_ssize_t,
    j=cython.Py_ssize_t,
    record=tuple,
)
def _write_records(
    pending: list[tuple],
    start: int,
    time_s: np.ndarray,
    duration_s: np.ndarray,
    ints: np.ndarray,
    columns: np.ndarray,
) -> None:
    """Write flat records (`RECORD_ORDER`) into rows `start`... of the recorder's columns, compiled.

    Why: `np.fromiter` per column converts each value through NumPy's generic item setter (~340
    instructions a value, 17 values a row); this C loop converts each with CPython's own float and
    integer conversions: the same doubles, the same int64s (a value that is not an integer, which
    `np.fromiter` would have cast, raises TypeError and the caller takes the NumPy path).
    """
    num_columns = columns.shape[0]
    row = start
    for record in pending:
        if len(record) != num_columns + 2:
            raise AssertionError(f"step records have {len(record)} values, expected {num_columns + 2}")
        time_s[row] = record[0]
        duration_s[row] = record[1]
        for j in range(num_columns):
            ints[columns[j], row] = record[j + 2]
        row += 1


@cython.cclass
class StepRecorder:
    """Bounded per-step table: every row until `max_rows`, then every 2nd kept and the stride doubled.

    Why this rule: the table stays a uniform sample in step order (rows k*stride), costs O(max_rows)
    memory whatever the run length, and a short run keeps every step. Rows are kept in preallocated
    NumPy columns so recording is a handful of scalar stores.

    Memory (issue 16): the columns are stored column-major in one anonymous memory map, so that
    `to_frame` hands each column to pandas as a view instead of copying the table twice, and so that
    after a halving the rows above the kept half can be handed back to the OS (`madvise
    DONTNEED`): the resident size follows the rows kept, not the rows ever written.

    An extension type compiled (`RequestLog`): the engine offers a row every turn.
    """

    _INT_COLUMNS = StepRow._fields
    max_rows = cython.declare(cython.longlong, visibility="public")
    stride = cython.declare(cython.longlong, visibility="public")
    seen = cython.declare(cython.longlong, visibility="public")
    size = cython.declare(cython.longlong, visibility="public")
    _buffer = cython.declare(object, visibility="public")
    _time_s = cython.declare(object, visibility="public")
    _duration_s = cython.declare(object, visibility="public")
    _ints = cython.declare(object, visibility="public")
    _pending = cython.declare(list, visibility="public")
    _record_columns = cython.declare(list, visibility="public")
    _record_columns_array = cython.declare(object, visibility="public")

    def __init__(self, max_rows: int = 200_000) -> None:
        if max_rows < 2:
            raise ValueError(f"max_rows must be >= 2 (got {max_rows})")
        self.max_rows = max_rows
        self.stride = 1
        self.seen = 0  # rows offered so far
        self.size = 0
        num_ints = len(self._INT_COLUMNS)
        self._buffer = mmap.mmap(-1, (2 + num_ints) * max_rows * 8)  # zero pages, resident once written
        self._time_s = np.frombuffer(self._buffer, np.float64, count=max_rows)
        self._duration_s = np.frombuffer(self._buffer, np.float64, count=max_rows, offset=max_rows * 8)
        self._ints = np.frombuffer(
            self._buffer, np.int64, count=num_ints * max_rows, offset=2 * max_rows * 8
        ).reshape(num_ints, max_rows)
        # kept rows not yet in the columns, as flat tuples in `RECORD_ORDER`, written in blocks by `_flush`
        self._pending = []  # of tuples
        column_of = {name: j for j, name in enumerate(self._INT_COLUMNS)}
        self._record_columns = [column_of[name] for name in RECORD_ORDER[2:]]
        self._record_columns_array = np.array(self._record_columns, dtype=np.int64)

    def skip(self) -> None:
        """Count a row the caller did not build because it would not be kept (`seen % stride != 0`)."""
        self.seen += 1

    def offer(self, time_s: float, duration_s: float, row: StepRow) -> None:
        """Offer one row by name; it is kept when it falls on the stride (`offer_record`'s rule)."""
        values = {"time_s": time_s, "duration_s": duration_s, **row._asdict()}
        self.offer_record(tuple(values[name] for name in RECORD_ORDER))

    def offer_record(self, record: tuple) -> None:
        """Offer one row as a flat tuple in `RECORD_ORDER`; it is kept when it falls on the stride.

        Why a flat tuple in this order: the engine builds a row every turn, and its head (the step's
        own numbers) plus the turn's `MemoryBreakdown` concatenated is one tuple operation, where a
        `StepRow` by keyword costs ~2 us a row (issue 24). Kept rows wait in a list and reach the
        columns `_FLUSH_ROWS` at a time (issue 16); `size` counts them already, so the sampling rule
        is unchanged.
        """
        keep = self.seen % self.stride == 0
        self.seen += 1
        if not keep:
            return
        if self.size == self.max_rows:
            self._flush()
            half = self.max_rows // 2 + self.max_rows % 2
            self._time_s[:half] = self._time_s[0 : self.max_rows : 2]
            self._duration_s[:half] = self._duration_s[0 : self.max_rows : 2]
            for column in self._ints:  # one column at a time: NumPy copies an overlapping source first
                column[:half] = column[0 : self.max_rows : 2]
            self.size = half
            self.stride *= 2
            self._release_rows(half)
            if (self.seen - 1) % self.stride != 0:
                return
        pending = self._pending
        pending.append(record)
        self.size += 1
        if len(pending) == _FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        """Write the pending rows into the columns (they are the last `len(pending)` of `size`)."""
        pending = self._pending
        count = len(pending)
        if not count:
            return
        start, stop = self.size - count, self.size
        if cython.compiled:
            try:
                _write_records(
                    pending, start, self._time_s, self._duration_s, self._ints, self._record_columns_array
                )
            except TypeError:  # a value that is not an int: NumPy's casts below, as before
                pass
            else:
                pending.clear()
                return
        columns = list(zip(*pending, strict=True))  # C loops only: no Python call per row
        if len(columns) != len(RECORD_ORDER):
            raise AssertionError(f"step records have {len(columns)} values, expected {len(RECORD_ORDER)}")
        self._time_s[start:stop] = np.fromiter(columns[0], np.float64, count)
        self._duration_s[start:stop] = np.fromiter(columns[1], np.float64, count)
        ints = self._ints
        for j, values in zip(self._record_columns, columns[2:], strict=True):
            ints[j, start:stop] = np.fromiter(values, np.int64, count)
        pending.clear()

    def _release_rows(self, start: int) -> None:
        """Give the pages of rows >= `start` of every column back to the OS (they read as 0 after)."""
        if not hasattr(mmap, "MADV_DONTNEED"):  # not on this OS: the rows stay resident, nothing else
            return
        page, row_bytes = mmap.PAGESIZE, self.max_rows * 8
        for column in range(2 + len(self._INT_COLUMNS)):
            lo = -(-(column * row_bytes + start * 8) // page) * page  # first whole page above `start`
            hi = (column + 1) * row_bytes // page * page
            if hi > lo:
                self._buffer.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def to_frame(self) -> pd.DataFrame:
        """The steps table; its columns are views of this recorder's buffers (record nothing after)."""
        self._flush()
        n = self.size
        data: dict[str, Any] = {}
        ints = {name: self._ints[j, :n] for j, name in enumerate(self._INT_COLUMNS)}
        for name in STEP_COLUMNS:
            if name == "time_s":
                data[name] = self._time_s[:n]
            elif name == "duration_s":
                data[name] = self._duration_s[:n]
            else:
                data[name] = ints[name]
        return pd.DataFrame(data, copy=False)


@cython.cclass
class TimeIntegrals:
    """Exact running integrals over simulated time: sum of value x duration over every iteration.

    Taxonomy parts come from `MemoryBreakdown`s; within a multi-iteration jump the engine gives the
    first and last iteration's parts and durations, and `add_linear` integrates the product of the
    two straight lines in closed form (exact when parts and step times are linear in the iteration
    index, which holds for slab allocators and linear step costs; see docs/metrics.md).

    An extension type compiled (`RequestLog`): the engine adds to it every turn.
    """

    parts_token_s = cython.declare(list, visibility="public")
    running_seq_s = cython.declare(cython.double, visibility="public")
    busy_s = cython.declare(cython.double, visibility="public")
    max_running = cython.declare(cython.longlong, visibility="public")

    def __init__(self) -> None:
        self.parts_token_s = [0.0] * len(INTEGRATED_PARTS)
        self.running_seq_s = 0.0
        self.busy_s = 0.0
        self.max_running = 0

    @cython.locals(acc=list)
    def add_constant(self, parts: MemoryBreakdown, duration_s: float) -> None:
        acc = self.parts_token_s
        acc[0] += parts.token_states * duration_s
        acc[1] += parts.reservation * duration_s
        acc[2] += parts.internal * duration_s
        acc[3] += parts.external * duration_s
        acc[4] += parts.duplicated * duration_s
        acc[5] += parts.out_of_window * duration_s
        acc[6] += parts.free * duration_s
        acc[7] += parts.cached * duration_s

    def add_linear(
        self,
        first: MemoryBreakdown,
        last: MemoryBreakdown,
        iterations: int,
        total_s: float,
        index_weighted_s: float,
    ) -> None:
        """Integrate m iterations whose parts move on a straight line from `first` (i=0) to `last` (i=m-1).

        With step durations d_i, total_s = sum d_i and index_weighted_s = sum i d_i (both exact from the
        cost model), sum_i d_i (p0 + q i) = p0 total_s + q index_weighted_s, q = (p_last - p0) / (m-1).
        """
        m = iterations
        if m == 1:
            self.add_constant(first, total_s)
            return
        acc = self.parts_token_s
        scale = index_weighted_s / (m - 1)
        for j, name in enumerate(INTEGRATED_PARTS):
            a = getattr(first, name)
            acc[j] += a * total_s + (getattr(last, name) - a) * scale

    def add_sums(self, sums: dict[str, float]) -> None:
        """Add exact per-part integrals (token x s) computed elsewhere (an allocator's jump hook)."""
        # Unrolled in INTEGRATED_PARTS order (once per jump: no loop, no enumerate); the same additions.
        acc, get = self.parts_token_s, sums.get
        acc[0] += float(get("token_states", 0.0))
        acc[1] += float(get("reservation", 0.0))
        acc[2] += float(get("internal", 0.0))
        acc[3] += float(get("external", 0.0))
        acc[4] += float(get("duplicated", 0.0))
        acc[5] += float(get("out_of_window", 0.0))
        acc[6] += float(get("free", 0.0))
        acc[7] += float(get("cached", 0.0))

    @cython.locals(num_running=cython.longlong, duration_s=cython.double)
    def add_running(self, num_running: int, duration_s: float) -> None:
        self.running_seq_s += num_running * duration_s
        self.busy_s += duration_s
        if num_running > self.max_running:
            self.max_running = num_running

    def as_dict(self) -> dict[str, float]:
        out = {
            f"{name}_token_s": value for name, value in zip(INTEGRATED_PARTS, self.parts_token_s, strict=True)
        }
        out["running_seq_s"] = self.running_seq_s
        out["busy_s"] = self.busy_s
        out["max_running"] = float(self.max_running)
        return out


def _pcts(values: np.ndarray, stem: str) -> dict[str, float]:
    """mean/median/p90/p99 under vllm-bench names (`mean_ttft_ms`, `p99_ttft_ms`, ...); NaN when empty."""
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return {f"{k}_{stem}": math.nan for k in ("mean", "median", "p90", "p99")}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        f"mean_{stem}": float(values.mean()),
        f"median_{stem}": float(p50),
        f"p90_{stem}": float(p90),
        f"p99_{stem}": float(p99),
    }


def backlog_growth_req_per_s(requests: pd.DataFrame) -> float:
    """Growth of requests in the system (waiting + running) over the second half of the arrivals.

    Why not a slope over the run's second half: a run with a fixed number of prompts drains at the end, so
    a slope over the run's second half mixes overload with the drain. Over the arrival window a
    server that keeps up holds its backlog level; one that cannot grows it by (arrival - service)
    rate. Rejected requests leave at arrival; unfinished ones never leave.
    """
    arrival_s = requests["arrival_s"].to_numpy(dtype=float)
    if len(arrival_s) < 2:
        return 0.0
    rejected = requests["rejected"].to_numpy(dtype=bool)
    finish_s = requests["finish_s"].to_numpy(dtype=float, copy=True)
    finish_s[rejected] = arrival_s[rejected]
    finish_s[~np.isfinite(finish_s)] = np.inf
    end_s = float(arrival_s.max())
    start_s = end_s / 2.0
    if end_s <= 0.0:
        return 0.0
    finish_s.sort()  # in place: the same order as np.sort, without a second copy
    arrived, left = np.sort(arrival_s), finish_s

    def in_system(at_s: float) -> int:
        return int(np.searchsorted(arrived, at_s, side="right") - np.searchsorted(left, at_s, side="right"))

    return (in_system(end_s) - in_system(start_s)) / (end_s - start_s)


# |share| below this (a billionth of a percent) is float rounding of sums that cancel, not memory:
# `--block-size 1` wrote kv_reservation_pct = -1.6e-17 (issue 23). No real part is that small.
NOISE_PCT = 1e-9


def _denoised_pct(part_token_s: float, span_token_s: float) -> float:
    """100 x part / span, with rounding noise around zero written as 0.0."""
    pct = 100.0 * part_token_s / span_token_s
    return 0.0 if abs(pct) < NOISE_PCT else pct


def summarize(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    totals: dict[str, Any],
    *,
    capacity_tokens: int,
    kv_bytes_per_token: int | None,
    wall_s: float,
) -> dict[str, Any]:
    """The summary metrics of docs/metrics.md from the two tables and the engine's exact totals."""
    duration_s = float(totals["duration_s"])
    done = ~requests["rejected"].to_numpy(bool)
    all_done = bool(done.all())

    def finished(name: str, dtype: type = np.float64) -> np.ndarray:
        """Column `name` over the requests that were not rejected (the column itself when none was)."""
        column = requests[name].to_numpy(dtype)
        return column if all_done else column[done]

    generated = int(finished("generated_tokens", np.int64).sum())
    prompt = int(finished("prompt_tokens", np.int64).sum())
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    metrics: dict[str, Any] = {
        "num_requests": int(len(requests)),
        "completed": int(done.sum()),
        "rejected": int((~done).sum()),
        "truncated": int((requests["finish_reason"] == FINISH_KV_EXHAUSTED).sum()),
        "preemptions": int(requests["preemptions"].sum()),
        "duration_s": duration_s,
        "wall_s": float(wall_s),
        "request_throughput": per_s(int(done.sum())),
        "output_throughput": per_s(generated),
        "total_token_throughput": per_s(generated + prompt),
        "total_generated_tokens": int(totals["generated_tokens"]),
        "total_prefill_tokens": int(totals["prefill_tokens"]),
        "total_recomputed_tokens": int(requests["recomputed_tokens"].sum()),
        "iterations": int(totals["iterations"]),
        "engine_turns": int(totals["turns"]),
    }
    # ITL gets only its mean: vllm bench's ITL percentiles are over individual gaps, which the engine
    # does not keep (jumps price many iterations at once), and percentiles of the per-request mean gap
    # would merely repeat TPOT's under a name that means something else.
    for stem in ("ttft_ms", "tpot_ms", "e2el_ms"):
        metrics.update(_pcts(finished(stem), stem))
    gaps = finished("generated_tokens")
    if not gaps.flags.writeable:  # the table's own float column (a view): work on a copy
        gaps = gaps.copy()
    gaps -= finished("n")
    itl = finished("itl_ms")
    ok = np.isfinite(itl) & (gaps > 0)
    # vllm bench's mean ITL is over all gaps, i.e. token-weighted across requests. The same sums as
    # (itl[ok] * gaps[ok]).sum() / gaps[ok].sum(), with one full-size temporary alive at a time.
    if ok.any():
        weights = gaps[ok]
        del gaps
        weighted = itl[ok]
        weighted *= weights
        metrics["mean_itl_ms"] = float(weighted.sum() / weights.sum())
        del weights, weighted
    else:
        metrics["mean_itl_ms"] = math.nan
    metrics.update(_pcts(finished("normalized_latency_s_per_token"), "normalized_latency_s_per_token"))
    # The taxonomy over the whole simulated span, idle time included (the engine integrates the idle
    # allocator too), so the parts sum to 100 % of capacity; a zero-length run is all free.
    # waste_pct = wasted allocated slot-time / allocated slot-time; nothing allocated: no waste (0).
    span_token_s = duration_s * capacity_tokens
    part_token_s = {name: float(totals.get(f"{name}_token_s", 0.0)) for name in INTEGRATED_PARTS}
    # `cached` is a subset of `free` (sim/core/taxonomy.py): `empty` is the rest of free, so the shown
    # parts (taxonomy.SHOWN_PARTS) are a partition of capacity; `allocated` never counts cached blocks.
    part_token_s["empty"] = taxonomy.empty_of(part_token_s["free"], part_token_s["cached"])
    part_token_s["allocated"] = taxonomy.allocated_of(part_token_s)
    for name, value in part_token_s.items():
        empty_span_pct = 100.0 if name in ("free", "empty") else 0.0
        metrics[f"kv_{name}_pct"] = _denoised_pct(value, span_token_s) if span_token_s > 0 else empty_span_pct
    metrics["waste_pct"] = taxonomy.waste_pct(part_token_s["token_states"], part_token_s["allocated"])
    metrics["mean_concurrency"] = float(totals["running_seq_s"]) / duration_s if duration_s > 0 else 0.0
    metrics["max_concurrency"] = int(totals["max_running"])
    metrics["mean_queue_length"] = float(totals["queue_request_s"]) / duration_s if duration_s > 0 else 0.0
    metrics["max_queue_length"] = int(totals["max_queue_length"])
    metrics["kv_capacity_tokens"] = int(capacity_tokens)
    metrics["kv_bytes_per_token"] = None if kv_bytes_per_token is None else int(kv_bytes_per_token)
    metrics["queue_growth"] = backlog_growth_req_per_s(requests)
    metrics["busy_pct"] = 100.0 * float(totals["busy_s"]) / duration_s if duration_s > 0 else 0.0
    if "cpu_tier" in totals:  # only runs with a CPU tier: the metrics of every other run stay as they were
        metrics.update(cpu_tier_metrics(totals["cpu_tier"], duration_s, kv_bytes_per_token))
    return metrics


def cpu_tier_metrics(
    tier: dict[str, Any], duration_s: float, kv_bytes_per_token: int | None
) -> dict[str, Any]:
    """The CPU tier's metrics (docs/metrics.md "CPU tier"): hit shares of the prompt tokens looked up,
    bytes moved each way, and its occupancy, from the engine's `cpu_tier` totals (token slots)."""
    queried = tier["queried_tokens"]
    capacity = tier["capacity_tokens"]

    def pct(part: float, whole: float) -> float:
        return 100.0 * part / whole if whole > 0 else 0.0

    def as_bytes(tokens: int) -> int | None:
        return None if kv_bytes_per_token is None else int(tokens) * int(kv_bytes_per_token)

    mean_used = tier["used_token_s"] / duration_s if duration_s > 0 else 0.0
    return {
        "prefix_hit_gpu_pct": pct(tier["gpu_hit_tokens"], queried),
        "prefix_hit_cpu_pct": pct(tier["cpu_hit_tokens"], queried),
        "prefix_queried_tokens": int(queried),
        "kv_offload_capacity_bytes": as_bytes(capacity),
        "kv_offload_loaded_bytes": as_bytes(tier["loaded_tokens"]),
        "kv_offload_stored_bytes": as_bytes(tier["stored_tokens"]),
        "kv_offload_evicted_bytes": as_bytes(tier["evicted_tokens"]),
        "kv_offload_mean_used_pct": pct(mean_used, capacity),
        "kv_offload_peak_used_pct": pct(tier["peak_used_tokens"], capacity),
        "kv_offload_transfer_s": float(tier["transfer_s"]),
    }
