"""The report's diagnosis: the patterns a production engineer would name, computed from the data.

Why rules with stated thresholds: a sentence like "the limit was allocation shape, not capacity" is
only worth printing when the numbers say so, and the reader must be able to check it. Each rule
below reads one run's tables and summary, compares what it measured with a named threshold (the
THRESHOLDS constants), and returns a Statement only when the threshold is crossed; the statement
carries the threshold in words so the report can print it next to the claim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sim.core.metrics import backlog_growth_req_per_s

if TYPE_CHECKING:
    from sim.reports.types import RunLike


@dataclass(frozen=True)
class Statement:
    """One diagnosis line: which run (or runs) it is about, what the data shows, and the bar it cleared."""

    kind: str
    label: str
    text: str  # the whole claim, readable on its own (notebooks print it)
    threshold: str
    detail: str = ""  # only this run's numbers: the report lists it under the finding's headline


@dataclass(frozen=True)
class Thresholds:
    """The bars each statement must clear. Percentages are of KV capacity unless named otherwise."""

    queue_min_requests: int = 10  # "the queue grew": its peak reached this many waiting requests
    external_pct: float = 10.0  # free-but-unusable share while requests waited
    reserved_unused_pct: float = 25.0  # reserved-without-tokens share while requests waited
    max_model_len_tolerance: float = 0.15  # concurrency while waiting within ±15 % of capacity/max_model_len
    actual_fit_factor: float = 2.0  # actual lengths would have fitted this many times more sequences
    duplicated_pct: float = 5.0
    waste_pct: float = 50.0  # of allocated KV
    queue_growth_req_per_s: float = 0.1
    preemption_share_pct: float = 5.0  # preemptions per request
    concurrency_ratio: float = 1.5  # cross-allocator comparison


THRESHOLDS = Thresholds()

NOTHING_TO_REPORT = (
    "No pattern crossed its threshold (queue growth, external fragmentation, unused reservations, "
    "max_model_len-bound concurrency, duplication, waste, preemptions, rejections)."
)


def step_hold_s(steps: pd.DataFrame) -> np.ndarray:
    """How long each recorded row's values held: until the next recorded row (its own duration last).

    Why not `duration_s`: long runs keep a uniform sample of steps (every k-th row), so a row stands
    for the time up to the next kept row; for an unthinned table both are the same.
    """
    time_s = steps["time_s"].to_numpy(dtype=float)
    if len(time_s) == 0:
        return np.zeros(0)
    last_s = float(steps["duration_s"].iloc[-1])
    return np.maximum(np.diff(time_s, append=time_s[-1] + last_s), 0.0)


def _waiting_mean(steps: pd.DataFrame, values: np.ndarray) -> float:
    """Time-weighted mean of per-row `values` over the rows during which at least one request
    waited; NaN when nobody ever waited."""
    waiting = steps["queue_length"].to_numpy() > 0
    if not waiting.any():
        return math.nan
    weights = step_hold_s(steps) * waiting
    if weights.sum() <= 0:
        weights = waiting.astype(float)
    return float(np.average(values, weights=weights))


def _waiting_mean_pct(steps: pd.DataFrame, parts: list[str]) -> float:
    """Time-weighted share of the taxonomy `parts` (summed), in % of capacity, while requests waited."""
    capacity = np.maximum(steps["capacity"].to_numpy(dtype=float), 1.0)
    return 100.0 * _waiting_mean(steps, steps[parts].to_numpy(dtype=float).sum(axis=1) / capacity)


def _max_queue(run: RunLike) -> int:
    return int(run.summary["metrics"]["max_queue_length"])


def shape_not_capacity(label: str, run: RunLike, t: Thresholds) -> Statement | None:
    """Requests waited while a large share of memory was free in holes too small for them."""
    max_queue = _max_queue(run)
    external_pct = _waiting_mean_pct(run.steps, ["external"])
    if max_queue < t.queue_min_requests or not external_pct >= t.external_pct:
        return None
    return Statement(
        "shape_not_capacity",
        label,
        f"the queue grew to {max_queue} while {external_pct:.0f} % of KV memory was free but unusable for "
        "the next request, so the limit was allocation shape, not capacity",
        f"peak queue ≥ {t.queue_min_requests} and external fragmentation ≥ {t.external_pct:g} % of capacity, "
        "time-averaged while requests waited",
        detail=f"queue peaked at {max_queue}; {external_pct:.0f} % of KV memory free but too fragmented "
        "for the next request",
    )


def reserved_but_unused(label: str, run: RunLike, t: Thresholds) -> Statement | None:
    """Requests waited while memory sat reserved for tokens not (or never) generated."""
    max_queue = _max_queue(run)
    unused_pct = _waiting_mean_pct(run.steps, ["reservation", "internal"])
    if max_queue < t.queue_min_requests or not unused_pct >= t.reserved_unused_pct:
        return None
    internal_pct = _waiting_mean_pct(run.steps, ["internal"])
    return Statement(
        "reserved_but_unused",
        label,
        f"the queue grew to {max_queue} while {unused_pct:.0f} % of KV memory was reserved but held no "
        f"token ({internal_pct:.0f} % for tokens never generated), so requests waited on reservations, "
        "not on token states",
        f"peak queue ≥ {t.queue_min_requests} and reservation + internal ≥ {t.reserved_unused_pct:g} % of "
        "capacity, time-averaged while requests waited",
        detail=f"queue peaked at {max_queue}; {unused_pct:.0f} % of KV memory reserved without a token "
        f"({internal_pct:.0f} % for tokens never generated)",
    )


def concurrency_tracked_max_model_len(label: str, run: RunLike, t: Thresholds) -> Statement | None:
    """While requests waited, concurrency sat at capacity / max_model_len although actual lengths were
    far shorter: the allocator admitted by the worst case, not by what the requests needed."""
    max_model_len = (run.summary.get("scenario") or {}).get("max_model_len")
    metrics = run.summary["metrics"]
    capacity_tokens = float(metrics["kv_capacity_tokens"])
    max_queue = _max_queue(run)
    if not max_model_len or max_queue < t.queue_min_requests:
        return None
    requests = run.requests
    served = requests[~requests["rejected"].astype(bool)]
    if served.empty:
        return None
    mean_length_tokens = float((served["prompt_tokens"] + served["generated_tokens"]).mean())
    bound = math.floor(capacity_tokens / float(max_model_len))
    waiting_concurrency = _waiting_mean(run.steps, run.steps["num_running"].to_numpy(dtype=float))
    would_fit = capacity_tokens / max(mean_length_tokens, 1.0)
    near_bound = abs(waiting_concurrency - bound) <= t.max_model_len_tolerance * bound
    if bound < 1 or not near_bound or would_fit < t.actual_fit_factor * waiting_concurrency:
        return None
    return Statement(
        "concurrency_tracked_max_model_len",
        label,
        f"admitted concurrency tracked max_model_len, not actual output lengths: while up to {max_queue} "
        f"requests waited it averaged {waiting_concurrency:.1f} ≈ KV capacity / max_model_len = "
        f"{capacity_tokens:.0f} / {int(max_model_len)} = {bound}, although requests averaged "
        f"{mean_length_tokens:.0f} tokens, room for about {would_fit:.0f}",
        f"peak queue ≥ {t.queue_min_requests}, concurrency while requests waited within "
        f"±{100 * t.max_model_len_tolerance:g} % of capacity / max_model_len, and actual lengths would fit "
        f"≥ {t.actual_fit_factor:g}× more sequences",
        detail=f"while up to {max_queue} requests waited, concurrency averaged {waiting_concurrency:.1f} ≈ "
        f"{capacity_tokens:.0f} / {int(max_model_len)} = {bound}; requests averaged "
        f"{mean_length_tokens:.0f} tokens, room for about {would_fit:.0f}",
    )


def duplication(label: str, run: RunLike, t: Thresholds) -> Statement | None:
    """A noticeable share of memory held second copies of identical prefixes."""
    duplicated_pct = float(run.summary["metrics"]["kv_duplicated_pct"])
    if not duplicated_pct >= t.duplicated_pct:
        return None
    return Statement(
        "duplication",
        label,
        f"{duplicated_pct:.1f} % of KV memory held second copies of shared prefixes; sharing them "
        "(paged blocks with prefix caching) would free that memory",
        f"duplicated ≥ {t.duplicated_pct:g} % of capacity, time-averaged",
        detail=f"{duplicated_pct:.1f} % of KV memory; sharing the prefixes (paged blocks with prefix "
        "caching) would free it",
    )


def high_waste(label: str, run: RunLike, t: Thresholds) -> Statement | None:
    """Most of the allocated memory held no token state."""
    waste_pct = float(run.summary["metrics"]["waste_pct"])
    if not waste_pct >= t.waste_pct:
        return None
    return Statement(
        "high_waste",
        label,
        f"{waste_pct:.0f} % of the allocated KV memory held no token state",
        f"waste ≥ {t.waste_pct:g} % of allocated KV, time-averaged",
        detail=f"waste {waste_pct:.0f} % of allocated KV",
    )


def queue_growth(label: str, run: RunLike, t: Thresholds) -> Statement | None:
    """The backlog kept growing while requests arrived: arrivals outpaced what the server served."""
    growth = backlog_growth_req_per_s(run.requests)
    if not growth >= t.queue_growth_req_per_s or _max_queue(run) < t.queue_min_requests:
        return None
    return Statement(
        "queue_growth",
        label,
        f"requests in the system grew by {growth:.2f}/s over the second half of the arrivals and the "
        f"queue peaked at {_max_queue(run)}: arrivals outpaced service at this request rate",
        f"backlog growth ≥ {t.queue_growth_req_per_s:g} requests/s over the second half of the arrivals "
        f"and peak queue ≥ {t.queue_min_requests}",
        detail=f"requests in the system grew by {growth:.2f}/s over the second half of the arrivals; "
        f"queue peaked at {_max_queue(run)}",
    )


def preemptions(label: str, run: RunLike, t: Thresholds) -> Statement | None:
    """Memory ran out mid-decode often enough to cost recomputation or swapping."""
    metrics = run.summary["metrics"]
    count, total = float(metrics["preemptions"]), max(float(metrics["num_requests"]), 1.0)
    share_pct = 100.0 * count / total
    if not share_pct >= t.preemption_share_pct:
        return None
    return Statement(
        "preemptions",
        label,
        f"memory ran out mid-decode {count:.0f} times ({share_pct:.0f} per 100 requests), so sequences "
        "were preempted and their work redone",
        f"preemptions ≥ {t.preemption_share_pct:g} per 100 requests",
        detail=f"{count:.0f} preemptions ({share_pct:.0f} per 100 requests)",
    )


def rejections(label: str, run: RunLike, t: Thresholds) -> Statement | None:
    """Some requests could never be served (e.g. longer than the KV capacity or max_model_len)."""
    count = float(run.summary["metrics"]["rejected"])
    if count < 1:
        return None
    return Statement(
        "rejections",
        label,
        f"{count:.0f} request(s) were rejected outright and never served",
        "at least 1 rejection",
        detail=f"{count:.0f} request(s) rejected",
    )


RunRule = Callable[[str, "RunLike", Thresholds], "Statement | None"]
RUN_RULES: tuple[RunRule, ...] = (
    shape_not_capacity,
    reserved_but_unused,
    concurrency_tracked_max_model_len,
    queue_growth,
    duplication,
    high_waste,
    preemptions,
    rejections,
)


def _workload_key(run: RunLike) -> tuple[str, ...]:
    """What must match for two runs to be compared head to head: model, GPU and workload."""
    scenario = run.summary.get("scenario") or {}
    workload = scenario.get("workload") or {}
    return tuple(
        str(v)
        for v in (
            scenario.get("model"),
            scenario.get("gpu"),
            workload.get("source"),
            workload.get("request_rate"),
            scenario.get("num_prompts"),
            scenario.get("seed"),
        )
    )


def concurrency_comparison(runs: Mapping[str, RunLike], t: Thresholds) -> list[Statement]:
    """Across runs of the same workload: how many times more sequences the best allocator kept running."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for label, run in runs.items():
        groups.setdefault(_workload_key(run), []).append(label)
    statements = []
    for labels in groups.values():
        if len(labels) < 2:
            continue
        concurrency = {label: float(runs[label].summary["metrics"]["mean_concurrency"]) for label in labels}
        best = max(concurrency, key=concurrency.__getitem__)
        worst = min(concurrency, key=concurrency.__getitem__)
        if concurrency[worst] <= 0 or concurrency[best] / concurrency[worst] < t.concurrency_ratio:
            continue
        statements.append(
            Statement(
                "concurrency_comparison",
                f"{best} vs {worst}",
                f"{best} kept {concurrency[best] / concurrency[worst]:.1f}× as many sequences running as "
                f"{worst} on the same workload "
                f"(mean concurrency {concurrency[best]:.1f} vs {concurrency[worst]:.1f})",
                f"ratio of mean concurrency ≥ {t.concurrency_ratio:g}",
                detail=f"{best} kept {concurrency[best] / concurrency[worst]:.1f}× as many sequences running "
                f"(mean concurrency {concurrency[best]:.1f} vs {concurrency[worst]:.1f})",
            )
        )
    return statements


