"""Per-sequence state in NumPy arrays indexed by seq id, grown geometrically.

Why arrays: the engine assigns dense small seq ids, so `lengths[seq_ids] += k` is one vectorised
operation for the whole batch; a dict of per-sequence objects would force a Python loop per token.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def grown(array: np.ndarray, min_rows: int, fill: int | bool) -> np.ndarray:
    """`array` with at least `min_rows` rows (doubling), new rows set to `fill`; same array if big enough."""
    rows = array.shape[0]
    if rows >= min_rows:
        return array
    new_rows = max(min_rows, 2 * rows, 16)
    out = np.full((new_rows, *array.shape[1:]), fill, dtype=array.dtype)
    out[:rows] = array
    return out


def ensure_rows(owner: object, seq_id: int, fills: Mapping[str, int | bool]) -> None:
    """Grow each per-sequence array attribute of `owner` named in `fills` so that `seq_id` is a row.

    Why one helper: every allocator keeps several arrays indexed by seq id that must always have the
    same number of rows; growing them in one place keeps them in step (new rows get each array's
    "no sequence" value from `fills`). The first named array stands for all of them.
    """
    rows = seq_id + 1
    if rows <= getattr(owner, next(iter(fills))).shape[0]:
        return
    for name, fill in fills.items():
        setattr(owner, name, grown(getattr(owner, name), rows, fill))


def check_new_seq(owner: object, seq_id: int) -> None:
    """Refuse a seq id that is negative or already live: an engine bug, never a user error."""
    if seq_id < 0:
        raise RuntimeError(f"seq id must be >= 0, got {seq_id}")
    live = owner.live  # type: ignore[attr-defined]
    if seq_id < live.shape[0] and live[seq_id]:
        raise RuntimeError(f"seq id {seq_id} is already live in {owner.name}")  # type: ignore[attr-defined]


def check_live_seq(owner: object, seq_id: int) -> None:
    """Refuse a seq id that is not live: releasing or forking an unknown sequence is an engine bug."""
    live = owner.live  # type: ignore[attr-defined]
    if not (0 <= seq_id < live.shape[0] and live[seq_id]):
        raise RuntimeError(f"seq id {seq_id} is not live in {owner.name}")  # type: ignore[attr-defined]


def ceil_div(numer: np.ndarray | int, denom: int) -> np.ndarray | int:
    """Ceiling division for non-negative ints (arrays or scalars)."""
    return -(-numer // denom)
