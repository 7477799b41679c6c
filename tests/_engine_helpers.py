"""Small, hand-checkable fakes for the engine tests: allocators and cost models with obvious rules.

Why fakes: the engine must be testable through the Protocol alone (and before, or independently of,
the real allocators); these fakes are deliberately simple so expected numbers can be worked by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from allocators.base import AllocatorBase, Layout, MemoryBreakdown, SeqSpec


class FakeSlab(AllocatorBase):
    """Reserves prompt + max_tokens at admission (the request-limit policy), no placement holes."""

    name = "fake_slab"

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self.length: dict[int, int] = {}
        self.reserved: dict[int, int] = {}
        self.final: dict[int, int] = {}

    def demand_tokens(self, seq: SeqSpec) -> int:
        return seq.prompt_tokens + seq.max_tokens

    def _free(self) -> int:
        return self.capacity_tokens - sum(self.reserved.values())

    def admit(self, seq: SeqSpec) -> bool:
        assert seq.seq_id not in self.length, f"seq {seq.seq_id} admitted twice"
        need = self.demand_tokens(seq)
        if need > self._free():
            return False
        self.length[seq.seq_id] = seq.prompt_tokens
        self.reserved[seq.seq_id] = need
        self.final[seq.seq_id] = seq.final_tokens
        return True

    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        failed = []
        for sid in seq_ids.tolist():
            if self.length[sid] + num_tokens > self.reserved[sid]:
                failed.append(sid)
            else:
                self.length[sid] += num_tokens
        return np.asarray(failed, dtype=np.int64)

    def max_uniform_growth(self, seq_ids: np.ndarray, limit: int) -> int:
        room = min((self.reserved[s] - self.length[s] for s in seq_ids.tolist()), default=limit)
        return max(0, min(limit, room))

    def release(self, seq_id: int) -> None:
        del self.length[seq_id], self.reserved[seq_id], self.final[seq_id]

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        need = self.reserved[parent_id]
        if need > self._free():
            return False
        self.length[child.seq_id] = self.length[parent_id]
        self.reserved[child.seq_id] = need
        self.final[child.seq_id] = child.final_tokens
        return True

    def prefix_hit_tokens(self, seq_id: int) -> int:
        return 0

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        tokens = sum(self.length.values())
        will_fill = sum(min(self.reserved[s], self.final[s]) for s in self.length)
        reserved = sum(self.reserved.values())
        free = self.capacity_tokens - reserved
        external = free if next_demand_tokens > free else 0
        return MemoryBreakdown(
            capacity=self.capacity_tokens,
            token_states=tokens,
            reservation=will_fill - tokens,
            internal=reserved - will_fill,
            external=external,
            duplicated=0,
            free=free - external,
        )

    def layout(self) -> Layout:
        ids = np.asarray(sorted(self.length), dtype=np.int64)
        return Layout("contiguous", self.capacity_tokens, 1, ids, np.asarray([self.length[i] for i in ids]))

    def hole_stats(self) -> dict[str, float]:
        return {"count": 1.0, "total": float(self._free())}

    def in_use(self) -> int:
        return len(self.length)


class FakePaged(AllocatorBase):
    """Blocks of `block_size` handed out on demand; first come first served inside one grow call."""

    name = "fake_paged"

    def __init__(self, capacity_tokens: int, block_size: int = 16) -> None:
        self.block_size = block_size
        self.swap_block_tokens = block_size  # swaps whole blocks, as the paged allocator declares
        self.num_blocks = capacity_tokens // block_size
        self.capacity_tokens = capacity_tokens
        self.length: dict[int, int] = {}
        self.final: dict[int, int] = {}
        self.free_blocks = self.num_blocks

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def demand_tokens(self, seq: SeqSpec) -> int:
        return self._blocks(seq.prompt_tokens) * self.block_size

    def admit(self, seq: SeqSpec) -> bool:
        assert seq.seq_id not in self.length
        need = self._blocks(seq.prompt_tokens)
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        self.length[seq.seq_id] = seq.prompt_tokens
        self.final[seq.seq_id] = seq.final_tokens
        return True

    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        failed = []
        for sid in seq_ids.tolist():
            now = self.length[sid]
            need = self._blocks(now + num_tokens) - self._blocks(now)
            if need > self.free_blocks:
                failed.append(sid)
            else:
                self.free_blocks -= need
                self.length[sid] = now + num_tokens
        return np.asarray(failed, dtype=np.int64)

    def _need(self, seq_ids: list[int], k: int) -> int:
        return sum(self._blocks(self.length[s] + k) - self._blocks(self.length[s]) for s in seq_ids)

    def max_uniform_growth(self, seq_ids: np.ndarray, limit: int) -> int:
        ids = seq_ids.tolist()
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._need(ids, mid) <= self.free_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def release(self, seq_id: int) -> None:
        self.free_blocks += self._blocks(self.length.pop(seq_id))
        del self.final[seq_id]

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        need = self._blocks(self.length[parent_id])
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        self.length[child.seq_id] = self.length[parent_id]
        self.final[child.seq_id] = child.final_tokens
        return True

    def prefix_hit_tokens(self, seq_id: int) -> int:
        return 0

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        bs = self.block_size
        tokens = sum(self.length.values())
        allocated = sum(self._blocks(v) * bs for v in self.length.values())
        will_fill = sum(min(self._blocks(v) * bs, self.final[s]) for s, v in self.length.items())
        free = self.capacity_tokens - allocated
        external = free if next_demand_tokens > self.free_blocks * bs else 0
        return MemoryBreakdown(
            capacity=self.capacity_tokens,
            token_states=tokens,
            reservation=will_fill - tokens,
            internal=allocated - will_fill,
            external=external,
            duplicated=0,
            free=free - external,
        )

    def breakdown_integral(
        self,
        seq_ids: np.ndarray,
        durations_s: np.ndarray,
        next_demand_tokens: int = 0,
        *,
        first: MemoryBreakdown | None = None,
        total_s: float | None = None,
    ) -> dict[str, float]:
        """sum_i durations_s[i] x part after growing `seq_ids` by i tokens (the exact hook)."""
        bs, m = self.block_size, len(durations_s)
        growing = set(seq_ids.tolist())
        ids = sorted(self.length)
        lengths = np.asarray([self.length[s] for s in ids], dtype=np.int64)
        final = np.asarray([self.final[s] for s in ids], dtype=np.int64)
        step = np.asarray([1 if s in growing else 0 for s in ids], dtype=np.int64)
        grid = lengths[:, None] + step[:, None] * np.arange(m)[None, :]
        reserved = -(-grid // bs) * bs
        will_fill = np.minimum(reserved, final[:, None])
        free = self.capacity_tokens - reserved.sum(axis=0)
        external = np.where(next_demand_tokens > free, free, 0)
        parts = {
            "token_states": grid.sum(axis=0),
            "reservation": (will_fill - grid).sum(axis=0),
            "internal": (reserved - will_fill).sum(axis=0),
            "external": external,
            "duplicated": np.zeros(m),
            "free": free - external,
            "cached": np.zeros(m),
        }
        return {name: float(np.dot(values, durations_s)) for name, values in parts.items()}

    def layout(self) -> Layout:
        ids = np.asarray(sorted(self.length), dtype=np.int64)
        return Layout(
            "paged", self.capacity_tokens, self.block_size, ids, np.asarray([self.length[i] for i in ids])
        )

    def hole_stats(self) -> dict[str, float]:
        return {"count": float(self.free_blocks), "total": float(self.free_blocks * self.block_size)}

    def in_use(self) -> int:
        return len(self.length)


class LinearCost:
    """step = base_s + per_prefill_token_s * prefill + per_context_token_s * decode context (+ swap)."""

    def __init__(
        self,
        base_s: float = 0.01,
        per_prefill_token_s: float = 0.0,
        per_context_token_s: float = 0.0,
        per_swap_token_s: float = 1e-6,
    ) -> None:
        self.base_s = base_s
        self.per_prefill_token_s = per_prefill_token_s
        self.per_context_token_s = per_context_token_s
        self.per_swap_token_s = per_swap_token_s

    def step_time_s(
        self,
        prefill_tokens: int,
        num_decode_seqs: int,
        decode_context_tokens: int,
        prefill_context_tokens: int = 0,
    ) -> float:
        if prefill_tokens <= 0 and num_decode_seqs <= 0:
            return 0.0
        return (
            self.base_s
            + self.per_prefill_token_s * prefill_tokens
            + self.per_context_token_s * decode_context_tokens
        )

    def decode_step_durations_s(self, num_decode_seqs: int, context_tokens_sum: int, k: int) -> np.ndarray:
        c = self.per_context_token_s
        return self.base_s + c * (context_tokens_sum + num_decode_seqs * np.arange(k, dtype=np.float64))

    def decode_steps_starting_before(
        self, num_decode_seqs: int, context_tokens_sum: int, k: int, gap_s: float
    ) -> int:
        starts = self.decode_step_durations_s(num_decode_seqs, context_tokens_sum, k)[:-1].cumsum()
        return 1 + int(starts.searchsorted(gap_s, side="left"))

    def swap_time_s(self, tokens: int) -> float:
        return max(0, tokens) * self.per_swap_token_s

    def offload_step_s(self, compute_s: float, load_tokens: int, store_tokens: int) -> float:
        return max(compute_s + self.swap_time_s(load_tokens), self.swap_time_s(store_tokens))


def make_requests(
    arrival_s: list[float],
    prompt_tokens: list[int],
    output_tokens: list[int],
    max_tokens: list[int] | None = None,
    n: list[int] | None = None,
) -> pd.DataFrame:
    num = len(arrival_s)
    df = pd.DataFrame(
        {
            "request_id": np.arange(num, dtype=np.int64),
            "arrival_s": np.asarray(arrival_s, dtype=np.float64),
            "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64),
            "output_tokens": np.asarray(output_tokens, dtype=np.int64),
            "max_tokens": np.asarray(max_tokens if max_tokens is not None else output_tokens, dtype=np.int64),
        }
    )
    if n is not None:
        df["n"] = np.asarray(n, dtype=np.int64)
    return df


def random_requests(
    rng: np.random.Generator, num: int, rate: float, mean_prompt: int, mean_output: int
) -> pd.DataFrame:
    gaps = rng.exponential(1.0 / rate, num)
    arrival = np.cumsum(gaps) - gaps[0]
    prompt = np.maximum(1, rng.geometric(1.0 / mean_prompt, num))
    output = np.maximum(1, rng.geometric(1.0 / mean_output, num))
    max_tokens = output + rng.integers(0, mean_output, num)
    return make_requests(arrival.tolist(), prompt.tolist(), output.tolist(), max_tokens.tolist())


def isclose_rel(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)
