"""Loops over a batch's per-sequence arrays, typed for the compiled core.

Why: on a decode step the paged allocator and its jump integral make ~30 NumPy calls on arrays of a
batch's ~40 sequences (gather, add, compare, scatter, bincount, min), each ~1 us of call overhead for
nanoseconds of arithmetic (issue 24). Each function here does one such group of calls as one loop
over the sequences. Compiled (setup.py, `allocators.compiled.COMPILED_MODULES`), the Cython
declarations (`@cython.locals`: C integers and typed memoryviews) make it a C loop; as Python (no
compiler, `KVSIM_PURE=1`, or no Cython: `allocators/cython_shim.py`) it is the same loop, slower, with
the same results. Input arrays are declared `const` (read-only views), as a caller's array may be
read-only. Types are written out in each declaration: Cython does not resolve a module-level alias.

As Python, a loop over a batch's ~40 sequences costs more than the NumPy calls it replaced, so the
batch-sized functions keep those calls in a `not cython.compiled` branch (`cython.compiled` is a
compile-time constant: the compiled module has only the loop); tests/allocators/test_seq_kernels.py
checks both against the expressions the allocator used before, and tests/test_compiled_core.py the
whole engine, compiled against pure. The few-sequence ones (the lean append) are scalar loops on both
paths (`.item()` as Python).

Integers only: these compute exact integer quantities (lengths, block counts, histograms). Float
sums stay with NumPy in the callers, whose summation orders (pairwise `np.add.reduce`, BLAS `dot`)
the results must keep bit for bit; the one exception repeats NumPy's own order, addition for
addition (`_pairwise_sum`: `np.add.reduce`, and `np.add.accumulate`'s running sum, in `jump_terms`),
and tests/allocators/test_jump_sums.py checks it against NumPy. BLAS `dot` stays NumPy's (its order
depends on the CPU's kernel).
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # Cython is a build requirement, not a runtime one
    from allocators import cython_shim as cython

import numpy as np

# Whether the loops here run compiled (C loops): then a loop beats NumPy's calls at any batch size,
# and the callers take their loop paths for any count (allocators/paged.py `_LEAN_LOOP_MAX`).
LOOPS_COMPILED: bool = bool(cython.compiled)


@cython.locals(array=cython.longlong[:])
def _int64_view(array: np.ndarray) -> object:
    return array


@cython.locals(array=cython.int[:])
def _int32_view(array: np.ndarray) -> object:
    return array


@cython.locals(array=cython.int[:, :])
def _int32_table_view(array: np.ndarray) -> object:
    return array


def typed_view(array: np.ndarray) -> object:
    """A typed memoryview of `array` (int64 or int32, 1-D, or an int32 table) for the loops here.

    Why: a loop acquires a typed view of each array argument, ~0.2 us from a NumPy array but a
    fraction of that from a view of the same type, so an owner of long-lived arrays (the paged
    allocator's per-sequence arrays and block table) keeps their views and passes those. A view writes
    through to its array and keeps it alive; the owner must make a new one when it replaces the array.
    As Python (`cython.compiled` false) the array itself.
    """
    if not cython.compiled:
        return array
    if array.ndim == 2:
        return _int32_table_view(array)
    if array.dtype == np.int32:
        return _int32_view(array)
    return _int64_view(array)


@cython.locals(
    lengths=cython.longlong[:],
    quiet=cython.const_longlong[:],
    seq_ids=cython.const_longlong[:],
    num_tokens=cython.longlong,
    index=cython.Py_ssize_t,
    seq_id=cython.longlong,
    grown_length=cython.longlong,
)
def grow_quiet(lengths: np.ndarray, quiet: np.ndarray, seq_ids: np.ndarray, num_tokens: int) -> list[int]:
    """lengths[s] += num_tokens for each s of `seq_ids`; returns (in order) those grown past quiet[s].

    The paged allocator's first growth tier (`PagedAllocator.grow`): `lengths[ids] + k`, the compare
    with the quiet limits, the scatter back and the mask, in one pass.
    """
    if not cython.compiled:  # as Python, NumPy's calls beat a loop over the batch (module docstring)
        grown = lengths[seq_ids] + num_tokens
        lengths[seq_ids] = grown
        return seq_ids[grown > quiet[seq_ids]].tolist()
    events: list[int] = []
    for index in range(seq_ids.shape[0]):
        seq_id = seq_ids[index]
        grown_length = lengths[seq_id] + num_tokens
        lengths[seq_id] = grown_length
        if grown_length > quiet[seq_id]:
            events.append(seq_id)
    return events


@cython.locals(
    lengths=cython.const_longlong[:],
    seq_ids=cython.const_longlong[:],
    index=cython.Py_ssize_t,
    longest=cython.longlong,
    length=cython.longlong,
)
def longest_length(lengths: np.ndarray, seq_ids: np.ndarray) -> int:
    """max(lengths[seq_ids]) (seq_ids not empty)."""
    if not cython.compiled:
        return int(np.maximum.reduce(lengths[seq_ids]))
    longest = lengths[seq_ids[0]]
    for index in range(1, seq_ids.shape[0]):
        length = lengths[seq_ids[index]]
        if length > longest:
            longest = length
    return longest


@cython.locals(
    lengths=cython.const_longlong[:],
    final=cython.const_longlong[:],
    num_blocks=cython.const_longlong[:],
    block_from=cython.const_longlong[:],
    seq_ids=cython.const_longlong[:],
    per_room=cython.longlong[:],
    appended=cython.double[:],
    block_size=cython.longlong,
    steps=cython.longlong,
    index=cython.Py_ssize_t,
    seq_id=cython.longlong,
    length=cython.longlong,
    remaining=cython.longlong,
    room=cython.longlong,
    from_now=cython.longlong,
    min_remaining=cython.longlong,
    min_from_now=cython.longlong,
    min_start=cython.longlong,
    start=cython.longlong,
    all_small=cython.bint,
    total=cython.longlong,
)
def jump_scan(
    lengths: np.ndarray,
    final: np.ndarray,
    num_blocks: np.ndarray,
    block_from: np.ndarray,
    seq_ids: np.ndarray,
    block_size: int,
    steps: int,
    per_room: np.ndarray,
    appended: np.ndarray,
) -> tuple[int, bool, int]:
    """The jump integral's integer pass (allocators/jump_integral.py): one loop over the sequences.

    Returns (min remaining tokens, every room < block_size, min first iteration holding the final
    block); when min remaining >= steps - 1 it also fills `appended[i]` (float64, `steps` long) with
    the blocks appended by iteration i: the cumulative per-phase counts. `per_room` is scratch of
    `block_size` int64 (zeroed here). The start of a sequence holding its final block already is 0;
    otherwise `block_from - length`.
    """
    if not cython.compiled:
        lengths_now = lengths[seq_ids]
        remaining = final[seq_ids] - lengths_now
        min_remaining = int(np.minimum.reduce(remaining))
        room = num_blocks[seq_ids] * block_size - lengths_now
        counts = np.bincount(room, minlength=block_size)  # longer when some room >= block_size
        starts = np.where(room >= remaining, 0, block_from[seq_ids] - lengths_now)
        min_start = min(int(np.minimum.reduce(starts)), steps)
        if min_remaining >= steps - 1:
            appended[0] = 0.0
            phases = np.arange(steps - 1) % block_size
            np.add.accumulate(counts[phases], out=appended[1:])
        return min_remaining, counts.size == block_size, min_start
    for index in range(block_size):
        per_room[index] = 0
    min_remaining = final[seq_ids[0]] - lengths[seq_ids[0]]
    min_start = steps
    all_small = True
    for index in range(seq_ids.shape[0]):
        seq_id = seq_ids[index]
        length = lengths[seq_id]
        remaining = final[seq_id] - length
        if remaining < min_remaining:
            min_remaining = remaining
        room = num_blocks[seq_id] * block_size - length
        if room < block_size:
            per_room[room] += 1
        else:
            all_small = False
        start = 0 if room >= remaining else block_from[seq_id] - length
        if start < min_start:
            min_start = start
    if min_remaining < steps - 1:
        return min_remaining, all_small, min_start
    # iteration i >= 1 adds the sequences with room == (i - 1) % block_size
    total = 0
    appended[0] = 0.0
    for index in range(1, steps):
        total += per_room[(index - 1) % block_size]
        appended[index] = total
    return min_remaining, all_small, min_start


@cython.locals(
    lengths=cython.const_longlong[:],
    final=cython.const_longlong[:],
    num_blocks=cython.const_longlong[:],
    block_from=cython.const_longlong[:],
    tail=cython.const_longlong[:],
    seq_ids=cython.const_longlong[:],
    suffix_s=cython.const_double[:],
    products=cython.double[:],
    block_size=cython.longlong,
    steps=cython.longlong,
    all_small=cython.bint,
    index=cython.Py_ssize_t,
    seq_id=cython.longlong,
    length=cython.longlong,
    held=cython.longlong,
    start=cython.longlong,
    never=cython.longlong,
)
def final_block_terms(
    lengths: np.ndarray,
    final: np.ndarray,
    num_blocks: np.ndarray,
    block_from: np.ndarray,
    tail: np.ndarray,
    seq_ids: np.ndarray,
    block_size: int,
    steps: int,
    all_small: bool,
    suffix_s: np.ndarray,
    products: np.ndarray,
) -> int:
    """The jump integral's internal-waste terms: products[j] = tail x suffix_s[min(start, steps)] per
    sequence (float64, the product NumPy's `tail * suffix_s[...]` computes), and returns the internal
    waste now, sum(max(0, held - final)).

    The start (first iteration holding the final block) as jump_integral.py had it: max(block_from -
    length, 0) when every room < block_size (`all_small`), else 0 if the final block is held already.
    """
    if not cython.compiled:
        lengths_now = lengths[seq_ids]
        held_now = num_blocks[seq_ids] * block_size
        final_now = final[seq_ids]
        from_now = block_from[seq_ids] - lengths_now
        starts = np.maximum(from_now, 0) if all_small else np.where(held_now >= final_now, 0, from_now)
        np.multiply(tail[seq_ids], suffix_s[np.minimum(starts, steps)], out=products)
        return int(np.add.reduce(np.maximum(0, held_now - final_now)))
    never = 0
    for index in range(seq_ids.shape[0]):
        seq_id = seq_ids[index]
        length = lengths[seq_id]
        held = num_blocks[seq_id] * block_size
        start = block_from[seq_id] - length
        if all_small:
            if start < 0:
                start = 0
        elif held - length >= final[seq_id] - length:
            start = 0
        if start > steps:
            start = steps
        products[index] = tail[seq_id] * suffix_s[start]
        if held > final[seq_id]:
            never += held - final[seq_id]
    return never


@cython.locals(
    tables=cython.int[:, :],
    num_blocks=cython.longlong[:],
    slots=cython.const_longlong[:],
    final=cython.const_longlong[:],
    quiet=cython.longlong[:],
    caps=cython.const_longlong[:],
    seq_ids=list,
    blocks=list,
    block_size=cython.longlong,
    index=cython.Py_ssize_t,
    seq_id=cython.longlong,
    have=cython.longlong,
    held=cython.longlong,
    cap=cython.longlong,
    never=cython.longlong,
)
def lean_append(
    tables: np.ndarray,
    num_blocks: np.ndarray,
    slots: np.ndarray,
    final: np.ndarray,
    quiet: np.ndarray,
    caps: np.ndarray,
    seq_ids: list[int],
    blocks: list[int],
    block_size: int,
) -> int:
    """Put blocks[i] at the end of seq_ids[i]'s block table (the table has the columns), update its
    block count and quiet limit; returns the slots now past final lengths (never-filled tokens) added.

    `PagedAllocator._append_lean_few`'s writes: each sequence was below its final length, so nothing
    was never-filled before; now its final block may be held.
    """
    if not cython.compiled:  # as Python: `.item()` gives Python ints, cheaper than NumPy scalars
        never = 0
        for seq_id, block in zip(seq_ids, blocks, strict=True):
            have = num_blocks.item(seq_id)
            tables[slots.item(seq_id), have] = block
            num_blocks[seq_id] = have + 1
            held = (have + 1) * block_size
            never += max(0, held - final.item(seq_id))
            quiet[seq_id] = min(held, caps.item(seq_id))
        return never
    never = 0
    for index in range(len(seq_ids)):
        seq_id = seq_ids[index]
        have = num_blocks[seq_id]
        tables[slots[seq_id], have] = blocks[index]
        num_blocks[seq_id] = have + 1
        held = (have + 1) * block_size
        if held > final[seq_id]:
            never += held - final[seq_id]
        cap = caps[seq_id]
        quiet[seq_id] = held if held < cap else cap
    return never


@cython.locals(
    tables=cython.int[:, :],
    slot=cython.Py_ssize_t,
    count=cython.Py_ssize_t,
    blocks=cython.longlong[:],
    index=cython.Py_ssize_t,
)
def take_row_reversed(tables: np.ndarray, slot: int, count: int, blocks: np.ndarray) -> None:
    """blocks[:] = tables[slot, count - 1 :: -1] (as int64), then tables[slot, :count] = -1: a released
    sequence's blocks, last first, and its emptied block-table row (`PagedAllocator.release`)."""
    if not cython.compiled:
        blocks[:] = tables[slot, :count][::-1]
        tables[slot, :count] = -1
        return
    for index in range(count):
        blocks[index] = tables[slot, count - 1 - index]
        tables[slot, count - 1 - index] = -1


@cython.locals(
    refcount=cython.int[:],
    blocks=cython.const_longlong[:],
    freed=cython.longlong[:],
    index=cython.Py_ssize_t,
    num_freed=cython.Py_ssize_t,
    block=cython.longlong,
    left=cython.int,
)
def drop_refs(refcount: np.ndarray, blocks: np.ndarray, freed: np.ndarray) -> int:
    """refcount[b] -= 1 for each (distinct) block b of `blocks`; those reaching 0 go to freed[:n], in
    order; returns n (`BlockPool.release`'s first step)."""
    if not cython.compiled:
        left = refcount[blocks] - 1
        refcount[blocks] = left
        gone = blocks[left == 0]
        freed[: gone.size] = gone
        return int(gone.size)
    num_freed = 0
    for index in range(blocks.shape[0]):
        block = blocks[index]
        left = refcount[block] - 1
        refcount[block] = left
        if left == 0:
            freed[num_freed] = block
            num_freed += 1
    return num_freed


# ---- the block pool's free queue (allocators/block_pool.py) -------------------------------------
# A pop takes the blocks at the queue's head when those entries are all valid (the caller checks:
# no stale entry among them): each leaves the queue (in_queue 0), gets refcount 1, and one still
# named by a cached key is reported in `evicted` (its name cleared in has_key; the caller forgets
# the key). A push appends freed blocks at the tail. Boolean arrays come as uint8 views
# (`ndarray.view(np.uint8)`: a typed memoryview does not take NumPy's bool format).


@cython.locals(array=cython.uchar[:])
def _uint8_view(array: np.ndarray) -> object:
    return array


def flag_view(array: np.ndarray) -> object:
    """A typed memoryview of a bool array (as uint8, writing through) for the loops here; as Python
    (`cython.compiled` false) the uint8 view itself."""
    as_bytes = array.view(np.uint8)
    if not cython.compiled:
        return as_bytes
    return _uint8_view(as_bytes)


@cython.locals(
    entries=cython.const_longlong[:],
    in_queue=cython.uchar[:],
    refcount=cython.int[:],
    has_key=cython.uchar[:],
    head=cython.Py_ssize_t,
    count=cython.Py_ssize_t,
    evicted=list,
    index=cython.Py_ssize_t,
    block=cython.longlong,
)
def pop_blocks(
    entries: np.ndarray,
    in_queue: np.ndarray,
    refcount: np.ndarray,
    has_key: np.ndarray,
    head: int,
    count: int,
    evicted: list[int],
) -> list[int]:
    """The `count` blocks at entries[head:], taken (in_queue 0, refcount 1), as a list of ints; blocks
    still named are cleared in has_key and appended to `evicted`, in order (`BlockPool.allocate_few`)."""
    if not cython.compiled:
        blocks = entries[head : head + count].tolist()
        for block in blocks:
            in_queue[block] = 0
            refcount[block] = 1
            if has_key[block]:
                has_key[block] = 0
                evicted.append(block)
        return blocks
    blocks_out: list = []
    for index in range(head, head + count):
        block = entries[index]
        in_queue[block] = 0
        refcount[block] = 1
        if has_key[block]:
            has_key[block] = 0
            evicted.append(block)
        blocks_out.append(block)
    return blocks_out


@cython.locals(
    entries=cython.const_longlong[:],
    in_queue=cython.uchar[:],
    refcount=cython.int[:],
    has_key=cython.uchar[:],
    head=cython.Py_ssize_t,
    count=cython.Py_ssize_t,
    tables=cython.int[:, :],
    slot=cython.Py_ssize_t,
    evicted=list,
    index=cython.Py_ssize_t,
    block=cython.longlong,
)
def pop_into_row(
    entries: np.ndarray,
    in_queue: np.ndarray,
    refcount: np.ndarray,
    has_key: np.ndarray,
    head: int,
    count: int,
    tables: np.ndarray,
    slot: int,
    evicted: list[int],
) -> None:
    """`pop_blocks`, the blocks written to tables[slot, :count] instead of returned (an admission)."""
    if not cython.compiled:
        blocks = entries[head : head + count]
        tables[slot, :count] = blocks
        for block in blocks.tolist():
            in_queue[block] = 0
            refcount[block] = 1
            if has_key[block]:
                has_key[block] = 0
                evicted.append(block)
        return
    for index in range(count):
        block = entries[head + index]
        in_queue[block] = 0
        refcount[block] = 1
        if has_key[block]:
            has_key[block] = 0
            evicted.append(block)
        tables[slot, index] = block


@cython.locals(
    tables=cython.int[:, :],
    slot=cython.Py_ssize_t,
    count=cython.Py_ssize_t,
    refcount=cython.int[:],
    entries=cython.longlong[:],
    in_queue=cython.uchar[:],
    tail=cython.Py_ssize_t,
    index=cython.Py_ssize_t,
    num_freed=cython.Py_ssize_t,
    block=cython.longlong,
    left=cython.int,
)
def release_row_to_tail(
    tables: np.ndarray,
    slot: int,
    count: int,
    refcount: np.ndarray,
    entries: np.ndarray,
    in_queue: np.ndarray,
    tail: int,
) -> int:
    """A released block-table row, last block first: the row emptied (-1), one reference dropped from
    each block, and those freed pushed at entries[tail:] (in_queue 1), in that order; returns how many.

    `take_row_reversed`, `drop_refs` and the free queue's push in one pass (`BlockPool.release_row`:
    no caching, so every freed block goes to the tail, and no stamps to keep).
    """
    if not cython.compiled:
        blocks = tables[slot, :count][::-1].astype(np.int64)
        tables[slot, :count] = -1
        left = refcount[blocks] - 1
        refcount[blocks] = left
        freed = blocks[left == 0]
        entries[tail : tail + freed.size] = freed
        in_queue[freed] = 1
        return int(freed.size)
    num_freed = 0
    for index in range(count - 1, -1, -1):
        block = tables[slot, index]
        tables[slot, index] = -1
        left = refcount[block] - 1
        refcount[block] = left
        if left == 0:
            entries[tail + num_freed] = block
            in_queue[block] = 1
            num_freed += 1
    return num_freed


@cython.locals(array=cython.double[:])
def _float64_view(array: np.ndarray) -> object:
    return array


def float_view(array: np.ndarray) -> object:
    """A typed memoryview of a 1-D float64 array (`typed_view` for scratch the loops here fill), kept
    by its owner for the same reason; as Python the array itself."""
    if not cython.compiled:
        return array
    return _float64_view(array)


@cython.cfunc
@cython.returns(cython.double)
@cython.locals(
    values=cython.double[:],
    start=cython.Py_ssize_t,
    count=cython.Py_ssize_t,
    index=cython.Py_ssize_t,
    end=cython.Py_ssize_t,
    half=cython.Py_ssize_t,
    total=cython.double,
    r0=cython.double,
    r1=cython.double,
    r2=cython.double,
    r3=cython.double,
    r4=cython.double,
    r5=cython.double,
    r6=cython.double,
    r7=cython.double,
)
def _pairwise_sum(values: np.ndarray, start: int, count: int) -> float:
    """sum(values[start : start + count]) in NumPy's float64 pairwise order, bit for bit.

    Why: `np.add.reduce` of a contiguous float64 array is `0.0 + DOUBLE_pairwise_sum(a, n)`
    (numpy/_core/src/umath/loops_utils.h.src): below 8 values a plain loop from -0.0; up to 128, eight
    accumulators over the multiples of 8, combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)),
    then the rest one by one; above 128, the two halves (the first a multiple of 8) summed apart. The
    same additions in the same order give the same double (IEEE, no reassociation: gcc without
    -ffast-math). tests/allocators/test_seq_kernels.py checks it against NumPy, compiled and as Python.
    """
    if count < 8:
        total = -0.0
        for index in range(start, start + count):
            total += values[index]
        return total
    if count <= 128:
        r0 = values[start]
        r1 = values[start + 1]
        r2 = values[start + 2]
        r3 = values[start + 3]
        r4 = values[start + 4]
        r5 = values[start + 5]
        r6 = values[start + 6]
        r7 = values[start + 7]
        end = start + count - count % 8
        index = start + 8
        while index < end:
            r0 += values[index]
            r1 += values[index + 1]
            r2 += values[index + 2]
            r3 += values[index + 3]
            r4 += values[index + 4]
            r5 += values[index + 5]
            r6 += values[index + 6]
            r7 += values[index + 7]
            index += 8
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for index in range(end, start + count):
            total += values[index]
        return total
    half = count // 2
    half -= half % 8
    return _pairwise_sum(values, start, half) + _pairwise_sum(values, start + half, count - half)


@cython.locals(values=cython.double[:])
def pairwise_sum(values: np.ndarray) -> float:
    """`float(np.add.reduce(values))` of a 1-D float64 array, bit for bit, as a typed loop
    (`_pairwise_sum`, with NumPy's 0.0 start); as Python NumPy's own call. For tests and callers
    holding a typed view."""
    if not cython.compiled:
        return float(np.add.reduce(values))
    return 0.0 + _pairwise_sum(values, 0, values.shape[0])


@cython.locals(
    lengths=cython.const_longlong[:],
    final=cython.const_longlong[:],
    num_blocks=cython.const_longlong[:],
    block_from=cython.const_longlong[:],
    tail=cython.const_longlong[:],
    seq_ids=cython.const_longlong[:],
    durations=cython.const_double[:],
    per_room=cython.longlong[:],
    appended=cython.double[:],
    scratch=cython.double[:],
    block_size=cython.longlong,
    steps=cython.longlong,
    count=cython.Py_ssize_t,
    index=cython.Py_ssize_t,
    seq_id=cython.longlong,
    length=cython.longlong,
    remaining=cython.longlong,
    room=cython.longlong,
    min_remaining=cython.longlong,
    min_start=cython.longlong,
    start=cython.longlong,
    all_small=cython.bint,
    total=cython.longlong,
    held=cython.longlong,
    never=cython.longlong,
    products_s=cython.double,
)
def jump_terms(
    lengths: np.ndarray,
    final: np.ndarray,
    num_blocks: np.ndarray,
    block_from: np.ndarray,
    tail: np.ndarray,
    seq_ids: np.ndarray,
    block_size: int,
    steps: int,
    durations: np.ndarray,
    per_room: np.ndarray,
    appended: np.ndarray,
    scratch: np.ndarray,
) -> tuple[int, int, float, int]:
    """The jump integral's pass over the sequences (allocators/jump_integral.py), in one call: `jump_scan`,
    then the suffix sums of the durations, `final_block_terms` and the sum of its products.

    Returns (min remaining tokens, min first iteration holding the final block (at most `steps`),
    sum of the internal-waste products, internal waste now). When min remaining < steps - 1 (someone
    passes its final length: the caller steps instead) it stops after the scan and the last three
    are (steps, 0.0, 0); when nobody holds or reaches its final block within the jump (min start ==
    steps) the last two are 0.0 and 0. Otherwise `appended` (float64, `steps` long) holds the blocks
    appended by iteration i, as `jump_scan` fills it.

    The float results are NumPy's, bit for bit: the suffix sums `suffix_s[t] = sum_{i>=t} d_i` are
    `np.add.accumulate` of the reversed durations (sequential: out[0] = in[0], out[j] = out[j-1] + in[j]),
    each product is one IEEE multiply, and their sum is `np.add.reduce`'s pairwise order
    (`_pairwise_sum`). `per_room` is int64 scratch of `block_size`, `scratch` float64 scratch of at
    least steps + 1 + len(seq_ids) (suffix sums, then products).
    """
    if not cython.compiled:  # as Python: the NumPy calls jump_integral.py made (module docstring)
        min_remaining, all_small, min_start = jump_scan(
            lengths, final, num_blocks, block_from, seq_ids, block_size, steps, per_room, appended
        )
        if min_remaining < steps - 1:
            return min_remaining, steps, 0.0, 0
        if min_start >= steps:
            return min_remaining, steps, 0.0, 0
        suffix_s = np.zeros(steps + 1)  # suffix_s[t] = sum_{i>=t} d_i, summed from the end
        np.add.accumulate(durations[::-1], out=suffix_s[-2::-1])
        products = np.empty(seq_ids.size)
        never = final_block_terms(
            lengths,
            final,
            num_blocks,
            block_from,
            tail,
            seq_ids,
            block_size,
            steps,
            all_small,
            suffix_s,
            products,
        )
        return min_remaining, min_start, float(np.add.reduce(products)), never
    count = seq_ids.shape[0]
    for index in range(block_size):
        per_room[index] = 0
    min_remaining = final[seq_ids[0]] - lengths[seq_ids[0]]
    min_start = steps
    all_small = True
    for index in range(count):
        seq_id = seq_ids[index]
        length = lengths[seq_id]
        remaining = final[seq_id] - length
        if remaining < min_remaining:
            min_remaining = remaining
        room = num_blocks[seq_id] * block_size - length
        if room < block_size:
            per_room[room] += 1
        else:
            all_small = False
        start = 0 if room >= remaining else block_from[seq_id] - length
        if start < min_start:
            min_start = start
    if min_remaining < steps - 1:
        return min_remaining, steps, 0.0, 0
    # iteration i >= 1 adds the sequences with room == (i - 1) % block_size
    total = 0
    appended[0] = 0.0
    for index in range(1, steps):
        total += per_room[(index - 1) % block_size]
        appended[index] = total
    if min_start >= steps:
        return min_remaining, steps, 0.0, 0
    # suffix sums in scratch[0 : steps + 1], as np.add.accumulate(durations[::-1]) writes them backwards
    scratch[steps] = 0.0
    scratch[steps - 1] = durations[steps - 1]
    for index in range(steps - 2, -1, -1):
        scratch[index] = scratch[index + 1] + durations[index]
    # products in scratch[steps + 1 : steps + 1 + count] (final_block_terms' loop)
    never = 0
    for index in range(count):
        seq_id = seq_ids[index]
        length = lengths[seq_id]
        held = num_blocks[seq_id] * block_size
        start = block_from[seq_id] - length
        if all_small:
            if start < 0:
                start = 0
        elif held - length >= final[seq_id] - length:
            start = 0
        if start > steps:
            start = steps
        scratch[steps + 1 + index] = tail[seq_id] * scratch[start]
        if held > final[seq_id]:
            never += held - final[seq_id]
    products_s = 0.0 + _pairwise_sum(scratch, steps + 1, count)
    return min_remaining, min_start, products_s, never
