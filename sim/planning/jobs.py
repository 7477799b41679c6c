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
from sim.planning.sizing import ProbeSizing
from sim.planning.slo import DEFAULT_QUEUE_SLOPE_TOLERANCE, MIN_SPAN_LIFETIMES, Slo, judge_run, metric_value

BRACKET_RATIO = 2.0  # default bracket: [saturation throughput / this, saturation throughput], widened below
MAX_SATURATION_DOUBLINGS = 3  # more prompts when a saturation run's peak was capped by num_prompts
SATURATION_PROMPTS_CAP = 50_000
PROBE_PROMPTS_CAP = 20_000  # a probe too short to judge is lengthened up to this (or 4x its size) prompts
MAX_PROBE_EXTENSIONS = 3


@dataclass(frozen=True, slots=True)
class PlanJob:
    """One independent line of the plan; picklable so that jobs run in parallel processes."""

    allocator: str
    max_model_len: int
    tensor_parallel_size: int
    scenario: Any  # sim.scenario.scenario.Scenario with allocator/max_model_len/TP applied
    slo: Slo | None  # None: the saturation rate (stationary queue and batch, no latency bound)
    rel_tol: float
    rate_bracket: tuple[float, float] | None
    queue_slope_tolerance: float
    find_rate: bool
    sizing: ProbeSizing = ProbeSizing()
    tally_path: str | None = None  # one byte per simulation (`simulate_counted`), for the progress display


def simulate_counted(scenario: Any, tally_path: str | None) -> Any:
    """`sim.simulate(scenario)`, then one byte appended to `tally_path` (when given).

    Why a file: a plan's rows run in worker processes (or on Dask); the parent's progress display
    reads the file's size to show simulations done while rows are still running. Appends of one
    byte are atomic; a worker that cannot reach the file (a remote Dask worker) just does not count.
    """
    from sim.api import simulate

    run = simulate(scenario)
    if tally_path is not None:
        try:
            with open(tally_path, "ab") as tally:
                tally.write(b".")
        except OSError:
            pass
    return run


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
    prompts = max(int(job.scenario.num_prompts or 0), job.sizing.min_prompts)
    records: list[dict[str, Any]] = []
    for _ in range(MAX_SATURATION_DOUBLINGS + 1):
        scenario = job.scenario.with_overrides(
            **{"workload.request_rate": math.inf, "num_prompts": prompts, "max_num_seqs": prompts}
        )
        run = simulate_counted(scenario, job.tally_path)
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
    }
    return result, records


def saturated_throughput_req_s(requests: Any, full_batch: float) -> float:
    """Completions per second while the server was saturated, in a run where every request arrived at t = 0.

    The window starts once a full batch has finished (the first completions are the shortest requests
    of the first batch, which would overstate the rate) and ends at the last admission (after it the
    batch drains and runs below full). Falls back to completed / duration when the window is empty.
    """
    finish_s = np.sort(requests["finish_s"].to_numpy(dtype=np.float64))
    finish_s = finish_s[np.isfinite(finish_s)]
    if finish_s.size == 0:
        return 0.0
    admitted_s = requests["admitted_s"].to_numpy(dtype=np.float64)
    end_s = float(np.nanmax(admitted_s)) if np.isfinite(admitted_s).any() else 0.0
    first = min(max(int(math.ceil(full_batch)), 1), finish_s.size) - 1
    start_s = float(finish_s[first])
    done = int(np.searchsorted(finish_s, end_s, side="right")) - (first + 1)
    if end_s > start_s and done > 0:
        return done / (end_s - start_s)
    return finish_s.size / max(float(finish_s[-1]), 1e-12)


