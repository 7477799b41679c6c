"""Which clock a request table's arrivals follow, said in one line before a run starts.

Why: a trace replayed at some other rate, or cut to its first rows, gives a different answer (issue
20 §3: a 1,200-row trace silently cut to 1,000 rows and replayed at twice its rate showed 1,319
preemptions instead of none). `load()` records in `df.attrs["clock"]` what it did -- the trace's own
timestamps, a rescale to a given mean rate, a preset's documented rate -- and how many rows it kept;
the CLI prints the record's `line`, and `summary.json` keeps the whole record under "workload".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

# attrs["clock"]["kind"] values, one per way `load()` decides arrival times.
TRACE_TIMESTAMPS = "trace-timestamps"  # a file's (or a DataFrame's) own arrival_s, shifted to start at 0
TRACE_RESCALED = "trace-rescaled"  # the same rows, stretched to a given mean rate (request_rate)
TRACE_TIME_SCALED = "trace-time-scaled"  # the same rows, every time multiplied by time_scale
DRAWN_ARRIVALS = "drawn-arrivals"  # a length-only file: arrivals drawn from an arrival process
PRESET_RATE = "preset-rate"  # a preset at its documented rate
GIVEN_RATE = "given-rate"  # a preset at the caller's request_rate
ARRIVAL_RATE = "arrival-rate"  # a preset whose `arrival` spec names its own rate
CLOSED_LOOP = "closed-loop"  # closed(users, think_s): the engine releases requests
SESSION_LOOP = (
    "session-loop"  # a trace's sessions: first turns on the trace's clock, later ones after think_s
)


def mean_rate_req_s(arrival_s: np.ndarray) -> float:
    """(N - 1) / span, the mean rate `describe()` reports; inf when every request arrives at once."""
    if len(arrival_s) < 2:
        return math.inf
    span_s = float(arrival_s[-1]) - float(arrival_s[0])
    return math.inf if span_s <= 0 else (len(arrival_s) - 1) / span_s


def rate_text(rate_req_s: float) -> str:
    """A rate for the one line: "3.87 req/s", "0.0042 req/s", or "all at 0 s" for inf."""
    if math.isinf(rate_req_s):
        return "all at 0 s"
    return f"{rate_req_s:.2f} req/s" if rate_req_s >= 0.1 else f"{rate_req_s:.2g} req/s"


def _rows_text(kept: int, total: int, num_prompts: int | None, duration_s: float | None) -> str:
    if kept == total:
        return f"{kept:,} rows"
    if num_prompts is not None and kept == min(num_prompts, total):
        return f"the first {kept:,} of {total:,} rows"
    return f"{kept:,} of {total:,} rows (those arriving within {duration_s:g} s)"


def record(kind: str, line: str, df: pd.DataFrame, **extra: Any) -> dict[str, Any]:
    """The attrs["clock"] record: kind, requests kept, their mean rate, the printed line, and extras."""
    rate = mean_rate_req_s(df["arrival_s"].to_numpy()) if kind != CLOSED_LOOP else None
    return {"kind": kind, "requests": len(df), "mean_rate_req_s": rate, **extra, "line": line}


def trace_clock(
    df: pd.DataFrame,
    *,
    total_rows: int,
    own_rate_req_s: float,
    num_prompts: int | None,
    duration_s: float | None,
    request_rate: float | None,
    time_scale: float,
) -> dict[str, Any]:
    """The clock of rows replayed from a file or a DataFrame that carries its own `arrival_s`.

    `own_rate_req_s` is the mean rate of the kept rows on their own timestamps (before any rescale).
    """
    rows = _rows_text(len(df), total_rows, num_prompts, duration_s)
    if "think_s" in df.columns:
        return session_clock(df, rows, request_rate, time_scale, total_rows)
    rate = mean_rate_req_s(df["arrival_s"].to_numpy())
    own = f"their own mean: {rate_text(own_rate_req_s)}"
    if request_rate is not None:
        kind = TRACE_RESCALED
        line = f"replaying {rows} rescaled to a mean {rate_text(request_rate)} (request_rate; {own})"
    elif time_scale != 1.0:
        kind = TRACE_TIME_SCALED
        line = f"replaying {rows} at their own timestamps x {time_scale:g} (mean {rate_text(rate)}; {own})"
    else:
        kind = TRACE_TIMESTAMPS
        line = f"replaying {rows} at their own timestamps (mean {rate_text(rate)})"
    return record(kind, line, df, source_rows=total_rows, own_mean_rate_req_s=own_rate_req_s)


def session_clock(
    df: pd.DataFrame, rows: str, request_rate: float | None, time_scale: float, total_rows: int
) -> dict[str, Any]:
    """Rows with `think_s`: a closed loop per session (sim/core/arrivals.py); only first turns keep a time."""
    sessions = df["session_id"].to_numpy()
    first = ~pd.Series(sessions).duplicated().to_numpy() | (sessions < 0)
    starts = mean_rate_req_s(df["arrival_s"].to_numpy()[first])
    how = "at their own timestamps"
    if request_rate is not None:
        how = f"on timestamps rescaled to a mean {rate_text(request_rate)} over all rows (request_rate)"
    elif time_scale != 1.0:
        how = f"at their own timestamps x {time_scale:g}"
    count = len(np.unique(sessions[sessions >= 0]))
    line = (
        f"replaying {rows} as {count:,} sessions in a closed loop: first turns {how} "
        f"(mean {rate_text(starts)}), each later turn its think_s after the previous answer"
    )
    return record(
        SESSION_LOOP, line, df, source_rows=total_rows, sessions=count, first_turn_rate_req_s=starts
    )


def drawn_clock(df: pd.DataFrame, *, total_rows: int, arrival: str) -> dict[str, Any]:
    """The clock of a length-only file: its rows' lengths, arrivals drawn from `arrival`."""
    rows = _rows_text(len(df), total_rows, len(df), None)
    if "closed_loop" in df.attrs:
        return closed_clock(df, f"replaying the lengths of {rows} (no timestamps)")
    line = f"replaying the lengths of {rows} (no timestamps) with {arrival} arrivals"
    return record(DRAWN_ARRIVALS, line, df, source_rows=total_rows, arrival=arrival)


def preset_clock(
    df: pd.DataFrame,
    *,
    name: str,
    kind: str,
    arrival: str,
    documented_rate_req_s: float | None,
    time_scale: float = 1.0,
) -> dict[str, Any]:
    """The clock of a generated preset: its arrival process and where the rate came from."""
    what = f"generating {len(df):,} {name} requests"
    if "closed_loop" in df.attrs:
        return closed_clock(df, what)
    origin = {
        PRESET_RATE: "the preset's documented rate",
        GIVEN_RATE: "request_rate",
        ARRIVAL_RATE: "the arrival's own rate",
    }[kind]
    if kind == GIVEN_RATE and documented_rate_req_s is not None:
        origin += f"; the preset documents {rate_text(documented_rate_req_s)}"
    scaled = "" if time_scale == 1.0 else f", times x {time_scale:g}"
    line = f"{what} with {arrival} arrivals ({origin}{scaled})"
    return record(kind, line, df, arrival=arrival, documented_rate_req_s=documented_rate_req_s)


def closed_clock(df: pd.DataFrame, what: str) -> dict[str, Any]:
    """The clock of a closed loop: no arrival times, the engine releases each user's next request."""
    loop = df.attrs["closed_loop"]
    line = f"{what} in a closed loop ({loop['users']} users, {loop['think_s']:g} s think time)"
    return record(CLOSED_LOOP, line, df)
