"""`radix`: SGLang's token-granular KV pool with a radix-tree prefix cache (page size 1 by default).

How SGLang holds KV (sgl-project/sglang, python/sglang/srt/): the pool hands out token slots, one at
a time at page_size 1 or in pages (`mem_cache/allocator.py` `TokenToKVPoolAllocator`,
`PagedTokenToKVPoolAllocator`); a request first matches the longest cached prefix in the radix tree
(`mem_cache/radix_cache.py` `RadixCache.match_prefix`) and locks it (`inc_lock_ref`), allocates
slots for the rest, and its prompt is inserted into the tree after prefill
(`cache_unfinished_req`); when it finishes, its whole content goes into the tree and the lock is
dropped (`cache_finished_req`, `dec_lock_ref`), so its KV stays as a cached, evictable leaf. When
the pool runs short, unreferenced leaves are evicted LRU (`RadixCache.evict`, called by
`alloc_token_slots` in `mem_cache/common.py`).

The taxonomy this produces (docs/allocators.md): tokens of running requests (tree nodes they lock,
counted once however many share them, plus their private slots) are `token_states`; the unfilled
tail of each request's last private page is `internal` (0 at page size 1); unreferenced tree nodes
are `cached`, a part of `free` (evictable on demand); slots past the last whole page are `external`.
Nothing is reserved ahead of use.

Simplifications (docs/engines.md "SGLang"): prompt tokens enter the tree when they are allocated
(SGLang inserts them after the prefill step that computes them), so a request admitted in the same
step already hits them; release always inserts the whole content (SGLang's `retract_decode` does not
insert a retracted request's decoded tokens); with pages > 1 the unaligned tail of a shared prefix is
a private copy per request, counted as token states rather than duplicated.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from allocators.base import AllocatorBase, AllocatorConfigError, Layout, MemoryBreakdown, SeqSpec
from allocators.holes import uniform_hole_stats
from allocators.jump_integral import INTEGRATED_PARTS, _stepped_integral
from allocators.radix_content import Run, extend_runs, generated_stream, prompt_runs, runs_upto
from allocators.radix_tree import RadixTree, TreeNode
from allocators.seq_arrays import ceil_div, check_live_seq, check_new_seq, ensure_rows

# per-sequence arrays and their "no sequence" value (allocators/seq_arrays.py ensure_rows)
_ROWS = {"live": False, "lengths_tokens": 0, "depth_tokens": 0, "prompt_tokens": 0}


class _SeqContent:
    """What a live sequence's tokens are: runs up to `base_end`, then its growth stream."""

    __slots__ = ("runs", "base_end", "growth", "node", "hit_tokens")

    def __init__(self, runs: list[Run], growth: Hashable, node: TreeNode) -> None:
        self.runs = runs
        self.base_end = runs[-1][2] if runs else 0
        self.growth = growth
        self.node = node  # last tree node it locks (the root when none)
        self.hit_tokens = 0

    def runs_to(self, end: int) -> list[Run]:
        """Its runs over [0, end)."""
        if end <= self.base_end:
            return runs_upto(self.runs, end)
        runs = list(self.runs)
        extend_runs(runs, self.growth, self.base_end, end)
        return runs


