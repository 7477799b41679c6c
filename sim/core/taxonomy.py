"""The one definition of the KV memory taxonomy as kvsim reports it: what is allocated, what is waste.

Why one module: the summary, the CLI tables, the report, the diagnosis, the figures and the sweep
tables all show the same partition of the KV cache. When each consumer summed the parts itself,
`summarize` counted prefix-cache blocks (`cached`) as allocated although they are free for the next
allocation, and a cached run reported 99 % waste (issue 20). Every consumer now asks this module.

The definitions (docs/metrics.md, "The memory taxonomy"):

- **allocated** = token_states + reservation + internal + external + duplicated + out_of_window
  = capacity - free. `MemoryBreakdown.allocated` is the same rule at one instant.
- **free** = every slot a new allocation may take. Prefix caching keeps some free blocks' content
  for reuse (vLLM's `BlockPool.free_block_queue` holds them and evicts them LRU when a new block is
  needed: vllm/v1/core/block_pool.py, `get_new_blocks` / `_maybe_evict_cached_block`), so free splits
  into **cached** (free, holding reusable prefix KV) and **empty** (free, holding nothing).
  Cached memory is neither allocated nor waste.
- **waste_pct** = 100 x (1 - token_states / allocated), time-integrated; 0 when nothing was allocated.

The shown partition of capacity, in stacking order, is `SHOWN_PARTS`: the allocated parts, then
cached, then empty. They sum to 100 % of capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allocators.base import BREAKDOWN_PARTS

# Parts that hold memory a new request cannot take: everything in the breakdown but `free`.
ALLOCATED_PARTS: tuple[str, ...] = tuple(part for part in BREAKDOWN_PARTS if part != "free")

# The partition of capacity shown in tables and figures: allocated parts, then free split in two.
SHOWN_PARTS: tuple[str, ...] = (*ALLOCATED_PARTS, "cached", "empty")

PART_LABELS: dict[str, str] = {
    "token_states": "token states",
    "reservation": "reservation",
    "internal": "internal frag.",
    "external": "external frag.",
    "duplicated": "duplicated",
    "out_of_window": "out of window",
    "cached": "cached (free, reusable)",
    "empty": "free (empty)",
    "free": "free (cached + empty)",
}


def allocated_of(parts: Mapping[str, float]) -> float:
    """Allocated amount from a mapping of breakdown parts (slots, slot-seconds or % of capacity).

    `cached` and `free` in the mapping are ignored: cached blocks are a subset of free.
    """
    return float(sum(float(parts.get(part, 0.0)) for part in ALLOCATED_PARTS))


def waste_pct(token_states: float, allocated: float) -> float:
    """100 x (1 - token_states / allocated); 0 when nothing was allocated (no allocation, no waste)."""
    if allocated <= 0.0:
        return 0.0
    return 100.0 * (1.0 - token_states / allocated)


def empty_of(free: float, cached: float) -> float:
    """Free memory that holds no reusable content (free - cached), never below 0 (rounding noise)."""
    return max(0.0, float(free) - float(cached))


def shown_shares_pct(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The shown partition (`SHOWN_PARTS`) in % of capacity, from a run's summary metrics.

    Reads `kv_<part>_pct`; a summary written before `kv_empty_pct` existed gets empty = free - cached.
    """
    shares = {part: float(metrics.get(f"kv_{part}_pct") or 0.0) for part in (*ALLOCATED_PARTS, "cached")}
    empty_pct = metrics.get("kv_empty_pct")
    if empty_pct is None:
        empty_pct = empty_of(float(metrics.get("kv_free_pct") or 0.0), shares["cached"])
    shares["empty"] = float(empty_pct)
    return shares
