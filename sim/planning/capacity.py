"""`sim.planning.capacity` (public as `sim.capacity`): the planner's answers, each from real simulations.

Why simulations and not formulas: whether a rate is sustainable depends on batching, preemption,
fragmentation and the cost model together. So every figure here is measured, and lists the runs
(rate, seed, prompts) it came from. The answers, per allocator:

1. max sustainable request rate: the highest rate whose run meets the SLO with a stable queue,
   found by geometric bisection (see `find_max_rate` and `judge_run`; docs/capacity.md);
2. max concurrency: from a saturation run (every request at t = 0, `max_num_seqs` lifted), the peak
   number of sequences running at once and the concurrency sustained while requests wait, i.e. what
   the KV memory holds at the workload's real lengths; beside them vLLM's own "Maximum concurrency
   for N tokens per request: X x" (= KV capacity tokens / max_model_len, no simulation);
3. GPUs needed for a target rate: replicas = ceil(target / max rate of one replica) for each tensor
   parallel size asked for; GPUs = replicas x TP, the smallest wins;
4. the max_model_len trade-off: 1 and 2 again for each max_model_len asked for.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim import interrupts
from sim.errors import KvsimError
from sim.files import check_output_file, dumps_json, publish_files, write_error

DEFAULT_MAX_MODEL_LENS: tuple[int, ...] = (2048, 4096, 8192, 16384, 32768)
DEFAULT_REL_TOL = 0.05  # bisection stops when hi/lo - 1 <= this
DEFAULT_QUEUE_SLOPE_TOLERANCE = 0.05  # stable iff the queue grows by <= this fraction of the arrival rate
SATURATION_BRACKET_HIGH = 1.25  # bracket high = this x the saturation run's request throughput
BRACKET_RATIO = 64.0  # bracket low = high / this
MAX_EXPANSIONS = 8  # times the bracket may be widened (x2 or /2) when an end is on the wrong side
MAX_SATURATION_DOUBLINGS = 3  # more prompts when a saturation run's peak was capped by num_prompts
SATURATION_PROMPTS_CAP = 50_000
MIN_SPAN_LIFETIMES = 4.0  # a probe's arrivals must span this many mean request latencies
PROBE_PROMPTS_CAP = 20_000  # a probe too short to judge is lengthened up to this many prompts
MAX_PROBE_EXTENSIONS = 3


class CapacityError(KvsimError):
    """Bad capacity-planner input: names the flag and the allowed range."""


# --------------------------------------------------------------------------------------------------
# The SLO and the stability rule
# --------------------------------------------------------------------------------------------------


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


def judge_run(
    run: Any,
    rate_req_s: float,
    slo: Slo | None,
    queue_slope_tolerance: float = DEFAULT_QUEUE_SLOPE_TOLERANCE,
) -> tuple[bool, dict[str, Any]]:
    """Is this rate sustainable? (SLO holds) and (no request rejected) and (the queue is stable).

    `slo=None` judges stability alone (no rejection, stable queue, long enough): the question "at
    which rate does the queue start to grow", with exactly the rule `kvsim capacity` applies.

    Stable: the waiting queue's fitted slope over the second half of the arrivals (T/2 to T, T the
    arrival span; `queue_slope_req_s`) is at most `queue_slope_tolerance` x the arrival rate. A run
    can only show that when its arrivals span at least MIN_SPAN_LIFETIMES mean request latencies
    (the second half then starts after the warm-up); a shorter passing run is judged "too short"
    (`evidence["too_short"]`) and the caller reruns it with more prompts.
    Returns the verdict and the evidence it was judged on.
    """
    metrics = run.summary["metrics"]
    arrival_s = run.requests["arrival_s"].to_numpy(dtype=np.float64)
    last_arrival_s = float(arrival_s.max() - arrival_s.min()) if arrival_s.size else 0.0
    slope = queue_slope_req_s(run.steps, last_arrival_s / 2.0, last_arrival_s)
    mean_e2el_s = (_metric(metrics, "mean_e2el_ms") or 0.0) / 1e3
    evidence: dict[str, Any] = {
        "rate_req_s": rate_req_s,
        "arrival_span_s": last_arrival_s,
        "mean_e2el_s": mean_e2el_s,
        "p99_ttft_ms": _metric(metrics, "p99_ttft_ms"),
        "p99_tpot_ms": _metric(metrics, "p99_tpot_ms"),
        "mean_normalized_latency_s_per_token": _metric(metrics, "mean_normalized_latency_s_per_token"),
        "queue_slope_req_s": slope,
        "queue_growth": _metric(metrics, "queue_growth"),
        "completed": int(metrics.get("completed", 0)),
        "rejected": int(metrics.get("rejected", 0)),
        "request_throughput": _metric(metrics, "request_throughput"),
    }
    reasons = []
    if evidence["rejected"]:
        reasons.append(f"{evidence['rejected']} request(s) rejected")
    if slope > queue_slope_tolerance * rate_req_s:
        reasons.append(f"queue grows {slope:.3g} req/s > {queue_slope_tolerance:g} x rate")
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
    # A run shorter than a few request lifetimes is a burst the server absorbs, not a steady state.
    evidence["too_short"] = not reasons and last_arrival_s < MIN_SPAN_LIFETIMES * mean_e2el_s
    if evidence["too_short"]:
        reasons.append(
            f"too short to judge: arrivals span {last_arrival_s:.3g} s < {MIN_SPAN_LIFETIMES:g} x mean "
            f"latency {mean_e2el_s:.3g} s"
        )
    evidence["ok"] = not reasons
    evidence["reason"] = "; ".join(reasons) if reasons else ("SLO met, " if slo else "") + "queue stable"
    return not reasons, evidence


def _metric(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return None if value is None else float(value)


# --------------------------------------------------------------------------------------------------
# Bisection over the rate, as a pure function of an `evaluate(rate) -> (ok, evidence)` callback
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Probe:
    rate_req_s: float
    ok: bool
    evidence: Any


@dataclass(slots=True)
class RateSearch:
    """Outcome of a bisection: the answer, how it was bracketed and every probe it took."""

    max_rate_req_s: float  # highest rate that passed (0.0 when none did)
    status: str  # "converged", "below_bracket" (even the lowest probe failed), "above_bracket"
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
) -> RateSearch:
    """Largest rate with `evaluate(rate)[0]` true, assuming pass below / fail above a threshold.

    Probes `low` and `high` first; an end on the wrong side is moved (/2 or x2) up to
    `max_expansions` times. Then geometric bisection (midpoint sqrt(lo*hi): the answer may lie
    anywhere across decades) until hi/lo - 1 <= rel_tol. The answer is the highest passing probe,
    so it is never above the true threshold of a monotone `evaluate`.
    """
    if not (0.0 < low < high) or not math.isfinite(high):
        raise CapacityError(f"rate bracket must satisfy 0 < low < high (got {low!r}, {high!r})")
    if not (0.0 < rel_tol < 1.0):
        raise CapacityError(f"rate tolerance must be in (0, 1) (got {rel_tol!r})")
    probes: list[Probe] = []

    def probe(rate: float) -> bool:
        ok, evidence = evaluate(rate)
        probes.append(Probe(rate, bool(ok), evidence))
        return bool(ok)

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
        if not hi_ok:
            break
        low, high = high, high * 2.0
        hi_ok = probe(high)
    if hi_ok:
        return RateSearch(high, "above_bracket", initial, (high, math.inf), rel_tol, probes)
    while high / low - 1.0 > rel_tol:
        mid = math.sqrt(low * high)
        if probe(mid):
            low = mid
        else:
            high = mid
    return RateSearch(low, "converged", initial, (low, high), rel_tol, probes)


# --------------------------------------------------------------------------------------------------
# Real simulations: one planning job per (allocator, max_model_len, tensor_parallel_size)
# --------------------------------------------------------------------------------------------------


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
                    "mean_concurrency": _metric(metrics, "mean_concurrency"),
                    "request_throughput": _metric(metrics, "request_throughput"),
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


# --------------------------------------------------------------------------------------------------
# The plan: all rows, the GPU count, and the outputs (rich table, JSON, CSV)
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class CapacityPlan:
    """Every row of the plan plus the inputs it answered; `rows` are plain dicts (JSON-ready)."""

    scenario: dict[str, Any]
    slo: Slo
    target_rate_req_s: float | None
    rows: list[dict[str, Any]]
    failures: dict[str, str] = field(default_factory=dict)
    queue_slope_tolerance: float = DEFAULT_QUEUE_SLOPE_TOLERANCE
    gpu_hour_cost: float | None = None  # USD per GPU-hour; rows then carry USD figures (capacity_cost.py)

    def cost_lines(self) -> list[str]:
        """Per row: USD per 1M output tokens and per 1k requests at the max rate, per month at the target."""
        from sim.planning.money import cost_lines

        return cost_lines(self.rows, self.gpu_hour_cost, self.target_rate_req_s)

    def gpu_plan(self) -> dict[str, dict[str, Any]]:
        """Per allocator, the fewest GPUs that serve the target rate at the scenario's max_model_len."""
        if self.target_rate_req_s is None:
            return {}
        base_len = self.scenario.get("max_model_len")
        best: dict[str, dict[str, Any]] = {}
        for row in self.rows:
            if row["max_model_len"] != base_len or row.get("gpus_needed", -1) < 0:
                continue
            current = best.get(row["allocator"])
            if current is None or row["gpus_needed"] < current["gpus"]:
                best[row["allocator"]] = {
                    "gpus": row["gpus_needed"],
                    "replicas": row["replicas_needed"],
                    "tensor_parallel_size": row["tensor_parallel_size"],
                    "max_rate_per_replica_req_s": row["max_rate_req_s"],
                }
        return best

    def stability_rule(self) -> str:
        """When a probed rate counts as sustainable, in words (JSON `stability_rule`, table caption)."""
        return (
            "waiting-queue slope over the second half of the arrivals <= "
            f"{self.queue_slope_tolerance:g} x rate, no request is rejected, and the SLO holds"
        )

    def caption_lines(self) -> list[str]:
        """What the max-rate column was searched over and judged by, printed under the table.

        Why beside the answer: a max rate means little without its bracket (an answer at an end is
        only a bound: the (<) and (>=) flags), the tolerance (how close below the threshold it is) and
        the rule that decided each probe.
        """
        searched = [row for row in self.rows if row.get("rate_bracket") is not None]
        if not searched:
            return [f"sustainable = {self.stability_rule()}"]
        brackets = {
            f"{row['allocator']} {row['max_model_len']}/TP{row['tensor_parallel_size']}": (
                f"[{row['rate_bracket'][0]:.3g}, {row['rate_bracket'][1]:.3g}]"
            )
            for row in searched
        }
        if len(set(brackets.values())) == 1:
            bracket_text = f"bracket {next(iter(brackets.values()))} req/s"
        else:
            bracket_text = (
                f"bracket per row ({SATURATION_BRACKET_HIGH:g} x saturation throughput down to "
                f"/{BRACKET_RATIO:g}), req/s: " + "; ".join(f"{k} {v}" for k, v in brackets.items())
            )
        tolerances = sorted({float(row["rate_rel_tol"]) for row in searched})
        return [
            f"max rate: geometric bisection, {bracket_text} (widened x2 or /2 when an end is on the "
            f"wrong side), stopped at hi/lo - 1 <= {', '.join(f'{t:g}' for t in tolerances)}; "
            "(<) = even the lowest rate failed, (>=) = the highest rate tried still passed",
            f"sustainable = {self.stability_rule()}; a passing run whose arrivals span under "
            f"{MIN_SPAN_LIFETIMES:g} x its mean latency is rerun with more prompts",
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "slo": asdict(self.slo),
            "slo_text": self.slo.describe(),
            "target_rate_req_s": self.target_rate_req_s,
            "gpu_hour_cost_usd": self.gpu_hour_cost,
            "stability_rule": self.stability_rule(),
            "gpus_needed": self.gpu_plan(),
            "rows": self.rows,
            "failures": self.failures,
        }

    def to_frame(self) -> Any:
        import pandas as pd

        flat = []
        for row in self.rows:
            flat.append(
                {k: (dumps_json(v, indent=None) if isinstance(v, list | dict) else v) for k, v in row.items()}
            )
        return pd.DataFrame(flat)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """JSON (.json) or CSV (.csv) by suffix, atomically through `sim.files` (one JSON rule).

        The folder must already exist (`check_plan_output`): a mistyped folder is refused rather
        than created, and so is a file of the same name that kvsim did not write. Any OSError while
        writing becomes one line naming the file.
        """
        target = check_plan_output(path)
        suffix = target.suffix.lower()
        if suffix == ".json":
            text = dumps_json(self.to_dict())
        else:
            buffer = io.StringIO()
            frame = self.to_frame()
            frame.to_csv(buffer, index=False, quoting=csv.QUOTE_MINIMAL)
            text = buffer.getvalue()
        try:
            publish_files(target.parent, "capacity", [(target.name, text)])
        except OSError as exc:
            raise write_error("argument 'output'", target, exc) from None
        interrupts.note_written(target)
        return target

    def rich_table(self) -> Any:
        """The plan as a rich Table; `caption_lines` (bracket, tolerance, stability rule) under it."""
        from rich.table import Table
        from rich.text import Text

        title = f"capacity · SLO: {self.slo.describe()}"
        if self.target_rate_req_s is not None:
            title += f" · target {self.target_rate_req_s:g} req/s"
        caption = Text("\n".join(self.caption_lines()))  # Text: brackets are not rich markup
        table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
        for name in (
            "allocator",
            "max_model_len",
            "TP",
            "KV tokens",
            "vLLM max conc.",
            "conc. peak",
            "conc. sustained",
            "max rate req/s",
            "GPUs",
            "sims (seeds)",
        ):
            table.add_column(name, justify="left" if name == "allocator" else "right")
        for row in self.rows:
            rate = row.get("max_rate_req_s")
            rate_text = "—" if rate is None else f"{rate:.3g}" + _rate_flag(row.get("rate_status"))
            conc = f"{row['max_concurrency']}" + (
                "+" if row.get("concurrency_limited_by") == "num_prompts" else ""
            )
            runs = row.get("max_concurrency_runs", []) + row.get("max_rate_runs", [])
            seeds = sorted({r["seed"] for r in runs})
            gpus = row.get("gpus_needed")
            table.add_row(
                row["allocator"],
                str(row["max_model_len"]),
                str(row["tensor_parallel_size"]),
                f"{row['kv_capacity_tokens']:,}",
                f"{row['vllm_max_concurrency_x']:.2f}x",
                conc,
                f"{row['sustained_concurrency']:.1f}",
                rate_text,
                "—" if gpus is None else ("∞" if gpus < 0 else str(gpus)),
                f"{len(runs)} ({', '.join(map(str, seeds))})",
            )
        return table


