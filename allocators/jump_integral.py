"""Exact time integrals of a paged allocator's taxonomy over a multi-iteration decode jump.

Why: the engine jumps k decode iterations at once. For slabs the parts move linearly and the
engine can interpolate, but for blocks and pages they are step functions (a block appears when a
sequence crosses a boundary). This computes sum_i d_i x part(i), where part(i) is the breakdown
after the sequences grew by i tokens (i = 0..m-1), in O(m + n) work and without growing (the pass
over the sequences is one typed loop, seq_kernels.jump_terms, whose float sums repeat NumPy's
additions in NumPy's order; the two dot products stay NumPy's BLAS calls):

- Each growing sequence crosses a block boundary at iterations c, c + B, c + 2B, ... with its phase
  c = blocks x B - length + 1 in [1, B], so blocks appended by iteration i, A(i), is a cumulative
  sum of a per-phase histogram (the design notes' "counts of sequences per phase").
- token_states grows by n per iteration; free falls by A(i) x B; cached falls by the cached blocks
  among the first A(i) blocks of the free queue (they are evicted when popped).
- internal is 0 for a sequence until it holds the block containing its final token, then the
  tail of that block: one suffix sum of the durations per sequence.
- reservation is what is left of the held-but-unfilled slots.

When a growing sequence still shares a partial block with a fork (copy-on-write pending) or would
pass its final length inside the jump, the closed forms do not hold and the integral is computed
by stepping a copy of the allocator: exact, and rare (right after a fork).
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING

import numpy as np

from allocators.base import BREAKDOWN_PARTS, MemoryBreakdown
from allocators.seq_kernels import LOOPS_COMPILED, float_view, jump_terms, typed_view

if TYPE_CHECKING:
    from allocators.paged import PagedAllocator

INTEGRATED_PARTS: tuple[str, ...] = (*BREAKDOWN_PARTS, "cached")


_NDARRAY = np.ndarray
_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)
_FLOAT_ARANGE = np.arange(1024, dtype=np.float64)
_FLOAT_ARANGE.flags.writeable = False
# The typed loop's scratch (seq_kernels.jump_terms, filled and read within one jump, so one serves
# every jump of a thread): [block size, per-room int64 of that many entries, float64 entries, float64
# scratch, the blocks appended per iteration (float64, as many entries) and its view], the scratch as
# kept typed views (seq_kernels.typed_view, float_view); read inline on every jump. The appended array
# is kept too: a fresh `np.empty` per jump, and the loop's acquiring its buffer, cost ~1,500
# instructions. One per thread, not one per process: a dask worker (`kvsim sweep --scheduler`,
# threads_per_worker > 1) runs several simulations in threads of one process, and a jump's `appended`
# is still read (NumPy's dot, which may let another thread run) after its loop wrote it; shared, another
# thread's jump could overwrite it in between (seen as a sweep cell's kv_reservation_pct differing from
# the same cell run alone, tests/sweeps/test_sweep.py; tests/allocators/test_jump_threads.py).


class _ThreadScratch(threading.local):
    """The calling thread's jump scratch (`slots`, laid out as described above)."""

    def __init__(self) -> None:
        self.slots: list = [0, None, 0, None, None, None]


_SCRATCH = _ThreadScratch()


def _float_arange(count: int) -> np.ndarray:
    """np.arange(count) in float64, a read-only view of a cached array.

    Why float: the jump's index weights are a dot with the float durations, which would otherwise
    cast an int arange on every jump (the same float64 values, exact below 2**53).
    """
    global _FLOAT_ARANGE
    if count > _FLOAT_ARANGE.size:
        _FLOAT_ARANGE = np.arange(max(count, 2 * _FLOAT_ARANGE.size), dtype=np.float64)
        _FLOAT_ARANGE.flags.writeable = False
    return _FLOAT_ARANGE[:count]


def _renew_scratch(scratch: list, block_size: int, float_entries: int) -> None:
    """Make a thread's `scratch` fit a block size (per-room counts for jump_terms, which zeroes them)
    and at least `float_entries` float64 (suffix sums and products)."""
    if scratch[0] != block_size:
        scratch[0], scratch[1] = block_size, typed_view(np.zeros(block_size, dtype=np.int64))
    if scratch[2] < float_entries:
        size = max(float_entries, 2 * scratch[2], 256)
        scratch[2], scratch[3] = size, float_view(np.zeros(size))
        scratch[4] = np.zeros(size)
        scratch[5] = float_view(scratch[4])


def _stepped_integral(
    alloc: PagedAllocator, seq_ids: np.ndarray, durations_s: np.ndarray, next_demand_tokens: int
) -> dict[str, float]:
    """The reference: grow a copy one token at a time and sum d_i x breakdown."""
    probe = copy.deepcopy(alloc)
    sums = dict.fromkeys(INTEGRATED_PARTS, 0.0)
    for index, duration in enumerate(durations_s.tolist()):
        if index:
            failed = probe.grow(seq_ids, 1)
            if failed.size:
                raise RuntimeError(f"breakdown_integral: {failed.size} sequences cannot grow {index} tokens")
        parts = probe.breakdown(next_demand_tokens).as_dict()
        for name in INTEGRATED_PARTS:
            sums[name] += duration * parts[name]
    return sums


