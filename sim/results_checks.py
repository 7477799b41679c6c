"""Type checks of a results folder's content: numbers where numbers belong.

Why: `kvsim report` reads folders that users copy, edit and regenerate. A `summary.json` with a string
where a metric belongs, or a `steps.parquet` whose column became text, used to end in a traceback
(`could not convert string to float`) or in a report of garbage; these checks turn each into one
line naming the file, the column or metric, and the first bad value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.errors import ResultsError

# Request columns that hold text or flags, not numbers (docs/architecture.md).
NON_NUMERIC_REQUEST_COLUMNS: frozenset[str] = frozenset({"rejected", "rejection_reason", "finish_reason"})


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _first_non_number(series: pd.Series) -> tuple[int, Any] | None:
    """The first (row, value) of `series` that is neither a number nor missing, or None."""
    for row, value in enumerate(series.to_numpy(dtype=object)):
        if value is None or value is pd.NA or _is_number(value):
            continue
        return row, value
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_numeric_columns(frame: pd.DataFrame, path: Path, columns: Iterable[str]) -> None:
    """Every listed column of `frame` it has holds numbers; else ResultsError naming the first bad value."""
    for column in columns:
        if column not in frame.columns:
            continue
        series = frame[column]
        if pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series):
            continue
        bad = _first_non_number(series)
        if bad is None:  # e.g. an object column of numbers and nulls
            continue
        row, value = bad
        raise ResultsError(
            f"{path}: column {column!r} must hold numbers (row {row + 1} holds {_short(value)}); "
            "was the file edited or written by another tool?"
        )


def check_metric_numbers(metrics: Mapping[str, Any], path: Path, keys: Iterable[str]) -> None:
    """summary.json's metrics `keys` are numbers or null; else ResultsError naming the metric."""
    for key in keys:
        value = metrics.get(key)
        if value is None:
            continue
        if not _is_number(value):
            raise ResultsError(f"{path}: metric {key!r} must be a number or null (got {_short(value)})")