def check_plan_output(path: str | os.PathLike[str]) -> Path:
    """The plan's `--output` as an absolute path, refused (one line) before any simulation when it
    cannot be written: a suffix other than .json/.csv, a missing or read-only folder, a folder name."""
    target = Path(path)
    if target.suffix.lower() not in (".json", ".csv"):
        raise CapacityError(f"argument 'output' ({target}): suffix must be .json or .csv")
    return check_output_file(target, "capacity", what="argument 'output'")


def _rate_flag(status: str | None) -> str:
    return {"below_bracket": " (<)", "above_bracket": " (>=)"}.get(status or "", "")


def gpus_for_target(
    target_rate_req_s: float, max_rate_req_s: float, tensor_parallel_size: int
) -> tuple[int, int]:
    """(replicas, GPUs) to serve the target; (-1, -1) when one replica sustains no load at all."""
    if max_rate_req_s <= 0:
        return -1, -1
    replicas = math.ceil(target_rate_req_s / max_rate_req_s - 1e-12)
    return replicas, replicas * tensor_parallel_size


def _default_allocators() -> list[str]:
    """Every registered allocator family, in registration order."""
    import allocators

    return list(allocators.available())


def _model_max_len(scenario: Any) -> int | None:
    try:
        return int(scenario.model_spec().max_context_tokens)
    except (AttributeError, TypeError, ValueError):
        return None


