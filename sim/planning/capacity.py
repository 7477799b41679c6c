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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sim import interrupts
from sim.errors import CapacityError
from sim.files import check_output_file, dumps_json, publish_files, write_error
from sim.planning.jobs import BRACKET_RATIO, PlanJob, plan_one
from sim.planning.plan_table import RUN_LISTS, needed_width, plan_table, row_key
from sim.planning.search import DEFAULT_REL_TOL
from sim.planning.sizing import ProbeSizing
from sim.planning.slo import DEFAULT_QUEUE_SLOPE_TOLERANCE, MIN_SPAN_LIFETIMES, Slo

DEFAULT_MAX_MODEL_LENS: tuple[int, ...] = (2048, 4096, 8192, 16384, 32768)


@dataclass(slots=True)
class CapacityPlan:
    """Every row of the plan plus the inputs it answered; `rows` are plain dicts (JSON-ready)."""

    scenario: dict[str, Any]
    slo: Slo | None  # None: the saturation rate (stationary queue and batch), no latency bound
    target_rate_req_s: float | None
    rows: list[dict[str, Any]]
    failures: dict[str, str] = field(default_factory=dict)
    # allocator family -> why it was left out: with the default (every family), one that refuses the
    # scenario's model at every max_model_len and TP (hybrid on a model without window layers)
    skipped: dict[str, str] = field(default_factory=dict)
    queue_slope_tolerance: float = DEFAULT_QUEUE_SLOPE_TOLERANCE
    gpu_hour_cost: float | None = None  # USD per GPU-hour; rows then carry USD figures (capacity_cost.py)
    # "allocator max_model_len/TPn" -> why the row was not simulated: the weights do not fit at that TP,
    # or vLLM would refuse to start (its KV cache cannot hold one max_model_len request)
    skipped_rows: dict[str, str] = field(default_factory=dict)
    sizing: ProbeSizing = field(default_factory=ProbeSizing)

    def slo_text(self) -> str:
        return "none (saturation rate)" if self.slo is None else self.slo.describe()

    def sustainable_line(self) -> str:
        """What "sustainable" means, in one line (under the table and in the JSON)."""
        latency = "" if self.slo is None else f" with {self.slo.describe()}"
        return (
            "sustainable = served in steady state: a long run at that rate keeps the waiting queue and "
            f"the running batch from growing{latency}, and never above the measured saturation throughput"
        )

    def probe_size_line(self) -> str | None:
        """Says how probes were sized when that is not the scenario's `num_prompts` (issue 23 item 9:
        `--num-prompts 1` must not silently run probes of thousands of prompts)."""
        asked = self.scenario.get("num_prompts")
        sizes = sorted({int(row["probe_prompts"]) for row in self.rows if row.get("probe_prompts")})
        confirms = sorted(
            {int(row["confirmation_num_prompts"]) for row in self.rows if row.get("confirmation_num_prompts")}
        )
        if not sizes or sizes == [asked]:
            return None
        span = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,} to {sizes[-1]:,}"
        line = f"--num-prompts {asked}: probes ran {span} prompts each ({self.sizing.describe_rule()})"
        if confirms:
            line += f"; confirmation runs {confirms[0]:,}" + (
                f" to {confirms[-1]:,}" if len(confirms) > 1 else ""
            )
        return line

    def unmet_lines(self) -> list[str]:
        """One line per row where no rate was sustainable (an SLO too tight for even an idle server)."""
        lines = []
        for row in self.rows:
            status = row.get("rate_status")
            if status == "unconfirmed":
                confirmations = row.get("confirmation_runs") or [{}]
                lines.append(
                    f"no rate meets the SLO for {row_key(row)} in steady state: every long confirmation "
                    f"run failed (the last at {confirmations[-1].get('request_rate', 0):.3g} req/s "
                    f"{confirmations[-1].get('reason', 'failed')})"
                )
                continue
            if status != "below_bracket":
                continue
            runs = row.get("max_rate_runs") or [{}]
            lowest = min(runs, key=lambda run: run.get("request_rate") or math.inf)
            lines.append(
                f"no rate meets the SLO for {row_key(row)}: even at {lowest.get('request_rate', 0):.3g} "
                f"req/s {lowest.get('reason', 'it failed')}"
            )
        return lines

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
        tail = "" if self.slo is None else ", and the SLO holds"
        return (
            "slopes of the waiting queue and of everything in the system over the second half of the "
            f"arrivals <= {self.queue_slope_tolerance:g} x rate, no request is rejected{tail}"
        )

    def caption_lines(self) -> list[str]:
        """What the max-rate column was searched over and judged by, printed under the table.

        Why beside the answer: a max rate means little without its bracket (an answer at an end is
        only a bound: the (<) and (>=) flags), the tolerance (how close below the threshold it is) and
        the rule that decided each probe.
        """
        searched = [row for row in self.rows if row.get("rate_bracket") is not None]
        if not searched:
            return [self.sustainable_line(), f"probe rule = {self.stability_rule()}"]
        brackets = {
            row_key(row): f"[{row['rate_bracket'][0]:.3g}, {row['rate_bracket'][1]:.3g}]" for row in searched
        }
        if len(set(brackets.values())) == 1:
            bracket_text = f"bracket {next(iter(brackets.values()))} req/s"
        else:
            bracket_text = (
                f"bracket per row (saturation throughput down to /{BRACKET_RATIO:g}), req/s: "
                + "; ".join(f"{k} {v}" for k, v in brackets.items())
            )
        tolerances = ", ".join(f"{t:g}" for t in sorted({float(row["rate_rel_tol"]) for row in searched}))
        probes = "; ".join(f"{row_key(row)} {row.get('probe_prompts', 0):,}" for row in searched)
        return [
            self.sustainable_line(),
            f"max rate: geometric bisection, {bracket_text} (widened /2 when the low end fails, never "
            f"above the saturation throughput), stopped at hi/lo - 1 <= {tolerances}; "
            "answer = one step below the highest passing rate; (<) = even the lowest rate failed, "
            "(sat) = the saturation throughput itself passed",
            f"probe rule = {self.stability_rule()}; a probe whose batch still grows or whose arrivals "
            f"span under {MIN_SPAN_LIFETIMES:g} x its mean latency is rerun with more prompts",
            f"{self.sizing.describe()}; prompts per probe: {probes}",
            "p99 TTFT / TPOT: of the confirmation run at the max rate",
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "slo": None if self.slo is None else asdict(self.slo),
            "slo_text": self.slo_text(),
            "sustainable": self.sustainable_line(),
            "probe_sizing": asdict(self.sizing),
            "target_rate_req_s": self.target_rate_req_s,
            "gpu_hour_cost_usd": self.gpu_hour_cost,
            "stability_rule": self.stability_rule(),
            "gpus_needed": self.gpu_plan(),
            "rows": self.rows,
            "failures": self.failures,
            "skipped_allocators": self.skipped,
            "skipped_rows": self.skipped_rows,
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

    def rich_table(self, *, wide: bool = False) -> Any:
        """The plan as a rich Table (`sim.planning.plan_table`); `caption_lines` under it."""
        title = f"capacity · SLO: {self.slo_text()}"
        if self.target_rate_req_s is not None:
            title += f" · target {self.target_rate_req_s:g} req/s"
        return plan_table(self.rows, title, "\n".join(self.caption_lines()), wide=wide)

    def table_width(self, *, wide: bool = False) -> int:
        """Columns the table needs so that no number is cut (`plan_table.needed_width`)."""
        return needed_width(self.rows, wide=wide)


def check_plan_output(path: str | os.PathLike[str]) -> Path:
    """The plan's `--output` as an absolute path, refused (one line) before any simulation when it
    cannot be written: a suffix other than .json/.csv, a missing or read-only folder, a folder name."""
    target = Path(path)
    if target.suffix.lower() not in (".json", ".csv"):
        raise CapacityError(f"argument 'output' ({target}): suffix must be .json or .csv")
    return check_output_file(target, "capacity", what="argument 'output'")


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


def _refusal(scenario: Any) -> str | None:
    """The allocator's own one-line refusal of `scenario` (its model, max_model_len, TP), or None.

    Asks the family itself, by building the allocator the run would build (cheap: no simulation), so
    no family is named here; the error's leading "<family>: " is dropped, the caller names it.
    """
    import allocators
    from sim.sweeps.spec import one_line

    try:
        scenario.make_allocator()
    except allocators.AllocatorConfigError as exc:
        text = one_line(exc)
        prefix = f"{scenario.allocator.name}: "
        return text[len(prefix) :] if text.startswith(prefix) else text
    return None


def _model_max_len(scenario: Any) -> int | None:
    try:
        return int(scenario.model_spec().max_context_tokens)
    except (AttributeError, TypeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class RowSettings:
    """What every row of one plan shares: the SLO, the rate search's knobs, probe sizing, the tally.

    Why a value of its own: each (allocator, max_model_len, TP) row becomes a `PlanJob` that differs
    from its siblings only in those three and its scenario; bundling the rest keeps the row builders'
    signatures short and the job's field order in one place.
    """

    slo: Slo | None
    rel_tol: float
    rate_bracket: tuple[float, float] | None
    queue_slope_tolerance: float
    sizing: ProbeSizing
    tally_path: str | None

    def job(self, allocator: str, max_model_len: int, tp: int, scenario: Any) -> PlanJob:
        """The row's picklable job (it searches the max rate: `find_rate=True`)."""
        return PlanJob(
            allocator,
            max_model_len,
            tp,
            scenario,
            self.slo,
            self.rel_tol,
            self.rate_bracket,
            self.queue_slope_tolerance,
            True,
            self.sizing,
            self.tally_path,
        )


def capacity(
    scenario: Any,
    *,
    slo: Slo | None,
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
    sizing: ProbeSizing | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    tally_path: str | None = None,
) -> CapacityPlan:
    """Plan capacity for `scenario` (a Scenario or a scenario TOML path) under `slo`.

    One row per (allocator, max_model_len, tensor_parallel_size): the scenario's own max_model_len
    and TP plus every value in `max_model_lens` (default 2k..32k up to the model's context) and
    `tensor_parallel_sizes` (for the GPU count; only at the scenario's max_model_len). Rows are
    computed in parallel (`jobs` processes, or Dask); a row whose simulations fail is reported in
    `failures` with its one-line error instead of stopping the plan. `slo=None` asks for the
    saturation rate (stationary queue and batch, no latency bound). A row whose scenario cannot run
    (the weights do not fit at its TP, or vLLM would refuse to start it: `row_refusal`) is listed in
    `skipped_rows` with its reason. `progress(rows_done, rows_total, simulations_done)` is called
    once before the first row finishes and after each row; `tally_path`, a file that every
    simulation appends one byte to, lets a display count simulations while rows still run.

    The steps, in order (every argument is checked before any worker starts): check the arguments,
    list the rows, build one job per row, run the jobs, then add GPUs needed and costs to the rows.
    """
    from sim.planning.money import add_costs

    gpu_hour_cost = _check_backend_and_price(jobs, scheduler, dask_local, gpu_hour_cost)
    scenario = _as_scenario(scenario)
    _check_search_args(target_rate_req_s, rate_bracket, rel_tol)
    # A missing trace or a bad preset parameter fails every simulation alike: say so once, now,
    # instead of after starting workers (and an empty plan). Workload errors are one-line ValueErrors.
    scenario.load_workload()
    names = list(allocators) if allocators else _default_allocators()
    lens = _row_max_model_lens(scenario, max_model_lens)
    tps = sorted({int(t) for t in (tensor_parallel_sizes or ())} | {int(scenario.tensor_parallel_size)})
    _check_max_model_lens(lens)
    settings = RowSettings(
        slo, rel_tol, rate_bracket, queue_slope_tolerance, sizing or ProbeSizing(), tally_path
    )
    _check_allocator_names(scenario, names)
    plan_jobs, skipped, skipped_rows = _plan_jobs(
        scenario, names, _row_combos(scenario, lens, tps), settings, leave_out_refusing=not allocators
    )
    if not plan_jobs:
        reasons = "; ".join(f"{key}: {why}" for key, why in skipped_rows.items())
        raise CapacityError(f"no row of the plan can run: {reasons or 'no allocator left'}")
    executor = _row_executor(len(plan_jobs), jobs=jobs, scheduler=scheduler, dask_local=dask_local)
    rows, failures = _run_rows(plan_jobs, executor, progress)
    if target_rate_req_s is not None:
        _add_gpus_needed(rows, target_rate_req_s)
    add_costs(rows, gpu_hour_cost)
    return CapacityPlan(
        scenario=scenario.to_dict(),
        slo=slo,
        target_rate_req_s=target_rate_req_s,
        rows=rows,
        failures=failures,
        skipped=skipped,
        queue_slope_tolerance=queue_slope_tolerance,
        gpu_hour_cost=gpu_hour_cost,
        skipped_rows=skipped_rows,
        sizing=settings.sizing,
    )


def _check_backend_and_price(
    jobs: int | None, scheduler: str | None, dask_local: int | None, gpu_hour_cost: float | None
) -> float | None:
    """Refuse a bad executor choice or GPU-hour price (one line) before anything else; the checked price."""
    from sim.planning.money import check_gpu_hour_cost
    from sim.sweeps.executors import check_backend_args

    check_backend_args(jobs=jobs, scheduler=scheduler, dask_local=dask_local)
    return check_gpu_hour_cost(gpu_hour_cost)


def _as_scenario(scenario: Any) -> Any:
    """A Scenario as given, or read from the TOML file it names."""
    from sim.scenario.scenario import Scenario

    return scenario if isinstance(scenario, Scenario) else Scenario.from_toml(Path(scenario))


def _check_search_args(
    target_rate_req_s: float | None, rate_bracket: tuple[float, float] | None, rel_tol: float
) -> None:
    """Refuse a target rate, rate bracket or bisection tolerance the search cannot use (one line each)."""
    if target_rate_req_s is not None and not (math.isfinite(target_rate_req_s) and target_rate_req_s > 0):
        raise CapacityError(
            f"argument 'target_rate_req_s': must be a finite number > 0 req/s (got {target_rate_req_s!r})"
        )
    if rate_bracket is not None and not (0 < rate_bracket[0] < rate_bracket[1] < math.inf):
        raise CapacityError(f"argument 'rate_bracket': must satisfy 0 < min < max (got {rate_bracket!r})")
    if not 0 < rel_tol < 1:
        raise CapacityError(f"argument 'rel_tol': must be in (0, 1) (got {rel_tol!r})")


def _row_max_model_lens(scenario: Any, max_model_lens: Sequence[int] | None) -> list[int]:
    """The max_model_len values to plan, sorted, always with the scenario's own.

    Without a list: `DEFAULT_MAX_MODEL_LENS` up to the model's context (a length the model cannot
    take is no trade-off to show).
    """
    base_len = int(scenario.max_model_len)
    if max_model_lens is None:
        limit = _model_max_len(scenario) or base_len
        return sorted({n for n in DEFAULT_MAX_MODEL_LENS if n <= limit} | {base_len})
    return sorted({int(n) for n in max_model_lens} | {base_len})


def _check_max_model_lens(lens: Sequence[int]) -> None:
    """Refuse a max_model_len below one token (one line)."""
    for value in lens:
        if value < 1:
            raise CapacityError(f"argument 'max_model_lens': values must be >= 1 (got {value})")


def _check_allocator_names(scenario: Any, names: Sequence[str]) -> None:
    """An unknown allocator or a bad parameter is the user's error (one line), not a skipped row."""
    for name in names:
        try:
            scenario.with_overrides(allocator=name)
        except ValueError as exc:
            from sim.sweeps.spec import one_line

            raise CapacityError(f"allocator={name}: {one_line(exc)}") from exc


def _row_combos(scenario: Any, lens: Sequence[int], tps: Sequence[int]) -> list[tuple[int, int]]:
    """(max_model_len, TP) of each row of a family: every length at the scenario's TP, then every
    other TP at the scenario's max_model_len (the GPU count is asked only there)."""
    base_len = int(scenario.max_model_len)
    base_tp = int(scenario.tensor_parallel_size)
    return [(n, base_tp) for n in lens] + [(base_len, t) for t in tps if t != base_tp]


def _plan_jobs(
    scenario: Any,
    names: Sequence[str],
    combos: Sequence[tuple[int, int]],
    settings: RowSettings,
    *,
    leave_out_refusing: bool,
) -> tuple[list[tuple[str, PlanJob]], dict[str, str], dict[str, str]]:
    """(keyed jobs in plan order, families left out -> why, rows skipped -> why).

    With `leave_out_refusing` (the user named no allocator), a family that refuses this model at
    every row is left out with one line; an allocator the user named keeps failing its rows with
    its own error.
    """
    plan_jobs: list[tuple[str, PlanJob]] = []
    skipped: dict[str, str] = {}
    skipped_rows: dict[str, str] = {}
    for name in names:
        family_jobs = _family_jobs(scenario, name, combos, settings, skipped_rows)
        if leave_out_refusing and family_jobs:
            refusal = _family_refusal(family_jobs)
            if refusal is not None:
                skipped[name] = refusal
                continue
        plan_jobs.extend(family_jobs)
    return plan_jobs, skipped, skipped_rows


def _family_jobs(
    scenario: Any,
    name: str,
    combos: Sequence[tuple[int, int]],
    settings: RowSettings,
    skipped_rows: dict[str, str],
) -> list[tuple[str, PlanJob]]:
    """One family's keyed jobs ("name|max_model_len|tp"); a row that cannot run goes to `skipped_rows`."""
    family_jobs: list[tuple[str, PlanJob]] = []
    for mml, tp in combos:
        job_scenario, refusal = row_scenario(scenario, name, mml, tp)
        if job_scenario is None:
            skipped_rows[f"{name} {mml}/TP{tp}"] = str(refusal)
            continue
        family_jobs.append((f"{name}|{mml}|{tp}", settings.job(name, mml, tp, job_scenario)))
    return family_jobs


def _family_refusal(family_jobs: Sequence[tuple[str, PlanJob]]) -> str | None:
    """The family's refusal of its first row when it refuses every row, else None."""
    refusals = [_refusal(job.scenario) for _, job in family_jobs]
    return str(refusals[0]) if all(refusals) else None


def _row_executor(n_rows: int, *, jobs: int | None, scheduler: str | None, dask_local: int | None) -> Any:
    """Where the rows run: local workers, never more than rows (default one per CPU), or Dask as asked."""
    from sim.sweeps.executors import make_executor

    local = scheduler is None and dask_local is None
    return make_executor(
        jobs=min(jobs or os.cpu_count() or 1, n_rows) if local else jobs,
        scheduler=scheduler,
        dask_local=dask_local,
    )


def _run_rows(
    plan_jobs: Sequence[tuple[str, PlanJob]],
    executor: Any,
    progress: Callable[[int, int, int], None] | None,
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Run every job, then close the executor: (finished rows in plan order, failed key -> one line)."""
    report = progress or (lambda rows_done, rows_total, simulations_done: None)
    rows_by_key: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    simulations = 0
    report(0, len(plan_jobs), 0)
    try:
        for outcome in executor.map_unordered(_plan_one_safe, plan_jobs):
            simulations += _record_outcome(outcome, rows_by_key, failures)
            report(len(rows_by_key) + len(failures), len(plan_jobs), simulations)
    finally:
        executor.close()
    return [rows_by_key[key] for key, _ in plan_jobs if key in rows_by_key], failures


def _record_outcome(outcome: Any, rows_by_key: dict[str, dict[str, Any]], failures: dict[str, str]) -> int:
    """File one job's outcome as a row or a failure (its one line); the simulations the row ran."""
    value = outcome.value
    if outcome.ok and isinstance(value, dict) and "error" not in value:
        rows_by_key[outcome.key] = value
        return count_simulations(value)
    failures[outcome.key] = value["error"] if isinstance(value, dict) else outcome.error
    return 0


def _add_gpus_needed(rows: Sequence[dict[str, Any]], target_rate_req_s: float) -> None:
    """Add each row's replicas and GPUs needed for the target rate (`gpus_for_target`), in place."""
    for row in rows:
        replicas, gpus = gpus_for_target(
            target_rate_req_s, row.get("max_rate_req_s") or 0.0, row["tensor_parallel_size"]
        )
        row["replicas_needed"] = replicas
        row["gpus_needed"] = gpus


def count_simulations(row: dict[str, Any]) -> int:
    """How many simulations a finished row ran (its evidence lists)."""
    return sum(len(row.get(key, [])) for key in RUN_LISTS)


def row_scenario(scenario: Any, allocator: str, max_model_len: int, tp: int) -> tuple[Any, str | None]:
    """The row's scenario, or (None, why) when the row cannot run as asked.

    Checked per row, so that `--tensor-parallel-size 2,4,8` plans a model whose weights do not fit
    one GPU: the rows that fit are planned, the others are skipped with their reason. Two refusals:
    the scenario's own (weights larger than the GPU at that TP, no memory left for KV), and vLLM's
    start-up check that the KV cache holds one request of max_model_len tokens (vLLM v1
    `vllm/v1/core/kv_cache_utils.py` `check_enough_kv_cache_memory`; v0 `vllm/worker/worker.py`
    `raise_if_cache_size_invalid`): vLLM refuses to start such an engine, so no rate is served.
    """
    from sim.sweeps.spec import one_line

    try:
        row = scenario.with_overrides(
            allocator=allocator, max_model_len=max_model_len, tensor_parallel_size=tp
        )
    except ValueError as exc:
        return None, one_line(exc)
    kv_tokens = int(row.kv_capacity_tokens())
    if kv_tokens < max_model_len:
        return None, (
            f"vLLM would refuse to start: its KV cache holds {kv_tokens:,} tokens, fewer than one "
            f"max_model_len={max_model_len:,} request (lower --max-model-len or raise the TP size)"
        )
    return row, None


def _plan_one_safe(job: PlanJob) -> dict[str, Any]:
    """Worker entry: a failing row returns its one-line error instead of killing the plan."""
    try:
        return plan_one(job)
    except Exception as exc:
        from sim.sweeps.spec import one_line

        return {"error": f"{type(exc).__name__}: {one_line(exc)}"}
