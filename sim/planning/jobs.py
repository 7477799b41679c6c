"""Real simulations: one planning job per (allocator, max_model_len, tensor_parallel_size).

Why jobs: each line of a plan is independent and picklable, so the executors of sim.sweeps run them
in parallel processes or on Dask.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.planning.search import DEFAULT_REL_TOL, RateSearch, find_max_rate
from sim.planning.slo import DEFAULT_QUEUE_SLOPE_TOLERANCE, MIN_SPAN_LIFETIMES, Slo, judge_run, metric_value

SATURATION_BRACKET_HIGH = 1.25  # bracket high = this x the saturation run's request throughput
BRACKET_RATIO = 64.0  # bracket low = high / this
MAX_SATURATION_DOUBLINGS = 3  # more prompts when a saturation run's peak was capped by num_prompts
SATURATION_PROMPTS_CAP = 50_000
PROBE_PROMPTS_CAP = 20_000  # a probe too short to judge is lengthened up to this many prompts
MAX_PROBE_EXTENSIONS = 3


@dataclass(frozen=True, slots=True)
class PlanJob:
    """One independent line of the plan; picklable so that jobs run in parallel processes."""

    allocator: str
    max_model_len: int
    tensor_parallel_size: int
    scenario: Any  # sim.scenario.scenario.Scenario with allocator/max_model_len/TP applied
    slo: Slo
    rel_tol: float
    rate_bracket: tuple[float, float] | None
    queue_slope_tolerance: float
    find_rate: bool


def _sim_record(scenario: Any, run: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    metrics = run.summary["metrics"]
    record = {
        "request_rate": scenario.workload.request_rate,
        "seed": scenario.seed,
        "num_prompts": int(metrics.get("num_requests", len(run.requests))),
        "max_num_seqs": scenario.max_num_seqs,
        # for the cost per token (sim/planning/money.py)
        "request_throughput": float(metrics.get("request_throughput", 0.0)),
        "output_throughput": float(metrics.get("output_throughput", 0.0)),
    }
    record.update(extra)
    return record


def sustained_concurrency(steps: Any) -> float:
    """Time-weighted mean of running sequences over the steps during which requests were waiting.

    In a saturation run that is the concurrency KV memory sustains once sequences grow to their real
    lengths (a paged allocator admits on the prompt alone, so its momentary peak overstates it).
    """
    if len(steps) == 0:
        return 0.0
    waiting = steps[steps["queue_length"] > 0]
    if len(waiting) == 0:  # nobody ever waited: every request ran at once
        waiting = steps
    weights = waiting["duration_s"].to_numpy(dtype=np.float64)
    running = waiting["num_running"].to_numpy(dtype=np.float64)
    total_s = float(weights.sum())
    return float(running.mean()) if total_s <= 0 else float((running * weights).sum() / total_s)


def _saturation(job: PlanJob) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Peak concurrency with every request arriving at t=0 and max_num_seqs lifted out of the way."""
    from sim.api import simulate

    base_prompts = int(job.scenario.num_prompts or 1000)
    prompts = base_prompts
    records: list[dict[str, Any]] = []
    for _ in range(MAX_SATURATION_DOUBLINGS + 1):
        scenario = job.scenario.with_overrides(
            **{"workload.request_rate": math.inf, "num_prompts": prompts, "max_num_seqs": prompts}
        )
        run = simulate(scenario)
        metrics = run.summary["metrics"]
        peak = int(metrics.get("max_concurrency", 0))
        sustained = sustained_concurrency(run.steps)
        records.append(
            _sim_record(
                scenario,
                run,
                {
                    "purpose": "saturation",
                    "max_concurrency": peak,
                    "sustained_concurrency": sustained,
                    "mean_concurrency": metric_value(metrics, "mean_concurrency"),
                    "request_throughput": metric_value(metrics, "request_throughput"),
                    "rejected": int(metrics.get("rejected", 0)),
                },
            )
        )
        if peak < prompts or prompts >= SATURATION_PROMPTS_CAP:
            break
        prompts = min(prompts * 2, SATURATION_PROMPTS_CAP)
    limited_by = "memory" if peak < prompts else "num_prompts"
    result = {
        "max_concurrency": peak,
        "sustained_concurrency": sustained,
        "concurrency_limited_by": limited_by,
        "saturation_throughput_req_s": records[-1]["request_throughput"],
    }
    return result, records


