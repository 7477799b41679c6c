"""SGLang's radix tree over token content: match, insert, lock references and LRU eviction of leaves.

Modelled on sgl-project/sglang python/sglang/srt/mem_cache/radix_cache.py `RadixCache`:
- `match_prefix` walks from the root along the children keyed by the next page of content and
  splits a node that matches only in part (`_match_prefix_helper`, `_split_node`), so the match
  ends on a node boundary; it refreshes the last access time of every node on the path.
- `insert` matches the same way and hangs the unmatched rest as one new leaf (`_insert_helper`);
  what already existed is reported so the caller frees its own copy of it.
- `inc_lock_ref` / `dec_lock_ref` count, on every node from a leaf up to the root, the running
  requests that use it; a node with lock_ref 0 is *evictable* (`evictable_size_`), the rest
  *protected* (`protected_size_`).
- `evict(num_tokens)` frees unreferenced leaves, least recently used first, a whole leaf at a
  time, until at least `num_tokens` are freed; a parent left childless and unreferenced becomes a
  candidate in turn.
- With page_size > 1 only whole pages are matched or inserted (`_key_match_paged`, the key cut to
  `len(key) // page_size * page_size`), so every node holds whole pages.

Differences, and why: keys are runs of named content (allocators/radix_content.py) instead of token
ids; the access clock is a counter the allocator advances per operation instead of
`time.monotonic()`, so runs are deterministic; the heap of eviction candidates is kept between calls
(stale entries skipped) instead of collecting all leaves on every `evict`, which gives the same order.
"""

from __future__ import annotations

import heapq

from allocators.radix_content import Run, page_key