def capacity(
    scenario: Any,
    *,
    slo: Slo,
    allocators: Sequence[str] | None = None,
    target_rate_req_s: float | None = None,
    tensor_parallel_sizes: Sequence[int] | None = None,
    max_model_lens: Sequence[int] | None = None,
    rate_bracket: tuple[float, float] | None = None,
    rel_tol: float = DEFAULT_REL_TOL,
    queue_slope_tolerance: float = DEFAULT_QUEUE_SLOPE_TOLERANCE,
    jobs: int | None = None,
    scheduler: str | None = None,
    dask_local: int | None = None,
    gpu_hour_cost: float | None = None,
) -> CapacityPlan:
    """Plan capacity for `scenario` (a Scenario or a scenario TOML path) under `slo`.

    One row per (allocator, max_model_len, tensor_parallel_size): the scenario's own max_model_len
    and TP plus every value in `max_model_lens` (default 2k..32k up to the model's context) and
    `tensor_parallel_sizes` (for the GPU count; only at the scenario's max_model_len). Rows are
    computed in parallel (`jobs` processes, or Dask); a row whose simulations fail is reported in
    `failures` with its one-line error instead of stopping the plan.
    """
    from sim.scenario.scenario import Scenario
    from sim.sweeps.executors import check_backend_args, make_executor

    check_backend_args(jobs=jobs, scheduler=scheduler, dask_local=dask_local)
    from sim.planning.money import add_costs, check_gpu_hour_cost

    gpu_hour_cost = check_gpu_hour_cost(gpu_hour_cost)

    if not isinstance(scenario, Scenario):
        scenario = Scenario.from_toml(Path(scenario))
    if target_rate_req_s is not None and not (math.isfinite(target_rate_req_s) and target_rate_req_s > 0):
        raise CapacityError(
            f"argument 'target_rate_req_s': must be a finite number > 0 req/s (got {target_rate_req_s!r})"
        )
    if rate_bracket is not None and not (0 < rate_bracket[0] < rate_bracket[1] < math.inf):
        raise CapacityError(f"argument 'rate_bracket': must satisfy 0 < min < max (got {rate_bracket!r})")
    if not 0 < rel_tol < 1:
        raise CapacityError(f"argument 'rel_tol': must be in (0, 1) (got {rel_tol!r})")
    # A missing trace or a bad preset parameter fails every simulation alike: say so once, now,
    # instead of after starting workers (and an empty plan). Workload errors are one-line ValueErrors.
    scenario.load_workload()
    names = list(allocators) if allocators else _default_allocators()
    base_len = int(scenario.max_model_len)
    base_tp = int(scenario.tensor_parallel_size)
    if max_model_lens is None:
        limit = _model_max_len(scenario) or base_len
        lens = sorted({n for n in DEFAULT_MAX_MODEL_LENS if n <= limit} | {base_len})
    else:
        lens = sorted({int(n) for n in max_model_lens} | {base_len})
    tps = sorted({int(t) for t in (tensor_parallel_sizes or ())} | {base_tp})
    for value in lens:
        if value < 1:
            raise CapacityError(f"argument 'max_model_lens': values must be >= 1 (got {value})")

    plan_jobs: list[tuple[str, PlanJob]] = []
    for name in names:
        combos = [(n, base_tp) for n in lens] + [(base_len, t) for t in tps if t != base_tp]
        for mml, tp in combos:
            key = f"{name}|{mml}|{tp}"
            try:
                job_scenario = scenario.with_overrides(
                    allocator=name, max_model_len=mml, tensor_parallel_size=tp
                )
            except ValueError as exc:
                from sim.sweeps.spec import one_line

                raise CapacityError(
                    f"allocator={name}, max_model_len={mml}, TP={tp}: {one_line(exc)}"
                ) from exc
            plan_jobs.append(
                (
                    key,
                    PlanJob(
                        name, mml, tp, job_scenario, slo, rel_tol, rate_bracket, queue_slope_tolerance, True
                    ),
                )
            )

    executor = make_executor(
        jobs=min(jobs or os.cpu_count() or 1, len(plan_jobs))
        if scheduler is None and dask_local is None
        else jobs,
        scheduler=scheduler,
        dask_local=dask_local,
    )
    rows_by_key: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    try:
        for outcome in executor.map_unordered(_plan_one_safe, plan_jobs):
            value = outcome.value
            if outcome.ok and isinstance(value, dict) and "error" not in value:
                rows_by_key[outcome.key] = value
            else:
                failures[outcome.key] = value["error"] if isinstance(value, dict) else outcome.error
    finally:
        executor.close()
    rows = [rows_by_key[key] for key, _ in plan_jobs if key in rows_by_key]
    if target_rate_req_s is not None:
        for row in rows:
            replicas, gpus = gpus_for_target(
                target_rate_req_s, row.get("max_rate_req_s") or 0.0, row["tensor_parallel_size"]
            )
            row["replicas_needed"] = replicas
            row["gpus_needed"] = gpus
    add_costs(rows, gpu_hour_cost)
    return CapacityPlan(
        scenario=scenario.to_dict(),
        slo=slo,
        target_rate_req_s=target_rate_req_s,
        rows=rows,
        failures=failures,
        queue_slope_tolerance=queue_slope_tolerance,
        gpu_hour_cost=gpu_hour_cost,
    )


def _plan_one_safe(job: PlanJob) -> dict[str, Any]:
    """Worker entry: a failing row returns its one-line error instead of killing the plan."""
    try:
        return plan_one(job)
    except Exception as exc:
        from sim.sweeps.spec import one_line

        return {"error": f"{type(exc).__name__}: {one_line(exc)}"}
