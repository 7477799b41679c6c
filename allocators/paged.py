"""PagedAttention's allocator: fixed-size blocks, one block table per sequence, refcounted sharing.

Why blocks: a sequence takes one block at a time as it grows, so internal waste is under one block
per sequence and there is no external fragmentation except the `capacity % block_size` remainder
that cannot form a block. Block tables let sequences share physical blocks:
- prefix sharing: full prompt blocks with the same name (prefix group or hash chain, see
  prefix_keys.py) are stored once, with a refcount;
- fork (parallel sampling, beams): the child shares all the parent's blocks; the partially filled
  last block is copied on the first write to it while shared (copy-on-write). The copied tokens
  count as `duplicated` while both copies exist;
- prefix caching (`enable_prefix_caching`): see block_pool.py.

Performance: per-sequence state is NumPy arrays indexed by seq id; only sequences that cross a block
boundary (or write into a shared block) get blocks. The engine calls `grow` and `breakdown` every
step, so both are kept to a handful of calls: `grow`'s pass over the batch and the lean append are
typed loops (allocators/seq_kernels.py, C loops in the compiled core), the rarer tiers NumPy:
- each sequence has a *quiet limit*: the length up to which growing changes nothing but its length
  (no new block, no change of internal waste, no copy-on-write, within max_model_len). One
  comparison against it finds the few sequences that need real work; the rest just grow.
- running totals over live sequences (tokens, held slots, never-filled slots) make `breakdown` O(1)
  (except while forks share a partial block, where it scans, as before).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence

import numpy as np

try:
    import cython
except ImportError:  # Cython is a build requirement, not a runtime one
    from allocators import cython_shim as cython

from allocators.base import AllocatorBase, Layout, MemoryBreakdown, SeqSpec
from allocators.block_pool import BlockPool
from allocators.cpu_tier import CpuTier
from allocators.holes import uniform_hole_stats
from allocators.jump_integral import paged_breakdown_integral
from allocators.ledger import DuplicateLedger
from allocators.prefix_keys import block_pieces, extended_block_keys, sequence_block_keys
from allocators.seq_arrays import ceil_div, check_live_seq, check_new_seq, ensure_rows, grown
from allocators.seq_kernels import (
    LOOPS_COMPILED,
    flag_view,
    grow_quiet,
    lean_append,
    longest_length,
    pop_into_row,
    release_row_to_tail,
    typed_view,
)

_EMPTY_IDS = np.zeros(0, dtype=np.int64)
# `grow`'s ids are an int64 ndarray already on every engine call (`Scheduler.decode_ids`): tested against
# these (module globals, cached lookups) before `np.asarray`, whose call costs ~1,250 instructions
_NDARRAY = np.ndarray
_INT64 = np.dtype(np.int64)
# Up to this many sequences crossing a block boundary in one grow are served by a scalar loop
# (`_append_lean_few`); as Python, measured faster than the vectorised path below about 13 of them
# (`benchmarks/lean_crossover.py`: ~0.6 us per sequence + ~3 us against ~11 us for NumPy). Compiled,
# its loops (PagedState.lean_columns, lean_append_popped) are C and win at any count
# (lean_crossover.py, compiled, a loaded machine: 3-7 us per round against 14-44 us for NumPy, 1 to
# 64 crossings), so every crossing count takes it.
_LEAN_LOOP_MAX_PYTHON = 12
_LEAN_LOOP_MAX = 1 << 62 if LOOPS_COMPILED else _LEAN_LOOP_MAX_PYTHON
# Up to this many sequences in one grow are handled by a scalar loop (`_grow_few`) instead of the
# vectorised tiers: the sequence that just finished its prefill, a chunk's one sequence, a small
# batch. `benchmarks/lean_crossover.py` (second table): the loop costs ~1.2 us + ~0.3 us a sequence
# against ~3 us for the tiers, and stops winning at about 10 sequences. Compiled, the tiers' first
# pass is a C loop (seq_kernels.grow_quiet) and wins from 2 sequences (lean_crossover.py, compiled:
# 1.6-1.8 us against 2.1-5.2 us for 2 to 12), so only one sequence takes the scalar loop.
_SCALAR_GROW_MAX = 1 if LOOPS_COMPILED else 8
# Up to this many prefix-hit blocks are counted live in a scalar loop (`_live_hits`), more with NumPy.
_SCALAR_HITS_MAX = 48
# tuple.__new__: builds a MemoryBreakdown from its checked parts without its Python __new__ (`breakdown`)
_new_tuple = tuple.__new__


@cython.ccall  # a C call from admission and demand_tokens here; hybrid_caching calls it from Python
def _has_named_content(seq: SeqSpec) -> bool:
    """Whether any prompt token is named (hash blocks or a shared prefix), as prefix_keys decides.

    Most requests have none: admission then skips the key, hit and piece machinery altogether.
    """
    return (
        bool(seq.block_hashes and seq.block_hash_tokens > 0)
        or (seq.prefix_group >= 0 and seq.prefix_tokens > 0)
        or seq.content_key is not None
    )


def _cached_block_keys(seq: SeqSpec, block_size: int) -> tuple[Hashable, ...]:
    """Prompt block names; cached because the engine asks demand_tokens then admit for one seq.

    The cache is keyed by the fields the names depend on only (prefix_keys.sequence_block_keys): the
    engine asks demand_tokens with a placeholder seq id and no first chunk, then admits the same
    prompt under its real id and chunk, and releases it with its limits, so a whole-SeqSpec key
    would miss every time.
    """
    return _block_keys_of_content(
        seq.prompt_tokens,
        seq.prefix_group,
        seq.prefix_tokens,
        seq.block_hashes,
        seq.block_hash_tokens,
        seq.content_key,
        seq.content_prompt_tokens,
        seq.sample,
        block_size,
    )


@functools.lru_cache(maxsize=256)
def _block_keys_of_content(
    prompt_tokens: int,
    prefix_group: int,
    prefix_tokens: int,
    block_hashes: tuple[int, ...],
    block_hash_tokens: int,
    content_key: tuple | None,
    content_prompt_tokens: int,
    sample: int,
    block_size: int,
) -> tuple[Hashable, ...]:
    """Prompt block names of a prompt with this content (`_cached_block_keys`' cached part)."""
    seq = SeqSpec(
        0,
        prompt_tokens,
        0,
        0,
        prefix_group=prefix_group,
        prefix_tokens=prefix_tokens,
        block_hashes=block_hashes,
        block_hash_tokens=block_hash_tokens,
        content_key=content_key,
        content_prompt_tokens=content_prompt_tokens,
        sample=sample,
    )
    return tuple(sequence_block_keys(seq, block_size))


def _cached_block_pieces(
    seq: SeqSpec, block_size: int, skip_whole_blocks: bool
) -> dict[int, list[tuple[Hashable, int]]]:
    """prefix_keys.block_pieces of a prompt with named content, cached; read-only (shared between calls).

    Why: admission asks it for every request, and the pieces depend only on the named stretches
    (prefix_keys.named_segments), which the prompt length cuts only when it ends inside them: a
    prompt at least as long as its named content has the same pieces at any length, so the cache
    is keyed by the prompt length capped there (most prompts then share one entry per prefix).
    """
    prompt = seq.prompt_tokens
    if seq.block_hashes and seq.block_hash_tokens > 0:
        named_extent = len(seq.block_hashes) * seq.block_hash_tokens
    elif seq.prefix_group >= 0 and seq.prefix_tokens > 0:
        named_extent = seq.prefix_tokens
    else:
        return {}
    return _block_pieces_of_content(
        min(prompt, named_extent),
        seq.prefix_group,
        seq.prefix_tokens,
        seq.block_hashes,
        seq.block_hash_tokens,
        block_size,
        skip_whole_blocks,
    )


@functools.lru_cache(maxsize=256)
def _block_pieces_of_content(
    prompt_tokens: int,
    prefix_group: int,
    prefix_tokens: int,
    block_hashes: tuple[int, ...],
    block_hash_tokens: int,
    block_size: int,
    skip_whole_blocks: bool,
) -> dict[int, list[tuple[Hashable, int]]]:
    """`_cached_block_pieces`' cached part."""
    seq = SeqSpec(
        0,
        prompt_tokens,
        0,
        0,
        prefix_group=prefix_group,
        prefix_tokens=prefix_tokens,
        block_hashes=block_hashes,
        block_hash_tokens=block_hash_tokens,
    )
    return block_pieces(seq, block_size, skip_whole_blocks=skip_whole_blocks)


@cython.cclass
class PagedState:
    """The paged allocator's running totals over its live sequences and typed views of its
    per-sequence arrays, with one sequence's stores at admission and release.

    Why an object of its own: compiled, this is an extension type whose fields are C integers and
    typed memoryviews, so the allocator's per-request and per-turn methods (admission, release, growth,
    `breakdown`), which declare their local `state` of this type, read and update them as C fields
    and call `admit_row` and `clear_row` as C functions; an attribute of the allocator itself is a
    dict lookup and a Python int each time, and a typed loop in seq_kernels acquires each view it is
    passed (the allocator cannot be an extension type: its base, AllocatorBase, is a Python class).
    As Python it is a plain object, the views the arrays themselves (seq_kernels.typed_view).
    """

    stored_tokens = cython.declare(cython.longlong, visibility="public")  # sum of lengths
    # sum of blocks x block_size, per holder (a shared block counts per holder)
    held_slots = cython.declare(cython.longlong, visibility="public")
    # sum of slots past the final token in held blocks (internal waste)
    never_tokens = cython.declare(cython.longlong, visibility="public")
    # live sequences (live.sum()): the jump integral asks whether its ids are all of them
    num_live = cython.declare(cython.longlong, visibility="public")
    # Views of the allocator's arrays, set by `set_views` from its `_views` and `_flag_views`, valid
    # while those are (PagedAllocator._make_views): lengths, quiet limits, lean caps, block counts,
    # table slots, final lengths, final_block_from, final tails, live (uint8), prefix hits, block table.
    lengths = cython.declare(cython.longlong[:])
    quiet = cython.declare(cython.longlong[:])
    caps = cython.declare(cython.longlong[:])
    num_blocks = cython.declare(cython.longlong[:])
    slots = cython.declare(cython.longlong[:])
    final = cython.declare(cython.longlong[:])
    block_from = cython.declare(cython.longlong[:])
    tail = cython.declare(cython.longlong[:])
    live = cython.declare(cython.uchar[:])
    prefix_hit = cython.declare(cython.longlong[:])
    table = cython.declare(cython.int[:, :])  # the block table
    # Views of the block pool's arrays (BlockPool._views: never replaced): its free queue's entries and
    # in-queue flags (uint8), the refcounts and has_key (uint8), for the lean append's in-place pop.
    entries = cython.declare(cython.longlong[:])
    in_queue = cython.declare(cython.uchar[:])
    refcount = cython.declare(cython.int[:])
    has_key = cython.declare(cython.uchar[:])

    def __init__(self) -> None:
        self.stored_tokens = 0
        self.held_slots = 0
        self.never_tokens = 0
        self.num_live = 0

    def __reduce__(self) -> tuple:
        """Pickle and deepcopy (the jump integral's stepped reference): the totals only; the copy's
        owner sets its views from its own arrays (its `_views` are None after `__getstate__`)."""
        return (_restored_state, (self.stored_tokens, self.held_slots, self.never_tokens, self.num_live))

    def set_views(self, views: tuple, flag_views: tuple, pool_views: tuple) -> None:
        """Take the allocator's fresh typed views (`PagedAllocator._make_views`: its `_views` and
        `_flag_views`) and its pool's (`BlockPool._views`)."""
        self.lengths = views[0]
        self.quiet = views[1]
        self.caps = views[2]
        self.num_blocks = views[3]
        self.slots = views[4]
        self.final = views[5]
        self.block_from = views[6]
        self.tail = views[7]
        self.table = views[8]
        self.live = flag_views[0]
        self.prefix_hit = flag_views[1]
        self.entries = pool_views[0]
        self.in_queue = pool_views[1]
        self.refcount = pool_views[2]
        self.has_key = pool_views[3]

    @cython.ccall
    @cython.locals(
        seq_id=cython.Py_ssize_t,
        length=cython.longlong,
        blocks=cython.longlong,
        final_length=cython.longlong,
        quiet_limit=cython.longlong,
        cap=cython.longlong,
        block_size=cython.longlong,
        tail_slots=cython.longlong,
        held=cython.longlong,
        never=cython.longlong,
    )
    def admit_row(
        self,
        seq_id: int,
        length: int,
        blocks: int,
        final_length: int,
        quiet_limit: int,
        cap: int,
        block_size: int,
    ) -> None:
        """A new sequence's row (`PagedAllocator._admit_plain`'s stores): live, its length and block
        count, final length with its tail and block_from (as `_set_final`), no prefix hit, quiet limit
        and lean cap; and its share of the running totals (`_count_in(seq_id, 1)`)."""
        tail_slots = -final_length % block_size  # Python's floor modulo on both paths (cdivision is off)
        self.live[seq_id] = 1
        self.lengths[seq_id] = length
        self.num_blocks[seq_id] = blocks
        self.final[seq_id] = final_length
        self.tail[seq_id] = tail_slots
        self.block_from[seq_id] = final_length + tail_slots - block_size + 1
        self.prefix_hit[seq_id] = 0
        self.quiet[seq_id] = quiet_limit
        self.caps[seq_id] = cap
        held = blocks * block_size
        never = held - (final_length if final_length > length else length)
        self.stored_tokens += length
        self.held_slots += held
        self.never_tokens += never if never > 0 else 0
        self.num_live += 1

    @cython.ccall
    @cython.locals(
        seq_id=cython.Py_ssize_t,
        block_size=cython.longlong,
        length=cython.longlong,
        held=cython.longlong,
        final_length=cython.longlong,
        never=cython.longlong,
    )
    def clear_row(self, seq_id: int, block_size: int) -> None:
        """A released sequence's row back to "no sequence" (not live, length and blocks 0, no table
        slot, quiet limit 0 (a dead id is never quiet: growing it takes the general path), lean cap
        -1), and its share of the running totals taken out (`_count_in(seq_id, -1)`)."""
        length = self.lengths[seq_id]
        held = self.num_blocks[seq_id] * block_size
        final_length = self.final[seq_id]
        never = held - (final_length if final_length > length else length)
        self.live[seq_id] = 0
        self.lengths[seq_id] = 0
        self.num_blocks[seq_id] = 0
        self.slots[seq_id] = -1
        self.quiet[seq_id] = 0
        self.caps[seq_id] = -1
        self.stored_tokens -= length
        self.held_slots -= held
        self.never_tokens -= never if never > 0 else 0
        self.num_live -= 1

    @cython.ccall
    @cython.locals(
        seq_ids=list,
        index=cython.Py_ssize_t,
        seq_id=cython.Py_ssize_t,
        columns=cython.longlong,
    )
    def lean_columns(self, seq_ids: list[int]) -> int:
        """Block-table columns that one more block each needs (max blocks held + 1), or -1 when a
        sequence (already grown) is past its lean cap (`PagedAllocator._append_lean_few`'s test)."""
        columns = 0
        for index in range(len(seq_ids)):
            seq_id = seq_ids[index]
            if self.lengths[seq_id] > self.caps[seq_id]:
                return -1
            if self.num_blocks[seq_id] + 1 > columns:
                columns = self.num_blocks[seq_id] + 1
        if not cython.compiled:  # a Python int, as from C (the arrays' items are NumPy scalars)
            return int(columns)
        return columns

    @cython.ccall
    @cython.locals(
        seq_ids=list,
        block_size=cython.longlong,
        head=cython.Py_ssize_t,
        evicted=list,
        index=cython.Py_ssize_t,
        seq_id=cython.Py_ssize_t,
        block=cython.Py_ssize_t,
        have=cython.longlong,
        held=cython.longlong,
        cap=cython.longlong,
        never=cython.longlong,
    )
    def lean_append_popped(self, seq_ids: list[int], block_size: int, head: int, evicted: list[int]) -> int:
        """The pool's pop of len(seq_ids) blocks from entries[head:] (in_queue cleared, refcount 1, a
        cached block's has_key cleared and the block appended to `evicted`, in order) and the lean
        append of them, block i to seq_ids[i] (table, block count, quiet limit), in one pass; returns the
        never-filled slots added (`PagedAllocator._append_lean_few` when the queue's head is clean).
        `seq_kernels.pop_blocks` then `lean_append`, fused."""
        never = 0
        for index in range(len(seq_ids)):
            block = self.entries[head + index]
            self.in_queue[block] = 0
            self.refcount[block] = 1
            if self.has_key[block]:
                self.has_key[block] = 0
                evicted.append(int(block))
            seq_id = seq_ids[index]
            have = self.num_blocks[seq_id]
            self.table[self.slots[seq_id], have] = block
            self.num_blocks[seq_id] = have + 1
            held = (have + 1) * block_size
            if held > self.final[seq_id]:
                never += held - self.final[seq_id]
            cap = self.caps[seq_id]
            self.quiet[seq_id] = held if held < cap else cap
        if not cython.compiled:  # a Python int, as from C: it goes into the running totals
            return int(never)
        return never

    @cython.cfunc
    @cython.locals(
        slot=cython.Py_ssize_t,
        count=cython.Py_ssize_t,
        head=cython.Py_ssize_t,
        evicted=list,
        index=cython.Py_ssize_t,
        block=cython.Py_ssize_t,
    )
    def pop_into_row(self, slot: int, count: int, head: int, evicted: list[int]) -> None:
        """The pool's pop of `count` blocks from entries[head:] into table[slot, :count] (in_queue
        cleared, refcount 1, a cached block's has_key cleared and the block appended to `evicted`, in
        order): `seq_kernels.pop_into_row` on the views kept here (`PagedAllocator._admit_plain` when the
        queue's head is clean).

        Why here: called from seq_kernels, the loop acquired five typed views per admission (~5,000
        instructions with the call's argument parsing, callgrind); these views are C fields already.
        As Python it is that function's NumPy branch, on the same arrays.
        """
        if not cython.compiled:
            pop_into_row(
                self.entries,
                self.in_queue,
                self.refcount,
                self.has_key,
                head,
                count,
                self.table,
                slot,
                evicted,
            )
            return
        for index in range(count):
            block = self.entries[head + index]
            self.in_queue[block] = 0
            self.refcount[block] = 1
            if self.has_key[block]:
                self.has_key[block] = 0
                evicted.append(block)
            self.table[slot, index] = block

    @cython.cfunc
    @cython.locals(
        seq_id=cython.Py_ssize_t,
        tail=cython.Py_ssize_t,
        slot=cython.Py_ssize_t,
        index=cython.Py_ssize_t,
        num_freed=cython.Py_ssize_t,
        block=cython.Py_ssize_t,
        left=cython.int,
    )
    def release_row_to_tail(self, seq_id: int, tail: int) -> int:
        """A released sequence's block-table row, last block first: emptied (-1), one reference dropped
        from each block, the freed ones pushed at the pool's entries[tail:] (in_queue 1); returns how
        many were freed. `seq_kernels.release_row_to_tail` on the views kept here
        (`PagedAllocator.release` when the pool's fast release applies: no caching, no stale entries).

        Why here: the same reason as `pop_into_row` (four typed views acquired per release).
        """
        slot = self.slots[seq_id]
        if not cython.compiled:
            return release_row_to_tail(
                self.table,
                slot,
                int(self.num_blocks[seq_id]),
                self.refcount,
                self.entries,
                self.in_queue,
                tail,
            )
        num_freed = 0
        for index in range(self.num_blocks[seq_id] - 1, -1, -1):
            block = self.table[slot, index]
            self.table[slot, index] = -1
            left = self.refcount[block] - 1
            self.refcount[block] = left
            if left == 0:
                self.entries[tail + num_freed] = block
                self.in_queue[block] = 1
                num_freed += 1
        return num_freed

    @cython.cfunc
    @cython.locals(
        seq_ids=cython.const_longlong[:],
        num_tokens=cython.longlong,
        index=cython.Py_ssize_t,
        seq_id=cython.Py_ssize_t,
        grown_length=cython.longlong,
    )
    def grow_quiet(self, seq_ids: np.ndarray, num_tokens: int) -> list[int]:
        """lengths[s] += num_tokens for each s of `seq_ids`; returns (in order) those grown past their
        quiet limit: `seq_kernels.grow_quiet` on the views kept here (`PagedAllocator.grow`'s first tier).

        Why here: called from seq_kernels, the loop acquired three typed views per grow (the two kept
        ones ~570 instructions each, callgrind) and parsed four arguments; here only `seq_ids` is
        acquired. As Python it is that function's NumPy branch, on the same arrays.
        """
        if not cython.compiled:
            return grow_quiet(self.lengths, self.quiet, seq_ids, num_tokens)
        events: list[int] = []
        for index in range(seq_ids.shape[0]):
            seq_id = seq_ids[index]
            grown_length = self.lengths[seq_id] + num_tokens
            self.lengths[seq_id] = grown_length
            if grown_length > self.quiet[seq_id]:
                events.append(seq_id)
        return events


def _restored_state(stored_tokens: int, held_slots: int, never_tokens: int, num_live: int) -> PagedState:
    """A PagedState with these totals and no views (`PagedState.__reduce__`)."""
    state = PagedState()
    state.stored_tokens = stored_tokens
    state.held_slots = held_slots
    state.never_tokens = never_tokens
    state.num_live = num_live
    return state


class PagedAllocator(AllocatorBase):
    """Block pool + block tables + refcounts + prefix sharing/caching."""

    # Honours SeqSpec.first_chunk_tokens: admission holds the hits plus the first chunk only (vLLM v1
    # kv_cache_manager.py `allocate_slots` is called per scheduled chunk with num_new_tokens).
    allocates_per_chunk = True

    def __init__(
        self,
        name: str,
        capacity_tokens: int,
        block_size: int,
        enable_prefix_caching: bool = False,
        share_prefixes: bool = True,
        fork_copies: bool = False,
        max_model_len: int | None = None,
        cpu_tier_tokens: int | None = None,
    ) -> None:
        self.name = name
        self.capacity_tokens = capacity_tokens
        self.block_size = block_size
        self.num_blocks = capacity_tokens // block_size
        self.enable_prefix_caching = enable_prefix_caching
        # swap moves whole blocks; with caching every full block (prompt or generated) is named by content
        self.swap_block_tokens = block_size
        self.content_identity = enable_prefix_caching
        self.share_prefixes = share_prefixes
        self.fork_copies = fork_copies
        self.max_model_len = max_model_len
        self.pool = BlockPool(self.num_blocks, enable_caching=enable_prefix_caching)
        self._ledger = DuplicateLedger()
        self._block_content: dict[int, list[Hashable]] = {}  # block -> ledger keys it holds
        self._has_content = np.zeros(self.num_blocks, dtype=bool)
        # live sequences with a content identity (SeqSpec.content_key): their blocks filled after
        # admission (decode, later chunks) are named at release, see `_name_filled_blocks`
        self._content_of: dict[int, SeqSpec] = {}
        # The CPU tier under the prefix cache (allocators/cpu_tier.py; None: no tier), and per live
        # sequence the index of its next block to store there (vLLM `_next_stored_block_idx`).
        self.cpu_tier: CpuTier | None = (
            None if cpu_tier_tokens is None else CpuTier(cpu_tier_tokens // block_size, block_size)
        )
        self._tier_next_block: dict[int, int] = {}
        # live sequences whose prompt is still arriving chunk by chunk (per-chunk admission), with
        # their prompt length: the tier stores each chunk's full blocks as it is computed
        self._tier_prefilling: dict[int, int] = {}
        self.live = np.zeros(0, dtype=bool)
        self.lengths_tokens = np.zeros(0, dtype=np.int64)
        self.num_seq_blocks = np.zeros(0, dtype=np.int64)
        self.final_tokens = np.zeros(0, dtype=np.int64)
        # slots after the final token in its block, (-final) % block_size: fixed per sequence, kept so
        # the jump integral need not recompute it every jump; final_block_from_tokens = final + tail -
        # block_size + 1, the length at which the block holding the final token is appended
        self.final_tail_tokens = np.zeros(0, dtype=np.int64)
        self.final_block_from_tokens = np.zeros(0, dtype=np.int64)
        self.prefix_hit = np.zeros(0, dtype=np.int64)
        self.cow_flag = np.zeros(0, dtype=bool)  # last block may be a shared partial block (forks)
        self._num_cow_flagged = 0
        # Growth limits per sequence (see the module docstring), in tokens:
        # _lean_cap_tokens = min(final, max_model_len): growing up to it at most appends blocks (past
        #   the final length internal waste changes per token); -1 while copy-on-write is pending.
        # quiet_limit_tokens = min(held slots, lean cap): growing up to it changes only the length
        #   (0 for dead ids and -1 caps: any growth takes the general path).
        self.quiet_limit_tokens = np.zeros(0, dtype=np.int64)
        self._lean_cap_tokens = np.zeros(0, dtype=np.int64)
        # Totals over live sequences, kept in step with every change so `breakdown` need not scan
        self._state = PagedState()
        # Block tables live in rows ("slots") recycled across sequences, so the table is
        # (live sequences x longest table), not (every seq id ever seen x longest table).
        self.table_slot = np.zeros(0, dtype=np.int64)  # seq id -> row of _tables
        self._tables = np.full((0, 8), -1, dtype=np.int32)
        self._free_slots: list[int] = []
        self._next_slot = 0
        # Typed views (seq_kernels.typed_view) of lengths, quiet limits, lean caps, block counts, table
        # slots, final lengths, final_block_from, final tails and the block table, in that order, for
        # the typed loops; None after any of those arrays is replaced (`_ensure_rows`, `_ensure_columns`,
        # `_take_slot`), rebuilt by `_make_views` when next needed. `_flag_views`: views of `live` (as
        # uint8, seq_kernels.flag_view) and prefix_hit, made with `_views` (valid whenever it is).
        self._views: tuple | None = None
        self._flag_views: tuple | None = None

    # ---- per-sequence arrays -------------------------------------------------------------
    # Every array indexed by seq id, with its "no sequence" value (seq_arrays.ensure_rows keeps them in step).
    _ROW_FILLS: dict[str, int | bool] = {
        "live": False,
        "lengths_tokens": 0,
        "num_seq_blocks": 0,
        "final_tokens": 0,
        "final_tail_tokens": 0,
        "final_block_from_tokens": 0,
        "prefix_hit": 0,
        "cow_flag": False,
        "table_slot": -1,
        "quiet_limit_tokens": 0,
        "_lean_cap_tokens": -1,
    }

    def _ensure_rows(self, seq_id: int) -> None:
        if seq_id >= self.live.shape[0]:  # the arrays are replaced by longer ones
            ensure_rows(self, seq_id, self._ROW_FILLS)
            self._views = None
            self._flag_views = None

    def _ensure_columns(self, num_blocks: int) -> None:
        cols = self._tables.shape[1]
        if num_blocks <= cols:
            return
        new_cols = max(num_blocks, 2 * cols)
        table = np.full((self._tables.shape[0], new_cols), -1, dtype=np.int32)
        table[:, :cols] = self._tables
        self._tables = table
        self._views = None

    def _make_views(self) -> tuple:
        """`_views`, made afresh from the current arrays (after one was replaced)."""
        self._views = tuple(
            typed_view(array)
            for array in (
                self.lengths_tokens,
                self.quiet_limit_tokens,
                self._lean_cap_tokens,
                self.num_seq_blocks,
                self.table_slot,
                self.final_tokens,
                self.final_block_from_tokens,
                self.final_tail_tokens,
                self._tables,
            )
        )
        self._flag_views = (flag_view(self.live), typed_view(self.prefix_hit))
        self._state.set_views(self._views, self._flag_views, self.pool._views or self.pool._make_views())
        return self._views

    def __getstate__(self) -> dict:
        """State without the typed views (deepcopy, as the jump integral's stepped reference takes,
        and pickling): a copy makes its own from its own arrays."""
        state = self.__dict__.copy()
        state["_views"] = None
        state["_flag_views"] = None
        return state

    def _take_slot(self, seq_id: int) -> int:
        """A block-table row for a new live sequence (reusing released rows first)."""
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = self._next_slot
            self._next_slot += 1
            if slot >= self._tables.shape[0]:
                self._tables = grown(self._tables, slot + 1, -1)
                self._views = None
        self.table_slot[seq_id] = slot
        return slot

    def block_table_of(self, seq_id: int) -> np.ndarray:
        """Physical block ids of a live sequence, in order (a copy)."""
        return self._tables[self.table_slot[seq_id], : self.num_seq_blocks[seq_id]].astype(np.int64)

    def _set_final(self, seq_id: int, final: int) -> None:
        """Store a new sequence's final length and the fixed quantities the jump integral derives from it."""
        tail = -final % self.block_size
        self.final_tokens[seq_id] = final
        self.final_tail_tokens[seq_id] = tail
        self.final_block_from_tokens[seq_id] = final + tail - self.block_size + 1

    # ---- running totals and growth limits ------------------------------------------------------
    def _count_in(self, seq_id: int, sign: int) -> None:
        """Add (sign 1) or remove (sign -1) one live sequence's share of the running totals."""
        length = self.lengths_tokens.item(seq_id)
        held = self.num_seq_blocks.item(seq_id) * self.block_size
        self._state.stored_tokens += sign * length
        self._state.held_slots += sign * held
        self._state.never_tokens += sign * max(0, held - max(self.final_tokens.item(seq_id), length))

    def _totals_of(self, seq_ids: np.ndarray) -> tuple[int, int, int]:
        """(tokens, held slots, never-filled slots) of these sequences, for updating the totals."""
        lengths = self.lengths_tokens[seq_ids]
        held = self.num_seq_blocks[seq_ids] * self.block_size
        never = np.maximum(0, held - np.maximum(self.final_tokens[seq_ids], lengths))
        return int(lengths.sum()), int(held.sum()), int(never.sum())

    def _set_limits_of(self, seq_id: int) -> None:
        """`_set_limits` for one sequence, in Python ints (admission runs it once per request)."""
        final = self.final_tokens.item(seq_id)
        cap = final if self.max_model_len is None else min(final, self.max_model_len)
        quiet = min(self.num_seq_blocks.item(seq_id) * self.block_size, cap)
        if self._num_cow_flagged and self.cow_flag[seq_id]:
            quiet, cap = self.lengths_tokens.item(seq_id), -1
        self.quiet_limit_tokens[seq_id] = quiet
        self._lean_cap_tokens[seq_id] = cap

    def _set_limits(self, seq_ids: np.ndarray) -> None:
        """Recompute the growth limits of these sequences from their current state."""
        final = self.final_tokens[seq_ids]
        cap = final if self.max_model_len is None else np.minimum(final, self.max_model_len)
        quiet = np.minimum(self.num_seq_blocks[seq_ids] * self.block_size, cap)
        if self._num_cow_flagged:  # a pending copy-on-write makes any growth an event
            cow = self.cow_flag[seq_ids]
            quiet = np.where(cow, self.lengths_tokens[seq_ids], quiet)
            cap = np.where(cow, -1, cap)
        self.quiet_limit_tokens[seq_ids] = quiet
        self._lean_cap_tokens[seq_ids] = cap

    # ---- content ledger (duplicates) -------------------------------------------------------
    def _hold_pieces(self, block: int, pieces: list[tuple[Hashable, int]]) -> None:
        """`block` (live) now holds these named pieces of a prompt: one more copy of each."""
        if not pieces:
            return
        for key, tokens in pieces:
            self._ledger.add(key, tokens)
        self._block_content[block] = [key for key, _ in pieces]
        self._has_content[block] = True

    def _drop_content(self, blocks: np.ndarray) -> None:
        if not self._block_content:  # no named content anywhere (no shared prompts): nothing to drop
            return
        for block in blocks[self._has_content[blocks]].tolist():
            for key in self._block_content.pop(block):
                self._ledger.remove(key)
            self._has_content[block] = False

    def _copy_content(self, source: int, copy: int, copied_tokens: int) -> None:
        """`copy` now holds the first `copied_tokens` tokens of `source`: name them, hold them twice."""
        keys = self._block_content.get(source, [])
        covered = sum(self._ledger.tokens_of(key) for key in keys)
        if copied_tokens > covered:
            new_key = self._ledger.new_key("copy")
            self._ledger.add(new_key, copied_tokens - covered)
            keys = [*keys, new_key]
            self._block_content[source] = keys
            self._has_content[source] = True
        for key in keys:
            self._ledger.add(key, self._ledger.tokens_of(key))
        self._block_content[copy] = list(keys)
        self._has_content[copy] = bool(keys)

    # ---- admission ---------------------------------------------------------------------------
    def _prefix_hits(self, seq: SeqSpec) -> tuple[tuple[Hashable, ...], list[int]]:
        """The prompt's block names and the blocks already holding its leading named blocks."""
        if not _has_named_content(seq):
            return (), []
        keys = _cached_block_keys(seq, self.block_size)
        return keys, (self.pool.leading_hits(keys) if self.share_prefixes else [])

    def _blocks_from_free(self, seq: SeqSpec) -> int:
        _, hits = self._prefix_hits(seq)
        return -(-seq.prompt_tokens // self.block_size) - self._live_hits(hits)

    def _live_hits(self, hits: list[int]) -> int:
        """How many of the hit blocks are live (held by a sequence).

        In scalars for a short hit (timeit, 9 hits: 1.0 us against 6.7 us for the gather, compare
        and sum); with NumPy past `_SCALAR_HITS_MAX` hits, where the loop's ~0.1 us a block loses.
        """
        refcount = self.pool.refcount
        if len(hits) > _SCALAR_HITS_MAX:
            return int((refcount[np.asarray(hits, dtype=np.int64)] > 0).sum())
        return sum([refcount.item(block) > 0 for block in hits])

    def demand_tokens(self, seq: SeqSpec) -> int:
        """Blocks the prompt needs from the free pool (not already live-shared) x block_size."""
        if not _has_named_content(seq):  # nothing shareable: every prompt block (asked per arrival)
            return -(-seq.prompt_tokens // self.block_size) * self.block_size
        return self._blocks_from_free(seq) * self.block_size

    def rejection_reason(self, seq: SeqSpec) -> str:
        """Why `seq` could never be admitted, even into an empty cache ("" when it could)."""
        if self.max_model_len is not None and seq.prompt_tokens > self.max_model_len:
            return "prompt_exceeds_max_model_len"
        if int(ceil_div(seq.prompt_tokens, self.block_size)) > self.num_blocks:
            return "demand_exceeds_capacity"
        return ""

    def admit(self, seq: SeqSpec) -> bool:
        check_new_seq(self, seq.seq_id)
        if self.max_model_len is not None and seq.prompt_tokens > self.max_model_len:
            return False
        if not _has_named_content(seq):
            return self._admit_plain(seq)
        keys, hits = self._prefix_hits(seq)
        loaded = self._cpu_hit_blocks(seq, keys, len(hits)) if self.cpu_tier is not None else 0
        held_tokens = self._held_at_admission(seq, len(hits) + loaded)
        prompt_blocks = int(ceil_div(held_tokens, self.block_size))  # held now (the prompt but per chunk)
        hit_blocks = np.asarray(hits, dtype=np.int64) if hits else _EMPTY_IDS
        live_hits = self._live_hits(hits)
        if prompt_blocks - live_hits > self.pool.num_free:
            return False
        # named pieces that could be duplicates (with sharing, whole named blocks never are)
        pieces = _cached_block_pieces(seq, self.block_size, self.share_prefixes)
        revived = self.pool.touch(hit_blocks) if hits else _EMPTY_IDS
        if pieces and revived.size:  # a cached block is live content again
            revived_set = set(revived.tolist())
            for index, block in enumerate(hits):
                if block in revived_set and index in pieces:
                    self._hold_pieces(block, pieces[index])
        new_blocks = self.pool.allocate(prompt_blocks - hit_blocks.size)
        named_full = min(len(keys), held_tokens // self.block_size)  # full named blocks held now
        if self.share_prefixes and named_full > hit_blocks.size:
            self.pool.register_many(
                new_blocks[: named_full - hit_blocks.size], keys[hit_blocks.size : named_full]
            )
        for index, block_pieces_here in pieces.items():
            if hit_blocks.size <= index < prompt_blocks:
                self._hold_pieces(int(new_blocks[index - hit_blocks.size]), block_pieces_here)
        sid = seq.seq_id
        self._ensure_rows(sid)
        self._ensure_columns(prompt_blocks)
        slot = self._take_slot(sid)  # may grow self._tables: index after
        row = self._tables[slot]
        if hits:
            row[: hit_blocks.size] = hit_blocks
        row[hit_blocks.size : prompt_blocks] = new_blocks
        self.live[sid] = True
        self._state.num_live += 1
        self.lengths_tokens[sid] = held_tokens
        self.num_seq_blocks[sid] = prompt_blocks
        self._set_final(sid, seq.final_tokens)
        # A full hit still computes the last prompt token, and computed tokens are whole blocks: at
        # most (prompt - 1) // block_size blocks count as hits (vLLM v1 kv_cache_manager.py
        # `get_computed_blocks`: max_cache_hit_length = num_tokens - 1, then whole blocks). The
        # recomputed block still shares memory here (vLLM writes a second copy of it: one block).
        self.prefix_hit[sid] = (
            min(hit_blocks.size + loaded, (seq.prompt_tokens - 1) // self.block_size) * self.block_size
        )
        if seq.content_key is not None and self.enable_prefix_caching:
            self._content_of[sid] = seq
        if self.cpu_tier is not None:
            self._tier_admitted(seq, keys, hit_blocks.size, loaded, named_full)
        self._count_in(sid, 1)
        self._set_limits_of(sid)
        return True

    def _cpu_hit_blocks(self, seq: SeqSpec, keys: tuple[Hashable, ...], gpu_hit_blocks: int) -> int:
        """Blocks to load from the CPU tier: its run of the prompt's keys after the GPU hit.

        Capped, like the GPU hit, at the whole blocks before the prompt's last token, which is always
        computed (vLLM `Scheduler._update_waiting_for_remote_kv` drops one token of a full hit; kvsim
        drops the whole block, as for GPU hits: kv_cache_manager.py `get_computed_blocks`).
        """
        room = (seq.prompt_tokens - 1) // self.block_size - gpu_hit_blocks
        if room <= 0 or not keys:
            return 0
        return min(room, self.cpu_tier.run_length(keys, gpu_hit_blocks))  # type: ignore[union-attr]

    def _tier_admitted(
        self, seq: SeqSpec, keys: tuple[Hashable, ...], gpu_hit_blocks: int, loaded: int, named_full: int
    ) -> None:
        """The CPU tier's side of an admission: count the lookup, store the blocks computed now.

        vLLM (offloading_connector.py `OffloadingConnectorScheduler`): a request that loaded CPU
        blocks stores from the end of its hit on (`update_state_after_alloc` sets
        `_next_stored_block_idx`); any other stores every full block scheduled so far, GPU hits
        included, and the tier skips what it holds (`_get_reqs_to_store`, `prepare_store`). Its
        keys are touched, head last (`get_num_new_matched_tokens` and the store both touch).
        """
        tier = self.cpu_tier
        assert tier is not None
        gpu_hit_tokens = min(gpu_hit_blocks, (seq.prompt_tokens - 1) // self.block_size) * self.block_size
        tier.record_admission(seq.prompt_tokens, gpu_hit_tokens, loaded)
        first = gpu_hit_blocks + loaded if loaded else 0
        tier.store(keys[first:named_full])
        tier.touch(keys[:named_full])
        self._tier_next_block[seq.seq_id] = max(named_full, first)
        if self.lengths_tokens.item(seq.seq_id) < seq.prompt_tokens and seq.seq_id in self._content_of:
            self._tier_prefilling[seq.seq_id] = seq.prompt_tokens  # the rest comes chunk by chunk

    def _held_at_admission(self, seq: SeqSpec, hit_blocks: int) -> int:
        """Tokens a new sequence holds at admission: its prompt, or (per chunk) its hits + first chunk."""
        if seq.first_chunk_tokens <= 0:
            return seq.prompt_tokens
        hit_tokens = min(hit_blocks, (seq.prompt_tokens - 1) // self.block_size) * self.block_size
        return hit_tokens + min(seq.prompt_tokens - hit_tokens, seq.first_chunk_tokens)

    @cython.locals(state=PagedState)
    def _admit_plain(self, seq: SeqSpec) -> bool:
        """`admit` for a prompt with no named content (most requests), in Python scalars.

        Why: with nothing to share or cache there are no hits, pieces or keys, so admission is a
        block allocation plus a few scalar stores; this does exactly what the general path does for
        such a prompt (same blocks, totals and limits) without its array and helper calls.
        """
        state = self._state
        bs = self.block_size
        sid = seq.seq_id
        prompt = (
            seq.prompt_tokens
            if seq.first_chunk_tokens <= 0
            else min(seq.prompt_tokens, seq.first_chunk_tokens)
        )
        prompt_blocks = -(-prompt // bs)
        pool = self.pool
        if prompt_blocks > pool.queue.num_free:
            return False
        if sid >= self.live.shape[0]:  # `_ensure_rows`' and `_ensure_columns`' tests, without the calls
            self._ensure_rows(sid)
        if prompt_blocks > self._tables.shape[1]:
            self._ensure_columns(prompt_blocks)
        slot = self._take_slot(sid)  # may grow self._tables: views after
        if self._views is None:  # the state's views are fresh from here on
            self._make_views()
        head = pool.clean_head(prompt_blocks)
        if head < 0:  # stale head entries: the pool's general pop
            self._tables[slot, :prompt_blocks] = pool.allocate(prompt_blocks)
        else:  # `BlockPool.allocate_into_row`'s pass, on the state's views
            evicted: list[int] = []
            state.pop_into_row(slot, prompt_blocks, head, evicted)
            pool.popped_at_head(prompt_blocks, evicted)
        final = seq.final_tokens
        if self.cpu_tier is not None:  # nothing named, nothing to store: the lookup still counts
            self.cpu_tier.record_admission(seq.prompt_tokens, 0, 0)
        # _set_limits_of(sid), from the values stored below
        held = prompt_blocks * bs
        cap = final if self.max_model_len is None else min(final, self.max_model_len)
        quiet = min(held, cap)
        if self._num_cow_flagged and self.cow_flag[sid]:
            quiet, cap = prompt, -1
        # live, length, blocks, final length (with `_set_final`'s tail and block_from), no prefix hit,
        # quiet limit, lean cap and `_count_in(sid, 1)`: one C call (the views are fresh: made above)
        state.admit_row(sid, prompt, prompt_blocks, final, quiet, cap, bs)
        return True

    # ---- growth ------------------------------------------------------------------------------
    def _cow_writers(self, seq_ids: np.ndarray, lengths: np.ndarray, have: np.ndarray) -> np.ndarray | None:
        """Bool per sequence: its partial last block is shared (a write must copy it); None if no forks."""
        if self._num_cow_flagged == 0:
            return None
        flagged = self.cow_flag[seq_ids]
        if not flagged.any():
            return None
        cow = np.zeros(seq_ids.size, dtype=np.int64)
        rows = np.flatnonzero(flagged & (lengths % self.block_size != 0))
        last_blocks = self._tables[self.table_slot[seq_ids[rows]], have[rows] - 1]
        cow[rows] = self.pool.refcount[last_blocks] > 1
        return cow

    def _blocks_needed(
        self, seq_ids: np.ndarray, num_tokens: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(lengths, new blocks to append, copy-on-write 0/1 or None, over max_model_len or None)."""
        lengths = self.lengths_tokens[seq_ids]
        extra = (lengths + (num_tokens + self.block_size - 1)) // self.block_size
        have = self.num_seq_blocks[seq_ids]
        extra -= have
        cow = self._cow_writers(seq_ids, lengths, have)
        over = None
        if self.max_model_len is not None and lengths.max() + num_tokens > self.max_model_len:
            over = lengths + num_tokens > self.max_model_len
        return lengths, extra, cow, over

    @cython.locals(state=PagedState)
    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        """Grow each sequence by `num_tokens`; blocks go to sequences in the order given.

        Sequences needing no new block always grow; the others are served first-come until the
        free pool runs out, and the rest fail unchanged (seq ids must be distinct).

        Three tiers, cheapest first, with the same result as the general rule: sequences within
        their quiet limit only change length; if the rest just need one fresh block each and the
        pool has them, they get them in one allocation (`_append_lean`); otherwise the general
        rule (`_grow_general`) handles copy-on-write, max_model_len and running out of blocks.
        """
        state = self._state
        if type(seq_ids) is not _NDARRAY or seq_ids.dtype is not _INT64:  # else `np.asarray` returns it
            seq_ids = np.asarray(seq_ids, dtype=np.int64)
        if num_tokens <= 0 or seq_ids.size == 0:
            return _EMPTY_IDS
        if self._tier_prefilling and seq_ids.size == 1 and seq_ids.item(0) in self._tier_prefilling:
            return self._grow_chunk_stored(seq_ids, num_tokens)
        if seq_ids.size <= _SCALAR_GROW_MAX and num_tokens <= self.block_size:
            return self._grow_few(seq_ids.tolist(), num_tokens)
        if seq_ids.size == 1 and not self._num_cow_flagged and self.live.item(seq_ids.item(0)):
            return self._grow_single(seq_ids.item(0), num_tokens)  # a prefill chunk
        # lengths[ids] += num_tokens, and the sequences grown past their quiet limit, in one loop
        if self._views is None:  # the state's views are fresh from here on
            self._make_views()
        events = state.grow_quiet(seq_ids, num_tokens)
        state.stored_tokens += seq_ids.size * num_tokens
        if not events:
            return _EMPTY_IDS
        if num_tokens <= self.block_size and len(events) <= _LEAN_LOOP_MAX:
            # the few-crossings case is called directly (it is most grows): no extra call layer
            if self._append_lean_few(events):
                return _EMPTY_IDS
            event_ids = np.array(events, dtype=np.int64)
        else:
            event_ids = np.array(events, dtype=np.int64)
            grown_lengths = self.lengths_tokens[event_ids]
            if num_tokens <= self.block_size:
                if self._append_lean(event_ids, grown_lengths):
                    return _EMPTY_IDS
            elif self._append_lean_blocks(event_ids, grown_lengths):
                return _EMPTY_IDS
        # undo the eventful sequences' growth and redo it under the general rule
        self.lengths_tokens[event_ids] -= num_tokens
        state.stored_tokens -= event_ids.size * num_tokens
        return self._grow_general(event_ids, num_tokens)

    def _grow_chunk_stored(self, seq_ids: np.ndarray, num_tokens: int) -> np.ndarray:
        """`grow` of a prompt's next chunk under a CPU tier: the chunk's full blocks are stored as computed.

        vLLM stores the blocks a step computes (`OffloadingConnectorScheduler._get_reqs_to_store`), so a
        long prompt reaches the tier chunk by chunk, not all at its release. Only prompt chunks come
        here (the scheduler grows one prefilling sequence at a time); decode growth is stored at
        release, which no multi-iteration jump crosses.
        """
        seq_id = seq_ids.item(0)
        prompt_tokens = self._tier_prefilling.pop(seq_id)
        failed = self.grow(seq_ids, num_tokens)
        if failed.size:
            self._tier_prefilling[seq_id] = prompt_tokens
            return failed
        computed = min(self.lengths_tokens.item(seq_id), prompt_tokens)
        self._tier_store_through(seq_id, computed // self.block_size)
        if computed < prompt_tokens:
            self._tier_prefilling[seq_id] = prompt_tokens
        return failed

    def _tier_store_through(self, seq_id: int, full_blocks: int) -> None:
        """Store a live sequence's blocks from its next unstored one up to `full_blocks` in the CPU tier."""
        if full_blocks > self._tier_next_block.get(seq_id, 0):
            # prompt blocks only (chunks): the admission's cached prompt keys, not computed afresh per chunk
            prompt_keys = _cached_block_keys(self._content_of[seq_id], self.block_size)
            self._tier_store_keys(seq_id, prompt_keys[:full_blocks])

    def _tier_store_keys(self, seq_id: int, keys: Sequence[Hashable]) -> None:
        """`keys` name a sequence's full blocks from its first on: store those not stored yet, touch all."""
        tier = self.cpu_tier
        assert tier is not None
        tier.store(keys[self._tier_next_block.get(seq_id, 0) :])
        tier.touch(keys)
        self._tier_next_block[seq_id] = len(keys)

    @cython.locals(state=PagedState)
    def _grow_few(self, seq_ids: list[int], num_tokens: int) -> np.ndarray:
        """`grow` for a handful of sequences (`num_tokens` <= block_size), in Python scalars.

        Why: the sequence that just finished its prefill grows alone (one per prefill-only step),
        and a chunk grows its one sequence; the vectorised tiers cost ~6 NumPy calls for that. The
        same tiers in the same order: quiet sequences only grow, the rest take the lean append or,
        undone, the general rule.
        """
        state = self._state
        lengths, quiet = self.lengths_tokens, self.quiet_limit_tokens
        events: list[int] = []
        for seq_id in seq_ids:
            grown_length = lengths.item(seq_id) + num_tokens
            lengths[seq_id] = grown_length
            if grown_length > quiet.item(seq_id):
                events.append(seq_id)
        state.stored_tokens += len(seq_ids) * num_tokens
        if not events or self._append_lean_few(events):
            return _EMPTY_IDS
        for seq_id in events:  # undo the eventful sequences' growth and redo it under the general rule
            lengths[seq_id] -= num_tokens
        state.stored_tokens -= len(events) * num_tokens
        return self._grow_general(np.asarray(events, dtype=np.int64), num_tokens)

    @cython.locals(state=PagedState)
    def _grow_single(self, seq_id: int, num_tokens: int) -> np.ndarray:
        """`grow` of one live sequence by more than a block (a prefill chunk), no fork sharing, in scalars.

        Why: chunked prefill grows one sequence by a chunk every step it runs; that always took the
        general rule (`_grow_general`: ~40 NumPy calls on one-element arrays). The same rule for one
        sequence without copy-on-write: it fails unchanged past max_model_len or when the pool lacks
        the blocks; otherwise it takes them in one allocation, at the end of its table.
        """
        state = self._state
        bs = self.block_size
        length = self.lengths_tokens.item(seq_id)
        have = self.num_seq_blocks.item(seq_id)
        grown_length = length + num_tokens
        extra = -(-grown_length // bs) - have  # blocks to append (as `_blocks_needed`)
        if (self.max_model_len is not None and grown_length > self.max_model_len) or (
            extra > 0 and extra > self.pool.queue.num_free
        ):
            self._set_limits_of(seq_id)  # as `_grow_general` does for every sequence it was given
            return np.array([seq_id], dtype=np.int64)
        final = self.final_tokens.item(seq_id)
        never_before = max(0, have * bs - max(final, length))
        if extra > 0:
            self._ensure_columns(have + extra)
            self._tables[self.table_slot.item(seq_id), have : have + extra] = self.pool.allocate(extra)
            have += extra
            self.num_seq_blocks[seq_id] = have
            state.held_slots += extra * bs
        self.lengths_tokens[seq_id] = grown_length
        state.stored_tokens += num_tokens
        state.never_tokens += max(0, have * bs - max(final, grown_length)) - never_before
        self._set_limits_of(seq_id)
        return _EMPTY_IDS

    def _append_lean(self, seq_ids: np.ndarray, grown_lengths: np.ndarray) -> bool:
        """One fresh block for each sequence (already grown past its quiet limit), if that is all it takes.

        Applies when every sequence stays within its lean cap (no copy-on-write, not past its final
        length or max_model_len, so it crossed exactly one block boundary: growth <= block_size)
        and the pool has a block for each. Returns False, having changed nothing, otherwise.
        """
        caps = self._lean_cap_tokens[seq_ids]
        if seq_ids.size > self.pool.num_free or not (grown_lengths <= caps).all():
            return False
        have = self.num_seq_blocks[seq_ids]
        self._ensure_columns(int(np.maximum.reduce(have)) + 1)  # the ufuncs: no method wrapper per call
        self._tables[self.table_slot[seq_ids], have] = self.pool.allocate(seq_ids.size)
        have += 1
        self.num_seq_blocks[seq_ids] = have
        held = have * self.block_size
        self._state.held_slots += seq_ids.size * self.block_size
        # below the final length before, so nothing was never-filled; now the final block may be held
        self._state.never_tokens += int(np.add.reduce(np.maximum(held - self.final_tokens[seq_ids], 0)))
        self.quiet_limit_tokens[seq_ids] = np.minimum(held, caps)
        return True

    def _append_lean_blocks(self, seq_ids: np.ndarray, grown_lengths: np.ndarray) -> bool:
        """`_append_lean` for growth of more than a block (a jump): each sequence takes the blocks it needs.

        Why: a decode jump longer than a block took the general rule every time (`_grow_general`:
        totals before and after, copy-on-write and max_model_len tests, a cumulative sum). When
        every sequence stays within its lean cap (no copy-on-write, not past its final length or
        max_model_len) and the pool has all the blocks, that rule gives each sequence, in order, its
        blocks from one allocation; this does just that. Returns False, having changed nothing,
        otherwise (the general rule then serves them first-come).
        """
        caps = self._lean_cap_tokens[seq_ids]
        if not (grown_lengths <= caps).all():
            return False
        bs = self.block_size
        have = self.num_seq_blocks[seq_ids]
        counts = (grown_lengths + (bs - 1)) // bs - have  # >= 1: each grew past its held slots
        total = int(np.add.reduce(counts))
        if total > self.pool.queue.num_free:
            return False
        held = have + counts
        self._ensure_columns(int(np.maximum.reduce(held)))
        new_blocks = self.pool.allocate(total)
        # as `_append_blocks`: sequence i's blocks are the next counts[i] popped, at columns have[i]...
        first_new = np.cumsum(counts) - counts
        rows = np.repeat(self.table_slot[seq_ids], counts)
        cols = np.repeat(have - first_new, counts) + np.arange(total)
        self._tables[rows, cols] = new_blocks
        self.num_seq_blocks[seq_ids] = held
        held *= bs
        self._state.held_slots += total * bs
        # below the final length before (grown <= cap), so nothing was never-filled; now it may be
        self._state.never_tokens += int(np.add.reduce(np.maximum(held - self.final_tokens[seq_ids], 0)))
        self.quiet_limit_tokens[seq_ids] = np.minimum(held, caps)
        return True

    @cython.locals(state=PagedState)
    def _append_lean_few(self, seq_ids: list[int]) -> bool:
        """`_append_lean` in one typed pass over the crossing sequences (same blocks, same order).

        Why a loop: a decode step usually has only one or two sequences crossing a block boundary,
        and ~20 small-array NumPy calls cost more than a few scalar updates each. This loops over
        the crossing sequences only (at most _LEAN_LOOP_MAX), never over the batch. The pool's
        pop is inlined (`BlockPool.allocate_few`'s clean case, in the same loop as the appends):
        this runs on nearly every decode step.
        """
        state = self._state
        count = len(seq_ids)
        pool = self.pool
        if count > pool.queue.num_free:
            return False
        views = self._views or self._make_views()  # the state's views are fresh from here on
        columns = state.lean_columns(seq_ids)
        if columns < 0:  # someone (already grown) is past its lean cap
            return False
        if columns > state.table.shape[1]:
            self._ensure_columns(columns)
            views = self._make_views()
        head = pool.clean_head(count)
        if head < 0:  # stale head entries: the general pop
            blocks = pool.allocate_few(count)
            _, quiet, caps, num_blocks, slots, final, _, _, table = views
            never = lean_append(
                table, num_blocks, slots, final, quiet, caps, seq_ids, blocks, self.block_size
            )
        else:  # the head entries are the blocks: take them in place
            evicted: list[int] = []
            never = state.lean_append_popped(seq_ids, self.block_size, head, evicted)
            pool.popped_at_head(count, evicted)
        state.never_tokens += never
        state.held_slots += count * self.block_size
        return True

    def _grow_general(self, seq_ids: np.ndarray, num_tokens: int) -> np.ndarray:
        """The full growth rule (copy-on-write, max_model_len, first-come blocks); returns the failures."""
        before = self._totals_of(seq_ids)
        lengths, extra, cow, over = self._blocks_needed(seq_ids, num_tokens)
        need = extra if cow is None else extra + cow
        if over is not None:
            need = np.where(over, 0, need)
        if over is None and int(need.sum()) <= self.pool.num_free:  # the common case: everyone grows
            ok = None
            grown_ids = seq_ids
        else:
            ok = (need == 0) | (np.cumsum(need) <= self.pool.num_free)
            if over is not None:
                ok &= ~over
            grown_ids = seq_ids[ok]
        if cow is not None:
            writers = cow.astype(bool) if ok is None else cow.astype(bool) & ok
            self._copy_on_write(seq_ids[writers])
        append = extra > 0 if ok is None else (extra > 0) & ok
        appending = np.flatnonzero(append)
        if appending.size:
            self._append_blocks(seq_ids[appending], extra[appending], num_tokens)
        self.lengths_tokens[grown_ids] = lengths if ok is None else lengths[ok]
        self.lengths_tokens[grown_ids] += num_tokens
        if self._num_cow_flagged:  # after a write, a sequence's last block is private
            cleared = grown_ids[self.cow_flag[grown_ids]]
            self.cow_flag[cleared] = False
            self._num_cow_flagged -= cleared.size
        after = self._totals_of(seq_ids)
        self._state.stored_tokens += after[0] - before[0]
        self._state.held_slots += after[1] - before[1]
        self._state.never_tokens += after[2] - before[2]
        self._set_limits(seq_ids)
        return _EMPTY_IDS if ok is None else seq_ids[~ok]

    def _copy_on_write(self, writers: np.ndarray) -> None:
        """Each writer whose partial last block is still shared gets a private copy (rare: forks)."""
        for sid in writers.tolist():
            last_col = int(self.num_seq_blocks[sid]) - 1
            slot = int(self.table_slot[sid])
            shared_block = int(self._tables[slot, last_col])
            if self.pool.refcount[shared_block] <= 1:  # earlier writers already left it
                continue
            copy = int(self.pool.allocate(1)[0])
            self.pool.refcount[shared_block] -= 1
            self._copy_content(shared_block, copy, int(self.lengths_tokens[sid]) % self.block_size)
            self._tables[slot, last_col] = copy

    def _append_blocks(self, seq_ids: np.ndarray, counts: np.ndarray, num_tokens: int) -> None:
        """Give seq_ids[i] counts[i] fresh blocks at the end of its table, all in one scatter."""
        have = self.num_seq_blocks[seq_ids]
        if num_tokens <= self.block_size:  # at most one block each: no repeat needed
            self._ensure_columns(int(have.max()) + 1)
            self._tables[self.table_slot[seq_ids], have] = self.pool.allocate(seq_ids.size)
            self.num_seq_blocks[seq_ids] = have + 1
            return
        total = int(counts.sum())
        self._ensure_columns(int((have + counts).max()))
        new_blocks = self.pool.allocate(total)
        rows = np.repeat(self.table_slot[seq_ids], counts)
        first_new = np.cumsum(counts) - counts
        cols = np.repeat(have, counts) + (np.arange(total) - np.repeat(first_new, counts))
        self._tables[rows, cols] = new_blocks
        self.num_seq_blocks[seq_ids] = have + counts

    def max_uniform_growth(self, seq_ids: np.ndarray, limit: int) -> int:
        """Exact largest k <= limit with grow(seq_ids, k) succeeding for all: binary search on k."""
        if type(seq_ids) is not _NDARRAY or seq_ids.dtype is not _INT64:  # as in `grow`
            seq_ids = np.asarray(seq_ids, dtype=np.int64)
        if limit <= 0:
            return 0
        count = seq_ids.size
        if count == 0:
            return int(limit)
        if self.max_model_len is not None:
            limit = min(
                int(limit),
                self.max_model_len - longest_length((self._views or self._make_views())[0], seq_ids),
            )
            if limit <= 0:
                return 0
        # Each sequence needs at most ceil(limit / block_size) new blocks (lengths never exceed the
        # slots held): when the pool has that many for all, no need to count exactly. (ceil_div and
        # pool.num_free inlined: the engine asks before every jump.)
        if not self._num_cow_flagged and count * -(-limit // self.block_size) <= self.pool.queue.num_free:
            return int(limit)
        lengths = self.lengths_tokens[seq_ids]
        have = self.num_seq_blocks[seq_ids]
        cow = self._cow_writers(seq_ids, lengths, have)
        free = self.pool.num_free - (0 if cow is None else int(cow.sum()))

        def blocks_needed(k: int) -> int:
            return int((ceil_div(lengths + k, self.block_size) - have).sum())

        if blocks_needed(limit) <= free:
            return int(limit)
        low, high = 0, int(limit)  # blocks_needed(low) <= free < blocks_needed(high)
        if free < 0 or blocks_needed(1) > free:
            return 0
        low = 1
        while high - low > 1:
            mid = (low + high) // 2
            if blocks_needed(mid) <= free:
                low = mid
            else:
                high = mid
        return low

    # ---- release and fork -------------------------------------------------------------------
    def _name_filled_blocks(self, seq_id: int, blocks: np.ndarray) -> None:
        """Give a released sequence's full, unnamed blocks their content keys, so they are cached.

        vLLM hashes each block when it becomes full, prompt or decode (vllm/v1/core/block_pool.py
        `BlockPool.cache_full_blocks`, called from kv_cache_manager.py `allocate_slots`). Naming them
        at release instead is the same for every later hit: no other request can hit a running
        sequence's own generated tokens (forks share its blocks directly). A key a live block
        already holds keeps that holder (`BlockPool.register`).
        """
        spec = self._content_of.pop(seq_id)
        bs = self.block_size
        keys = extended_block_keys(spec, bs, self.lengths_tokens.item(seq_id), _cached_block_keys(spec, bs))
        pool = self.pool
        held = blocks[: len(keys)]
        # gathered once: registering one of these blocks changes no other block's name or refcount
        # (a key's previous holder it unnames is free, so not one of this live sequence's blocks),
        # so registering the unnamed private ones in one call is `register` of each in order
        take = np.flatnonzero(~pool.has_key[held] & (pool.refcount[held] == 1)).tolist()
        if take:
            pool.register_list(held[take].tolist(), [keys[index] for index in take])
        if self.cpu_tier is not None:
            # the blocks filled since the last store (decode, a chunk's tail) reach the CPU tier as well
            self._tier_store_keys(seq_id, keys)
            del self._tier_next_block[seq_id]

    @cython.locals(state=PagedState)
    def release(self, seq_id: int) -> None:
        check_live_seq(self, seq_id)
        state = self._state
        views = self._views or self._make_views()  # the state's views are fresh from here on
        count = int(state.num_blocks[seq_id])
        slot = int(state.slots[seq_id])
        if self._tier_prefilling:
            self._tier_prefilling.pop(seq_id, None)
        if self._content_of and seq_id in self._content_of:
            self._name_filled_blocks(seq_id, self._tables[slot, :count].astype(np.int64))
        elif self._tier_next_block:
            self._tier_next_block.pop(seq_id, None)
        # the row's blocks go back to the pool tail first (evicted first), and the row is emptied (-1)
        pool = self.pool
        tail = -1 if self._block_content else pool.plain_tail(count)
        if tail < 0:  # named content (the freed blocks are needed) or the pool's general release
            freed = pool.release_row(views[8], slot, count, bool(self._block_content))
            if self._block_content:  # as _drop_content, without the call when nothing is named
                self._drop_content(freed)
        else:  # `BlockPool.release_row`'s one typed pass, on the state's views
            num_freed = state.release_row_to_tail(seq_id, tail)
            pool.pushed_at_tail(tail, num_freed)
        self._free_slots.append(slot)
        if self._num_cow_flagged and self.cow_flag.item(seq_id):
            self.cow_flag[seq_id] = False
            self._num_cow_flagged -= 1
        # `_count_in(seq_id, -1)`, and the row back to "no sequence", in one C call
        state.clear_row(seq_id, self.block_size)

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        """Child shares every parent block (refcount+1); copy-on-write happens at the first write."""
        check_live_seq(self, parent_id)
        check_new_seq(self, child.seq_id)
        count = int(self.num_seq_blocks[parent_id])
        length = int(self.lengths_tokens[parent_id])
        parent_blocks = self.block_table_of(parent_id)
        if self.fork_copies:
            if count > self.pool.num_free:
                return False
            child_blocks = self.pool.allocate(count)
            for index in range(count):
                filled = min(self.block_size, length - index * self.block_size)
                self._copy_content(int(parent_blocks[index]), int(child_blocks[index]), filled)
        else:
            child_blocks = parent_blocks
            self.pool.refcount[parent_blocks] += 1
        sid = child.seq_id
        self._ensure_rows(sid)
        if not self.fork_copies and length % self.block_size:  # the partial last block is now shared
            for holder in (parent_id, sid):
                if not self.cow_flag[holder]:
                    self.cow_flag[holder] = True
                    self._num_cow_flagged += 1
        self._ensure_columns(count)
        slot = self._take_slot(sid)
        self._tables[slot, :count] = child_blocks
        self.live[sid] = True
        self._state.num_live += 1
        self.lengths_tokens[sid] = length
        self.num_seq_blocks[sid] = count
        self._set_final(sid, child.final_tokens)
        self.prefix_hit[sid] = min(length, child.prompt_tokens)
        if child.content_key is not None and self.enable_prefix_caching:
            self._content_of[sid] = child
        if parent_id in self._tier_next_block:  # the shared blocks were stored with the parent's
            self._tier_next_block[sid] = self._tier_next_block[parent_id]
        self._count_in(sid, 1)
        self._set_limits(np.array([parent_id, sid], dtype=np.int64))  # either may now be copy-on-write
        return True

    def prefix_hit_tokens(self, seq_id: int) -> int:
        return int(self.prefix_hit[seq_id])

    # ---- accounting ---------------------------------------------------------------------------
    def live_seq_ids(self) -> np.ndarray:
        return np.flatnonzero(self.live)

    # C integers for the counts (capacity and external stay Python objects, as given): the same values,
    # without a Python int per operation on this per-turn path
    @cython.locals(
        state=PagedState,
        bs=cython.longlong,
        reservation=cython.longlong,
        internal=cython.longlong,
        num_free=cython.longlong,
        pool_slots=cython.longlong,
        duplicated=cython.longlong,
        token_states=cython.longlong,
        free=cython.longlong,
        cached=cython.longlong,
    )
    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        """Taxonomy; `next_demand_tokens` does not matter: any free block serves any demand.

        O(1) from the running totals, except while forks share a partial block (`_scan_held`).
        """
        state = self._state
        bs = self.block_size
        if self._num_cow_flagged:
            reservation, internal = self._scan_held()
        else:
            internal = state.never_tokens
            reservation = state.held_slots - state.stored_tokens - internal
        pool = self.pool
        num_free = pool.queue.num_free  # pool.num_free without the property (the engine asks every turn)
        capacity = self.capacity_tokens
        pool_slots = self.num_blocks * bs
        duplicated = self._ledger.duplicated_tokens
        token_states = pool_slots - num_free * bs - reservation - internal - duplicated
        external = capacity - pool_slots
        free = num_free * bs
        cached = pool.num_cached * bs
        # in field order (capacity, token_states, reservation, internal, external, duplicated, free,
        # cached, out_of_window), built as the tuple it is: MemoryBreakdown.__new__ runs as Python
        # (allocators/base.py is not compiled), ~7,000 instructions a call on this per-turn path. Its
        # checks (parts sum to capacity, none negative) run here; a failing one builds it the checked
        # way, which raises with the parts in the message.
        parts = (capacity, token_states, reservation, internal, external, duplicated, free, cached, 0)
        if (
            token_states < 0
            or reservation < 0
            or internal < 0
            or external < 0
            or duplicated < 0
            or free < 0
            or cached < 0
            or token_states + reservation + internal + external + duplicated + free != capacity
        ):
            return MemoryBreakdown(*parts)
        return _new_tuple(MemoryBreakdown, parts)

    def _scan_held(self) -> tuple[int, int]:
        """(reservation, internal) summed over live sequences, a shared partial last block once."""
        bs = self.block_size
        ids = self.live_seq_ids()
        lengths = self.lengths_tokens[ids]
        have = self.num_seq_blocks[ids]
        reserved = have * bs
        will_fill = np.minimum(reserved, np.maximum(self.final_tokens[ids], lengths))
        will = will_fill - lengths
        never = reserved - will_fill
        # a partial last block shared by forks is one physical block: count its empty slots once
        partial = (lengths % bs != 0) & (have > 0)
        if partial.any():
            last_blocks = self._tables[self.table_slot[ids[partial]], have[partial] - 1]
            shared = self.pool.refcount[last_blocks] > 1
            if shared.any():
                positions = np.flatnonzero(partial)[shared]
                _, first = np.unique(last_blocks[shared], return_index=True)
                repeat = np.ones(positions.size, dtype=bool)
                repeat[first] = False
                will[positions[repeat]] = 0
                never[positions[repeat]] = 0
        return int(will.sum()), int(never.sum())

    # sum_i durations_s[i] x breakdown part after growing `seq_ids` by i tokens (the engine's jump hook):
    # exact, without growing anything; see jump_integral.py for the closed forms. Bound directly as a
    # method (self is its `alloc`), so a jump pays no wrapper call; `first` and `total_s` may be passed.
    breakdown_integral = paged_breakdown_integral

    def layout(self) -> Layout:
        ids = self.live_seq_ids()
        width = int(self.num_seq_blocks[ids].max()) if ids.size else 0
        return Layout(
            kind="paged",
            capacity_tokens=self.capacity_tokens,
            block_size=self.block_size,
            seq_ids=ids.copy(),
            lengths_tokens=self.lengths_tokens[ids].copy(),
            block_table=self._tables[self.table_slot[ids], :width].copy(),
        )

    def hole_stats(self) -> dict[str, float]:
        """Free blocks as holes of block_size tokens each (they need not be adjacent to be usable)."""
        return uniform_hole_stats(self.pool.num_free, self.block_size)

    def state_snapshot(self) -> tuple:
        """Everything observable, for tests that check a refused operation changed nothing."""
        ids = self.live_seq_ids()
        return (
            tuple(ids.tolist()),
            tuple(self.lengths_tokens[ids].tolist()),
            tuple(self.num_seq_blocks[ids].tolist()),
            self._tables[self.table_slot[ids]].tobytes(),
            self.pool.refcount.tobytes(),
            self.pool.num_free,
            self.pool.num_cached,
            tuple(self.pool.cached_blocks().tolist()),
            self._ledger.duplicated_tokens,
        )
