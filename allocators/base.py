"""The allocator contract: what the engine may ask of KV memory, in token slots.

Why a Protocol and plain data here: the engine (sim/) must never know which allocator it drives,
and allocators must never know about time, SimPy or pandas. Everything crosses this boundary as
ints and NumPy arrays so that `grow` can be vectorised over all running sequences.

Units: every quantity is in *token slots* (one token's K and V for every layer). Bytes are
slots x bytes-per-token, which the caller knows; the allocator does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np


class AllocatorConfigError(ValueError):
    """A bad allocator argument: the message says what is wrong and what is allowed."""


class SeqSpec(NamedTuple):
    """What an allocator may know about a sequence when it is admitted.

    `output_tokens` is the true length: only the accounting (`breakdown`) and the explicit
    `oracle`/`pow2` reservation policies may read it. Seq ids are small non-negative ints that the
    engine assigns densely, so allocators may index NumPy arrays by them.

    Why a NamedTuple (immutable, hashable, fields by name): the scheduler builds one or two per
    request, and a tuple is built in a quarter of the time of a frozen dataclass (issue 16).
    """

    seq_id: int
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    prefix_group: int = -1  # -1: no shared system prompt
    prefix_tokens: int = 0  # length of the shared prefix inside the prompt
    block_hashes: tuple[int, ...] = ()  # prefix-block ids (Mooncake style); equal id = identical KV
    block_hash_tokens: int = 0  # tokens covered by one hash (e.g. 512 for Mooncake)
    # Content identity of the tokens the names above do not cover (prefix_keys.sequence_block_keys):
    # None = anonymous. Blocks past `content_prompt_tokens` hold generated tokens, sample-specific.
    content_key: tuple | None = None
    content_prompt_tokens: int = 0
    sample: int = 0
    # > 0: hold only the cache hits plus this many new prompt tokens now; the rest of the prompt
    # comes through `grow`, one chunk at a time (chunked prefill, vLLM v1). Only allocators with
    # `allocates_per_chunk = True` honour it; the engine asks nothing else of them.
    first_chunk_tokens: int = 0

    @property
    def final_tokens(self) -> int:
        """Length the sequence will reach: prompt + generated, capped by the client's limit."""
        return self.prompt_tokens + min(self.output_tokens, self.max_tokens)


# The taxonomy, in the order the parts are stacked in every figure.
BREAKDOWN_PARTS: tuple[str, ...] = (
    "token_states",
    "reservation",
    "internal",
    "external",
    "duplicated",
    "out_of_window",
    "free",
)


class _BreakdownParts(NamedTuple):
    capacity: int
    token_states: int
    reservation: int
    internal: int
    external: int
    duplicated: int
    free: int
    cached: int = 0
    # Slots held for tokens that slid out of a sliding window: no attention reads them again (issue 14,
    # docs/metrics.md). Last so the allocators' positional construction stays valid; 0 for full attention.
    out_of_window: int = 0


class MemoryBreakdown(_BreakdownParts):
    """The vLLM paper's taxonomy of KV memory at one instant, in token slots.

    The six parts sum to `capacity` exactly. `duplicated` slots are carved out of what would
    otherwise be token states (a second copy is not a new token state). `cached` is an
    informational sub-part of `free`: prefix-cache blocks kept for reuse but evictable on demand.

    Why a checked NamedTuple (immutable, fields by name and position): the engine builds one every
    turn, and a tuple is built in a third of the time of a frozen dataclass (issue 16); the sum and
    sign checks run on every construction all the same.
    """

    __slots__ = ()

    def __new__(
        cls,
        capacity: int,
        token_states: int,
        reservation: int,
        internal: int,
        external: int,
        duplicated: int,
        free: int,
        cached: int = 0,
        out_of_window: int = 0,
    ) -> MemoryBreakdown:
        # No reflection here: this runs once per engine event, so it must stay plain int arithmetic.
        self = tuple.__new__(
            cls,
            (
                capacity,
                token_states,
                reservation,
                internal,
                external,
                duplicated,
                free,
                cached,
                out_of_window,
            ),
        )
        total = token_states + reservation + internal + external + duplicated + free + out_of_window
        if total != capacity:
            raise AssertionError(f"breakdown parts sum to {total}, capacity is {capacity}: {self}")
        if min(token_states, reservation, internal, external, duplicated, out_of_window, free, cached) < 0:
            raise AssertionError(f"a breakdown part is negative: {self}")
        return self

    @property
    def allocated(self) -> int:
        """Slots not available to a new request: everything but `free`."""
        return self.capacity - self.free

    @property
    def waste_pct(self) -> float:
        """1 - token_states / allocated, in percent (0 when nothing is allocated)."""
        return 0.0 if self.allocated == 0 else 100.0 * (1.0 - self.token_states / self.allocated)

    def as_dict(self) -> dict[str, int]:
        return dict(self._asdict())


