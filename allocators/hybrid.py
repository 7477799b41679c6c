"""vLLM v1's hybrid KV-cache manager: one block pool, layer groups, window blocks freed as they slide out.

Why (vllm/v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator, single_type_kv_cache_manager.py
FullAttentionManager / SlidingWindowManager, kv_cache_utils.py `_get_kv_cache_config_uniform_page_size`):
layers are split into groups of equal size, each group all full attention or all sliding window, and
every group takes its blocks from one shared pool, so a block has one size (`block_size` tokens of
`group_layers` layers) whatever group holds it. A full-attention group holds every block of the
sequence; a sliding-window group frees the blocks whose tokens the next token no longer attends to
(`SlidingWindowManager.remove_skipped_blocks`, called before new blocks are allocated).

Group size here is gcd(full layers, window layers), so the groups tile the layers exactly (Gemma-3-27B:
10 full and 52 window layers -> groups of 2 layers, 5 full and 26 window groups). vLLM picks the group
size from the smallest layer type and pads the last group of a type when the counts do not divide; that
padding is not modelled (docs/allocators.md "Hybrid").

Units: layer-slots (one token's K and V in one layer), as in allocators/windowed.py. Blocks of a
sequence are real block ids from `BlockPool` (block_pool.py, reused, not copied), so conservation and
single ownership can be checked block by block.

Prefix caching (`enable_prefix_caching`) is the subclass in allocators/hybrid_caching.py. Not
modelled (docs/allocators.md): copy-on-write forks (a fork copies the parent's blocks).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from allocators.base import AllocatorBase, AllocatorConfigError, Layout, MemoryBreakdown, SeqSpec
from allocators.block_pool import BlockPool
from allocators.holes import uniform_hole_stats
from allocators.seq_arrays import ceil_div, check_live_seq, check_new_seq, ensure_rows
from allocators.windowed import LayerPlan


class HybridPagedAllocator(AllocatorBase):
    """Full-attention groups hold every block; sliding-window groups only the blocks still in the window."""

    frees_while_growing = True  # window groups drop blocks that slide out of the window

    _ROW_FILLS: dict[str, int | bool] = {
        "live": False,
        "lengths_tokens": 0,
        "final_tokens": 0,
        "num_seq_blocks": 0,  # logical blocks covering the sequence: ceil(length / block_size)
        "first_window_block": 0,  # first logical block the window groups still hold
    }

    def __init__(
        self,
        capacity_tokens: int,
        block_size: int,
        plan: LayerPlan,
        max_model_len: int | None = None,
        prefill_chunk_tokens: int | None = None,
    ) -> None:
        self.name = "hybrid"
        # Chunked prefill: vLLM allocates per chunk and frees skipped window blocks before each one, so
        # while the last chunk runs the window groups hold only its window and the chunk itself.
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.plan = plan
        self.block_size = block_size
        # a preempted sequence swaps whole blocks, as paged does (vLLM v0 block_manager swap_out)
        self.swap_block_tokens = block_size
        self.max_model_len = max_model_len
        self.slots_per_token = plan.num_layers
        self.capacity_tokens = capacity_tokens * plan.num_layers  # layer-slots
        self.group_layers = math.gcd(plan.num_full_layers, plan.num_window_layers)
        self.num_full_groups = plan.num_full_layers // self.group_layers
        self.num_window_groups = plan.num_window_layers // self.group_layers
        self.block_slots = block_size * self.group_layers
        self.num_blocks = self.capacity_tokens // self.block_slots
        if self.num_blocks < 1:
            raise AllocatorConfigError(
                f"hybrid: capacity_tokens x num_layers ({self.capacity_tokens}) holds no block of "
                f"{self.block_slots} layer-slots"
            )
        self.pool = BlockPool(self.num_blocks, enable_caching=False)
        self.live = np.zeros(0, dtype=bool)
        self.lengths_tokens = np.zeros(0, dtype=np.int64)
        self.final_tokens = np.zeros(0, dtype=np.int64)
        self.num_seq_blocks = np.zeros(0, dtype=np.int64)
        self.first_window_block = np.zeros(0, dtype=np.int64)
        # per live sequence: one array of group blocks per logical block (full groups: all of them;
        # window groups: from first_window_block on)
        self._full: dict[int, list[np.ndarray]] = {}
        self._window: dict[int, deque[np.ndarray]] = {}

    def _ensure_rows(self, seq_id: int) -> None:
        ensure_rows(self, seq_id, self._ROW_FILLS)

    # ---- block arithmetic ----------------------------------------------------------------
    def _first_needed(self, lengths: np.ndarray) -> np.ndarray:
        """First logical block a window group must hold at these lengths (skipped tokens // block)."""
        return self.plan.skipped_tokens(lengths) // self.block_size

    def _usage_blocks(self, seq_ids: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Blocks each sequence holds after growing by each of `steps` tokens (rows: seqs, columns: steps).

        Stepwise, as the engine's iterations run: window blocks whose tokens slid out are freed before
        the new token's block is taken, so the count after a step is also the step's peak.
        """
        lengths = self.lengths_tokens[seq_ids][:, None] + steps[None, :]
        blocks = ceil_div(lengths, self.block_size)
        first = np.maximum(self.first_window_block[seq_ids][:, None], self._first_needed(lengths))
        return self.num_full_groups * blocks + self.num_window_groups * (blocks - first)

    def _held_now(self, seq_ids: np.ndarray) -> np.ndarray:
        """Blocks each sequence holds now (window groups may still hold skipped prompt blocks)."""
        blocks = self.num_seq_blocks[seq_ids]
        return self.num_full_groups * blocks + self.num_window_groups * (
            blocks - self.first_window_block[seq_ids]
        )

    def _peak_and_net(self, seq_ids: np.ndarray, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Per sequence: the most extra blocks held during `num_tokens` steps, and the change at the end."""
        now = self._held_now(seq_ids)
        after = self._usage_blocks(seq_ids, np.arange(1, num_tokens + 1, dtype=np.int64)) - now[:, None]
        return np.maximum(0, after.max(axis=1)), after[:, -1]

    def _too_long(self, seq_ids: np.ndarray, num_tokens: int) -> np.ndarray:
        if self.max_model_len is None:
            return np.zeros(seq_ids.size, dtype=bool)
        return self.lengths_tokens[seq_ids] + num_tokens > self.max_model_len

    # ---- protocol ------------------------------------------------------------------------
    def _admission_first_block(self, prompt_tokens: int) -> int:
        """First window block held at admission: 0 without chunked prefill (vLLM allocates every prompt
        block, skipped ones are freed at the next step); with chunks of c tokens, the blocks the last
        chunk does not read (its first token reads back to prompt - c - window + 1)."""
        if self.prefill_chunk_tokens is None or prompt_tokens <= self.prefill_chunk_tokens:
            return 0
        return int(self._first_needed(np.int64(prompt_tokens - self.prefill_chunk_tokens)))

    def demand_tokens(self, seq: SeqSpec) -> int:
        """The prompt's blocks in every group (window groups: from the admission's first block)."""
        blocks = int(ceil_div(seq.prompt_tokens, self.block_size))
        first = self._admission_first_block(seq.prompt_tokens)
        return (self.num_full_groups * blocks + self.num_window_groups * (blocks - first)) * self.block_slots

    def rejection_reason(self, seq: SeqSpec) -> str:
        if self.max_model_len is not None and seq.prompt_tokens > self.max_model_len:
            return "prompt_exceeds_max_model_len"
        if self.demand_tokens(seq) > self.num_blocks * self.block_slots:
            return "demand_exceeds_capacity"
        return ""

    def _take(self, count: int) -> np.ndarray:
        return self.pool.allocate(count)

    def _start(self, seq: SeqSpec, length: int, first: int = 0) -> bool:
        """Hold `length` tokens: full groups every block, window groups the blocks from `first` on."""
        if self.max_model_len is not None and length > self.max_model_len:
            return False
        blocks = int(ceil_div(length, self.block_size))
        if self.num_full_groups * blocks + self.num_window_groups * (blocks - first) > self.pool.num_free:
            return False
        sid = seq.seq_id
        self._ensure_rows(sid)
        full = self._take(self.num_full_groups * blocks).reshape(blocks, self.num_full_groups)
        window = self._take(self.num_window_groups * (blocks - first)).reshape(
            blocks - first, self.num_window_groups
        )
        self._full[sid] = list(full)
        self._window[sid] = deque(window)
        self.live[sid] = True
        self.lengths_tokens[sid] = length
        self.final_tokens[sid] = seq.final_tokens
        self.num_seq_blocks[sid] = blocks
        self.first_window_block[sid] = first
        return True

    def admit(self, seq: SeqSpec) -> bool:
        check_new_seq(self, seq.seq_id)
        return self._start(seq, seq.prompt_tokens, self._admission_first_block(seq.prompt_tokens))

    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        """Grow each sequence in turn by `num_tokens` steps; it fails (unchanged) if its peak does not fit.

        Growing k tokens at once is the k steps of one sequence after another: a sequence succeeds when
        the most blocks it holds on the way fit in the free pool left by the sequences before it.
        """
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        if num_tokens <= 0 or seq_ids.size == 0:
            return np.zeros(0, dtype=np.int64)
        new_lengths = self.lengths_tokens[seq_ids] + num_tokens
        peak, net = self._peak_and_net(seq_ids, num_tokens)
        too_long = self._too_long(seq_ids, num_tokens)
        old_blocks = self.num_seq_blocks[seq_ids]
        new_first = np.maximum(self.first_window_block[seq_ids], self._first_needed(new_lengths))
        changes = (ceil_div(new_lengths, self.block_size) != old_blocks) | (
            new_first != self.first_window_block[seq_ids]
        )
        quiet = ~changes & ~too_long
        self.lengths_tokens[seq_ids[quiet]] = new_lengths[quiet]
        failed: list[int] = []
        for index in np.flatnonzero(~quiet).tolist():
            sid = int(seq_ids[index])
            if too_long[index] or self._grow_peak(sid, num_tokens, int(peak[index])) > self.pool.num_free:
                failed.append(sid)
                continue
            self._advance(sid, int(new_lengths[index]))
        return np.asarray(failed, dtype=np.int64)

    def _grow_peak(self, sid: int, num_tokens: int, peak: int) -> int:
        """Blocks `sid` needs from the free pool at its peak while growing (private blocks: `peak`)."""
        return peak

    def _advance(self, sid: int, new_length: int) -> None:
        """Move one sequence to `new_length`: release slid-out window blocks, then append new blocks."""
        old_blocks = int(self.num_seq_blocks[sid])
        new_blocks = -(-new_length // self.block_size)
        first = int(self.first_window_block[sid])
        new_first = max(first, int(self._first_needed(np.int64(new_length))))
        window = self._window[sid]
        gone = [window.popleft() for _ in range(first, min(new_first, old_blocks))]
        if gone:  # oldest first, as vLLM frees them
            self.pool.release(np.concatenate(gone))
        appended = new_blocks - old_blocks
        if appended > 0:
            full_groups, window_groups = self.num_full_groups, self.num_window_groups
            in_window = new_blocks - max(old_blocks, new_first)
            taken = self._take(full_groups * appended + window_groups * in_window)
            split = full_groups * appended
            self._full[sid].extend(taken[:split].reshape(appended, full_groups))
            window.extend(taken[split:].reshape(in_window, window_groups))
        self.lengths_tokens[sid] = new_length
        self.num_seq_blocks[sid] = new_blocks
        self.first_window_block[sid] = new_first

    def _new_rows(self, seq_ids: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Block rows each sequence appends growing by each of `steps` tokens (rows: seqs)."""
        lengths = self.lengths_tokens[seq_ids][:, None] + steps[None, :]
        return ceil_div(lengths, self.block_size) - self.num_seq_blocks[seq_ids][:, None]

    def _grows_without_frees(self, seq_ids: np.ndarray, num_tokens: int) -> bool:
        """Whether the free pool holds every block the growth appends, crediting no release."""
        if (
            self.max_model_len is not None
            and self.lengths_tokens[seq_ids].max() + num_tokens > self.max_model_len
        ):
            return False
        new_rows = self._new_rows(seq_ids, np.array([num_tokens], dtype=np.int64))
        groups = self.num_full_groups + self.num_window_groups
        return int(new_rows.sum()) * groups <= self.pool.num_free

    def max_uniform_growth(self, seq_ids: np.ndarray, limit: int) -> int:
        """Largest k <= limit whose appended blocks the free pool holds outright, crediting no release.

        Why not the exact bound of `grow(seq_ids, k)`: `grow` lets a sequence use blocks that the
        sequences before it free over all k steps, while the engine stepping one iteration at a time
        frees them step by step; a bound that credits no release is reached the same way by both, so
        a jump of this length equals stepping it (tests/core/test_hybrid_prefix_caching.py).
        """
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        if limit <= 0:
            return 0
        if seq_ids.size == 0:
            return int(limit)
        limit = int(limit)
        if self.max_model_len is not None:
            limit = min(limit, int(self.max_model_len - self.lengths_tokens[seq_ids].max()))
        if limit <= 0:
            return 0
        if self._grows_without_frees(seq_ids, limit):
            return limit
        new_rows = self._new_rows(seq_ids, np.arange(1, limit + 1, dtype=np.int64))
        groups = self.num_full_groups + self.num_window_groups
        fits = new_rows.sum(axis=0) * groups <= self.pool.num_free
        return int(np.argmin(fits))  # monotone: true up to some k, then false (false at `limit`)

    def release(self, seq_id: int) -> None:
        check_live_seq(self, seq_id)
        held = [*reversed(self._window.pop(seq_id)), *reversed(self._full.pop(seq_id))]
        if held:
            self.pool.release(np.concatenate(held))
        self.live[seq_id] = False
        self.lengths_tokens[seq_id] = 0
        self.num_seq_blocks[seq_id] = 0
        self.first_window_block[seq_id] = 0

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        """The child starts with its own copy of the parent's tokens (no block sharing)."""
        check_live_seq(self, parent_id)
        check_new_seq(self, child.seq_id)
        return self._start(
            child, int(self.lengths_tokens[parent_id]), int(self.first_window_block[parent_id])
        )

    def prefix_hit_tokens(self, seq_id: int) -> int:
        return 0

    def live_seq_ids(self) -> np.ndarray:
        return np.flatnonzero(self.live)

    def held_blocks(self, seq_id: int) -> np.ndarray:
        """Every physical block the sequence holds (full and window groups)."""
        parts = [*self._full[seq_id], *self._window[seq_id]]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        """The taxonomy in layer-slots; `out_of_window`: window slots of tokens before the window."""
        ids = self.live_seq_ids()
        plan, bs = self.plan, self.block_size
        lengths = self.lengths_tokens[ids]
        held_to = self.num_seq_blocks[ids] * bs  # positions covered by the last block
        will_fill = np.minimum(held_to, np.maximum(self.final_tokens[ids], lengths))
        window_from = self.first_window_block[ids] * bs  # first position the window groups hold
        read_from = np.maximum(window_from, np.minimum(plan.skipped_tokens(lengths), lengths))
        full, win = plan.num_full_layers, plan.num_window_layers
        out_of_window = win * int((read_from - window_from).sum())
        token_states = full * int(lengths.sum()) + win * int((lengths - read_from).sum())
        reservation = (full + win) * int((will_fill - lengths).sum())
        internal = (full + win) * int((held_to - will_fill).sum())
        free = self.pool.num_free * self.block_slots
        return MemoryBreakdown(
            capacity=self.capacity_tokens,
            token_states=token_states,
            reservation=reservation,
            internal=internal,
            external=self.capacity_tokens - self.num_blocks * self.block_slots,
            duplicated=0,
            free=free,
            out_of_window=out_of_window,
        )

    def state_snapshot(self) -> tuple:
        """Everything observable, for tests that check a refused operation changed nothing."""
        ids = self.live_seq_ids()
        return (
            tuple(ids.tolist()),
            tuple(self.lengths_tokens[ids].tolist()),
            tuple(self.num_seq_blocks[ids].tolist()),
            tuple(self.first_window_block[ids].tolist()),
            self.pool.num_free,
        )

    def layout(self) -> Layout:
        """Block tables of the full-attention groups' first group (what one full layer sees)."""
        ids = self.live_seq_ids()
        width = int(self.num_seq_blocks[ids].max()) if ids.size else 0
        table = np.full((ids.size, width), -1, dtype=np.int32)
        for row, sid in enumerate(ids.tolist()):
            blocks = [int(group[0]) for group in self._full[sid]] if self.num_full_groups else []
            table[row, : len(blocks)] = blocks
        return Layout(
            kind="paged",
            capacity_tokens=self.num_blocks * bs if (bs := self.block_size) else 0,
            block_size=self.block_size,
            seq_ids=ids.copy(),
            lengths_tokens=self.lengths_tokens[ids].copy(),
            block_table=table,
        )

    def hole_stats(self) -> dict[str, float]:
        return uniform_hole_stats(self.pool.num_free, self.block_slots)
