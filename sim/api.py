"""The Python API of a run: `simulate(scenario) -> Run` and `compare(scenario, allocators) -> {label: Run}`.

Why here and not in the engine: this module is the only one that turns a Scenario into the engine's
plain inputs (request table, allocator, cost model, EngineConfig) and wraps the engine's output
into a Run with a summary (scenario, seed, versions, metrics). The CLI, sweeps, capacity search and
notebooks all call these two functions.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

import sim
from sim.core.engine import EngineConfig, run_engine
from sim.core.metrics import summarize
from sim.cost.model import CostModel
from sim.cost.output_path import apply_output_path, intake_jobs
from sim.cost.server import (
    ServerTerms,
    add_frontend_latency,
    frontend_arrivals,
    intake_turn_share,
    scenario_terms,
)
from sim.results import Run
from sim.scenario.scenario import Scenario

# `kvsim compare` with no --allocators: the paper's contenders, same workload and seed for each.
DEFAULT_COMPARE_ALLOCATORS: tuple[str, ...] = (
    "contiguous",
    "request_limit:limit",
    "request_limit:oracle",
    "request_limit:pow2",
    "paged",
    "virtual",
)

_VERSIONED_PACKAGES: tuple[str, ...] = ("simpy", "numpy", "pandas", "pyarrow", "pydantic", "typer", "rich")


def package_versions() -> dict[str, str]:
    """Versions that can change results or files (recorded in every summary.json).

    Read once per process (`_installed_versions`): each lookup parses the package's metadata file,
    ~15 ms for the seven, which was 5 % of a 500-request simulation (issue 16: capacity runs
    hundreds of them in one worker). A copy, so a caller may change it.
    """
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def engine_config(
    scenario: Scenario, *, multi_step: bool = True, max_step_rows: int = 200_000
) -> EngineConfig:
    """The engine knobs of a scenario (vLLM names map one to one) plus its engine's policy."""
    return EngineConfig(
        max_num_seqs=scenario.max_num_seqs,
        max_num_batched_tokens=int(scenario.max_num_batched_tokens),
        max_model_len=int(scenario.max_model_len),
        enable_chunked_prefill=scenario.enable_chunked_prefill,
        preemption_mode=scenario.preemption_mode,
        # --swap-space is a real bound of the engine that swaps (v0); v1 never swaps
        swap_space_tokens=scenario.swap_space_tokens(),
        policy=scenario.engine_policy(),
        multi_step=multi_step,
        max_step_rows=max_step_rows,
        export_layouts_every=scenario.export_layouts_every,
    )


@contextlib.contextmanager
def _progress_bar(
    enabled: bool, total: int, label: str
) -> Iterator[Callable[[float, int, int], None] | None]:
    """A rich progress bar over finished requests that shows simulated time; None when disabled."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("simulated {task.fields[sim_s]:>9.1f} s"),
        TimeElapsedColumn(),
        transient=True,
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task(label, total=total, sim_s=0.0)

        def update(now_s: float, done: int, _total: int) -> None:
            bar.update(task, completed=done, sim_s=now_s)

        yield update


def simulate(
    scenario: Scenario,
    *,
    progress: bool = False,
    workload: pd.DataFrame | None = None,
    multi_step: bool = True,
    server: ServerTerms | None = None,
) -> Run:
    """Run one scenario end to end and return its tables and summary (nothing is written to disk).

    `workload`: a request table to use instead of `scenario.load_workload()` (compare passes one
    table to every allocator). `multi_step=False` steps every iteration (for checking the jumps).
    `server`: server-level terms (sim/cost/server.py) instead of the scenario's (`kvsim bench replay`).
    """
    wall_start = time.perf_counter()
    requests = workload if workload is not None else scenario.load_workload()
    allocator = scenario.make_allocator()
    terms = scenario_terms(scenario) if server is None else server
    cost = CostModel.from_scenario(scenario, server=terms)
    config = engine_config(scenario, multi_step=multi_step)
    label = scenario.allocator.label
    engine_view, queued_s = frontend_arrivals(
        requests, cost.frontend_service_s, cost.frontend_blocks_engine, terms.frontend_turn_share
    )
    with _progress_bar(progress, len(requests), label) as update:
        result = run_engine(
            engine_view, allocator, cost, config, progress=update, kv_read_time_s=cost.kv_read_time_s
        )
    if terms.output_service_s:
        # the outputs pass through the same loop as the intake (sim/cost/output_path.py)
        intake = None
        if queued_s is not None:
            send_s = requests["arrival_s"].to_numpy(np.float64)
            leave_s = send_s + queued_s[requests["request_id"].to_numpy()]
            share = intake_turn_share(cost.frontend_blocks_engine, terms.frontend_turn_share)
            intake = intake_jobs(send_s, leave_s, cost.frontend_service_s, share)
        apply_output_path(result.requests, result.steps, result.totals, terms.output_service_s, intake)
    add_frontend_latency(result.requests, cost.frontend_s, queued_s)
    wall_s = time.perf_counter() - wall_start
    metrics = summarize(
        result.requests,
        result.steps,
        result.totals,
        capacity_tokens=int(allocator.capacity_tokens),
        kv_bytes_per_token=scenario.kv_bytes_per_token(),
        wall_s=wall_s,
    )
    # Windowed allocators count in layer-slots (allocators/windowed.py); the summary's capacity is tokens.
    metrics["kv_capacity_tokens"] = scenario.kv_capacity_tokens()
    metrics["kv_slots_per_token"] = int(getattr(allocator, "slots_per_token", 1))
    summary: dict[str, Any] = {
        "kvsim_version": sim.__version__,
        "versions": package_versions(),
        "scenario": scenario.to_dict(),
        "seed": scenario.seed,
        "allocator": label,
        "metrics": metrics,
        "cost_model": cost.describe(),
        "workload": {k: v for k, v in requests.attrs.items() if isinstance(v, str | int | float | dict)},
        "engine": {
            "multi_step": multi_step,
            "step_rows_seen": result.totals["step_rows_seen"],
            "step_rows_kept": len(result.steps),
            "step_rows_stride": result.totals["step_rows_stride"],
        },
    }
    return Run(requests=result.requests, steps=result.steps, summary=summary, layouts=result.layouts)


def run_label(allocator: str) -> str:
    """Folder-safe label of an allocator string ('request_limit:oracle' -> 'request_limit-oracle')."""
    return allocator.replace(":", "-").replace("/", "-")


def compare(
    scenario: Scenario,
    allocators: Sequence[str] | None = None,
    *,
    progress: bool = False,
    workload: pd.DataFrame | None = None,
) -> dict[str, Run]:
    """The same workload and seed through several allocators; keys are allocator labels, in order."""
    names = list(allocators) if allocators else list(DEFAULT_COMPARE_ALLOCATORS)
    requests = workload if workload is not None else scenario.load_workload()
    runs: dict[str, Run] = {}
    for name in names:
        variant = scenario.with_overrides(allocator=name)
        label = variant.allocator.label
        if label in runs:
            continue
        runs[label] = simulate(variant, progress=progress, workload=requests)
    return runs
