"""Geometric bisection over the request rate, as a pure function of an `evaluate(rate)` callback.

Why pure: the search's bracket, expansion and tolerance rules are tested without simulating.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.errors import CapacityError

DEFAULT_REL_TOL = 0.05  # bisection stops when hi/lo - 1 <= this
MAX_EXPANSIONS = 8  # times the bracket may be widened (x2 or /2) when an end is on the wrong side


@dataclass(slots=True)
class Probe:
    rate_req_s: float
    ok: bool
    evidence: Any


@dataclass(slots=True)
class RateSearch:
    """Outcome of a bisection: the answer, how it was bracketed and every probe it took."""

    max_rate_req_s: float  # highest rate that passed (0.0 when none did)
    # "converged"; "below_bracket" (even the lowest probe failed); "above_bracket" (the highest probe
    # passed); "at_ceiling" (the ceiling itself passed: the answer is the ceiling, never above it)
    status: str
    initial_bracket: tuple[float, float]
    final_bracket: tuple[float, float]  # (highest pass, lowest fail)
    rel_tol: float
    probes: list[Probe] = field(default_factory=list)


def find_max_rate(
    evaluate: Callable[[float], tuple[bool, Any]],
    *,
    low: float,
    high: float,
    rel_tol: float = DEFAULT_REL_TOL,
    max_expansions: int = MAX_EXPANSIONS,
    ceiling: float = math.inf,
    known: Mapping[float, bool] | None = None,
) -> RateSearch:
    """Largest rate with `evaluate(rate)[0]` true, assuming pass below / fail above a threshold.

    Probes `low` and `high` first; an end on the wrong side is moved (/2 or x2) up to
    `max_expansions` times, but never above `ceiling` (the capacity planner's measured saturation
    throughput: no rate above it is sustainable, whatever a finite run says). Then geometric
    bisection (midpoint sqrt(lo*hi): the answer may lie anywhere across decades) until
    hi/lo - 1 <= rel_tol. The answer is the highest passing probe, so it is never above the true
    threshold of a monotone `evaluate`. `known` holds verdicts already established (rate -> ok), which
    are used instead of evaluating again (a resumed search after a failed confirmation run).
    """
    if not (0.0 < low < high) or not math.isfinite(high):
        raise CapacityError(f"rate bracket must satisfy 0 < low < high (got {low!r}, {high!r})")
    if not (0.0 < rel_tol < 1.0):
        raise CapacityError(f"rate tolerance must be in (0, 1) (got {rel_tol!r})")
    if not ceiling > 0.0:
        raise CapacityError(f"rate ceiling must be > 0 (got {ceiling!r})")
    probes: list[Probe] = []
    verdicts = dict(known or {})

    def probe(rate: float) -> bool:
        if rate in verdicts:
            return verdicts[rate]
        ok, evidence = evaluate(rate)
        probes.append(Probe(rate, bool(ok), evidence))
        verdicts[rate] = bool(ok)
        return bool(ok)

    high = min(high, ceiling)
    if low >= high:  # the whole bracket lay above the ceiling: search below it
        low = high / 2.0
    initial = (low, high)
    lo_ok = probe(low)
    for _ in range(max_expansions):
        if lo_ok:
            break
        high, low = low, low / 2.0
        lo_ok = probe(low)
    if not lo_ok:
        return RateSearch(0.0, "below_bracket", initial, (0.0, low), rel_tol, probes)
    hi_ok = probe(high) if high > low else True
    for _ in range(max_expansions):
        if not hi_ok or high >= ceiling:
            break
        low, high = high, min(high * 2.0, ceiling)
        hi_ok = probe(high)
    if hi_ok:
        status = "at_ceiling" if high >= ceiling else "above_bracket"
        return RateSearch(high, status, initial, (high, math.inf), rel_tol, probes)
    while high / low - 1.0 > rel_tol:
        mid = math.sqrt(low * high)
        if probe(mid):
            low = mid
        else:
            high = mid
    return RateSearch(low, "converged", initial, (low, high), rel_tol, probes)
