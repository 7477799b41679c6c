"""Sliding-window models in the contiguous and uniform-paged families, accounted in layer-slots.

Why a unit finer than a token slot: a model with window layers (Gemma 3: 52 of 62 layers see only the
last 1024 tokens) keeps different numbers of tokens in different layers, so "slots held" is no longer
a whole number of token slots. Every windowed allocator therefore counts in *layer-slots*: one
token's K and V in one layer. A token slot is `num_layers` layer-slots, `capacity_tokens` and every
`MemoryBreakdown` part are in layer-slots, and the parts still sum to the capacity exactly
(docs/metrics.md "Sliding windows"). All layers of the supported models have the same per-layer KV
size (Gemma 3, gpt-oss, Mistral), so layer-slots are also bytes-weighted.

- `WindowedSlabAllocator` (contiguous, request_limit): a slab per sequence that reserves the policy's
  tokens on full layers and only `min(window, tokens)` on window layers (a ring buffer per window
  layer, as a static sliding-window cache does). Nothing is ever held outside the window.
- `UniformWindowAccounting` (paged, virtual on a windowed model): the wrapped allocator treats every
  layer as full attention (vLLM's uniform KV cache spec with sliding windows disabled); the wrapper
  only reports, in layer-slots, the window layers' slots that hold tokens no attention reads again
  as `out_of_window`.

A token at position p is read again by a window layer while the next token (at position `length`)
attends to it, i.e. while p >= length - window + 1 (vLLM's SlidingWindowManager.get_num_skipped_tokens:
num_computed_tokens - sliding_window + 1 tokens are skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from allocators.base import AllocatorBase, AllocatorConfigError, Layout, MemoryBreakdown, SeqSpec
from allocators.contiguous import ReservationPolicy, SlabAllocator
from allocators.placement import Placement
from allocators.prefix_keys import prompt_segments
from allocators.seq_arrays import check_live_seq, check_new_seq


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """How many layers attend fully and how many within a window of `window_tokens`."""

    num_layers: int
    num_window_layers: int
    window_tokens: int

    def __post_init__(self) -> None:
        if not 0 < self.num_window_layers <= self.num_layers:
            raise AllocatorConfigError(
                f"num_window_layers must be in [1, num_layers={self.num_layers}], "
                f"got {self.num_window_layers}"
            )
        if self.window_tokens < 1:
            raise AllocatorConfigError(f"window_tokens must be an integer >= 1, got {self.window_tokens}")

    @property
    def num_full_layers(self) -> int:
        return self.num_layers - self.num_window_layers

    def skipped_tokens(self, lengths: Any) -> Any:
        """Tokens before the window of the next token: max(0, length - window + 1) (scalar or array)."""
        return np.maximum(0, np.asarray(lengths) - self.window_tokens + 1)

    def slots(self, tokens: Any) -> Any:
        """Layer-slots a window-aware cache needs for `tokens`: full layers all, window layers the window."""
        tokens = np.asarray(tokens)
        return self.num_full_layers * tokens + self.num_window_layers * np.minimum(tokens, self.window_tokens)


def layer_plan(num_layers: Any, num_window_layers: Any, window_tokens: Any) -> LayerPlan | None:
    """The plan for a windowed model; None when the model has no window layers."""
    if not num_window_layers:
        return None
    return LayerPlan(int(num_layers), int(num_window_layers), int(window_tokens))


class WindowedSlabAllocator(SlabAllocator):
    """Contiguous slabs sized for full layers at the reservation and window layers at the window.

    `capacity_tokens` and the placement are in layer-slots; lengths and reservations stay in tokens.
    Duplicated prefixes are counted on the full layers only (a window layer's copy of a shared prompt
    is overwritten as the window moves); window-layer copies count as token states.
    """

    def __init__(
        self,
        name: str,
        capacity_slots: int,
        placement: Placement,
        reserve: ReservationPolicy,
        max_model_len: int | None,
        plan: LayerPlan,
    ) -> None:
        super().__init__(name, capacity_slots, placement, reserve, max_model_len)
        self.plan = plan
        self.slots_per_token = plan.num_layers
        self.cap_tokens = np.zeros(0, dtype=np.int64)  # tokens the slab can hold (the policy's request)
        self._ROW_FILLS = {**SlabAllocator._ROW_FILLS, "cap_tokens": 0}

    def demand_tokens(self, seq: SeqSpec) -> int:
        return self.placement.slab_tokens(int(self.plan.slots(self._reserve(seq))))

    def rejection_reason(self, seq: SeqSpec) -> str:
        if self.max_model_len is not None and seq.prompt_tokens > self.max_model_len:
            return "prompt_exceeds_max_model_len"
        if seq.prompt_tokens > self._reserve(seq):
            return "prompt_exceeds_reservation"
        if self.demand_tokens(seq) > self.capacity_tokens:
            return "demand_exceeds_capacity"
        return ""

    def _place(self, seq: SeqSpec, length: int) -> bool:
        request_tokens = self._reserve(seq)
        if length > request_tokens:
            return False
        request = int(self.plan.slots(request_tokens))
        offset = self.placement.allocate(request)
        if offset is None:
            return False
        self._start(seq, offset, self.placement.slab_tokens(request), length)
        self.cap_tokens[seq.seq_id] = request_tokens
        return True

    def admit(self, seq: SeqSpec) -> bool:
        check_new_seq(self, seq.seq_id)
        if not self._place(seq, seq.prompt_tokens):
            return False
        keys = []
        for key, tokens in prompt_segments(seq):
            self._ledger.add(key, tokens)
            keys.append(key)
        self._content_keys[seq.seq_id] = keys
        return True

    @property
    def _growth_limit_tokens(self) -> np.ndarray:
        """A windowed slab grows up to its token cap (its full-layer reservation)."""
        return self.cap_tokens

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        """The child gets its own slab and a copy of the parent's tokens (counted as token states)."""
        check_live_seq(self, parent_id)
        check_new_seq(self, child.seq_id)
        parent_length = int(self.lengths_tokens[parent_id])
        if not self._place(child, parent_length):
            return False
        self.prefix_hit[child.seq_id] = min(parent_length, child.prompt_tokens)
        self._content_keys[child.seq_id] = []
        return True

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        ids = self.live_seq_ids()
        lengths = self.lengths_tokens[ids]
        cap = self.cap_tokens[ids]
        will_fill = np.minimum(cap, np.maximum(self.final_tokens[ids], lengths))
        stored = int(self.plan.slots(lengths).sum())
        filled = int(self.plan.slots(will_fill).sum())
        duplicated = self.plan.num_full_layers * self._ledger.duplicated_tokens
        free_total = self.placement.free_tokens()
        external = self.placement.unusable_tokens(next_demand_tokens)
        return MemoryBreakdown(
            capacity=self.capacity_tokens,
            token_states=stored - duplicated,
            reservation=filled - stored,
            internal=int(self.reserved_tokens[ids].sum()) - filled,
            external=external,
            duplicated=duplicated,
            free=free_total - external,
        )