@dataclass(slots=True)
class Layout:
    """Physical placement of every live sequence at one instant, for gpu/ to replay.

    kind == "contiguous": `offsets_tokens[i]` is where sequence i's slab starts in the linear
    address space and `reserved_tokens[i]` its size. kind == "paged": `block_table[i, :n]` holds the
    physical block ids of sequence i (padded with -1), `block_size` tokens per block.
    """

    kind: str
    capacity_tokens: int
    block_size: int
    seq_ids: np.ndarray
    lengths_tokens: np.ndarray
    offsets_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    reserved_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    block_table: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int32))

    def to_npz(self, path: str) -> None:
        np.savez_compressed(
            path,
            kind=np.array(self.kind),
            capacity_tokens=np.array(self.capacity_tokens),
            block_size=np.array(self.block_size),
            seq_ids=self.seq_ids,
            lengths_tokens=self.lengths_tokens,
            offsets_tokens=self.offsets_tokens,
            reserved_tokens=self.reserved_tokens,
            block_table=self.block_table,
        )

    @classmethod
    def from_npz(cls, path: str) -> Layout:
        with np.load(path, allow_pickle=False) as z:
            return cls(
                kind=str(z["kind"]),
                capacity_tokens=int(z["capacity_tokens"]),
                block_size=int(z["block_size"]),
                seq_ids=z["seq_ids"],
                lengths_tokens=z["lengths_tokens"],
                offsets_tokens=z["offsets_tokens"],
                reserved_tokens=z["reserved_tokens"],
                block_table=z["block_table"],
            )


class OffloadTier(Protocol):
    """What the engine reads of a CPU tier under the prefix cache (allocators/cpu_tier.py `CpuTier`).

    Declared here, not imported, so that this contract module depends on no allocator module.
    """

    @property
    def capacity_tokens(self) -> int: ...

    @property
    def used_tokens(self) -> int: ...

    def take_transfers(self) -> tuple[int, int]:
        """(tokens loaded CPU -> GPU, tokens stored GPU -> CPU) since the last call; resets both."""
        ...

    def totals(self) -> dict[str, int]:
        """The tier's running counters (token slots), for the summary."""
        ...