def _constant_sums(first: MemoryBreakdown, total_s: float) -> dict[str, float]:
    """Each part held at `first` for `total_s` (a literal, not a loop over INTEGRATED_PARTS with
    getattr: this runs on every jump that grows nobody)."""
    return {
        "token_states": first.token_states * total_s,
        "reservation": first.reservation * total_s,
        "internal": first.internal * total_s,
        "external": first.external * total_s,
        "duplicated": first.duplicated * total_s,
        "out_of_window": first.out_of_window * total_s,
        "free": first.free * total_s,
        "cached": first.cached * total_s,
    }


def paged_breakdown_integral(
    alloc: PagedAllocator,
    seq_ids: np.ndarray,
    durations_s: np.ndarray,
    next_demand_tokens: int = 0,
    *,
    first: MemoryBreakdown | None = None,
    total_s: float | None = None,
) -> dict[str, float]:
    """sum_i durations_s[i] x part after growing each of `seq_ids` (distinct) by i tokens.

    `first` (the breakdown now) and `total_s` (durations_s.sum()) may be passed by a caller that has
    them already (the engine's jump), to save computing them twice; they must be those values.
    """
    # np.asarray returns an array of the dtype as it is; the engine's are (decode ids, the cost model's
    # durations), so the identity tests (module globals) skip its call on every jump
    if type(seq_ids) is not _NDARRAY or seq_ids.dtype is not _INT64:
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
    durations = durations_s
    if type(durations) is not _NDARRAY or durations.dtype is not _FLOAT64:
        durations = np.asarray(durations_s, dtype=np.float64)
    steps = durations.size
    if steps == 0:
        return dict.fromkeys(INTEGRATED_PARTS, 0.0)
    if first is None:
        first = alloc.breakdown(next_demand_tokens)  # O(1); attributes, not as_dict (which reflects)
    if total_s is None:
        total_s = float(durations.sum())
    growing = seq_ids.size
    if steps == 1 or growing == 0:
        return _constant_sums(first, total_s)
    bs = alloc.block_size
    if alloc._num_cow_flagged and bool(alloc.cow_flag[seq_ids].any()):  # copy-on-write pending
        return _stepped_integral(alloc, seq_ids, durations, next_demand_tokens)
    # One pass over the sequences (seq_kernels.jump_terms): someone passing its final length (the
    # closed forms do not hold), blocks appended by iteration i, and the internal-waste terms. A
    # sequence with `room` free slots in its blocks needs a new block at iterations room + 1,
    # room + 1 + bs, ... (room in [0, bs)); blocks appended by iteration i are the per-room counts,
    # cumulated, in float64 (block counts, exact below 2**53) so the dot with the durations needs no
    # cast. internal: the tail of the block holding the final token (final_tail_tokens, (-final) % bs),
    # from the first iteration holding that block (min_start: steps when nobody holds or reaches it).
    lengths, _, _, num_blocks, _, final, block_from, tail, _ = alloc._views or alloc._make_views()
    scratch = _SCRATCH.slots
    if scratch[0] != bs or scratch[2] < steps + 1 + growing:  # inline: this runs on every jump
        _renew_scratch(scratch, bs, steps + 1 + growing)
    # the first `steps` entries of the kept array; the compiled loop writes them through the kept view,
    # the Python one (NumPy's accumulate, by shape) into this slice
    appended = scratch[4][:steps]
    min_remaining, min_start, products_s, never_tokens = jump_terms(
        lengths,
        final,
        num_blocks,
        block_from,
        tail,
        seq_ids,
        bs,
        steps,
        durations,
        scratch[1],
        scratch[5] if LOOPS_COMPILED else appended,
        scratch[3],
    )
    if min_remaining < steps - 1:  # someone passes its final length
        return _stepped_integral(alloc, seq_ids, durations, next_demand_tokens)

    # ndarray.dot, not `@`: for 1-D float64 both are DOUBLE_dot (BLAS ddot), the same double
    # (tests/allocators/test_jump_sums.py), but matmul's gufunc costs ~3,000 instructions more a call
    arange = _FLOAT_ARANGE[:steps] if steps <= _FLOAT_ARANGE.shape[0] else _float_arange(steps)
    index_weighted_s = float(durations.dot(arange))
    appended_weighted = float(durations.dot(appended))
    if min_start < steps:
        # internal now: sum of max(0, held - final) (no one is past its final length); over every live
        # sequence without forks that is the allocator's running total, the same integer
        state = alloc._state
        if not alloc._num_cow_flagged and growing == state.num_live:
            internal_now_sum = state.never_tokens
        else:
            internal_now_sum = never_tokens
        internal_delta = float(products_s - internal_now_sum * total_s)
    else:  # nobody holds or reaches its final block: every term is 0
        internal_delta = 0.0
    cached_s = first.cached * total_s
    if first.cached and appended[-1]:
        popped = alloc.pool.queue.peek(int(appended[-1]))
        # evicted[j] = cached blocks among the first j popped (int64, as np.cumsum of the bools gives)
        evicted = np.zeros(popped.size + 1, dtype=np.int64)
        np.add.accumulate(alloc.pool.has_key[popped], dtype=np.int64, out=evicted[1:])
        cached_s -= bs * float(durations @ evicted[appended.astype(np.int64)])
    # one literal (each part: its constant term, then its change, the additions as before)
    return {
        "token_states": first.token_states * total_s + growing * index_weighted_s,
        "reservation": first.reservation * total_s
        + (bs * appended_weighted - growing * index_weighted_s - internal_delta),
        "internal": first.internal * total_s + internal_delta,
        "external": first.external * total_s,
        "duplicated": first.duplicated * total_s,
        "out_of_window": first.out_of_window * total_s,
        "free": first.free * total_s - bs * appended_weighted,
        "cached": cached_s,
    }
