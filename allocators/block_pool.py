"""The physical block pool of a paged KV cache: free queue (LRU), refcounts, prefix cache by key.

Why this shape (after vLLM v1's core/block_pool.py): a block with refcount 0 is free, and sits in
one FIFO free queue. With prefix caching on, a freed *full, named* block keeps its key and stays
findable until it is popped from the head of the queue for reuse (that pop is the eviction), so the
least recently freed cached block is evicted first. A cache hit on a free block takes it out of the
middle of the queue.

The queue is a NumPy ring buffer with lazy deletion (a per-block stamp marks the one valid entry),
so pushing and popping many blocks is vectorised; removal from the middle is O(log n). Stale entries
only come from removals (cache hits), so the queue counts them, and with prefix caching keeps their
positions in a heap: while none lies among the head entries a pop takes, the pop is one slice of the
ring, which is what every decode step does (cache hits take recently freed blocks, near the tail).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

import numpy as np

from allocators.seq_kernels import (
    drop_refs,
    flag_view,
    pop_blocks,
    pop_into_row,
    release_row_to_tail,
    take_row_reversed,
    typed_view,
)


class FreeBlockQueue:
    """FIFO of free block ids: pop from the head (least recently freed), push to the tail."""

    def __init__(self, num_blocks: int, track_positions: bool = True) -> None:
        size = 2 * num_blocks + 1
        self._entries = np.zeros(size, dtype=np.int64)
        self._entry_stamps = np.zeros(size, dtype=np.int64)
        self._stamp = np.zeros(num_blocks, dtype=np.int64)  # stamp of each block's valid entry
        self.in_queue = np.ones(num_blocks, dtype=bool)
        self._entries[:num_blocks] = np.arange(num_blocks)
        self._head = 0
        self._tail = num_blocks
        self.num_free = num_blocks
        self._num_stale = 0  # invalid entries between head and tail (left behind by `remove`)
        # Whether any block's stamp was ever raised: until then every stamp, and every entry's stamp,
        # is 0, so pushes need not copy stamps (most runs: without prefix-cache hits nothing is removed)
        self._stamps_raised = False
        # With `track_positions` (a pool with prefix caching, where cache hits remove blocks): each
        # queued block's entry index, and a heap of the stale entries' indices, so a pop or peek
        # knows whether its head entries are all valid from the smallest one (the common case: hits
        # take recently freed blocks near the tail, far from the head) and never scans for them.
        # The position also tells the valid entry (the one at it), so stamps are not kept then.
        # Without it (`remove` never called, or rarely) the stale heap stays empty and a queue with
        # stale entries scans, telling valid entries by their stamps.
        self._position: np.ndarray | None = np.arange(num_blocks) if track_positions else None
        self._stale_positions: list[int] = []

    def _valid(self, start: int, stop: int) -> np.ndarray:
        """Per entry in [start, stop): whether it is its block's one valid entry."""
        blocks = self._entries[start:stop]
        if self._position is not None:
            return self.in_queue[blocks] & (self._position[blocks] == np.arange(start, stop))
        return self.in_queue[blocks] & (self._entry_stamps[start:stop] == self._stamp[blocks])

    def head_is_clean(self, count: int) -> bool:
        """Whether the first `count` entries from the head are all valid (then they are the blocks)."""
        if self._num_stale == 0:
            return True
        stale = self._stale_positions
        return len(stale) == self._num_stale and stale[0] >= self._head + count

    def _compact(self, start: int = 0) -> None:
        """Drop stale entries and move the valid ones to begin at `start` (room for front pushes).

        Without stale entries every entry from the head to the tail is valid, so the move is of the
        whole span, without `_valid`'s gathers over it (every push that reaches the end of the ring
        compacts it: 41 times, ~475,000 instructions each, on the jump workload's 5,000 prompts).
        """
        if self._num_stale == 0:
            kept = self._entries[self._head : self._tail].copy()
            stamps = self._entry_stamps[self._head : self._tail].copy()
        else:
            valid = self._valid(self._head, self._tail)
            kept = self._entries[self._head : self._tail][valid].copy()
            stamps = self._entry_stamps[self._head : self._tail][valid].copy()
        self._entries[start : start + kept.size] = kept
        self._entry_stamps[start : start + kept.size] = stamps
        self._head, self._tail = start, start + kept.size
        if self._position is not None:
            self._position[kept] = np.arange(start, start + kept.size)
        self._num_stale = 0
        self._stale_positions = []

    def push_front(self, blocks: np.ndarray) -> None:
        """Put freed blocks at the head, in the given order (blocks[0] is popped first).

        vLLM v1 (vllm/v1/core/kv_cache_utils.py `FreeKVCacheBlockQueue.prepend_n`, called by
        block_pool.py `BlockPool.free_blocks` for freed blocks without a hash): blocks that can
        never be a cache hit are reused first, so cached blocks survive longer.
        """
        count = blocks.size
        if count == 0:
            return
        if self._head < count:  # no room before the head: re-centre the queue (amortised)
            live = self._tail - self._head
            self._compact(start=max(count, (self._entries.size - live) // 2))
        self._head -= count
        if self._position is not None:  # the new entries are valid by position
            self._position[blocks] = np.arange(self._head, self._head + count)
        elif self._num_stale:
            self._stamp[blocks] += 1
            self._stamps_raised = True
        self._entries[self._head : self._head + count] = blocks
        if self._stamps_raised:
            self._entry_stamps[self._head : self._head + count] = self._stamp[blocks]
        self.in_queue[blocks] = True
        self.num_free += count

    def push(self, blocks: np.ndarray) -> None:
        """Append freed blocks at the tail, in the given order."""
        count = blocks.size
        if count == 0:
            return
        if self._tail + count > self._entries.size:
            self._compact()
        if self._position is not None:  # the new entries are valid by position
            self._position[blocks] = np.arange(self._tail, self._tail + count)
        elif self._num_stale:  # a new stamp invalidates a removed block's old entry still in the queue
            self._stamp[blocks] += 1
            self._stamps_raised = True
        self._entries[self._tail : self._tail + count] = blocks
        if self._stamps_raised:
            self._entry_stamps[self._tail : self._tail + count] = self._stamp[blocks]
        self._tail += count
        self.in_queue[blocks] = True
        self.num_free += count

    def remove(self, blocks: np.ndarray) -> None:
        """Take free blocks out of the middle (cache hits); their stale entries are skipped later."""
        self.in_queue[blocks] = False
        self.num_free -= blocks.size
        self._num_stale += blocks.size  # each removed block leaves its one valid entry behind
        if self._position is not None:
            stale = self._stale_positions
            for position in self._position[blocks].tolist():
                heapq.heappush(stale, position)

    def _passed(self) -> None:
        """Forget the stale positions the head has moved past (a pop skipped those entries)."""
        stale, head = self._stale_positions, self._head
        while stale and stale[0] < head:
            heapq.heappop(stale)

    def peek(self, count: int) -> np.ndarray:
        """The `count` blocks `pop(count)` would return, without taking them."""
        if self._num_stale == 0 or self.head_is_clean(count):
            return self._entries[self._head : min(self._tail, self._head + count)].copy()
        # Scan from the head in doubling windows, only as far as `count` valid entries (as `pop`
        # does): a scan of the whole queue costs O(num_blocks) per call (the jump integral peeks
        # on every jump while cache hits leave stale entries behind).
        found: list[np.ndarray] = []
        still_needed = count
        start, window = self._head, max(count, 8)
        while still_needed > 0 and start < self._tail:
            stop = min(self._tail, start + window)
            valid_blocks = self._entries[start:stop][self._valid(start, stop)]
            found.append(valid_blocks)
            still_needed -= valid_blocks.size
            start, window = stop, 2 * window
        if not found:
            return np.zeros(0, dtype=np.int64)
        blocks = found[0] if len(found) == 1 else np.concatenate(found)
        return blocks[:count]

    def pop_few(self, count: int) -> list[int]:
        """`pop(count)` as a list, in scalar steps when the head entries are valid (same blocks, order).

        Why: a decode step typically takes one or two blocks, where the fancy-indexed updates of
        `pop` cost more than a few scalar stores.
        """
        if self._num_stale and not self.head_is_clean(count):
            return self.pop(count).tolist()
        head = self._head
        if count > self._tail - head:
            raise RuntimeError(f"free queue exhausted: {count - (self._tail - head)} more blocks wanted")
        blocks = self._entries[head : head + count].tolist()
        self._head = head + count
        in_queue = self.in_queue
        for block in blocks:
            in_queue[block] = False
        self.num_free -= count
        return blocks

    def pop(self, count: int) -> np.ndarray:
        """The `count` blocks at the head. Caller checks `num_free >= count`."""
        if count == 0:
            return np.zeros(0, dtype=np.int64)
        if self._num_stale == 0 or self.head_is_clean(count):  # the head `count` entries are the blocks
            if count > self._tail - self._head:
                raise RuntimeError(
                    f"free queue exhausted: {count - (self._tail - self._head)} more blocks wanted"
                )
            blocks = self._entries[self._head : self._head + count].copy()
            self._head += count
            self.in_queue[blocks] = False
            self.num_free -= count
            return blocks
        taken: list[np.ndarray] = []
        still_needed = count
        while still_needed:
            stop = min(self._tail, self._head + max(still_needed, 8))
            if stop <= self._head:
                raise RuntimeError(f"free queue exhausted: {still_needed} more blocks wanted")
            valid = self._valid(self._head, stop)
            positions = np.flatnonzero(valid)
            if positions.size > still_needed:
                stop = self._head + int(positions[still_needed - 1]) + 1
                positions = positions[:still_needed]
            taken.append(self._entries[self._head + positions])
            still_needed -= positions.size
            self._num_stale -= (stop - self._head) - positions.size  # skipped stale entries are gone
            self._head = stop
        if self._stale_positions:
            self._passed()
        blocks = taken[0] if len(taken) == 1 else np.concatenate(taken)
        self.in_queue[blocks] = False
        self.num_free -= count
        return blocks


class BlockPool:
    """Refcounted physical blocks with an optional prefix cache (key -> block)."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.refcount = np.zeros(num_blocks, dtype=np.int32)
        self.queue = FreeBlockQueue(num_blocks, track_positions=enable_caching)
        self.has_key = np.zeros(num_blocks, dtype=bool)
        # block -> its key (None: unnamed), a list indexed by block id: admission and release name
        # and evict dozens of blocks each, and list stores cost less than inserts into a dict of
        # every block; `_block_by_key` is its inverse (non-empty exactly when some block is named)
        self._key_of_block: list[Hashable | None] = [None] * num_blocks
        self._block_by_key: dict[Hashable, int] = {}
        self.num_cached = 0  # free blocks still findable by key
        # Typed views (seq_kernels.typed_view, flag_view) of the queue's entries and in_queue flags,
        # the refcounts and has_key, for the typed pops and pushes; made when first needed (none of
        # these arrays is ever replaced) and left out of deepcopy and pickle state.
        self._views: tuple | None = None

    def _make_views(self) -> tuple:
        queue = self.queue
        self._views = (
            typed_view(queue._entries),
            flag_view(queue.in_queue),
            typed_view(self.refcount),
            flag_view(self.has_key),
        )
        return self._views

    def __getstate__(self) -> dict:
        """State without the typed views: a copy makes its own from its own arrays."""
        state = self.__dict__.copy()
        state["_views"] = None
        return state

    @property
    def num_free(self) -> int:
        return self.queue.num_free

    def lookup(self, key: Hashable) -> int | None:
        """Block holding `key`'s content, live or cached; None when absent."""
        return self._block_by_key.get(key)

    def leading_hits(self, keys: tuple[Hashable, ...]) -> list[int]:
        """Blocks holding keys[0], keys[1], ... (live or cached), up to the first key not held.

        Why one call: admission looks up every block of a prompt (`lookup` per key, inlined).
        """
        hits: list[int] = []
        get = self._block_by_key.get
        for key in keys:
            block = get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def touch(self, blocks: np.ndarray) -> np.ndarray:
        """Add a reference to each block (prefix hits); return those revived from the free cache."""
        revived = blocks[self.refcount[blocks] == 0]
        if revived.size:
            self.queue.remove(revived)
            self.num_cached -= revived.size
        self.refcount[blocks] += 1
        return revived

    def allocate(self, count: int) -> np.ndarray:
        """Pop `count` blocks from the head of the free queue, evicting cached keys; refcount 1."""
        blocks = self.queue.pop(count)
        if self.num_cached:  # only cached (free, keyed) blocks can be evicted
            evicted = blocks[self.has_key[blocks]]
            if evicted.size:  # `_forget` of each, in order, with the lookups hoisted
                by_key, key_of_block = self._block_by_key, self._key_of_block
                for block in evicted.tolist():
                    del by_key[key_of_block[block]]
                    key_of_block[block] = None
                self.has_key[evicted] = False
                self.num_cached -= evicted.size
        self.refcount[blocks] = 1
        return blocks

    def allocate_few(self, count: int) -> list[int]:
        """`allocate(count)` as a list, in one typed pass (for the handful of blocks of a decode step)."""
        head = self.clean_head(count)
        if head < 0:  # stale head entries: general path
            return self.allocate(count).tolist()
        # FreeBlockQueue.pop's clean case with the refcount stores and evictions, in one loop (every
        # decode step that crosses a block boundary comes here)
        entries, in_queue, refcount, has_key = self._views or self._make_views()
        evicted: list[int] = []
        blocks = pop_blocks(entries, in_queue, refcount, has_key, head, count, evicted)
        self.popped_at_head(count, evicted)
        return blocks

    def clean_head(self, count: int) -> int:
        """Where a typed pass may pop `count` blocks (`allocate_few`, `allocate_into_row`, the paged
        allocator's admission on its own views): the queue's head when its first `count` entries are
        all valid, -1 when stale entries are among them (then `allocate`, which skips them).

        Why one place: the pass reads the queue's entries from the head on, so this test, the
        exhaustion error and `popped_at_head`'s bookkeeping are the pool's, whoever runs the pass.
        """
        queue = self.queue
        if queue._num_stale and not queue.head_is_clean(count):
            return -1
        head = queue._head
        if count > queue._tail - head:
            raise RuntimeError(f"free queue exhausted: {count - (queue._tail - head)} more blocks wanted")
        return head

    def popped_at_head(self, count: int, evicted: list[int]) -> None:
        """The queue's side of a typed pass that popped `count` blocks at `clean_head(count)`: the head
        moves past them, and the cached ones the pass evicted (their has_key already cleared, in pop
        order) lose their keys."""
        queue = self.queue
        queue._head += count
        queue.num_free -= count
        if evicted:
            self._forget_evicted(evicted)

    def allocate_into_row(self, table: object, slot: int, count: int) -> bool:
        """`allocate(count)` written to table[slot, :count] (a typed view of a block table), in one typed
        pass, when the queue's head entries are all valid; False, having done nothing, otherwise.

        Why: an admission takes its prompt's blocks straight into its block-table row, without the
        array `allocate` returns and the scatter of it.
        """
        head = self.clean_head(count)
        if head < 0:
            return False
        entries, in_queue, refcount, has_key = self._views or self._make_views()
        evicted: list[int] = []
        pop_into_row(entries, in_queue, refcount, has_key, head, count, table, slot, evicted)
        self.popped_at_head(count, evicted)
        return True

    def _forget_evicted(self, evicted: list[int]) -> None:
        """Forget the keys of popped cached blocks (their has_key already cleared), in order (`_forget`)."""
        by_key, key_of_block = self._block_by_key, self._key_of_block
        for block in evicted:
            del by_key[key_of_block[block]]
            key_of_block[block] = None
        self.num_cached -= len(evicted)

    def register(self, block: int, key: Hashable) -> bool:
        """Make a live, full block findable by `key`; False if a live block already holds that key."""
        holder = self._block_by_key.get(key)
        if holder is not None:
            if self.refcount[holder] > 0:
                return False
            self._forget(holder)  # a stale cached copy: now a plain free block; the new one takes the name
            self.num_cached -= 1
        self._block_by_key[key] = block
        self._key_of_block[block] = key
        self.has_key[block] = True
        return True

    def register_many(self, blocks: np.ndarray, keys: tuple[Hashable, ...]) -> None:
        """Register fresh blocks under their keys (admission of a prompt), as `register` one by one.

        A key still mapped to a cached free block (an earlier block of its chain was evicted, so
        lookups never reached it) is taken over by the new block; a key held by a live block keeps
        its holder and the new block stays unnamed.
        """
        self.register_list(blocks.tolist(), keys)

    def register_list(self, block_list: list[int], keys: Sequence[Hashable]) -> None:
        """`register_many` for blocks given as a list (distinct live blocks, distinct keys)."""
        by_key = self._block_by_key
        if by_key.keys().isdisjoint(keys):  # no key taken yet (one C-level pass): no clash to settle
            by_key.update(zip(keys, block_list, strict=True))
            key_of_block = self._key_of_block
            for block, key in zip(block_list, keys, strict=True):
                key_of_block[block] = key
            self.has_key[block_list] = True
            return
        for block, key in zip(block_list, keys, strict=True):
            self.register(block, key)

    def _forget(self, block: int) -> None:
        """Unname a named block (its key is no longer findable)."""
        key = self._key_of_block[block]
        if key is None:
            raise KeyError(block)
        self._key_of_block[block] = None
        del self._block_by_key[key]
        self.has_key[block] = False

    def release(self, blocks: np.ndarray) -> np.ndarray:
        """Drop one reference from each (distinct) block; return the blocks that became free.

        Freed blocks go to the queue tail in the given order (callers pass a sequence's blocks
        last-first, so the tail of a prompt is evicted before its head, as in vLLM). With caching on,
        freed blocks that hold no cached content go to the *head* instead, in the given order, and
        only the cached ones to the tail (vLLM v1 vllm/v1/core/block_pool.py `BlockPool.free_blocks`:
        `prepend_n(blocks_without_hash)`, `append_n(blocks_with_hash)`; with caching off it appends
        all, for GPU cache locality).
        """
        blocks = np.asarray(blocks, dtype=np.int64)  # (the loop's typed view; the callers' arrays are)
        freed = np.empty(blocks.size, dtype=np.int64)
        freed = freed[: drop_refs(self.refcount, blocks, freed)]  # one loop: refcounts down, the freed
        if freed.size == 0:
            return freed
        if self._block_by_key:  # named blocks exist: freed ones stay cached, or lose their names
            keyed = freed[self.has_key[freed]]
            if self.enable_caching:
                self.num_cached += keyed.size
            elif keyed.size:
                self._unname(keyed)
        if self.enable_caching:
            named = self.has_key[freed]
            if not named.all():
                self.queue.push_front(freed[~named])
                self.queue.push(freed[named])
                return freed
        self.queue.push(freed)
        return freed

    def release_row(self, table: object, slot: int, count: int, want_freed: bool) -> np.ndarray | None:
        """`release` of the blocks in table[slot, :count] (a typed view of a block table), last first,
        emptying the row (-1); returns the freed blocks when `want_freed`, else None.

        Why: a sequence's release is a handful of blocks, where `release`'s array calls cost more
        than the work. Without caching (every freed block goes to the tail) and with the queue
        free of stale entries and room at its tail, it is one typed pass; otherwise `release`.
        """
        tail = self.plain_tail(count)
        if tail < 0:
            blocks = np.empty(count, dtype=np.int64)
            take_row_reversed(table, slot, count, blocks)
            freed = self.release(blocks)
            return freed if want_freed else None
        entries, in_queue, refcount, _ = self._views or self._make_views()
        num_freed = release_row_to_tail(table, slot, count, refcount, entries, in_queue, tail)
        self.pushed_at_tail(tail, num_freed)
        return self.queue._entries[tail : tail + num_freed].copy() if want_freed else None

    def plain_tail(self, count: int) -> int:
        """Where a typed pass may push up to `count` freed blocks (`release_row`, the paged allocator's
        release on its own views): the queue's tail when every freed block goes there (caching off),
        the queue holds no stale entries and no raised stamps, and has room; -1 otherwise (`release`).

        Why one place: the same reason as `clean_head`, at the other end of the queue.
        """
        queue = self.queue
        tail = queue._tail
        if (
            self.enable_caching
            or queue._num_stale
            or queue._stamps_raised
            or tail + count > queue._entries.size
        ):
            return -1
        return tail

    def pushed_at_tail(self, tail: int, num_freed: int) -> None:
        """The queue's side of a typed pass that pushed `num_freed` blocks at `plain_tail(...)`: the
        tail moves past them, and any of them that was named loses its name (caching off: a freed
        block is not findable)."""
        queue = self.queue
        queue._tail = tail + num_freed
        queue.num_free += num_freed
        if self._block_by_key and num_freed:  # named blocks exist: freed ones lose their names
            freed = queue._entries[tail : tail + num_freed]
            keyed = freed[self.has_key[freed]]
            if keyed.size:
                self._unname(keyed)

    def _unname(self, keyed: np.ndarray) -> None:
        """Forget the keys of freed named blocks (caching off: a freed block is not findable)."""
        by_key, key_of_block = self._block_by_key, self._key_of_block
        for block in keyed.tolist():
            del by_key[key_of_block[block]]
            key_of_block[block] = None
        self.has_key[keyed] = False

    def cached_blocks(self) -> np.ndarray:
        """Free blocks still findable by key."""
        return np.flatnonzero(self.has_key & (self.refcount == 0))