def diagnose(runs: Mapping[str, RunLike], thresholds: Thresholds = THRESHOLDS) -> list[Statement]:
    """Every statement the data supports: per run in the given order, then comparisons across runs."""
    statements: list[Statement] = []
    for label, run in runs.items():
        for rule in RUN_RULES:
            statement = rule(label, run, thresholds)
            if statement is not None:
                statements.append(statement)
    statements.extend(concurrency_comparison(runs, thresholds))
    return statements


# One headline per kind of finding: the report opens with these, naming the allocators each applies
# to, and lists each allocator's numbers under it (so a claim is not repeated once per allocator).
HEADLINES: dict[str, str] = {
    "shape_not_capacity": "The limit was allocation shape, not capacity",
    "reserved_but_unused": "Requests waited on reservations, not on token states",
    "concurrency_tracked_max_model_len": "Concurrency tracked max_model_len, not actual lengths",
    "queue_growth": "Arrivals outpaced service",
    "duplication": "Shared prefixes were stored twice",
    "high_waste": "Most of the allocated KV memory held no token state",
    "preemptions": "Memory ran out mid-decode: sequences were preempted and redone",
    "rejections": "Requests were rejected outright",
    "concurrency_comparison": "Allocators kept very different numbers of sequences running",
}


@dataclass(frozen=True)
class Finding:
    """Every statement of one kind: a headline, the allocators it applies to, the bar, the details."""

    kind: str
    headline: str
    labels: tuple[str, ...]
    threshold: str
    details: tuple[Statement, ...]


def findings(statements: list[Statement]) -> list[Finding]:
    """Statements grouped by kind, in the order each kind first appears (rule order, then comparisons)."""
    grouped: dict[str, list[Statement]] = {}
    for statement in statements:
        grouped.setdefault(statement.kind, []).append(statement)
    return [
        Finding(
            kind=kind,
            headline=HEADLINES.get(kind, kind.replace("_", " ")),
            labels=tuple(dict.fromkeys(s.label for s in group)),
            threshold=group[0].threshold,
            details=tuple(group),
        )
        for kind, group in grouped.items()
    ]
