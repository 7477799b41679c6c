"""Free-space shape statistics shared by every allocator's `hole_stats()`.

Why one function: the figures and reports compare holes across allocators, so every allocator
must report the same keys with the same meaning (sizes in tokens).
"""

from __future__ import annotations

import numpy as np

HOLE_STAT_KEYS: tuple[str, ...] = ("count", "total_tokens", "mean_tokens", "p50_tokens", "max_tokens")


def hole_stats_from_sizes(hole_sizes_tokens: np.ndarray) -> dict[str, float]:
    """count, total, mean, median and max of free holes (all 0 when there is no hole)."""
    sizes = np.asarray(hole_sizes_tokens, dtype=np.int64)
    if sizes.size == 0:
        return dict.fromkeys(HOLE_STAT_KEYS, 0.0)
    return {
        "count": float(sizes.size),
        "total_tokens": float(sizes.sum()),
        "mean_tokens": float(sizes.mean()),
        "p50_tokens": float(np.median(sizes)),
        "max_tokens": float(sizes.max()),
    }


def uniform_hole_stats(count: int, size_tokens: int) -> dict[str, float]:
    """Stats for `count` holes of one size (free blocks of a paged pool), without building an array."""
    if count == 0:
        return dict.fromkeys(HOLE_STAT_KEYS, 0.0)
    return {
        "count": float(count),
        "total_tokens": float(count * size_tokens),
        "mean_tokens": float(size_tokens),
        "p50_tokens": float(size_tokens),
        "max_tokens": float(size_tokens),
    }