class UniformWindowAccounting(AllocatorBase):
    """A token-slot allocator (paged, virtual) over a windowed model, reported in layer-slots.

    Every call is the inner allocator's, with token slots scaled by `num_layers`; the breakdown moves
    the window layers' slots of skipped tokens from `token_states` to `out_of_window`. With shared
    prefixes the skipped tokens are counted per holder and capped at the token states (an upper bound
    when many sequences share one prompt's blocks).
    """

    def __init__(self, inner: Any, plan: LayerPlan) -> None:
        self.inner = inner
        self.plan = plan
        self.name = inner.name
        self.slots_per_token = plan.num_layers
        self.capacity_tokens = inner.capacity_tokens * plan.num_layers

    def __getattr__(self, name: str) -> Any:  # prefix_hit_tokens, lengths_tokens, live, pool, ...
        return getattr(self.inner, name)

    # The Protocol's optional abilities are the inner allocator's, except the exact jump integral:
    # the inner hook integrates token slots without the window part, so the engine interpolates.
    @property
    def allocates_per_chunk(self) -> bool:  # type: ignore[override]
        return bool(self.inner.allocates_per_chunk)

    @property
    def swap_block_tokens(self) -> int:  # type: ignore[override]
        return int(self.inner.swap_block_tokens)

    @property
    def content_identity(self) -> bool:  # type: ignore[override]
        return bool(self.inner.content_identity)

    @property
    def cpu_tier(self) -> Any:  # type: ignore[override]
        return self.inner.cpu_tier

    def rejection_reason(self, seq: SeqSpec) -> str:
        return self.inner.rejection_reason(seq)

    def layout(self) -> Layout:
        return self.inner.layout()

    def hole_stats(self) -> dict[str, float]:
        return self.inner.hole_stats()

    def demand_tokens(self, seq: SeqSpec) -> int:
        return int(self.inner.demand_tokens(seq)) * self.slots_per_token

    def admit(self, seq: SeqSpec) -> bool:
        return bool(self.inner.admit(seq))

    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        return self.inner.grow(seq_ids, num_tokens)

    def max_uniform_growth(self, seq_ids: np.ndarray, limit: int) -> int:
        return int(self.inner.max_uniform_growth(seq_ids, limit))

    def release(self, seq_id: int) -> None:
        self.inner.release(seq_id)

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        return bool(self.inner.fork(parent_id, child))

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        scale = self.slots_per_token
        parts = self.inner.breakdown(-(-next_demand_tokens // scale))
        live = np.flatnonzero(self.inner.live)
        skipped = int(self.plan.skipped_tokens(self.inner.lengths_tokens[live]).sum())
        out = min(self.plan.num_window_layers * skipped, parts.token_states * scale)
        return MemoryBreakdown(
            capacity=parts.capacity * scale,
            token_states=parts.token_states * scale - out,
            reservation=parts.reservation * scale,
            internal=parts.internal * scale,
            external=parts.external * scale,
            duplicated=parts.duplicated * scale,
            free=parts.free * scale,
            cached=parts.cached * scale,
            out_of_window=out,
        )
