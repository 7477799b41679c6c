"""A CPU tier under the paged prefix cache: vLLM v1's KV-offloading connector, in block keys.

Why a second tier: a prefix evicted from GPU memory can come back over PCIe instead of being
recomputed. vLLM v1 does this with its `OffloadingConnector` (`--kv-offloading-size GiB`,
vllm/config/cache.py `CacheConfig.kv_offloading_size`; vllm/config/vllm.py turns it into
`cpu_bytes_to_use` for vllm/v1/kv_offload/cpu.py `CPUOffloadingSpec`). The rules modelled here:

- **What is stored, and when.** Every full block of a request as it is computed, whether the
  GPU cache had it or not; blocks the CPU tier already holds are skipped
  (vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py
  `OffloadingConnectorScheduler._get_reqs_to_store`: the blocks from `_next_stored_block_idx` up to
  `(num_computed + num_scheduled) // block_size`, filtered by vllm/v1/kv_offload/lru_manager.py
  `LRUOffloadingManager.prepare_store`). It is write-through: storing never waits for a GPU eviction.
- **Eviction.** LRU over the tier's blocks (`LRUOffloadingManager`, an OrderedDict whose head is
  evicted first by `prepare_store`); a request's lookup and store move its blocks to the recent end,
  its first block last, so a prefix's head outlives its tail (`LRUOffloadingManager.touch` walks
  the hashes in reverse). When the new blocks outnumber what eviction can free, nothing of that
  request is stored (`prepare_store` returns None).
- **Lookup.** At admission, after the GPU prefix cache: the longest run of consecutive keys that
  the CPU tier holds, starting where the GPU hit stopped
  (`OffloadingConnectorScheduler.get_num_new_matched_tokens` -> `LRUOffloadingManager.lookup`).

Units are blocks of the GPU block size (vLLM's default `block_size_factor` of 1); the allocator
converts to token slots. The tier keeps no time: it counts blocks moved each way and the engine
asks for them once per step (`take_transfers`) to price them over PCIe.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class TierCounters:
    """Running totals of one run, in token slots (the allocator's unit), for the summary.

    `queried_tokens` counts every prompt token looked up at admission (re-admissions after a
    preemption too), as vLLM's prefix-cache stats count queries (vllm/v1/core/kv_cache_manager.py
    `KVCacheManager.get_computed_blocks`: `queries += num_tokens`, `hits += computed tokens`).
    """

    queried_tokens: int = 0
    gpu_hit_tokens: int = 0
    cpu_hit_tokens: int = 0
    loaded_tokens: int = 0  # CPU -> GPU (a CPU hit is loaded before the request's prefill)
    stored_tokens: int = 0  # GPU -> CPU
    evicted_tokens: int = 0  # dropped from the CPU tier to make room (LRU)
    peak_used_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name in self.__slots__}  # type: ignore[attr-defined]


class CpuTier:
    """LRU set of block keys with a fixed number of CPU blocks, and the traffic it causes."""

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        if capacity_blocks < 0 or block_size < 1:
            raise ValueError(
                f"CpuTier: capacity_blocks >= 0 and block_size >= 1 (got {capacity_blocks}, {block_size})"
            )
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self._blocks: OrderedDict[Hashable, None] = OrderedDict()  # head: least recently used
        self.counters = TierCounters()
        self._pending_load_blocks = 0
        self._pending_store_blocks = 0

    # -- what the allocator asks -----------------------------------------------------------------------

    @property
    def capacity_tokens(self) -> int:
        return self.capacity_blocks * self.block_size

    @property
    def used_blocks(self) -> int:
        return len(self._blocks)

    @property
    def used_tokens(self) -> int:
        return len(self._blocks) * self.block_size

    def __contains__(self, key: Hashable) -> bool:
        return key in self._blocks

    def run_length(self, keys: Sequence[Hashable], start: int) -> int:
        """Consecutive keys from `keys[start]` on that the tier holds (`LRUOffloadingManager.lookup`)."""
        blocks = self._blocks
        count = 0
        for key in keys[start:]:
            if key not in blocks:
                break
            count += 1
        return count

    def touch(self, keys: Sequence[Hashable]) -> None:
        """Move the held keys to the recent end, the first key last (`LRUOffloadingManager.touch`)."""
        blocks = self._blocks
        for key in reversed(keys):
            if key in blocks:
                blocks.move_to_end(key)

    def store(self, keys: Sequence[Hashable]) -> int:
        """Copy the blocks named `keys` to the tier (those it lacks), evicting LRU blocks for room.

        All or nothing, as `LRUOffloadingManager.prepare_store`: when the new blocks outnumber the
        tier's capacity, none is stored. Returns the number of blocks copied GPU -> CPU.
        """
        blocks = self._blocks
        new = [key for key in dict.fromkeys(keys) if key not in blocks]
        if not new:
            return 0
        if len(new) > self.capacity_blocks:
            return 0
        evict = len(blocks) + len(new) - self.capacity_blocks
        for _ in range(max(0, evict)):
            blocks.popitem(last=False)
        for key in new:
            blocks[key] = None
        counters = self.counters
        if evict > 0:
            counters.evicted_tokens += evict * self.block_size
        counters.stored_tokens += len(new) * self.block_size
        used = len(blocks) * self.block_size
        if used > counters.peak_used_tokens:
            counters.peak_used_tokens = used
        self._pending_store_blocks += len(new)
        return len(new)

    def record_admission(self, prompt_tokens: int, gpu_hit_tokens: int, loaded_blocks: int) -> None:
        """Count one admission's lookup: its prompt, the tokens the GPU had, the blocks loaded from CPU."""
        counters = self.counters
        counters.queried_tokens += prompt_tokens
        counters.gpu_hit_tokens += gpu_hit_tokens
        loaded_tokens = loaded_blocks * self.block_size
        counters.cpu_hit_tokens += loaded_tokens
        counters.loaded_tokens += loaded_tokens
        self._pending_load_blocks += loaded_blocks

    # -- what the engine asks (allocators.base.OffloadTier) --------------------------------------------

    def totals(self) -> dict[str, int]:
        """The running counters (token slots), for the summary."""
        return self.counters.as_dict()

    def take_transfers(self) -> tuple[int, int]:
        """(tokens loaded CPU -> GPU, tokens stored GPU -> CPU) since the last call; resets both."""
        load, store = self._pending_load_blocks, self._pending_store_blocks
        self._pending_load_blocks = self._pending_store_blocks = 0
        return load * self.block_size, store * self.block_size
