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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sim import interrupts
from sim.errors import CapacityError
from sim.files import check_output_file, dumps_json, publish_files, write_error
from sim.planning.jobs import BRACKET_RATIO, SATURATION_BRACKET_HIGH, PlanJob, plan_one
from sim.planning.search import DEFAULT_REL_TOL
from sim.planning.slo import DEFAULT_QUEUE_SLOPE_TOLERANCE, MIN_SPAN_LIFETIMES, Slo

DEFAULT_MAX_MODEL_LENS: tuple[int, ...] = (2048, 4096, 8192, 16384, 32768)


@dataclass(slots=True)
class CapacityPlan:
    """Every row of the plan plus the inputs it answered; `rows` are plain dicts (JSON-ready)."""

    scenario: dict[str, Any]
    slo: Slo
    target_rate_req_s: float | None
    rows: list[dict[str, Any]]
    failures: dict[str, str] = field(default_factory=dict)
    # allocator family -> why it was left out: with the default (every family), one that refuses the
    # scenario's model at every max_model_len and TP (hybrid on a model without window layers)
    skipped: dict[str, str] = field(default_factory=dict)
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
            "skipped_allocators": self.skipped,
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
    skipped: dict[str, str] = {}
    for name in names:
        combos = [(n, base_tp) for n in lens] + [(base_len, t) for t in tps if t != base_tp]
        family_jobs: list[tuple[str, PlanJob]] = []
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
            family_jobs.append(
                (
                    key,
                    PlanJob(
                        name, mml, tp, job_scenario, slo, rel_tol, rate_bracket, queue_slope_tolerance, True
                    ),
                )
            )
        if not allocators:
            # Not asked for by name: a family that refuses this model at every row is left out with
            # one line (an allocator the user named keeps failing its rows with its own error).
            refusals = [_refusal(job.scenario) for _, job in family_jobs]
            if all(refusals):
                skipped[name] = str(refusals[0])
                continue
        plan_jobs.extend(family_jobs)

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
        skipped=skipped,
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
