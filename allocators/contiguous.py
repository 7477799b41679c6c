"""Contiguous-family allocators: one slab per sequence in a linear address space.

Why one implementation for `contiguous` and `request_limit`: they differ only in how many slots
they reserve at admission (the *reservation policy*); placement (first_fit / best_fit / buddy) and
all accounting are shared. A slab never moves or grows, so a sequence can grow only up to its slab;
the slack it never fills is internal fragmentation, the holes between slabs external.

Each sequence stores its own copy of every token, so identical prefixes (a shared system prompt,
equal prefix-block hashes, a forked parent's tokens) are counted as `duplicated` via the ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np

from allocators.base import AllocatorBase, Layout, MemoryBreakdown, SeqSpec
from allocators.holes import hole_stats_from_sizes
from allocators.ledger import DuplicateLedger
from allocators.placement import Placement, next_pow2
from allocators.prefix_keys import prompt_segments
from allocators.seq_arrays import check_live_seq, check_new_seq, ensure_rows

ReservationPolicy = Callable[[SeqSpec], int]


def reserve_max_model_len(max_model_len: int) -> ReservationPolicy:
    """Orca (Max): every sequence reserves the model's maximum context."""
    return lambda seq: max_model_len


def _capped(tokens: int, max_model_len: int | None) -> int:
    return tokens if max_model_len is None else min(tokens, max_model_len)


def reserve_limit(max_model_len: int | None) -> ReservationPolicy:
    """The client's limit: prompt + max_tokens (capped at max_model_len when given)."""
    return lambda seq: _capped(seq.prompt_tokens + seq.max_tokens, max_model_len)


def reserve_oracle(max_model_len: int | None) -> ReservationPolicy:
    """Orca (Oracle): prompt + the true output length (which only an oracle knows)."""
    return lambda seq: _capped(seq.final_tokens, max_model_len)


def reserve_pow2(max_model_len: int | None) -> ReservationPolicy:
    """Orca (Pow2): prompt + the true output rounded up to a power of two (25 -> 32)."""
    return lambda seq: _capped(
        seq.prompt_tokens + next_pow2(min(seq.output_tokens, seq.max_tokens)), max_model_len
    )


RESERVATION_POLICIES: dict[str, Callable[[int | None], ReservationPolicy]] = {
    "limit": reserve_limit,
    "oracle": reserve_oracle,
    "pow2": reserve_pow2,
}


