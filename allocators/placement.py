"""Free-space managers over one linear address space of token slots: first_fit, best_fit, buddy.

Why a separate module: the contiguous family (contiguous, request_limit) differs from paging in
*where* a slab can go. External fragmentation is only meaningful if it is measured from real holes
left by real placements, so every contiguous-family allocator delegates placement to one of these,
and `unusable_tokens(demand)` reports exactly the free slots that lie in pieces too small for it.

All managers share one small interface (`Placement`); `make_placement(name, capacity_tokens)` is the
registry. Offsets and sizes are plain ints: placements happen once per admission or release, never
per token, so clarity beats vectorisation here.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Protocol

import numpy as np

from allocators.base import AllocatorConfigError


class Placement(Protocol):
    """One linear address space [0, capacity_tokens) handing out contiguous slabs."""

    name: str
    capacity_tokens: int

    def slab_tokens(self, request_tokens: int) -> int:
        """Size of the slab actually taken for a request (buddy rounds up to a power of two)."""
        ...

    def allocate(self, request_tokens: int) -> int | None:
        """Take a slab of `slab_tokens(request_tokens)`; return its offset, or None if nothing fits."""
        ...

    def free(self, offset_tokens: int, slab_tokens: int) -> None:
        """Return a slab previously handed out by `allocate`."""
        ...

    def free_tokens(self) -> int:
        """Total free slots."""
        ...

    def hole_sizes(self) -> np.ndarray:
        """Sizes of the free pieces, in address order (buddy: its free blocks)."""
        ...

    def unusable_tokens(self, demand_tokens: int) -> int:
        """Free slots that lie in pieces too small to hold a slab for `demand_tokens`."""
        ...


class LinearHoles:
    """Sorted, always-coalesced list of free holes; subclasses choose which hole to cut from.

    Holes are kept as two parallel sorted lists (offsets, sizes) so neighbours can be found with
    bisect on release and merged at once: two adjacent free holes never coexist.
    """

    name = "linear"

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._hole_offsets: list[int] = [0]
        self._hole_sizes: list[int] = [capacity_tokens]
        self._free_tokens = capacity_tokens

    def slab_tokens(self, request_tokens: int) -> int:
        return request_tokens

    def _choose_hole(self, slab_tokens: int) -> int | None:
        raise NotImplementedError

    def allocate(self, request_tokens: int) -> int | None:
        slab = self.slab_tokens(request_tokens)
        if slab <= 0:
            return 0  # an empty slab takes nothing; any offset is valid
        if slab > self._free_tokens:
            return None
        index = self._choose_hole(slab)
        if index is None:
            return None
        offset = self._hole_offsets[index]
        remaining = self._hole_sizes[index] - slab
        if remaining == 0:
            del self._hole_offsets[index]
            del self._hole_sizes[index]
        else:
            self._hole_offsets[index] = offset + slab
            self._hole_sizes[index] = remaining
        self._free_tokens -= slab
        return offset

    def free(self, offset_tokens: int, slab_tokens: int) -> None:
        if slab_tokens <= 0:
            return
        index = bisect.bisect_left(self._hole_offsets, offset_tokens)
        start, size = offset_tokens, slab_tokens
        # merge with the following hole
        if index < len(self._hole_offsets) and self._hole_offsets[index] == start + size:
            size += self._hole_sizes[index]
            del self._hole_offsets[index]
            del self._hole_sizes[index]
        # merge with the preceding hole
        if index > 0 and self._hole_offsets[index - 1] + self._hole_sizes[index - 1] == start:
            self._hole_sizes[index - 1] += size
        else:
            self._hole_offsets.insert(index, start)
            self._hole_sizes.insert(index, size)
        self._free_tokens += slab_tokens

    def free_tokens(self) -> int:
        return self._free_tokens

    def hole_sizes(self) -> np.ndarray:
        return np.asarray(self._hole_sizes, dtype=np.int64)

    def hole_offsets(self) -> np.ndarray:
        return np.asarray(self._hole_offsets, dtype=np.int64)

    def unusable_tokens(self, demand_tokens: int) -> int:
        if demand_tokens <= 0:
            return 0
        slab = self.slab_tokens(demand_tokens)
        return sum(size for size in self._hole_sizes if size < slab)


class FirstFit(LinearHoles):
    """Lowest-address hole that is large enough (classic first fit)."""

    name = "first_fit"

    def _choose_hole(self, slab_tokens: int) -> int | None:
        for index, size in enumerate(self._hole_sizes):
            if size >= slab_tokens:
                return index
        return None


class BestFit(LinearHoles):
    """Smallest hole that is large enough (ties: lowest address), to keep big holes intact."""

    name = "best_fit"

    def _choose_hole(self, slab_tokens: int) -> int | None:
        best_index: int | None = None
        best_size = 0
        for index, size in enumerate(self._hole_sizes):
            if size >= slab_tokens and (best_index is None or size < best_size):
                best_index, best_size = index, size
                if size == slab_tokens:
                    break
        return best_index


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1); 0 for n <= 0."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


class Buddy:
    """Binary buddy allocator: slabs are power-of-two blocks aligned to their size.

    A capacity that is not a power of two is split into its binary digits (largest first), each a
    top-level block that never merges with its neighbour. Every block's offset is then a multiple of
    its size, so a block's buddy is at `offset ^ size`. The rounding up of a request is internal
    fragmentation of the slab; free blocks smaller than the rounded demand are external.
    """

    name = "buddy"

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._free_by_size: dict[int, set[int]] = {}
        self._top_starts: list[int] = []
        self._top_sizes: list[int] = []
        offset = 0
        for bit in reversed(range(capacity_tokens.bit_length())):
            size = 1 << bit
            if capacity_tokens & size:
                self._top_starts.append(offset)
                self._top_sizes.append(size)
                self._free_by_size.setdefault(size, set()).add(offset)
                offset += size
        self._free_tokens = capacity_tokens

    def slab_tokens(self, request_tokens: int) -> int:
        return next_pow2(request_tokens)

    def allocate(self, request_tokens: int) -> int | None:
        slab = self.slab_tokens(request_tokens)
        if slab <= 0:
            return 0
        candidates = [size for size, offsets in self._free_by_size.items() if size >= slab and offsets]
        if not candidates:
            return None
        size = min(candidates)
        offset = min(self._free_by_size[size])  # lowest address: deterministic and compact
        self._free_by_size[size].discard(offset)
        while size > slab:  # split, keeping the lower half, freeing the upper buddy
            size //= 2
            self._free_by_size.setdefault(size, set()).add(offset + size)
        self._free_tokens -= slab
        return offset

    def _top_size_at(self, offset_tokens: int) -> int:
        index = bisect.bisect_right(self._top_starts, offset_tokens) - 1
        return self._top_sizes[index]

    def free(self, offset_tokens: int, slab_tokens: int) -> None:
        if slab_tokens <= 0:
            return
        offset, size = offset_tokens, slab_tokens
        top_size = self._top_size_at(offset)
        while size < top_size:
            buddy = offset ^ size
            same_size = self._free_by_size.get(size)
            if not same_size or buddy not in same_size:
                break
            same_size.discard(buddy)
            offset = min(offset, buddy)
            size *= 2
        self._free_by_size.setdefault(size, set()).add(offset)
        self._free_tokens += slab_tokens

    def free_tokens(self) -> int:
        return self._free_tokens

    def free_blocks(self) -> list[tuple[int, int]]:
        """(offset, size) of every free buddy block, in address order."""
        return sorted((off, size) for size, offsets in self._free_by_size.items() for off in offsets)

    def hole_sizes(self) -> np.ndarray:
        return np.asarray([size for _, size in self.free_blocks()], dtype=np.int64)

    def hole_offsets(self) -> np.ndarray:
        return np.asarray([off for off, _ in self.free_blocks()], dtype=np.int64)

    def unusable_tokens(self, demand_tokens: int) -> int:
        if demand_tokens <= 0:
            return 0
        slab = self.slab_tokens(demand_tokens)
        return sum(size * len(offsets) for size, offsets in self._free_by_size.items() if size < slab)


PLACEMENTS: dict[str, Callable[[int], Placement]] = {
    "first_fit": FirstFit,
    "best_fit": BestFit,
    "buddy": Buddy,
}


def available_placements() -> list[str]:
    return sorted(PLACEMENTS)


def make_placement(name: str, capacity_tokens: int) -> Placement:
    """The placement registry: one free-space manager over [0, capacity_tokens)."""
    if name not in PLACEMENTS:
        raise AllocatorConfigError(
            f"unknown placement {name!r}; allowed: {', '.join(available_placements())}"
        )
    return PLACEMENTS[name](capacity_tokens)
