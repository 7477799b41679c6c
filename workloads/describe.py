"""`describe(df)`: the figures a capacity planner checks first about a request table.

Why these: count, span and mean rate say how much load; the inter-arrival CV says how bursty
(1 = Poisson); length percentiles say how much KV each request needs; and the infinite-prefix-cache
hit ratio bounds what prefix caching can save (Mooncake's conversation trace: about 37 %).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)


def length_stats(values: np.ndarray) -> dict[str, float]:
    """mean, p50, p90, p99 and max of a length column (tokens)."""
    if len(values) == 0:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES}, "max": 0.0}
    quantiles = np.percentile(values, PERCENTILES)
    return {
        "mean": float(np.mean(values)),
        **{f"p{p}": float(q) for p, q in zip(PERCENTILES, quantiles, strict=True)},
        "max": float(np.max(values)),
    }


def prefix_hit_tokens_from_hashes(
    prompt_tokens: np.ndarray, hashes: np.ndarray, block_tokens: int
) -> np.ndarray:
    """Per request, prompt tokens an infinite prefix cache would already hold (block-hash traces).

    A block hits when an earlier request had the same id, and only while every earlier block of the
    same prompt hit too (prefix matching, as in vLLM and Mooncake). The last block holds the rest of
    the prompt (prompt - (blocks - 1) * block_tokens tokens). A request with no block ids (an empty
    list, e.g. from a hand-built table) hits nothing; it must not shift its neighbours' blocks.
    """
    counts = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=len(hashes))
    if counts.sum() == 0:
        return np.zeros(len(hashes), dtype=np.int64)
    flat = np.fromiter(itertools.chain.from_iterable(hashes), dtype=np.int64, count=int(counts.sum()))
    row = np.repeat(np.arange(len(hashes)), counts)
    # pandas' hash factorisation numbers ids in order of first appearance (no sort: ~5x faster than
    # np.unique on Mooncake-sized traces), so the k-th first appearance is id k's first position.
    codes = pd.factorize(flat)[0]
    del flat
    is_first = np.ones(len(codes), dtype=bool)
    is_first[1:] = codes[1:] > np.maximum.accumulate(codes)[:-1]
    first_row = row[np.flatnonzero(is_first)][codes]
    del codes, is_first
    hit = first_row < row
    del first_row
    # Each block's position in the flat array of its own row's first block: computed per block (not
    # per row, which would index past the end for trailing empty rows).
    starts = np.cumsum(counts) - counts
    block_start = np.repeat(starts, counts)
    misses = np.cumsum(~hit)
    misses_before_row = misses[block_start] - (~hit[block_start])
    prefix_hit = hit & (misses == misses_before_row)  # no miss yet within this prompt
    index_in_row = np.arange(len(row)) - block_start
    block_len = np.minimum(block_tokens, np.repeat(prompt_tokens, counts) - index_in_row * block_tokens)
    block_len = np.maximum(block_len, 0)
    return np.bincount(row, weights=np.where(prefix_hit, block_len, 0), minlength=len(hashes)).astype(
        np.int64
    )


def prefix_hit_tokens_from_groups(prefix_group: np.ndarray, prefix_tokens: np.ndarray) -> np.ndarray:
    """Per request, the shared prefix if an earlier request of the same group computed it, else 0."""
    _, first_rows = np.unique(prefix_group, return_index=True)
    is_first = np.zeros(len(prefix_group), dtype=bool)
    is_first[first_rows] = True
    return np.where((prefix_group >= 0) & ~is_first, prefix_tokens, 0).astype(np.int64)


def prefix_hit_ratio(df: pd.DataFrame) -> float | None:
    """Token hit ratio of an infinite prefix cache (hit prompt tokens / all prompt tokens), or None."""
    prompt = df["prompt_tokens"].to_numpy(dtype=np.int64)
    if "block_hashes" in df.columns and df.attrs.get("block_hash_tokens"):
        hits = prefix_hit_tokens_from_hashes(
            prompt, df["block_hashes"].to_numpy(dtype=object), int(df.attrs["block_hash_tokens"])
        )
    elif "prefix_group" in df.columns and "prefix_tokens" in df.columns:
        hits = prefix_hit_tokens_from_groups(df["prefix_group"].to_numpy(), df["prefix_tokens"].to_numpy())
    else:
        return None
    return float(hits.sum() / prompt.sum()) if prompt.sum() else 0.0


def describe(df: pd.DataFrame) -> dict[str, Any]:
    """Summary figures of a request table (JSON-safe dict)."""
    arrival_s = df["arrival_s"].to_numpy(dtype=np.float64)
    count = len(df)
    span_s = float(arrival_s[-1] - arrival_s[0]) if count else 0.0
    gaps_s = np.diff(arrival_s)
    gap_mean = float(gaps_s.mean()) if len(gaps_s) else 0.0
    summary: dict[str, Any] = {
        "source": df.attrs.get("source", ""),
        "format": df.attrs.get("format", "preset" if "generator" in df.attrs else ""),
        "count": count,
        "span_s": span_s,
        "mean_rate": (count - 1) / span_s if span_s > 0 else None,
        "interarrival_cv": float(gaps_s.std() / gap_mean) if gap_mean > 0 else None,
        "prompt_tokens": length_stats(df["prompt_tokens"].to_numpy()),
        "output_tokens": length_stats(df["output_tokens"].to_numpy()),
        "max_tokens": length_stats(df["max_tokens"].to_numpy()),
        "prefix_hit_ratio": prefix_hit_ratio(df),
        "clipped_requests": int(df.attrs.get("clipped_requests", 0)),
        "skipped_rows": int(df.attrs.get("skipped_rows", 0)),
    }
    for key in ("closed_loop", "over_length_prompts", "clipped_max_tokens", "block_hash_tokens", "generator"):
        if key in df.attrs:
            summary[key] = df.attrs[key]
    if "n" in df.columns:
        summary["n_mean"] = float(df["n"].mean())
    if "session_id" in df.columns:
        summary["sessions"] = int(df["session_id"].nunique())
    return summary