def _throughput(job: PlanJob, batch_estimate: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The saturation throughput with the scenario's own `max_num_seqs`: no sustainable rate exceeds it.

    Every request arrives at t = 0, enough of them to fill the batch `batch_turnovers` times
    (`batch_estimate`: the smaller of max_num_seqs and the memory peak). Also measures the full
    running batch (concurrency while requests waited), which sizes the rate probes.
    """
    prompts = job.sizing.probe_prompts(job.scenario.num_prompts, batch_estimate)
    scenario = job.scenario.with_overrides(**{"workload.request_rate": math.inf, "num_prompts": prompts})
    run = simulate_counted(scenario, job.tally_path)
    full_batch = sustained_concurrency(run.steps)
    throughput = saturated_throughput_req_s(run.requests, full_batch)
    record = _sim_record(
        scenario,
        run,
        {
            "purpose": "saturation throughput",
            "full_batch": full_batch,
            "saturation_throughput_req_s": throughput,
        },
    )
    return {"saturation_throughput_req_s": throughput, "full_batch": full_batch}, record


def probe_rate(
    scenario: Any,
    rate_req_s: float,
    slo: Slo | None,
    queue_slope_tolerance: float = DEFAULT_QUEUE_SLOPE_TOLERANCE,
    tally_path: str | None = None,
) -> tuple[bool, list[dict[str, Any]]]:
    """Simulate `scenario` at `rate_req_s` and judge it (`judge_run`); the verdict and every run's record.

    A run too short to judge (arrivals over too few lifetimes, or a batch still growing while the
    SLO and the queue hold) is rerun at the same rate with at least twice the prompts (up to
    MAX_PROBE_EXTENSIONS times, max(PROBE_PROMPTS_CAP, 4 x its size) prompts); the last verdict counts.
    """
    base_prompts = int(scenario.num_prompts or 0)
    records: list[dict[str, Any]] = []
    prompts = base_prompts
    ok = False
    for _ in range(MAX_PROBE_EXTENSIONS + 1):
        overrides: dict[str, Any] = {"workload.request_rate": rate_req_s}
        if prompts:
            overrides["num_prompts"] = prompts
        probe_scenario = scenario.with_overrides(**overrides)
        run = simulate_counted(probe_scenario, tally_path)
        ok, evidence = judge_run(run, rate_req_s, slo, queue_slope_tolerance)
        records.append(_sim_record(probe_scenario, run, {"purpose": "rate probe", **evidence}))
        cap = max(PROBE_PROMPTS_CAP, 4 * base_prompts)
        if not evidence["too_short"] or not prompts or prompts >= cap:
            break
        needed = MIN_SPAN_LIFETIMES * evidence["mean_e2el_s"] / max(evidence["arrival_span_s"], 1e-9)
        prompts = min(cap, math.ceil(prompts * max(2.0, needed * 1.25)))
    return ok, records


def max_stable_rate(
    scenario: Any,
    *,
    low: float,
    high: float,
    slo: Slo | None = None,
    rel_tol: float = DEFAULT_REL_TOL,
    queue_slope_tolerance: float = DEFAULT_QUEUE_SLOPE_TOLERANCE,
    ceiling: float = math.inf,
    known: Mapping[float, bool] | None = None,
    tally_path: str | None = None,
) -> RateSearch:
    """The bisection `kvsim capacity` runs for one row (before its confirmation), in this process.

    With `slo=None` it answers "at which rate do the queue or the batch start to grow": the highest
    stable rate is `max_rate_req_s`, the lowest one seen growing is `final_bracket[1]`. Each probe's
    evidence is the list of its runs' records (as in the plan's `max_rate_runs`). `ceiling`: the
    measured saturation throughput, above which nothing is probed (`find_max_rate`).
    """
    return find_max_rate(
        lambda rate: probe_rate(scenario, rate, slo, queue_slope_tolerance, tally_path),
        low=low,
        high=high,
        rel_tol=rel_tol,
        ceiling=ceiling,
        known=known,
    )


def confirm_rate(
    scenario: Any,
    rate_req_s: float,
    slo: Slo | None,
    queue_slope_tolerance: float,
    prompts: int,
    tally_path: str | None = None,
) -> tuple[bool, dict[str, Any]]:
    """One long run at `rate_req_s` (`prompts` prompts), judged by the same rule as every probe.

    Why: a probe that passes may still hide a slow drift (a batch that fills over minutes, a queue
    that wanders off near saturation); a run 10x longer sees it. A confirmation too short to judge
    fails (the answer errs on the safe side).
    """
    long_scenario = scenario.with_overrides(**{"workload.request_rate": rate_req_s, "num_prompts": prompts})
    run = simulate_counted(long_scenario, tally_path)
    ok, evidence = judge_run(run, rate_req_s, slo, queue_slope_tolerance)
    return ok, _sim_record(long_scenario, run, {"purpose": "confirmation", **evidence})


@dataclass(slots=True)
class ConfirmedSearch:
    """A row's answer: the probes' bisection, then long runs that confirm it (or search below it)."""

    max_rate_req_s: float
    status: str  # RateSearch.status of the search that gave the answer
    initial_bracket: tuple[float, float]
    final_bracket: tuple[float, float]
    probe_records: list[dict[str, Any]]
    confirmations: list[dict[str, Any]]  # every long run; the answer's own is the last passing one


MAX_CONFIRMATIONS = 3  # long runs at a margin below the answer before a row gives up ("unconfirmed")


def confirmed_max_rate(
    scenario: Any,
    *,
    low: float,
    high: float,
    slo: Slo | None,
    rel_tol: float,
    queue_slope_tolerance: float,
    ceiling: float,
    confirm_prompts: int,
    tally_path: str | None = None,
) -> ConfirmedSearch:
    """Bisect with probes; the answer is one tolerance step below the highest passing rate, and one
    long run at exactly the answer confirms it (`confirm_rate`).

    Why the step below: near the knee a p99 moves by a few percent between runs of different
    lengths (issue 20's check: a 10,000-prompt run at the highest rate a long run passed gave p99
    TPOT 100.4 ms against a 100 ms bound), so the highest passing rate is the edge, not a plan; the
    bisection's own tolerance is the margin (the answer stays within 2 tolerances of the knee).
    When the long run fails, the probes were too short for this row (a p99 near the knee needs a
    long run to show its excursions): the search goes on below it with long runs only, from half of
    it, and the answer is again one step below the highest passing long run, confirmed; after
    MAX_CONFIRMATIONS failed confirmations the row reports 0, status "unconfirmed".
    """
    search = max_stable_rate(
        scenario,
        low=low,
        high=high,
        slo=slo,
        rel_tol=rel_tol,
        queue_slope_tolerance=queue_slope_tolerance,
        ceiling=ceiling,
        tally_path=tally_path,
    )
    initial = search.initial_bracket
    probe_records = [record for probe in search.probes for record in probe.evidence]
    if search.max_rate_req_s <= 0:
        return ConfirmedSearch(0.0, search.status, initial, search.final_bracket, probe_records, [])

    def long_run(candidate_req_s: float) -> tuple[bool, dict[str, Any]]:
        return confirm_rate(
            scenario, candidate_req_s, slo, queue_slope_tolerance, confirm_prompts, tally_path
        )

    confirmations: list[dict[str, Any]] = []
    known: dict[float, bool] = {}
    status, final = search.status, search.final_bracket
    rate = search.max_rate_req_s / (1.0 + rel_tol)
    for _ in range(MAX_CONFIRMATIONS):
        ok, record = long_run(rate)
        confirmations.append(record)
        known[rate] = ok
        if ok:
            return ConfirmedSearch(rate, status, initial, final, probe_records, confirmations)
        below = find_max_rate(long_run, low=rate / 2.0, high=rate, rel_tol=rel_tol, known=known)
        confirmations.extend(probe.evidence for probe in below.probes)
        known.update({probe.rate_req_s: probe.ok for probe in below.probes})
        status, final = below.status, below.final_bracket
        if below.max_rate_req_s <= 0:
            return ConfirmedSearch(0.0, status, initial, final, probe_records, confirmations)
        rate = below.max_rate_req_s / (1.0 + rel_tol)
    return ConfirmedSearch(0.0, "unconfirmed", initial, final, probe_records, confirmations)


def plan_one(job: PlanJob) -> dict[str, Any]:
    """Saturation runs, then (if asked) the confirmed bisection over the rate: one row, with its runs."""
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

    estimate = min(float(scenario.max_num_seqs), float(saturation["max_concurrency"]))
    throughput, throughput_record = _throughput(job, estimate)
    row.update(throughput)
    row["throughput_runs"] = [throughput_record]
    probe_prompts = job.sizing.probe_prompts(scenario.num_prompts, throughput["full_batch"])
    confirm_prompts = job.sizing.confirm_prompts(probe_prompts)
    row["probe_prompts"] = probe_prompts
    ceiling = throughput["saturation_throughput_req_s"] or math.inf
    if job.rate_bracket is not None:
        low, high = job.rate_bracket
    else:
        high = ceiling if math.isfinite(ceiling) else 1.0
        low = high / BRACKET_RATIO
    search = confirmed_max_rate(
        scenario.with_overrides(num_prompts=probe_prompts),
        low=low,
        high=high,
        slo=job.slo,
        rel_tol=job.rel_tol,
        queue_slope_tolerance=job.queue_slope_tolerance,
        ceiling=ceiling,
        confirm_prompts=confirm_prompts,
        tally_path=job.tally_path,
    )
    last = search.confirmations[-1] if search.confirmations else {}
    row.update(
        {
            "max_rate_req_s": search.max_rate_req_s,
            "rate_status": search.status,
            "rate_bracket": list(search.initial_bracket),
            "rate_final_bracket": list(search.final_bracket),
            "rate_rel_tol": job.rel_tol,
            "max_rate_runs": search.probe_records,
            "confirmation_runs": search.confirmations,
            "confirmed": bool(last.get("ok", False)),
            "confirmation_num_prompts": last.get("num_prompts"),
            "confirmation_p99_ttft_ms": last.get("p99_ttft_ms"),
            "confirmation_p99_tpot_ms": last.get("p99_tpot_ms"),
        }
    )
    return row
