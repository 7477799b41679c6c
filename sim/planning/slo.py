"""The SLO and the stability rule a capacity run is judged by (docs/capacity.md "Stability").

Why its own module: one rule decides whether a rate is sustainable; the search, the jobs and the
report all apply the same one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.errors import CapacityError

DEFAULT_QUEUE_SLOPE_TOLERANCE = 0.05  # stable iff the queue grows by <= this fraction of the arrival rate
MIN_SPAN_LIFETIMES = 4.0  # a probe's arrivals must span this many mean request latencies
SLOPE_GRID_POINTS = 512  # the in-system count is sampled at this many evenly spaced instants of the window


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency bounds a run must meet; None means the bound is not asked for."""

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    normalized_latency_s_per_token: float | None = None  # bound on the mean, as in the vLLM paper

    def __post_init__(self) -> None:
        for name in ("ttft_p99_s", "tpot_p99_s", "normalized_latency_s_per_token"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise CapacityError(f"SLO {name} must be a finite number > 0 (got {value!r})")
        if (
            self.ttft_p99_s is None
            and self.tpot_p99_s is None
            and self.normalized_latency_s_per_token is None
        ):
            raise CapacityError(
                "give an SLO: --slo-ttft-p99 and/or --slo-tpot-p99, or --slo-normalized-latency"
            )

    def describe(self) -> str:
        parts = []
        if self.ttft_p99_s is not None:
            parts.append(f"p99 TTFT <= {self.ttft_p99_s * 1e3:g} ms")
        if self.tpot_p99_s is not None:
            parts.append(f"p99 TPOT <= {self.tpot_p99_s * 1e3:g} ms")
        if self.normalized_latency_s_per_token is not None:
            parts.append(f"mean normalized latency <= {self.normalized_latency_s_per_token:g} s/token")
        return " and ".join(parts)


def queue_slope_req_s(steps: Any, start_s: float, end_s: float) -> float:
    """Least-squares slope of the waiting queue (requests/s) over steps with start_s <= time_s <= end_s.

    Each step row is weighted by its duration (a multi-iteration row stands for that long). A server
    that keeps up holds the queue level (mostly empty); one that cannot grows it by (arrival rate -
    admission rate) per second. A fit over the whole window, not two end points, keeps the noise of a
    short run from deciding the verdict.
    """
    if len(steps) == 0 or end_s <= start_s:
        return 0.0
    window = steps[(steps["time_s"] >= start_s) & (steps["time_s"] <= end_s)]
    if len(window) < 2:
        return 0.0
    time_s = window["time_s"].to_numpy(dtype=np.float64)
    queue = window["queue_length"].to_numpy(dtype=np.float64)
    weights = np.maximum(window["duration_s"].to_numpy(dtype=np.float64), 1e-12)
    mean_t = np.average(time_s, weights=weights)
    mean_q = np.average(queue, weights=weights)
    spread = float(np.sum(weights * (time_s - mean_t) ** 2))
    if spread <= 0.0:
        return 0.0
    return float(np.sum(weights * (time_s - mean_t) * (queue - mean_q)) / spread)


def in_system_slope_req_s(requests: Any, start_s: float, end_s: float) -> float:
    """Least-squares slope (req/s) of the requests in the system (arrived, unfinished) in [start_s, end_s].

    Why besides the waiting queue: with a large `max_num_seqs` (vLLM v1: 1024 on an H100) an overloaded
    server first hides its backlog in the running batch, which keeps growing while the waiting queue
    stays empty (issue 20: probes marked stable grew by 5-10 req/s). Arrived-minus-finished counts both.
    Computed from the request table (exact arrival and finish times), sampled on an even grid of
    SLOPE_GRID_POINTS instants, so it does not depend on which step rows the metrics kept.
    """
    if len(requests) == 0 or end_s <= start_s:
        return 0.0
    arrival_s = np.sort(requests["arrival_s"].to_numpy(dtype=np.float64))
    finish_s = requests["finish_s"].to_numpy(dtype=np.float64)
    finish_s = np.sort(np.where(np.isfinite(finish_s), finish_s, np.inf))
    grid_s = np.linspace(start_s, end_s, SLOPE_GRID_POINTS)
    in_system = np.searchsorted(arrival_s, grid_s, side="right") - np.searchsorted(
        finish_s, grid_s, side="right"
    )
    centred_s = grid_s - grid_s.mean()
    return float(np.dot(centred_s, in_system - in_system.mean()) / np.dot(centred_s, centred_s))


def judge_run(
    run: Any,
    rate_req_s: float,
    slo: Slo | None,
    queue_slope_tolerance: float = DEFAULT_QUEUE_SLOPE_TOLERANCE,
) -> tuple[bool, dict[str, Any]]:
    """Is this rate sustainable? (SLO holds) and (no request rejected) and (queue and batch are stable).

    `slo=None` judges stability alone (no rejection, stable queue, long enough): the question "at
    which rate does the queue start to grow", with exactly the rule `kvsim capacity` applies.

    Stable: the waiting queue's fitted slope over the second half of the arrivals (T/2 to T, T the
    arrival span; `queue_slope_req_s`) is at most `queue_slope_tolerance` x the arrival rate, and so
    is the slope of everything in the system, waiting or running (`in_system_slope_req_s`). A run
    can only show that when its arrivals span at least MIN_SPAN_LIFETIMES mean request latencies
    (the second half then starts after the warm-up); a shorter passing run is judged "too short"
    (`evidence["too_short"]`) and the caller reruns it with more prompts.
    Returns the verdict and the evidence it was judged on.
    """
    metrics = run.summary["metrics"]
    arrival_s = run.requests["arrival_s"].to_numpy(dtype=np.float64)
    first_arrival_s = float(arrival_s.min()) if arrival_s.size else 0.0
    last_arrival_s = float(arrival_s.max()) - first_arrival_s if arrival_s.size else 0.0
    window_s = (first_arrival_s + last_arrival_s / 2.0, first_arrival_s + last_arrival_s)
    slope = queue_slope_req_s(run.steps, *window_s)
    system_slope = in_system_slope_req_s(run.requests, *window_s)
    mean_e2el_s = (metric_value(metrics, "mean_e2el_ms") or 0.0) / 1e3
    evidence: dict[str, Any] = {
        "rate_req_s": rate_req_s,
        "arrival_span_s": last_arrival_s,
        "mean_e2el_s": mean_e2el_s,
        "p99_ttft_ms": metric_value(metrics, "p99_ttft_ms"),
        "p99_tpot_ms": metric_value(metrics, "p99_tpot_ms"),
        "mean_normalized_latency_s_per_token": metric_value(metrics, "mean_normalized_latency_s_per_token"),
        "queue_slope_req_s": slope,
        "in_system_slope_req_s": system_slope,
        "queue_growth": metric_value(metrics, "queue_growth"),
        "completed": int(metrics.get("completed", 0)),
        "rejected": int(metrics.get("rejected", 0)),
        "request_throughput": metric_value(metrics, "request_throughput"),
    }
    reasons = []
    if evidence["rejected"]:
        reasons.append(f"{evidence['rejected']} request(s) rejected")
    if slope > queue_slope_tolerance * rate_req_s:
        reasons.append(f"queue grows {slope:.3g} req/s > {queue_slope_tolerance:g} x rate")
    batch_grows = slope <= queue_slope_tolerance * rate_req_s < system_slope
    checks = (
        ()
        if slo is None
        else (
            (slo.ttft_p99_s, "p99_ttft_ms", 1e3, "p99 TTFT"),
            (slo.tpot_p99_s, "p99_tpot_ms", 1e3, "p99 TPOT"),
            (
                slo.normalized_latency_s_per_token,
                "mean_normalized_latency_s_per_token",
                1.0,
                "normalized latency",
            ),
        )
    )
    for bound, key, scale, label in checks:
        if bound is None:
            continue
        value = evidence[key]
        if value is None or not math.isfinite(value) or value > bound * scale:
            shown = "n/a" if value is None else f"{value:.4g}"
            reasons.append(f"{label} {shown} > {bound * scale:g}")
    # Not settled yet, so a longer run must decide (`too_short`, the caller reruns with more prompts):
    # a run shorter than a few request lifetimes is a burst the server absorbs, not a steady state;
    # and a batch that still grows may be filling towards a level it holds (near saturation that
    # takes many lifetimes) or may never stop. Either way the verdict is "fail" until a longer run
    # shows the SLO met with a stationary batch.
    short = last_arrival_s < MIN_SPAN_LIFETIMES * mean_e2el_s
    evidence["too_short"] = not reasons and (short or batch_grows)
    if batch_grows:
        reasons.append(
            f"running batch grows: {system_slope:.3g} req/s more in the system > "
            f"{queue_slope_tolerance:g} x rate"
        )
    if short and not reasons:
        reasons.append(
            f"too short to judge: arrivals span {last_arrival_s:.3g} s < {MIN_SPAN_LIFETIMES:g} x mean "
            f"latency {mean_e2el_s:.3g} s"
        )
    evidence["ok"] = not reasons
    evidence["reason"] = (
        "; ".join(reasons) if reasons else ("SLO met, " if slo else "") + "queue and batch stable"
    )
    return not reasons, evidence


def metric_value(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return None if value is None else float(value)