def probe_rate(
    scenario: Any,
    rate_req_s: float,
    slo: Slo | None,
    queue_slope_tolerance: float = DEFAULT_QUEUE_SLOPE_TOLERANCE,
) -> tuple[bool, list[dict[str, Any]]]:
    """Simulate `scenario` at `rate_req_s` and judge it (`judge_run`); the verdict and every run's record.

    A passing run too short to judge is rerun at the same rate with more prompts (up to
    MAX_PROBE_EXTENSIONS times, PROBE_PROMPTS_CAP prompts); the last run's verdict counts.
    """
    from sim.api import simulate

    base_prompts = int(scenario.num_prompts or 0)
    records: list[dict[str, Any]] = []
    prompts = base_prompts
    ok = False
    for _ in range(MAX_PROBE_EXTENSIONS + 1):
        overrides: dict[str, Any] = {"workload.request_rate": rate_req_s}
        if prompts:
            overrides["num_prompts"] = prompts
        probe_scenario = scenario.with_overrides(**overrides)
        run = simulate(probe_scenario)
        ok, evidence = judge_run(run, rate_req_s, slo, queue_slope_tolerance)
        records.append(_sim_record(probe_scenario, run, {"purpose": "rate probe", **evidence}))
        if not evidence["too_short"] or not prompts or prompts >= PROBE_PROMPTS_CAP:
            break
        needed = MIN_SPAN_LIFETIMES * evidence["mean_e2el_s"] / max(evidence["arrival_span_s"], 1e-9)
        prompts = min(PROBE_PROMPTS_CAP, math.ceil(prompts * needed * 1.25))
    return ok, records


def max_stable_rate(
    scenario: Any,
    *,
    low: float,
    high: float,
    slo: Slo | None = None,
    rel_tol: float = DEFAULT_REL_TOL,
    queue_slope_tolerance: float = DEFAULT_QUEUE_SLOPE_TOLERANCE,
) -> RateSearch:
    """The bisection `kvsim capacity` runs for one row, in this process, for notebooks and scripts.

    With `slo=None` it answers "at which rate does the queue start to grow": the highest rate whose
    queue is stable is `max_rate_req_s`, the lowest one seen growing is `final_bracket[1]`. Each
    probe's evidence is the list of its runs' records (as in the plan's `max_rate_runs`).
    """
    return find_max_rate(
        lambda rate: probe_rate(scenario, rate, slo, queue_slope_tolerance),
        low=low,
        high=high,
        rel_tol=rel_tol,
    )


def plan_one(job: PlanJob) -> dict[str, Any]:
    """Saturation run, then (if asked) bisection over the rate: one row of the plan, with its runs."""
    scenario = job.scenario
    capacity_tokens = int(scenario.kv_capacity_tokens())
    row: dict[str, Any] = {
        "allocator": job.allocator,
        "max_model_len": job.max_model_len,
        "tensor_parallel_size": job.tensor_parallel_size,
        "kv_capacity_tokens": capacity_tokens,
        "vllm_max_concurrency_x": float(scenario.max_concurrency()),
    }
    saturation, records = _saturation(job)
    row.update(saturation)
    row["max_concurrency_runs"] = records
    row["vllm_max_concurrency_runs"] = []  # computed from the scenario's KV budget, no simulation
    if not job.find_rate:
        return row

    if job.rate_bracket is not None:
        low, high = job.rate_bracket
    else:
        throughput = saturation["saturation_throughput_req_s"] or 0.0
        high = SATURATION_BRACKET_HIGH * throughput if throughput > 0 else 1.0
        low = high / BRACKET_RATIO
    search = max_stable_rate(
        scenario,
        low=low,
        high=high,
        slo=job.slo,
        rel_tol=job.rel_tol,
        queue_slope_tolerance=job.queue_slope_tolerance,
    )
    row.update(
        {
            "max_rate_req_s": search.max_rate_req_s,
            "rate_status": search.status,
            "rate_bracket": list(search.initial_bracket),
            "rate_final_bracket": list(search.final_bracket),
            "rate_rel_tol": search.rel_tol,
            "max_rate_runs": [record for probe in search.probes for record in probe.evidence],
        }
    )
    return row