class TreeNode:
    """One edge of the tree: the content [start, end) as runs, its children, its lock count."""

    __slots__ = ("uid", "runs", "start", "end", "parent", "children", "lock_ref", "last_access", "alive")

    def __init__(self, uid: int, runs: list[Run], parent: TreeNode | None, last_access: int) -> None:
        self.uid = uid
        self.runs = runs
        self.start = runs[0][1] if runs else 0
        self.end = runs[-1][2] if runs else 0
        self.parent = parent
        self.children: dict[tuple, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = last_access
        self.alive = True

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


def _run_index(runs: list[Run], position: int, index: int) -> int:
    """Index of the run containing `position`, searching forward from `index` (len(runs) past the end)."""
    while index < len(runs) and runs[index][2] <= position:
        index += 1
    return index


def _split_runs(runs: list[Run], at: int) -> tuple[list[Run], list[Run]]:
    """Runs cut into [.., at) and [at, ..)."""
    head: list[Run] = []
    tail: list[Run] = []
    for stream, start, end in runs:
        if end <= at:
            head.append((stream, start, end))
        elif start >= at:
            tail.append((stream, start, end))
        else:
            head.append((stream, start, at))
            tail.append((stream, at, end))
    return head, tail


def _common_end(node_runs: list[Run], runs: list[Run], index: int, limit: int) -> int:
    """Where the node's content and the sequence's (from runs[index], at the node's start) part."""
    j = 0
    position = node_runs[0][1]
    while j < len(node_runs) and index < len(runs):
        stream, _, node_end = node_runs[j]
        if runs[index][0] != stream:
            break
        position = min(node_end, runs[index][2], limit)
        if position >= limit:
            break
        if node_end == position:
            j += 1
        if runs[index][2] == position:
            index += 1
    return position


class RadixTree:
    """The tree and its token counts; memory itself is the allocator's (allocators/radix.py)."""

    def __init__(self, page_tokens: int) -> None:
        self.page_tokens = page_tokens
        self._next_uid = 1
        self.root = TreeNode(0, [], None, 0)
        self.root.lock_ref = 1  # the root is never evicted (radix_cache.py `reset`: root lock_ref = 1)
        self.total_tokens = 0  # tokens held by the tree
        self.protected_tokens = 0  # ... by nodes some running sequence uses (lock_ref > 0)
        self.clock = 0
        self._candidates: list[tuple[int, int, TreeNode]] = []  # (last_access, uid, leaf)

    @property
    def evictable_tokens(self) -> int:
        return self.total_tokens - self.protected_tokens

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    # -- matching ------------------------------------------------------------------------------------

    def _walk(self, runs: list[Run], limit: int, *, touch: bool = True) -> tuple[TreeNode, int]:
        """Follow `runs` from the root up to `limit` tokens (page aligned).

        `touch`: split a partly matched node and refresh access times on the path (match_prefix);
        without it nothing changes and the walk stops inside the partly matched node.
        """
        page = self.page_tokens
        limit = limit // page * page
        node, position, index = self.root, 0, 0
        now = self.tick() if touch else 0
        if touch:
            node.last_access = now
        while position < limit:
            index = _run_index(runs, position, index)
            if index >= len(runs):
                break
            child = node.children.get(page_key(runs, index, position, page))
            if child is None:
                break
            end = _common_end(child.runs, runs, index, min(limit, child.end))
            end = position + (end - position) // page * page
            if end <= position:  # cannot happen: the child key matched a whole page
                break
            if not touch:
                node, position = child, end
                if end < child.end:
                    break
                continue
            if end < child.end:
                child = self._split(child, end)
            child.last_access = now
            node, position = child, end
        return node, position

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """radix_cache.py `_split_node`: a new node for [child.start, at) takes child's place."""
        head, tail = _split_runs(child.runs, at)
        parent = child.parent
        assert parent is not None
        new = TreeNode(self._uid(), head, parent, child.last_access)
        new.lock_ref = child.lock_ref
        key = page_key(head, 0, child.start, self.page_tokens)
        parent.children[key] = new
        child.runs, child.start, child.parent = tail, at, new
        new.children[page_key(tail, 0, at, self.page_tokens)] = child
        return new

    def _uid(self) -> int:
        self._next_uid += 1
        return self._next_uid - 1

    def match_prefix(self, runs: list[Run], limit: int) -> tuple[TreeNode, int]:
        """The deepest node whose path equals the content's first tokens, and how many tokens that is."""
        return self._walk(runs, limit)

    def peek_prefix(self, runs: list[Run], limit: int) -> int:
        """Tokens `match_prefix` would match, without splitting a node or touching access times.

        Why a side-effect-free twin: the scheduler asks it for ordering the waiting queue, as often
        as it plans a step; a query that refreshed LRU times would make eviction depend on how often
        the engine looked (and a multi-iteration jump looks less often than stepping).
        """
        return self._walk(runs, limit, touch=False)[1]

    def insert(self, runs: list[Run], limit: int) -> tuple[TreeNode, int]:
        """Make the first `limit` tokens (page aligned) a path: (its last node, tokens that existed)."""
        node, existed = self._walk(runs, limit)
        end = limit // self.page_tokens * self.page_tokens
        if existed < end:
            _, rest = _split_runs(runs, existed)
            rest, _ = _split_runs(rest, end)
            leaf = TreeNode(self._uid(), rest, node, self.clock)
            node.children[page_key(rest, 0, existed, self.page_tokens)] = leaf
            self.total_tokens += leaf.num_tokens
            self._maybe_candidate(leaf)
            node = leaf
        return node, existed

    # -- references ----------------------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode) -> None:
        """radix_cache.py `inc_lock_ref`: the path from `node` to the root is in use by one more request."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.protected_tokens += node.num_tokens
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: TreeNode) -> None:
        """radix_cache.py `dec_lock_ref`: one request fewer; an unreferenced leaf becomes evictable."""
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref < 0:
                raise RuntimeError("radix tree: lock_ref below zero")
            if node.lock_ref == 0:
                self.protected_tokens -= node.num_tokens
                self._maybe_candidate(node)
            node = node.parent  # type: ignore[assignment]

    # -- eviction ------------------------------------------------------------------------------------

    def _maybe_candidate(self, node: TreeNode) -> None:
        if node.lock_ref == 0 and not node.children and node is not self.root:
            heapq.heappush(self._candidates, (node.last_access, node.uid, node))

    def evict(self, num_tokens: int) -> int:
        """radix_cache.py `evict`: free unreferenced leaves, LRU first, until >= num_tokens; tokens freed."""
        freed = 0
        heap = self._candidates
        while freed < num_tokens and heap:
            access, _, leaf = heapq.heappop(heap)
            if not leaf.alive or leaf.lock_ref or leaf.children or access != leaf.last_access:
                if leaf.alive and not leaf.lock_ref and not leaf.children:
                    heapq.heappush(heap, (leaf.last_access, leaf.uid, leaf))  # re-queue at its new time
                continue
            freed += leaf.num_tokens
            self.total_tokens -= leaf.num_tokens
            leaf.alive = False
            parent = leaf.parent
            assert parent is not None
            del parent.children[page_key(leaf.runs, 0, leaf.start, self.page_tokens)]
            self._maybe_candidate(parent)
        return freed

    def nodes(self) -> list[TreeNode]:
        """Every node but the root (for tests and snapshots)."""
        out: list[TreeNode] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
