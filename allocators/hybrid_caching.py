"""Prefix caching in the hybrid allocator: vLLM v1's cache-hit rule under sliding windows.

Why a rule of its own (vLLM, vllm/v1/core/single_type_kv_cache_manager.py and
kv_cache_coordinator.py): a prompt hits the cache up to a block boundary H only if every layer group
can serve the tokens before H.
- A full-attention group needs every block from the start cached (`FullAttentionManager.
  find_longest_cache_hit`: left to right, stop at the first miss).
- A sliding-window group needs only the `cdiv(sliding_window - 1, block_size)` consecutive cached
  blocks ending at H: the next token reads no earlier one, so those become null blocks
  (`SlidingWindowManager.find_longest_cache_hit`: right to left from the longest candidate, stop at
  the first run long enough; with no such run, the run of cached blocks from block 0 is the hit).
- The coordinator (`HybridKVCacheCoordinator.find_longest_cache_hit`) runs the full groups first and
  gives their hit to the window groups as the longest candidate: the hit is the longest length every
  group serves. Candidates are capped at prompt - 1 tokens in whole blocks, as in `paged`
  (kv_cache_manager.py `get_computed_blocks`: max_cache_hit_length = num_tokens - 1).
Each group looks up its own blocks (vLLM keys the cache by block hash and group id), so a block is
named here by (prompt block key, group index) and a row of blocks is a hit only if every group of its
kind has it cached. Freed blocks keep their names in the pool's free queue, evictable LRU
(block_pool.py), whether a window group freed them as they slid out or the sequence ended.

Accounting: hit blocks are shared with refcounts, so the taxonomy is taken from the physical pool:
held slots minus the (private) reservation and internal slots of the last blocks, minus
`out_of_window` counted once per physical block (a slot is out of the window only if no holder reads
it), minus `duplicated`: full-attention blocks holding the same content as another live block (a
request that missed the cache recomputes a prefix a running one still holds). A window group's
second copy counts as token states, as in the windowed slabs (allocators/windowed.py): it slides out.

Not modelled: with chunked prefill, the window blocks the earlier chunks filled and freed are cached
only as far as the pool has room at admission (vLLM frees them chunk by chunk); window hits before
the blocks the last chunk reads are not touched (vLLM touches and frees them: only their LRU place
differs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable

import numpy as np

from allocators.base import MemoryBreakdown, SeqSpec
from allocators.block_pool import BlockPool
from allocators.hybrid import HybridPagedAllocator
from allocators.ledger import DuplicateLedger
from allocators.paged import _cached_block_keys, _has_named_content
from allocators.seq_arrays import ceil_div, check_live_seq, check_new_seq
from allocators.windowed import LayerPlan

_EMPTY = np.zeros(0, dtype=np.int64)


def full_attention_hit_blocks(cached: Callable[[int], bool], max_blocks: int) -> int:
    """Blocks a full-attention group hits: the cached blocks from block 0 up to the first miss."""
    hit = 0
    while hit < max_blocks and cached(hit):
        hit += 1
    return hit


def sliding_window_hit_blocks(cached: Callable[[int], bool], max_blocks: int, needed_blocks: int) -> int:
    """Blocks a sliding-window group hits within `max_blocks` (vLLM SlidingWindowManager's search).

    Right to left: the first run of `needed_blocks` consecutive cached blocks ends the hit; with no
    such run, the cached blocks from block 0 (a prefix shorter than the window) are the hit.
    """
    run = 0
    for index in range(max_blocks - 1, -1, -1):
        if cached(index):
            run += 1
            if run >= needed_blocks:
                return index + run
        else:
            run = 0
    return run


def window_needed_blocks(window_tokens: int, block_size: int) -> int:
    """cdiv(sliding_window - 1, block_size): the blocks the token after a hit reads (the -1: itself)."""
    return -(-(window_tokens - 1) // block_size)


class HybridPrefixCachingAllocator(HybridPagedAllocator):
    """The hybrid allocator with vLLM's automatic prefix caching (hits shared, freed blocks cached)."""

    _ROW_FILLS: dict[str, int | bool] = {
        **HybridPagedAllocator._ROW_FILLS,
        "prefix_hit": 0,  # tokens of the prompt found cached at admission
        "named_rows": 0,  # leading prompt blocks with a content key (cacheable)
    }

    def __init__(
        self,
        capacity_tokens: int,
        block_size: int,
        plan: LayerPlan,
        max_model_len: int | None = None,
        prefill_chunk_tokens: int | None = None,
    ) -> None:
        super().__init__(capacity_tokens, block_size, plan, max_model_len, prefill_chunk_tokens)
        self.pool = BlockPool(self.num_blocks, enable_caching=True)
        self.enable_prefix_caching = True
        # every full block is cached by content, so each request's own tokens need a name (as paged)
        self.content_identity = True
        self.prefix_hit = np.zeros(0, dtype=np.int64)
        self.named_rows = np.zeros(0, dtype=np.int64)
        self.window_needed_blocks = window_needed_blocks(plan.window_tokens, block_size)
        self._ledger = DuplicateLedger()  # full-group content held by live blocks
        self._block_key: dict[int, Hashable] = {}  # live full-group block -> its content key
        self._changes = 0  # bumped by every change of the blocks held (keeps `_last_plan` honest)
        self._last_plan: tuple | None = None

    # ---- the hit -------------------------------------------------------------------------
    def _row_blocks(self, key: Hashable, groups: range) -> list[int] | None:
        """The cached block of `key` in every group of `groups`, or None if one group misses."""
        lookup = self.pool.lookup
        blocks = []
        for group in groups:
            block = lookup((key, group))
            if block is None:
                return None
            blocks.append(block)
        return blocks

    def _find_hit(
        self, seq: SeqSpec
    ) -> tuple[tuple[Hashable, ...], int, list[list[int]], dict[int, list[int]]]:
        """(prompt block keys, hit blocks H, full groups' rows [0, H), window groups' cached rows)."""
        if not _has_named_content(seq):
            return (), 0, [], {}
        keys = _cached_block_keys(seq, self.block_size)
        max_blocks = min(len(keys), (seq.prompt_tokens - 1) // self.block_size)
        full_groups = range(self.num_full_groups)
        window_groups = range(self.num_full_groups, self.num_full_groups + self.num_window_groups)
        full_rows: list[list[int]] = []
        window_rows: dict[int, list[int]] = {}

        def full_cached(index: int) -> bool:
            row = self._row_blocks(keys[index], full_groups)
            if row is not None:
                full_rows.append(row)
            return row is not None

        def window_cached(index: int) -> bool:
            row = self._row_blocks(keys[index], window_groups)
            if row is not None:
                window_rows[index] = row
            return row is not None

        full_hit = full_attention_hit_blocks(full_cached, max_blocks)
        hit = sliding_window_hit_blocks(window_cached, full_hit, self.window_needed_blocks)
        return keys, hit, full_rows[:hit], window_rows

    def _first_window_row(self, prompt_tokens: int, hit_blocks: int) -> int:
        """First window block held at admission: none before the hit's window (null blocks), and with
        chunked prefill none the last chunk does not read (`_admission_first_block`)."""
        first = int(self._first_needed(np.int64(hit_blocks * self.block_size)))
        chunk = self.prefill_chunk_tokens
        if chunk is not None and prompt_tokens - hit_blocks * self.block_size > chunk:
            first = max(first, int(self._first_needed(np.int64(prompt_tokens - chunk))))
        return first

    def _admission_plan(self, seq: SeqSpec) -> tuple:
        """The hit and the blocks admission touches and takes; kept for the `admit` that follows the
        engine's `demand_tokens` (the hit search is most of an admission's cost)."""
        state = (seq, self._changes, self.pool.num_free, self.pool.num_cached)
        if self._last_plan is not None and self._last_plan[0] == state:
            return self._last_plan[1]
        plan = self._plan(seq)
        self._last_plan = (state, plan)
        return plan

    def _plan(self, seq: SeqSpec) -> tuple:
        keys, hit, full_rows, window_rows = self._find_hit(seq)
        blocks = int(ceil_div(seq.prompt_tokens, self.block_size))
        first = self._first_window_row(seq.prompt_tokens, hit)
        touched = [block for row in full_rows for block in row]
        touched += [block for index in range(first, hit) for block in window_rows[index]]
        new = self.num_full_groups * (blocks - hit) + self.num_window_groups * (blocks - max(first, hit))
        return keys, hit, first, blocks, full_rows, window_rows, touched, new

    def demand_tokens(self, seq: SeqSpec) -> int:
        """Blocks taken from the free pool: the new ones and the cached hits revived from it (vLLM
        `get_num_blocks_to_allocate` counts evictable hits too), in layer-slots."""
        *_, touched, new = self._admission_plan(seq)
        revived = int((self.pool.refcount[np.asarray(touched, dtype=np.int64)] == 0).sum()) if touched else 0
        return (new + revived) * self.block_slots

    def rejection_reason(self, seq: SeqSpec) -> str:
        """As without caching: an empty cache holds no hit."""
        if self.max_model_len is not None and seq.prompt_tokens > self.max_model_len:
            return "prompt_exceeds_max_model_len"
        if HybridPagedAllocator.demand_tokens(self, seq) > self.num_blocks * self.block_slots:
            return "demand_exceeds_capacity"
        return ""

    # ---- admission and release -----------------------------------------------------------
    def _hold_content(self, blocks: np.ndarray, keys: list[Hashable]) -> None:
        """Live full-group blocks now hold this content: one more copy of each key."""
        for block, key in zip(blocks.tolist(), keys, strict=True):
            self._ledger.add(key, self.block_slots)
            self._block_key[block] = key

    def _drop_content(self, freed: np.ndarray) -> None:
        for block in freed.tolist():
            key = self._block_key.pop(block, None)
            if key is not None:
                self._ledger.remove(key)

    def admit(self, seq: SeqSpec) -> bool:
        check_new_seq(self, seq.seq_id)
        if self.max_model_len is not None and seq.prompt_tokens > self.max_model_len:
            return False
        keys, hit, first, blocks, full_rows, window_rows, touched, new = self._admission_plan(seq)
        self._changes += 1
        touched_blocks = np.asarray(touched, dtype=np.int64)
        revived_count = int((self.pool.refcount[touched_blocks] == 0).sum()) if touched else 0
        if new + revived_count > self.pool.num_free:
            return False
        full_groups, window_groups = self.num_full_groups, self.num_window_groups
        revived = self.pool.touch(touched_blocks) if touched else _EMPTY
        full_hits = np.asarray(full_rows, dtype=np.int64).reshape(hit, full_groups)
        if revived.size and full_groups:  # a cached full block is live content again
            revived_set = set(revived.tolist())
            for index, row in enumerate(full_rows):
                for group, block in enumerate(row):
                    if block in revived_set:
                        self._hold_content(np.array([block]), [(keys[index], group)])
        new_full = self._take(full_groups * (blocks - hit)).reshape(blocks - hit, full_groups)
        window_from = max(first, hit)
        new_window = self._take(window_groups * (blocks - window_from)).reshape(
            blocks - window_from, window_groups
        )
        named = min(len(keys), blocks)
        self._name_rows(new_full, hit, named, keys, 0, ledger=True)
        self._name_rows(new_window, window_from, named, keys, full_groups, ledger=False)
        self._cache_passed_window_rows(keys, hit, first, named)
        sid = seq.seq_id
        self._ensure_rows(sid)
        self._full[sid] = [*full_hits, *new_full]
        window_hits = [np.asarray(window_rows[index], dtype=np.int64) for index in range(first, hit)]
        self._window[sid] = deque([*window_hits, *new_window])
        self.live[sid] = True
        self.lengths_tokens[sid] = seq.prompt_tokens
        self.final_tokens[sid] = seq.final_tokens
        self.num_seq_blocks[sid] = blocks
        self.first_window_block[sid] = first
        self.prefix_hit[sid] = hit * self.block_size
        self.named_rows[sid] = named
        return True

    def _name_rows(
        self, rows: np.ndarray, start: int, named: int, keys: tuple, group0: int, *, ledger: bool
    ) -> None:
        """Register new rows of blocks (rows[i] is prompt block start + i) under (key, group) names."""
        count = max(0, min(rows.shape[0], named - start))
        if count == 0 or rows.shape[1] == 0:
            return
        blocks = rows[:count].reshape(-1)
        names = [(keys[start + i], group0 + g) for i in range(count) for g in range(rows.shape[1])]
        self.pool.register_many(blocks, tuple(names))
        if ledger:
            self._hold_content(blocks, names)

    def _cache_passed_window_rows(self, keys: tuple, start: int, first: int, named: int) -> None:
        """Chunked prefill: the window blocks earlier chunks filled and freed stay cached (vLLM
        `remove_skipped_blocks` frees them named). Filled and freed here in one go, the rows nearest
        the last chunk first kept when the pool has no room for all."""
        stop = min(first, named)
        groups = self.num_window_groups
        count = min(stop - start, self.pool.num_free // groups) if stop > start else 0
        if count <= 0:
            return
        start = stop - count
        blocks = self._take(groups * count)
        names = [(keys[start + i], self.num_full_groups + g) for i in range(count) for g in range(groups)]
        self.pool.register_many(blocks, tuple(names))
        self.pool.release(blocks)

    def release(self, seq_id: int) -> None:
        check_live_seq(self, seq_id)
        self._changes += 1
        held = [*reversed(self._window.pop(seq_id)), *reversed(self._full.pop(seq_id))]
        if held:
            self._drop_content(self.pool.release(np.concatenate(held)))
        self.live[seq_id] = False
        self.lengths_tokens[seq_id] = 0
        self.num_seq_blocks[seq_id] = 0
        self.first_window_block[seq_id] = 0
        self.prefix_hit[seq_id] = 0
        self.named_rows[seq_id] = 0

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        """As without caching: the child copies the parent's blocks (unnamed, so never a hit)."""
        self._changes += 1
        ok = super().fork(parent_id, child)
        if ok:
            self.prefix_hit[child.seq_id] = 0
            self.named_rows[child.seq_id] = 0
        return ok

    def prefix_hit_tokens(self, seq_id: int) -> int:
        return int(self.prefix_hit[seq_id])

    # ---- growth --------------------------------------------------------------------------
    def _advance(self, sid: int, new_length: int) -> None:
        self._changes += 1
        super()._advance(sid, new_length)

    def _grow_peak(self, sid: int, num_tokens: int, peak: int) -> int:
        """The peak when released window blocks still shared with another holder free nothing."""
        first = int(self.first_window_block[sid])
        old_blocks = int(self.num_seq_blocks[sid])
        steps = np.arange(1, num_tokens + 1, dtype=np.int64)
        lengths = self.lengths_tokens[sid] + steps
        released_to = np.minimum(np.maximum(first, self._first_needed(lengths)), old_blocks)
        last = int(released_to[-1])
        if last <= first:
            return peak
        window, refcount = self._window[sid], self.pool.refcount
        shared = [int((refcount[window[row]] > 1).sum()) for row in range(last - first)]
        kept = np.concatenate(([0], np.cumsum(shared)))[released_to - first]
        ids = np.array([sid], dtype=np.int64)
        extra = self._usage_blocks(ids, steps)[0] - self._held_now(ids)[0] + kept
        return max(0, int(extra.max()))

    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        """As without caching, except that growth the free pool holds outright runs step by step.

        Why: the engine's multi-step jump calls grow(ids, k) where stepping calls grow(ids, 1) k
        times. With cached blocks in the free queue the order of releases and evictions decides
        later hits, so a jump replays the steps' order: each step, every sequence in turn (the
        sequences whose blocks do not change in a step do nothing to the pool).
        """
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        if num_tokens <= 1 or seq_ids.size == 0 or not self._grows_without_frees(seq_ids, num_tokens):
            return super().grow(seq_ids, num_tokens)
        lengths_now = self.lengths_tokens[seq_ids]
        lengths = lengths_now[:, None] + np.arange(1, num_tokens + 1, dtype=np.int64)[None, :]
        blocks = ceil_div(lengths, self.block_size)
        first = np.maximum(self.first_window_block[seq_ids][:, None], self._first_needed(lengths))
        changed = np.empty_like(blocks, dtype=bool)
        changed[:, 0] = (blocks[:, 0] != self.num_seq_blocks[seq_ids]) | (
            first[:, 0] != self.first_window_block[seq_ids]
        )
        changed[:, 1:] = (blocks[:, 1:] != blocks[:, :-1]) | (first[:, 1:] != first[:, :-1])
        steps, rows = np.nonzero(changed.T)  # step-major: every sequence's event of step 1, then 2, ...
        for step, row in zip(steps.tolist(), rows.tolist(), strict=True):
            self._advance(int(seq_ids[row]), int(lengths_now[row]) + step + 1)
        self.lengths_tokens[seq_ids] = lengths_now + num_tokens
        return _EMPTY

    # ---- accounting ----------------------------------------------------------------------
    def _out_of_window_slots(self, ids: np.ndarray, read_from: np.ndarray) -> int:
        """Window-layer slots no holder reads, each physical block once (see the module docstring)."""
        bs = self.block_size
        window_from = self.first_window_block[ids] * bs
        refcount = self.pool.refcount
        tokens = 0
        shared: dict[int, list[int]] = {}
        for sid, start, stop in zip(
            ids[read_from > window_from].tolist(),
            window_from[read_from > window_from].tolist(),
            read_from[read_from > window_from].tolist(),
            strict=True,
        ):
            window = self._window[sid]
            for row in range(-(-(stop - start) // bs)):
                out = min(bs, stop - start - row * bs)
                blocks = window[row]
                counts = refcount[blocks]
                tokens += out * int((counts == 1).sum())
                for block in blocks[counts > 1].tolist():
                    shared.setdefault(block, []).append(out)
        for block, outs in shared.items():
            if len(outs) == int(refcount[block]):  # every holder has these tokens out of its window
                tokens += min(outs)
        return tokens * self.group_layers

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        """The taxonomy in layer-slots from the physical pool (shared blocks once)."""
        ids = self.live_seq_ids()
        plan, bs = self.plan, self.block_size
        lengths = self.lengths_tokens[ids]
        held_to = self.num_seq_blocks[ids] * bs
        will_fill = np.minimum(held_to, np.maximum(self.final_tokens[ids], lengths))
        read_from = np.maximum(
            self.first_window_block[ids] * bs, np.minimum(plan.skipped_tokens(lengths), lengths)
        )
        layers = plan.num_layers
        reservation = layers * int((will_fill - lengths).sum())
        internal = layers * int((held_to - will_fill).sum())
        out_of_window = self._out_of_window_slots(ids, read_from)
        duplicated = self._ledger.duplicated_tokens
        live_slots = (self.num_blocks - self.pool.num_free) * self.block_slots
        return MemoryBreakdown(
            capacity=self.capacity_tokens,
            token_states=live_slots - reservation - internal - out_of_window - duplicated,
            reservation=reservation,
            internal=internal,
            external=self.capacity_tokens - self.num_blocks * self.block_slots,
            duplicated=duplicated,
            free=self.pool.num_free * self.block_slots,
            cached=self.pool.num_cached * self.block_slots,
            out_of_window=out_of_window,
        )

    def state_snapshot(self) -> tuple:
        ids = self.live_seq_ids()
        return (
            *super().state_snapshot(),
            self.pool.refcount.tobytes(),
            self.pool.num_cached,
            tuple(self.pool.cached_blocks().tolist()),
            tuple(self.prefix_hit[ids].tolist()),
            self._ledger.duplicated_tokens,
        )
