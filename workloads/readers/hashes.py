"""Per-request lists of block content hashes (Mooncake's `hash_ids`, our `block_hashes`): parsing and checks.

Why shared: a Mooncake trace and a generic CSV, Parquet or JSON-lines file can both say which blocks of
each prompt hold identical KV ("a system prompt shared by a group, plus each user's repeated history",
issue 21 §4). Both readers take the list from a cell -- a JSON list, a Parquet list, or in CSV the ids
separated by spaces ("17 18 42") -- and apply the same rules: every id an integer that fits in int64,
and at least ceil(prompt / block) ids (fewer would understate the sharing; more is a request-table
rule in workloads.schema).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workloads.schema import RowCheck

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _as_ids(value: Any, text: bool) -> list[int] | None:
    """A cell as a list of Python ints, or None when it is not a list of integer ids."""
    if text and isinstance(value, str):  # CSV: "17 18 42" (brackets and commas allowed: "[17, 18, 42]")
        words = value.strip().strip("[]").replace(",", " ").split()
        try:
            return [int(word) for word in words]
        except ValueError:
            return None
    if isinstance(value, np.ndarray):  # a Parquet list cell
        value = value.tolist()
    if not isinstance(value, list) or not all(type(x) is int for x in value):
        return None
    return value


def parse_block_hashes(
    raw: np.ndarray, field: str, missing: np.ndarray, *, text: bool = False
) -> tuple[np.ndarray, np.ndarray, list[RowCheck]]:
    """(object array of id lists, [] where unusable; the usable mask; the checks naming `field`).

    `missing[i]`: row i has no value at all (an absent JSON key, an empty CSV cell, a Parquet null),
    reported as a missing value rather than read as "no blocks". `text`: cells are CSV text.
    """
    num = len(raw)
    hashes = np.empty(num, dtype=object)
    not_ints = np.zeros(num, dtype=bool)
    for i in range(num):
        ids = None if missing[i] else _as_ids(raw[i], text)
        not_ints[i] = ids is None and not missing[i]
        hashes[i] = ids if ids is not None else []
    out_of_range = ~missing & ~not_ints
    out_of_range[out_of_range] = [
        bool(h) and (min(h) < INT64_MIN or max(h) > INT64_MAX) for h in hashes[out_of_range]
    ]
    shown = {int(i): repr(raw[i])[:40] for i in np.flatnonzero(not_ints | out_of_range)}
    for i in np.flatnonzero(out_of_range):  # (element-wise: a list of lists would broadcast as 2-D)
        hashes[i] = []
    checks = [
        RowCheck(field, missing, lambda i: "missing value"),
        RowCheck(field, not_ints, lambda i: f"not a list of integer block ids ({shown[i]})"),
        RowCheck(field, out_of_range, lambda i: f"block ids must fit in 64 bits ({shown[i]})"),
    ]
    return hashes, ~missing & ~not_ints, checks


def too_few_check(
    hashes: np.ndarray,
    usable: np.ndarray,
    prompt: np.ndarray,
    block_tokens: float,
    field: str,
    prompt_field: str,
) -> RowCheck:
    """Usable rows whose ids cover less than the prompt: every prompt token lies in exactly one block."""
    counts = np.fromiter((len(h) for h in hashes), dtype=np.float64, count=len(hashes))
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.ceil(prompt / block_tokens)
        too_few = usable & np.isfinite(expected) & (counts < expected)
    return RowCheck(
        field,
        too_few,
        lambda i: (
            f"{int(counts[i])} block ids cover less than {prompt_field} ({prompt[i]:g}) at "
            f"{block_tokens:g} tokens per block (needs {int(expected[i])})"
        ),
    )
