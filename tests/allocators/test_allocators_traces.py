"""Allocators on the real Mooncake conversation trace (../shared/traces, skipped when absent).

Why: the trace's `hash_ids` are real prefix-block identities, so prefix sharing and caching can
be checked against an independent count, and the invariants against long real prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _alloc_helpers import ContentModel, check_all_free, check_paged

from allocators import SeqSpec, make_allocator

MOONCAKE = Path("mooncake_conversation") / "conversation_trace.jsonl"
HASH_TOKENS = 512  # the trace's hash_ids each cover 512 prompt tokens


def _mooncake(traces_dir: Path, limit: int | None = None) -> list[dict]:
    path = traces_dir / MOONCAKE
    if not path.is_file():
        pytest.skip(f"{path} not found")
    rows = []
    with path.open() as handle:
        for line in handle:
            rows.append(json.loads(line))
            if limit is not None and len(rows) == limit:
                break
    return rows


def _spec(seq_id: int, row: dict) -> SeqSpec:
    return SeqSpec(
        seq_id=seq_id,
        prompt_tokens=row["input_length"],
        max_tokens=row["output_length"],
        output_tokens=row["output_length"],
        block_hashes=tuple(row["hash_ids"]),
        block_hash_tokens=HASH_TOKENS,
    )


def test_infinite_prefix_cache_hit_ratio_matches_the_trace(traces_dir: Path) -> None:
    """Every request's hit = the full 512-token blocks of its longest previously seen hash-chain prefix."""
    rows = _mooncake(traces_dir)
    total_prompt = sum(row["input_length"] for row in rows)
    alloc = make_allocator(
        "paged",
        capacity_tokens=total_prompt + HASH_TOKENS * len(rows),
        block_size=HASH_TOKENS,
        enable_prefix_caching=True,
    )
    seen_prefixes: set[tuple[int, ...]] = set()
    measured = expected = 0
    for seq_id, row in enumerate(rows):
        assert alloc.admit(_spec(seq_id, row))
        measured += alloc.prefix_hit_tokens(seq_id)
        alloc.release(seq_id)
        ids = row["hash_ids"]
        matched = 0
        while matched < len(ids) and tuple(ids[: matched + 1]) in seen_prefixes:
            matched += 1
        expected += min(matched * HASH_TOKENS, row["input_length"]) // HASH_TOKENS * HASH_TOKENS
        seen_prefixes.update(tuple(ids[: j + 1]) for j in range(len(ids)))
    assert measured == expected
    assert abs(measured / total_prompt - 0.374) < 0.002  # the trace README: 37.4 % with an infinite cache
    assert alloc.breakdown().cached > 0


@pytest.mark.parametrize(
    "params",
    [
        {"block_size": 16, "enable_prefix_caching": True},
        {"block_size": 16, "share_prefixes": False},
    ],
)
def test_invariants_hold_serving_real_prompts_under_memory_pressure(traces_dir: Path, params: dict) -> None:
    """FIFO admission of real prompts into a cache that fits a handful, decoding in jumps, forks included."""
    rows = _mooncake(traces_dir, limit=120)
    alloc = make_allocator("paged", capacity_tokens=200_000, **params)
    model = ContentModel()
    live: list[int] = []
    rng = np.random.default_rng(7)
    for seq_id, row in enumerate(rows):
        spec = _spec(seq_id, row)
        while not alloc.admit(spec):
            if not live:
                pytest.fail(f"request {seq_id} ({spec.prompt_tokens} tokens) does not fit an empty cache")
            oldest = live.pop(0)
            alloc.release(oldest)
            model.release(oldest)
        model.admit(spec)
        live.append(seq_id)
        if seq_id % 10 == 3:  # a parallel sample of the newest request
            child = SeqSpec(10_000 + seq_id, spec.prompt_tokens, spec.max_tokens, spec.output_tokens)
            if alloc.fork(seq_id, child):
                model.fork(seq_id, child)
                live.append(child.seq_id)
        ids = np.array(live, dtype=np.int64)
        k = alloc.max_uniform_growth(ids, int(rng.integers(1, 40)))
        if k:
            assert alloc.grow(ids, k).size == 0
            for sid in live:
                model.grow(sid, k)
        if seq_id % 15 == 0:
            check_paged(alloc, model)
    check_paged(alloc, model)
    for sid in live:
        alloc.release(sid)
        model.release(sid)
    check_all_free(alloc)