class RadixAllocator(AllocatorBase):
    """Token slots in pages of `page_tokens`, a radix tree of content, private slots per sequence."""

    allocates_per_chunk = True  # SGLang allocates each prefill chunk's slots when it runs
    content_identity = True  # every request's tokens need a name: the tree caches all of them

    def __init__(self, capacity_tokens: int, page_tokens: int = 1, max_model_len: int | None = None) -> None:
        self.name = "radix"
        self.capacity_tokens = capacity_tokens
        self.max_model_len = max_model_len  # a sequence never grows past it (SGLang's context_len)
        self.page_tokens = page_tokens
        self.swap_block_tokens = page_tokens
        self.num_pages = capacity_tokens // page_tokens
        self.free_pages = self.num_pages
        self.tree = RadixTree(page_tokens)
        # per sequence: tokens held, tokens covered by its locked tree path (the rest are private)
        self.live = np.zeros(0, dtype=bool)
        self.lengths_tokens = np.zeros(0, dtype=np.int64)
        self.depth_tokens = np.zeros(0, dtype=np.int64)
        self.prompt_tokens = np.zeros(0, dtype=np.int64)
        self.private_tokens_total = 0
        self.private_pages_total = 0
        self._content: dict[int, _SeqContent] = {}
        self._anonymous = 0

    # -- helpers ----------------------------------------------------------------------------------------

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.page_tokens)

    def _available_pages(self) -> int:
        """Free pages plus what eviction of unreferenced leaves would free."""
        return self.free_pages + self.tree.evictable_tokens // self.page_tokens

    def _take_pages(self, pages: int) -> None:
        """Take `pages` (callers checked `_available_pages`), evicting LRU leaves when the pool is short."""
        if pages > self.free_pages:
            freed = self.tree.evict((pages - self.free_pages) * self.page_tokens)
            self.free_pages += freed // self.page_tokens
        self.free_pages -= pages

    def _set_private(self, seq_id: int, length: int, depth: int) -> None:
        """Move the sequence to (length, depth), keeping the private totals (not the pool) in step."""
        old_private = int(self.lengths_tokens[seq_id] - self.depth_tokens[seq_id])
        self.private_tokens_total += (length - depth) - old_private
        self.private_pages_total += self._pages(length - depth) - self._pages(old_private)
        self.lengths_tokens[seq_id] = length
        self.depth_tokens[seq_id] = depth

    def _cache_prefix(self, seq_id: int, upto: int) -> None:
        """Insert the sequence's first `upto` tokens into the tree and lock them (cache_unfinished_req).

        Its own copy of what already existed is freed; the rest moves from private slots to the tree.
        """
        content = self._content[seq_id]
        depth = int(self.depth_tokens[seq_id])
        upto = upto // self.page_tokens * self.page_tokens
        if upto <= depth:
            return
        tree = self.tree
        node, existed = tree.insert(content.runs_to(upto), upto)
        tree.inc_lock_ref(node)
        tree.dec_lock_ref(content.node)
        content.node = node
        private_before = self.private_pages_total
        self._set_private(seq_id, int(self.lengths_tokens[seq_id]), upto)
        moved_pages = (upto - max(existed, depth)) // self.page_tokens
        # pages no longer private: those of new content now belong to the tree, duplicates are freed
        self.free_pages += (private_before - self.private_pages_total) - moved_pages

    # -- the Protocol ---------------------------------------------------------------------------------------

    def demand_tokens(self, seq: SeqSpec) -> int:
        return self._pages(seq.prompt_tokens) * self.page_tokens

    def rejection_reason(self, seq: SeqSpec) -> str:
        if self.max_model_len is not None and seq.prompt_tokens > self.max_model_len:
            return "prompt_exceeds_max_model_len"
        need = self._pages(seq.prompt_tokens)
        if need > self.num_pages:
            return f"needs {need} pages of {self.page_tokens} tokens, the cache has {self.num_pages}"
        return ""

    def admit(self, seq: SeqSpec) -> bool:
        """match_prefix, lock the match, allocate the rest of the prompt (or its first chunk), insert it."""
        seq_id = seq.seq_id
        check_new_seq(self, seq_id)
        if self.max_model_len is not None and seq.prompt_tokens > self.max_model_len:
            return False
        self._anonymous += 1
        runs = prompt_runs(seq, self._anonymous)
        tree = self.tree
        node, matched = tree.match_prefix(runs, seq.prompt_tokens)
        held = seq.prompt_tokens
        if seq.first_chunk_tokens > 0:
            held = min(seq.prompt_tokens, matched + seq.first_chunk_tokens)
        tree.inc_lock_ref(node)  # before evicting: its own match must stay
        pages = self._pages(held - matched)
        if pages > self._available_pages():
            tree.dec_lock_ref(node)
            return False
        self._take_pages(pages)
        ensure_rows(self, seq_id, _ROWS)
        self.live[seq_id] = True
        self.prompt_tokens[seq_id] = seq.prompt_tokens
        content = _SeqContent(runs, generated_stream(seq, self._anonymous), node)
        content.hit_tokens = matched
        self._content[seq_id] = content
        self._set_private(seq_id, held, matched)
        self._cache_prefix(seq_id, held)
        return True

    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        if num_tokens <= 0 or seq_ids.size == 0:
            return np.zeros(0, dtype=np.int64)
        private = self.lengths_tokens[seq_ids] - self.depth_tokens[seq_ids]
        need = ceil_div(private + num_tokens, self.page_tokens) - ceil_div(private, self.page_tokens)
        total = int(need.sum())
        too_long = self.max_model_len is not None and int(self.lengths_tokens[seq_ids].max()) + num_tokens > (
            self.max_model_len
        )
        if total <= self._available_pages() and not too_long:
            self._take_pages(total)
            self.lengths_tokens[seq_ids] += num_tokens
            self.private_tokens_total += num_tokens * seq_ids.size
            self.private_pages_total += total
            grown = seq_ids
            failed = np.zeros(0, dtype=np.int64)
        else:  # not all fit: in order, each sequence that fits grows, the others fail unchanged
            ok: list[int] = []
            bad: list[int] = []
            limit = self.max_model_len
            for seq_id, pages in zip(seq_ids.tolist(), need.tolist(), strict=True):
                over = limit is not None and int(self.lengths_tokens[seq_id]) + num_tokens > limit
                if over or pages > self._available_pages():
                    bad.append(seq_id)
                    continue
                self._take_pages(pages)
                self._set_private(
                    seq_id, int(self.lengths_tokens[seq_id]) + num_tokens, int(self.depth_tokens[seq_id])
                )
                ok.append(seq_id)
            grown = np.asarray(ok, dtype=np.int64)
            failed = np.asarray(bad, dtype=np.int64)
        # prompt chunks (chunked prefill) enter the tree as they are allocated
        cacheable = np.minimum(self.lengths_tokens[grown], self.prompt_tokens[grown])
        cacheable -= cacheable % self.page_tokens
        for seq_id, upto in zip(
            grown[cacheable > self.depth_tokens[grown]].tolist(),
            cacheable[cacheable > self.depth_tokens[grown]].tolist(),
            strict=True,
        ):
            self._cache_prefix(seq_id, upto)
        return failed

    def max_uniform_growth(self, seq_ids: np.ndarray, limit: int) -> int:
        """The largest k <= limit that `grow(seq_ids, k)` serves from free pages alone.

        Stopping before an eviction keeps a jump's taxonomy exact (evicting a whole leaf moves
        `cached` to free in a step); the engine's next single step evicts, as stepping would.
        """
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        if seq_ids.size == 0 or limit <= 0:
            return max(0, limit) if seq_ids.size == 0 else 0
        if self.max_model_len is not None:
            limit = min(limit, self.max_model_len - int(self.lengths_tokens[seq_ids].max()))
            if limit <= 0:
                return 0
        pages = self.free_pages
        if self.page_tokens == 1:
            return int(min(limit, pages // seq_ids.size))
        private = self.lengths_tokens[seq_ids] - self.depth_tokens[seq_ids]
        held = ceil_div(private, self.page_tokens)

        def need(k: int) -> int:
            return int((ceil_div(private + k, self.page_tokens) - held).sum())

        low, high = 0, int(min(limit, (pages + 1) * self.page_tokens))
        while low < high:
            mid = (low + high + 1) // 2
            if need(mid) <= pages:
                low = mid
            else:
                high = mid - 1
        return low

    def release(self, seq_id: int) -> None:
        """cache_finished_req: insert everything (whole pages), unlock, free the unaligned tail."""
        check_live_seq(self, seq_id)
        length = int(self.lengths_tokens[seq_id])
        self._cache_prefix(seq_id, length)
        content = self._content.pop(seq_id)
        self.tree.dec_lock_ref(content.node)
        private_pages = self._pages(length - int(self.depth_tokens[seq_id]))
        self._set_private(seq_id, 0, 0)
        self.free_pages += private_pages
        self.live[seq_id] = False

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        """A parallel sample: the parent's whole pages go into the tree and both share them; the
        child copies the unaligned tail (SGLang runs each sample as a request matching the cache)."""
        check_live_seq(self, parent_id)
        check_new_seq(self, child.seq_id)
        length = int(self.lengths_tokens[parent_id])
        tail = length % self.page_tokens
        pages = self._pages(tail)
        if pages > self._available_pages():  # inserting first frees, never takes
            return False
        self._cache_prefix(parent_id, length)
        depth = int(self.depth_tokens[parent_id])
        parent = self._content[parent_id]
        self.tree.inc_lock_ref(parent.node)
        self._take_pages(pages)
        seq_id = child.seq_id
        ensure_rows(self, seq_id, _ROWS)
        self.live[seq_id] = True
        self.prompt_tokens[seq_id] = self.prompt_tokens[parent_id]
        self._anonymous += 1
        content = _SeqContent(
            parent.runs_to(length),
            generated_stream(child, self._anonymous),
            parent.node,
        )
        content.hit_tokens = parent.hit_tokens
        self._content[seq_id] = content
        self._set_private(seq_id, length, depth)
        return True

    def prefix_hit_tokens(self, seq_id: int) -> int:
        return self._content[seq_id].hit_tokens

    def available_tokens(self) -> int:
        """Free slots plus evictable cached ones (SGLang `available_size() + evictable_size()`)."""
        return self._available_pages() * self.page_tokens

    def cached_prefix_tokens(self, seq: SeqSpec) -> int:
        """Prompt tokens the tree holds now (SGLang's match for schedule_policy.py LPM ordering)."""
        return self.tree.peek_prefix(prompt_runs(seq, -1), seq.prompt_tokens)

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        page = self.page_tokens
        tree = self.tree
        private_slots = self.private_pages_total * page
        cached = tree.evictable_tokens
        return MemoryBreakdown(
            capacity=self.capacity_tokens,
            token_states=tree.protected_tokens + self.private_tokens_total,
            reservation=0,
            internal=private_slots - self.private_tokens_total,
            external=self.capacity_tokens - self.num_pages * page,
            duplicated=0,
            free=self.free_pages * page + cached,
            cached=cached,
        )

    def breakdown_integral(
        self,
        seq_ids: np.ndarray,
        durations_s: np.ndarray,
        next_demand_tokens: int = 0,
        *,
        first: MemoryBreakdown | None = None,
        total_s: float | None = None,
    ) -> dict[str, float] | None:
        """Page size 1: the parts move linearly inside a jump (no eviction: max_uniform_growth), so
        the engine interpolates. Pages: new pages appear periodically per sequence, summed exactly."""
        if self.page_tokens == 1:
            return None
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        durations = np.asarray(durations_s, dtype=np.float64)
        steps = durations.size
        if steps == 0:
            return dict.fromkeys(INTEGRATED_PARTS, 0.0)
        if first is None:
            first = self.breakdown(next_demand_tokens)
        page = self.page_tokens
        private = self.lengths_tokens[seq_ids] - self.depth_tokens[seq_ids]
        # a sequence with r free slots in its last page takes a new page at growth r+1, r+1+P, ...
        room = (-private) % page
        per_phase = np.bincount(room, minlength=page)  # room r -> first new page at growth r + 1
        growth = np.arange(steps)
        new_at = np.zeros(steps, dtype=np.int64)
        new_at[1:] = per_phase[(growth[1:] - 1) % page]
        pages_by = np.cumsum(new_at)  # pages taken after growing i tokens
        if int(pages_by[-1]) > self.free_pages:
            return _stepped_integral(self, seq_ids, durations, next_demand_tokens)  # type: ignore[arg-type]
        n = seq_ids.size
        grown_tokens = growth * n
        slots = pages_by * page
        sums = {part: float(getattr(first, part)) * float(durations.sum()) for part in INTEGRATED_PARTS}
        sums["token_states"] += float(durations @ grown_tokens)
        sums["internal"] += float(durations @ (slots - grown_tokens))
        sums["free"] -= float(durations @ slots)
        return sums

    def layout(self) -> Layout:
        """Token slots are not placed in kvsim's radix model: gpu/ replays block tables, not this."""
        raise AllocatorConfigError(
            "radix: --export-layouts is not available (the radix model places no physical slot ids); "
            "use paged"
        )

    def hole_stats(self) -> dict[str, float]:
        """Free pages are interchangeable (no external fragmentation): one hole per free page."""
        return uniform_hole_stats(self.free_pages, self.page_tokens)

    def state_snapshot(self) -> tuple:
        """Everything observable, for tests that check a refused operation changed nothing."""
        ids = np.flatnonzero(self.live)
        return (
            tuple(ids.tolist()),
            tuple(self.lengths_tokens[ids].tolist()),
            tuple(self.depth_tokens[ids].tolist()),
            self.free_pages,
            self.tree.total_tokens,
            self.tree.protected_tokens,
        )
