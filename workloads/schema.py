"""The request table: its columns, and the one boundary check `validate(df)`.

Why one module: every producer (generators, trace readers, user DataFrames) hands its table to the
simulator through `validate`, so the rules live in one place. The row checks are vectorised masks so
that readers can reuse them to *skip* bad rows (`on_bad_row="skip"`) instead of failing on the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError

REQUIRED_COLUMNS: tuple[str, ...] = (
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
)
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "prefix_group",
    "prefix_tokens",
    "session_id",
    "turn",
    "think_s",
    "block_hashes",
    "n",
)
INT_COLUMNS: tuple[str, ...] = (
    "request_id",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "prefix_group",
    "prefix_tokens",
    "session_id",
    "turn",
    "n",
)
# Smallest allowed value of each integer column (prefix_group -1 means "no shared prefix").
MIN_VALUE: dict[str, int] = {
    "request_id": 0,
    "prompt_tokens": 1,
    "output_tokens": 1,
    "max_tokens": 1,
    "prefix_group": -1,
    "prefix_tokens": 0,
    "session_id": 0,
    "turn": 1,
    "n": 1,
}

# Largest value of an integer column: 2**53 is the largest integer float64 holds exactly, so every
# accepted value casts to int64 unchanged (readers parse numbers as float64; 1e30, 2**63 or a uint64
# max would otherwise wrap to a negative length in the cast). Any real length or id is far below it.
MAX_INT_VALUE = 2**53
# Longest trace span, first to last arrival. The longest public LLM serving traces cover weeks to a few
# months (Azure LLM inference 2024: one week; BurstGPT: 121 days); a span of centuries is a unit or
# year typo. Also keeps arrival_s far from the float64 range where a microsecond is lost.
MAX_TRACE_SPAN_S = 366 * 24 * 3600.0


@dataclass(frozen=True)
class RowCheck:
    """One rule over all rows: `bad[i]` is True where row i breaks it; `reason(i)` says how."""

    field: str
    bad: np.ndarray
    reason: Callable[[int], str]
    rule: str = "value"  # "order" for the sorted-timestamps rule, which skipping treats specially


def _value_text(values: np.ndarray, i: int) -> str:
    value = values[i]
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


def _numeric_checks(df: pd.DataFrame, column: str, integer: bool, minimum: float | None) -> list[RowCheck]:
    series = df[column]
    if not (pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)):
        coerced = pd.to_numeric(series, errors="coerce")
        raw = series.to_numpy(dtype=object)
        not_number = coerced.isna().to_numpy() & series.notna().to_numpy()
        checks = [RowCheck(column, not_number, lambda i, raw=raw: f"not a number ({raw[i]!r})")]
        series = coerced
    else:
        checks = []
    values = series.to_numpy(dtype=np.float64, na_value=np.nan)
    nan = np.isnan(values)
    checks.append(RowCheck(column, nan & ~checks[0].bad if checks else nan, lambda i: "missing value (NaN)"))
    with np.errstate(invalid="ignore"):
        inf = np.isinf(values)
        checks.append(RowCheck(column, inf, lambda i, v=values: f"not finite ({v[i]})"))
        if integer:
            fractional = np.isfinite(values) & (values != np.round(values))
            checks.append(RowCheck(column, fractional, lambda i, v=values: f"not an integer ({v[i]})"))
            too_large = np.isfinite(values) & (np.abs(values) > MAX_INT_VALUE)
            checks.append(
                RowCheck(column, too_large, lambda i, v=values: f"too large (got {v[i]:.6g}; at most 2**53)")
            )
        if minimum is not None:
            low = values < minimum
            what = "positive" if minimum == 1 else f">= {minimum:g}"
            if column.endswith("_tokens") and minimum == 1:
                what = "a positive length (>= 1)"
            checks.append(
                RowCheck(column, low, lambda i, v=values, w=what: f"must be {w} (got {_value_text(v, i)})")
            )
    return checks


def _block_hash_checks(df: pd.DataFrame, block_hash_tokens: int | None) -> list[RowCheck]:
    hashes = df["block_hashes"].to_numpy(dtype=object)
    lengths = np.fromiter(
        (len(h) if isinstance(h, list | tuple | np.ndarray) else -1 for h in hashes), np.int64
    )
    checks = [RowCheck("block_hashes", lengths < 0, lambda i: "not a list of block ids")]
    if block_hash_tokens:
        prompt = pd.to_numeric(df["prompt_tokens"], errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan
        )
        with np.errstate(invalid="ignore"):
            too_many = lengths > np.ceil(prompt / block_hash_tokens)
        checks.append(
            RowCheck(
                "block_hashes",
                too_many,
                lambda i: (
                    f"{lengths[i]} block ids cover more than prompt_tokens ({_value_text(prompt, i)}) "
                    f"at {block_hash_tokens} tokens per block"
                ),
            )
        )
    return checks


def beyond_span(arrival_s: np.ndarray) -> np.ndarray:
    """Rows more than MAX_TRACE_SPAN_S after the first valid arrival, with every later row too.

    Why "every later row too": one mistyped stamp in the middle (1e9 s, then 12 s again) is an unsorted
    row, reported as such on the row that goes back in time; a trace that really runs centuries long
    (or a stamp in the wrong unit at the end) has all its later rows that far out as well.
    """
    finite = np.isfinite(arrival_s)
    first = np.flatnonzero(finite)
    if not first.size:
        return np.zeros(len(arrival_s), dtype=bool)
    later_min = np.minimum.accumulate(np.where(finite, arrival_s, np.inf)[::-1])[::-1]
    with np.errstate(invalid="ignore", over="ignore"):
        return finite & (later_min - arrival_s[first[0]] > MAX_TRACE_SPAN_S)


def _span_check(arrival_s: np.ndarray) -> RowCheck:
    """A trace centuries long: the rows of `beyond_span`, with how far out they are."""
    finite = np.flatnonzero(np.isfinite(arrival_s))
    origin = arrival_s[finite[0]] if finite.size else 0.0
    days = MAX_TRACE_SPAN_S / 86400

    def reason(i: int) -> str:
        return f"{arrival_s[i] - origin:.6g} s after the first request: a trace spans at most {days:g} days"

    return RowCheck("arrival_s", beyond_span(arrival_s), reason)


def row_checks(df: pd.DataFrame, *, block_hash_tokens: int | None = None) -> list[RowCheck]:
    """Every per-row rule that applies to the columns `df` has (missing columns are not checked here)."""
    checks: list[RowCheck] = []
    # Order first: a timestamp that goes back in time is reported as unsorted, not as negative.
    if "arrival_s" in df.columns:
        arrival = pd.to_numeric(df["arrival_s"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        decreasing = np.zeros(len(arrival), dtype=bool)
        decreasing[1:] = arrival[1:] < arrival[:-1]
        checks.append(
            RowCheck(
                "arrival_s",
                decreasing,
                lambda i: f"timestamps not sorted ({arrival[i]:g} s comes after {arrival[i - 1]:g} s)",
                rule="order",
            )
        )
        checks.append(_span_check(arrival))
    for column in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS):
        if column not in df.columns or column == "block_hashes":
            continue
        integer = column in INT_COLUMNS
        checks += _numeric_checks(
            df, column, integer, MIN_VALUE.get(column, 0.0 if column in ("arrival_s", "think_s") else None)
        )
    if "think_s" in df.columns:
        checks += _session_loop_checks(df)
    if "prefix_tokens" in df.columns and "prompt_tokens" in df.columns:
        prefix = pd.to_numeric(df["prefix_tokens"], errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan
        )
        prompt = pd.to_numeric(df["prompt_tokens"], errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan
        )
        checks.append(
            RowCheck(
                "prefix_tokens",
                prefix > prompt,
                lambda i: f"longer than prompt_tokens ({_value_text(prefix, i)} > {_value_text(prompt, i)})",
            )
        )
        if "prefix_group" in df.columns:
            group = pd.to_numeric(df["prefix_group"], errors="coerce").to_numpy(
                dtype=np.float64, na_value=np.nan
            )
            checks.append(
                RowCheck(
                    "prefix_group",
                    (prefix > 0) & (group < 0),
                    lambda i: "prefix_tokens > 0 needs a group >= 0",
                )
            )
    if "block_hashes" in df.columns:
        checks += _block_hash_checks(df, block_hash_tokens)
    return checks


def _session_loop_checks(df: pd.DataFrame) -> list[RowCheck]:
    """A closed loop per session (`think_s`): it needs sessions, turns in table order, a bounded think.

    A session's turn k+1 is sent `think_s` after turn k's answer, so turn k must come first in the table
    (the table is in arrival order, and a session's first turn arrives first).
    """
    think = pd.to_numeric(df["think_s"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        too_long = think > MAX_TRACE_SPAN_S
    checks = [
        RowCheck(
            "think_s", too_long, lambda i: f"{think[i]:.6g} s: a think time is at most {MAX_TRACE_SPAN_S:g} s"
        )
    ]
    if "session_id" not in df.columns:
        no_session = np.ones(len(df), dtype=bool)  # every row: the closed loop has nothing to follow
        return [*checks, RowCheck("session_id", no_session, lambda i: "think_s needs a session_id column")]
    if "turn" in df.columns:
        session = pd.to_numeric(df["session_id"], errors="coerce")
        turn = pd.to_numeric(df["turn"], errors="coerce")
        previous = turn.groupby(session).shift(1).to_numpy(dtype=np.float64, na_value=np.nan)
        turns = turn.to_numpy(dtype=np.float64, na_value=np.nan)
        sessions = session.to_numpy(dtype=np.float64, na_value=np.nan)
        with np.errstate(invalid="ignore"):
            out_of_order = turns <= previous
        checks.append(
            RowCheck(
                "turn",
                out_of_order,
                lambda i: f"session {sessions[i]:g}'s turn {turns[i]:g} comes after its turn {previous[i]:g}",
            )
        )
    return checks


def bad_row_mask(checks: Sequence[RowCheck], num_rows: int) -> np.ndarray:
    """Rows that break at least one rule."""
    mask = np.zeros(num_rows, dtype=bool)
    for check in checks:
        mask |= check.bad
    return mask


def first_problem(checks: Sequence[RowCheck]) -> tuple[int, RowCheck] | None:
    """The earliest bad row and the first rule it breaks, or None when every row is fine."""
    best: tuple[int, RowCheck] | None = None
    for check in checks:
        hits = np.flatnonzero(check.bad)
        if hits.size and (best is None or hits[0] < best[0]):
            best = (int(hits[0]), check)
    return best


def validate(
    df: pd.DataFrame, *, file: str | None = None, line_numbers: np.ndarray | None = None
) -> pd.DataFrame:
    """The boundary check of a request table: returns it unchanged, or raises for the first bad row.

    `line_numbers[i]` is the 1-based line in `file` that row i came from; without it the row is reported
    as the 1-based position in the table. Also checks that required columns exist and that request_id is
    unique.
    """
    if not isinstance(df, pd.DataFrame):
        raise WorkloadError(f"expected a pandas DataFrame, got {type(df).__name__}", file=file)
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise WorkloadError(
            f"missing column (have: {', '.join(map(str, df.columns))})", file=file, field=missing[0]
        )
    if len(df) == 0:
        raise WorkloadError("no requests (empty table)", file=file)
    problem = first_problem(row_checks(df, block_hash_tokens=df.attrs.get("block_hash_tokens")))
    if problem is not None:
        i, check = problem
        row = int(line_numbers[i]) if line_numbers is not None else i + 1
        raise WorkloadError(check.reason(i), file=file, row=row, field=check.field)
    ids = df["request_id"].to_numpy()
    if len(np.unique(ids)) != len(ids):
        duplicated = np.flatnonzero(pd.Series(ids).duplicated().to_numpy())[0]
        row = int(line_numbers[duplicated]) if line_numbers is not None else int(duplicated) + 1
        raise WorkloadError(f"duplicate request_id {ids[duplicated]}", file=file, row=row, field="request_id")
    return df


def finalize(df: pd.DataFrame) -> pd.DataFrame:
    """Put a request table in canonical form: request_id 0..N-1, int64 token columns, contract column order.

    Why: producers build columns in whatever order and dtype is cheapest; consumers may rely on the
    contract's dtypes (docs/architecture.md). Attributes (`df.attrs`) are kept.
    """
    attrs = dict(df.attrs)
    columns: dict[str, object] = {"request_id": np.arange(len(df), dtype=np.int64)}
    columns["arrival_s"] = df["arrival_s"].to_numpy(dtype=np.float64)
    for column in ("prompt_tokens", "output_tokens", "max_tokens", *OPTIONAL_COLUMNS):
        if column not in df.columns:
            continue
        if column == "block_hashes":
            columns[column] = df[column].to_numpy(dtype=object)
        elif column == "think_s":
            columns[column] = df[column].to_numpy(dtype=np.float64)
        else:
            columns[column] = df[column].to_numpy(dtype=np.int64)
    out = pd.DataFrame(columns, copy=False)
    out.attrs.update(attrs)
    out.attrs.setdefault("clipped_requests", 0)
    out.attrs.setdefault("skipped_rows", 0)
    return out
