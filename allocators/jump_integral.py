"""Exact time integrals of a paged allocator's taxonomy over a multi-iteration decode jump.

Why: the engine jumps k decode iterations at once. For slabs the parts move linearly and the
engine can interpolate, but for blocks and pages they are step functions (a block appears when a
sequence crosses a boundary). This computes sum_i d_i x part(i), where part(i) is the breakdown
after the sequences grew by i tokens (i = 0..m-1), in O(m + n) NumPy work and without growing:

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
from typing import TYPE_CHECKING

import numpy as np

from allocators.base import BREAKDOWN_PARTS, MemoryBreakdown

if TYPE_CHECKING:
    from allocators.paged import PagedAllocator

INTEGRATED_PARTS: tuple[str, ...] = (*BREAKDOWN_PARTS, "cached")


_FLOAT_ARANGE = np.arange(1024, dtype=np.float64)
_FLOAT_ARANGE.flags.writeable = False
_PHASES: dict[int, np.ndarray] = {}


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


def _phase_index(count: int, block_size: int) -> np.ndarray:
    """np.arange(count) % block_size, from a cached array per block size (long jumps need it)."""
    cached = _PHASES.get(block_size)
    if cached is None or cached.size < count:
        cached = np.arange(max(count, 2 * (0 if cached is None else cached.size), 1024)) % block_size
        cached.flags.writeable = False
        _PHASES[block_size] = cached
    return cached[:count]


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
    seq_ids = np.asarray(seq_ids, dtype=np.int64)
    durations = np.asarray(durations_s, dtype=np.float64)
    steps = durations.size
    if steps == 0:
        return dict.fromkeys(INTEGRATED_PARTS, 0.0)
    if first is None:
        first = alloc.breakdown(next_demand_tokens)  # O(1); attributes, not as_dict (which reflects)
    if total_s is None:
        total_s = float(durations.sum())
    # a literal, not a loop over INTEGRATED_PARTS with getattr: this runs on every jump
    sums = {
        "token_states": first.token_states * total_s,
        "reservation": first.reservation * total_s,
        "internal": first.internal * total_s,
        "external": first.external * total_s,
        "duplicated": first.duplicated * total_s,
        "out_of_window": first.out_of_window * total_s,
        "free": first.free * total_s,
        "cached": first.cached * total_s,
    }
    if steps == 1 or seq_ids.size == 0:
        return sums
    bs = alloc.block_size
    lengths = alloc.lengths_tokens[seq_ids]
    final = alloc.final_tokens[seq_ids]
    remaining = final - lengths  # tokens to go before the final length
    cow_pending = alloc._num_cow_flagged and bool(alloc.cow_flag[seq_ids].any())
    if cow_pending or int(np.minimum.reduce(remaining)) < steps - 1:  # someone passes its final length
        return _stepped_integral(alloc, seq_ids, durations, next_demand_tokens)

    index_weighted_s = float(durations @ _float_arange(steps))
    # blocks appended by iteration i: per-phase counts, cumulated. A sequence with `room` free slots
    # in its blocks needs a new block at iterations room + 1, room + 1 + bs, ... (room in [0, bs)).
    held = alloc.num_seq_blocks[seq_ids] * bs
    room = held - lengths
    per_room = np.bincount(room, minlength=bs)
    # in float64 (block counts, exact below 2**53), so the dot with the durations needs no cast
    appended = np.zeros(steps)
    # iteration i >= 1 adds the sequences with room == (i - 1) % bs; a short jump needs no modulo
    phases = per_room[: steps - 1] if steps - 1 <= bs else per_room[_phase_index(steps - 1, bs)]
    np.add.accumulate(phases, out=appended[1:])  # = cumsum, without its slow out= path
    appended_weighted = float(durations @ appended)
    # internal: the tail of the block holding the final token, from the iteration that block appears
    tail = alloc.final_tail_tokens[seq_ids]  # slots after the final token in its block, (-final) % bs
    # first iteration holding it: 0 if held already (room >= remaining), else final + tail - bs + 1 - length
    # (final + tail - bs + 1 - length = remaining + tail - (bs - 1), stored per sequence)
    from_now = alloc.final_block_from_tokens[seq_ids] - lengths
    if per_room.size == bs:
        # every room < bs (blocks held = ceil(length / bs)): then from_now <= 0 exactly when the final
        # block is held (room >= remaining) and > 0 otherwise, so clamping at 0 is the same as the test;
        # min(starts) = max(min(from_now), 0) < steps (>= 2) exactly when min(from_now) < steps
        reaches = int(np.minimum.reduce(from_now)) < steps  # the ufunc: no method wrapper
        starts = np.maximum(from_now, 0) if reaches else from_now
    else:
        starts = np.where(room >= remaining, 0, from_now)
        reaches = int(starts.min()) < steps
    if reaches:
        suffix_s = np.zeros(steps + 1)  # suffix_s[t] = sum_{i>=t} d_i, summed from the end
        np.add.accumulate(durations[::-1], out=suffix_s[-2::-1])
        # internal now: sum of max(0, held - final) (no one is past its final length); over every live
        # sequence without forks that is the allocator's running total, the same integer
        if not alloc._num_cow_flagged and seq_ids.size == alloc._num_live:
            internal_now_sum = alloc._never_tokens
        else:
            internal_now_sum = np.add.reduce(np.maximum(0, held - final))
        internal_delta = float(
            np.add.reduce(tail * suffix_s[np.minimum(starts, steps)]) - internal_now_sum * total_s
        )
    else:  # nobody holds or reaches its final block: every term is 0
        internal_delta = 0.0
    growing = seq_ids.size
    sums["token_states"] += growing * index_weighted_s
    sums["internal"] += internal_delta
    sums["reservation"] += bs * appended_weighted - growing * index_weighted_s - internal_delta
    sums["free"] -= bs * appended_weighted
    if first.cached and appended[-1]:
        popped = alloc.pool.queue.peek(int(appended[-1]))
        # evicted[j] = cached blocks among the first j popped (int64, as np.cumsum of the bools gives)
        evicted = np.zeros(popped.size + 1, dtype=np.int64)
        np.add.accumulate(alloc.pool.has_key[popped], dtype=np.int64, out=evicted[1:])
        sums["cached"] -= bs * float(durations @ evicted[appended.astype(np.int64)])
    return sums