class SlabAllocator(AllocatorBase):
    """Contiguous slabs placed by a `Placement`; the reservation policy decides the slab size."""

    def __init__(
        self,
        name: str,
        capacity_tokens: int,
        placement: Placement,
        reserve: ReservationPolicy,
        max_model_len: int | None,
    ) -> None:
        self.name = name
        self.capacity_tokens = capacity_tokens
        self.placement = placement
        self.max_model_len = max_model_len
        self._reserve = reserve
        self._ledger = DuplicateLedger()
        self._content_keys: dict[int, list[Hashable]] = {}  # seq id -> ledger keys it holds
        self.live = np.zeros(0, dtype=bool)
        self.lengths_tokens = np.zeros(0, dtype=np.int64)
        self.reserved_tokens = np.zeros(0, dtype=np.int64)  # slab size (placement-rounded)
        self.offsets_tokens = np.zeros(0, dtype=np.int64)
        self.final_tokens = np.zeros(0, dtype=np.int64)  # true final length: accounting only
        self.prefix_hit = np.zeros(0, dtype=np.int64)

    # ---- per-sequence arrays -------------------------------------------------------------
    # Per-sequence arrays and the value of a row no sequence has used yet.
    _ROW_FILLS: dict[str, int | bool] = {
        "live": False,
        "lengths_tokens": 0,
        "reserved_tokens": 0,
        "offsets_tokens": 0,
        "final_tokens": 0,
        "prefix_hit": 0,
    }

    def _ensure_rows(self, seq_id: int) -> None:
        ensure_rows(self, seq_id, self._ROW_FILLS)

    # ---- protocol ------------------------------------------------------------------------
    def reservation_tokens(self, seq: SeqSpec) -> int:
        """Slots the policy asks for (before placement rounding)."""
        return self._reserve(seq)

    def demand_tokens(self, seq: SeqSpec) -> int:
        return self.placement.slab_tokens(self._reserve(seq))

    def rejection_reason(self, seq: SeqSpec) -> str:
        """Why `seq` could never be admitted, even into an empty cache ("" when it could)."""
        if self.max_model_len is not None and seq.prompt_tokens > self.max_model_len:
            return "prompt_exceeds_max_model_len"
        if seq.prompt_tokens > self._reserve(seq):
            return "prompt_exceeds_reservation"
        if self.demand_tokens(seq) > self.capacity_tokens:
            return "demand_exceeds_capacity"
        return ""

    def admit(self, seq: SeqSpec) -> bool:
        check_new_seq(self, seq.seq_id)
        request = self._reserve(seq)
        if seq.prompt_tokens > request:
            return False
        offset = self.placement.allocate(request)
        if offset is None:
            return False
        self._start(seq, offset, self.placement.slab_tokens(request), seq.prompt_tokens)
        keys = []
        for key, tokens in prompt_segments(seq):
            self._ledger.add(key, tokens)
            keys.append(key)
        self._content_keys[seq.seq_id] = keys
        return True

    def _start(self, seq: SeqSpec, offset: int, slab: int, length: int) -> None:
        sid = seq.seq_id
        self._ensure_rows(sid)
        self.live[sid] = True
        self.lengths_tokens[sid] = length
        self.reserved_tokens[sid] = slab
        self.offsets_tokens[sid] = offset
        self.final_tokens[sid] = seq.final_tokens
        self.prefix_hit[sid] = 0

    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        if num_tokens <= 0 or seq_ids.size == 0:
            return np.zeros(0, dtype=np.int64)
        new_lengths = self.lengths_tokens[seq_ids] + num_tokens
        fits = new_lengths <= self._growth_limit_tokens[seq_ids]
        self.lengths_tokens[seq_ids[fits]] = new_lengths[fits]
        return seq_ids[~fits]

    def max_uniform_growth(self, seq_ids: np.ndarray, limit: int) -> int:
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        if limit <= 0:
            return 0
        if seq_ids.size == 0:
            return int(limit)
        headroom = int((self._growth_limit_tokens[seq_ids] - self.lengths_tokens[seq_ids]).min())
        return max(0, min(int(limit), headroom))

    @property
    def _growth_limit_tokens(self) -> np.ndarray:
        """Per sequence, the length its slab lets it reach (the reservation; windowed slabs override)."""
        return self.reserved_tokens

    def release(self, seq_id: int) -> None:
        check_live_seq(self, seq_id)
        self.placement.free(int(self.offsets_tokens[seq_id]), int(self.reserved_tokens[seq_id]))
        for key in self._content_keys.pop(seq_id):
            self._ledger.remove(key)
        self.live[seq_id] = False
        self.lengths_tokens[seq_id] = 0
        self.reserved_tokens[seq_id] = 0

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        """The child gets its own slab (per the policy) and a copy of the parent's tokens."""
        check_live_seq(self, parent_id)
        check_new_seq(self, child.seq_id)
        parent_length = int(self.lengths_tokens[parent_id])
        request = self._reserve(child)
        if parent_length > self.placement.slab_tokens(request):
            return False
        offset = self.placement.allocate(request)
        if offset is None:
            return False
        self._start(child, offset, self.placement.slab_tokens(request), parent_length)
        self.prefix_hit[child.seq_id] = min(parent_length, child.prompt_tokens)
        parent_keys = self._content_keys[parent_id]
        covered = sum(self._ledger.tokens_of(key) for key in parent_keys)
        if parent_length > covered:  # the parent's own tokens become named content, now copied
            fork_key = self._ledger.new_key("fork")
            self._ledger.add(fork_key, parent_length - covered)
            parent_keys.append(fork_key)
        child_keys = list(parent_keys)
        for key in child_keys:
            self._ledger.add(key, self._ledger.tokens_of(key))
        self._content_keys[child.seq_id] = child_keys
        return True

    def prefix_hit_tokens(self, seq_id: int) -> int:
        return int(self.prefix_hit[seq_id])

    def live_seq_ids(self) -> np.ndarray:
        return np.flatnonzero(self.live)

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        ids = self.live_seq_ids()
        lengths = self.lengths_tokens[ids]
        reserved = self.reserved_tokens[ids]
        will_fill = np.minimum(reserved, np.maximum(self.final_tokens[ids], lengths))
        stored = int(lengths.sum())
        duplicated = self._ledger.duplicated_tokens
        free_total = self.placement.free_tokens()
        external = self.placement.unusable_tokens(next_demand_tokens)
        return MemoryBreakdown(
            capacity=self.capacity_tokens,
            token_states=stored - duplicated,
            reservation=int((will_fill - lengths).sum()),
            internal=int((reserved - will_fill).sum()),
            external=external,
            duplicated=duplicated,
            free=free_total - external,
        )

    def layout(self) -> Layout:
        ids = self.live_seq_ids()
        return Layout(
            kind="contiguous",
            capacity_tokens=self.capacity_tokens,
            block_size=1,
            seq_ids=ids.copy(),
            lengths_tokens=self.lengths_tokens[ids].copy(),
            offsets_tokens=self.offsets_tokens[ids].copy(),
            reserved_tokens=self.reserved_tokens[ids].copy(),
        )

    def hole_stats(self) -> dict[str, float]:
        return hole_stats_from_sizes(self.placement.hole_sizes())

    def state_snapshot(self) -> tuple:
        """Everything observable, for tests that check a refused operation changed nothing."""
        ids = self.live_seq_ids()
        return (
            tuple(ids.tolist()),
            tuple(self.lengths_tokens[ids].tolist()),
            tuple(self.reserved_tokens[ids].tolist()),
            tuple(self.offsets_tokens[ids].tolist()),
            tuple(self.placement.hole_sizes().tolist()),
            self.placement.free_tokens(),
            self._ledger.duplicated_tokens,
        )