@runtime_checkable
class Allocator(Protocol):
    """What the serving loop may ask of KV memory. See docs/allocators.md for the semantics."""

    name: str
    capacity_tokens: int
    # Whether `admit` may hold only the first chunk of the prompt and `grow` the rest chunk by chunk
    # (vLLM v1's per-chunk allocation under chunked prefill); slabs reserve everything at admission.
    allocates_per_chunk: bool
    # Whether growing sequences can free memory (sliding windows drop blocks they no longer read), so
    # a waiting request may fit in the middle of a decode stretch, not only when a request finishes.
    frees_while_growing: bool
    # Tokens per unit in which a preempted sequence's KV is swapped to CPU memory: a paged cache moves
    # whole blocks (vLLM v0 block_manager_v1.py `BlockSpaceManager.swap_out` maps GPU blocks to CPU
    # blocks), so the swap space a sequence holds is its token count rounded up to this many.
    swap_block_tokens: int
    # Whether the allocator caches KV by content (prefix caching over every full block, prompt and
    # generated): then every request's own tokens need a name (`SeqSpec.content_key`), as vLLM hashes
    # each full block's token ids (v1 block_pool.py `BlockPool.cache_full_blocks`).
    content_identity: bool
    # The CPU tier under the prefix cache (vLLM v1's KV-offloading connector, allocators/cpu_tier.py),
    # or None: the engine prices its PCIe traffic each step and the summary reports its hits.
    cpu_tier: OffloadTier | None

    def demand_tokens(self, seq: SeqSpec) -> int:
        """Slots this policy needs free, in one piece where the policy needs one, to admit `seq`."""
        ...

    def admit(self, seq: SeqSpec) -> bool:
        """Reserve what the policy needs and hold the prompt's KV. On False nothing changed."""
        ...

    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        """Add `num_tokens` token states to each sequence; return the ids that could not grow.

        Sequences that fail are left exactly as they were; the others have grown.
        """
        ...

    def max_uniform_growth(self, seq_ids: np.ndarray, limit: int) -> int:
        """Largest k <= limit such that grow(seq_ids, k) would succeed for every sequence now.

        Lets the engine jump k decode iterations at once without touching each sequence. An allocator
        whose growth frees memory (`frees_while_growing`) returns the largest k that needs no release,
        which a jump and one-iteration stepping both reach.
        """
        ...

    def release(self, seq_id: int) -> None:
        """Free the sequence's slots (shared blocks only when their refcount drops to 0)."""
        ...

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        """Start `child` as a copy of the parent's current state (copy-on-write where possible)."""
        ...

    def prefix_hit_tokens(self, seq_id: int) -> int:
        """Prompt tokens whose KV was already present (shared/cached) when the sequence was admitted."""
        ...

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        """The taxonomy now; free slots that cannot serve `next_demand_tokens` count as external."""
        ...

    def layout(self) -> Layout:
        """Physical placement of every live sequence (for gpu/ replay)."""
        ...

    def hole_stats(self) -> dict[str, float]:
        """Free-space shape: count, total, mean, max hole (tokens). Paged: free blocks as holes."""
        ...

    def rejection_reason(self, seq: SeqSpec) -> str:
        """Why `seq` can never be admitted, even into an empty cache ("" when it can be)."""
        ...

    def available_tokens(self) -> int:
        """Slots a new request could take now: free ones plus cached ones evictable on demand.

        SGLang's scheduler admits against this (`available_size() + evictable_size()`,
        sglang/srt/managers/schedule_policy.py `PrefillAdder`), so its policy asks every allocator.
        """
        ...

    def cached_prefix_tokens(self, seq: SeqSpec) -> int:
        """Prompt tokens of `seq` the cache holds now, without changing anything (0 without a cache)."""
        ...

    def breakdown_integral(
        self,
        seq_ids: np.ndarray,
        durations_s: np.ndarray,
        next_demand_tokens: int = 0,
        *,
        first: MemoryBreakdown | None = None,
        total_s: float | None = None,
    ) -> dict[str, float] | None:
        """Exact sum_i durations_s[i] x each part after growing `seq_ids` by i tokens, or None.

        For allocators whose parts are step functions of growth (blocks, pages), so a multi-iteration
        jump integrates the taxonomy exactly. None means the parts change linearly over the jump and
        the engine interpolates between the breakdowns before and after it. `first` (the breakdown
        now) and `total_s` (durations_s.sum()) are passed by the engine, which has them already.
        """
        ...


class AllocatorBase:
    """The defaults of the Protocol's optional abilities; allocators inherit from it.

    Why defaults and not `getattr`: the engine asks every allocator the same questions, so an
    allocator that has nothing special to say inherits the neutral answer here, and the engine has
    no branch for an allocator that lacks a method.
    """

    name: str
    capacity_tokens: int
    allocates_per_chunk: bool = False  # admit holds the whole prompt (and a slab its whole reservation)
    frees_while_growing: bool = False  # memory comes back only when a sequence is released
    swap_block_tokens: int = 1  # swapped token by token (a slab moves exactly its tokens)
    content_identity: bool = False  # no content cache: requests need no names beyond their prompt's
    cpu_tier: OffloadTier | None = None  # no CPU tier: nothing is offloaded

    def rejection_reason(self, seq: SeqSpec) -> str:
        """No reason of its own: the engine says the demand exceeds the cache."""
        return ""

    def available_tokens(self) -> int:
        """Free slots (which include cached ones, evictable on demand) from the taxonomy."""
        return self.breakdown(0).free  # type: ignore[attr-defined]

    def cached_prefix_tokens(self, seq: SeqSpec) -> int:
        """No content cache to look into."""
        return 0

    def breakdown_integral(
        self,
        seq_ids: np.ndarray,
        durations_s: np.ndarray,
        next_demand_tokens: int = 0,
        *,
        first: MemoryBreakdown | None = None,
        total_s: float | None = None,
    ) -> dict[str, float] | None:
        """Parts that change linearly over a jump (slabs): the engine interpolates."""
        return None

    def layout(self) -> Layout:
        """An allocator without a physical layout to replay says so when a snapshot is asked for."""
        raise NotImplementedError(f"allocator {self.name!r} does not export layouts")

    def hole_stats(self) -> dict[str, float]:
        """No holes to describe: one hole of all the free slots is not known, so report none."""
        return {"count": 0.0, "total_tokens": 0.0, "mean_tokens": 0.0, "p50_tokens": 0.0, "max_tokens": 0.0}
