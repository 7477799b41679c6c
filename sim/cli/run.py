"""`kvsim run`, `kvsim compare` and `kvsim presets`: flags with vLLM's names over sim.simulate/compare.

Why so thin: a run is `sim.simulate(scenario)` and a comparison is `sim.compare(scenario, ...)`;
this module only turns flags (and an optional TOML file) into a Scenario, writes the results
folders, and prints rich tables. Bad input raises ScenarioError etc., which `sim.cli.main` prints
as one line with exit code 2.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from sim.cli.scenario_flags import ALLOCATOR_FLAG, LAYOUTS_FLAG, scenario_from_flags, scenario_options
from sim.core.taxonomy import PART_LABELS, SHOWN_PARTS

# (label, metrics key, format) rows of the summary tables.
SUMMARY_ROWS: tuple[tuple[str, str, str], ...] = (
    ("requests (completed / rejected)", "_requests", ""),
    ("preemptions", "preemptions", "int"),
    ("simulated duration (s)", "duration_s", ".1f"),
    ("wall time (s)", "wall_s", ".2f"),
    ("request throughput (req/s)", "request_throughput", ".3f"),
    ("output throughput (tok/s)", "output_throughput", ".1f"),
    ("mean / p99 TTFT (ms)", "_ttft", ""),
    ("mean / p99 TPOT (ms)", "_tpot", ""),
    ("mean / p99 E2E latency (ms)", "_e2el", ""),
    ("mean normalized latency (s/token)", "mean_normalized_latency_s_per_token", ".4f"),
    # The taxonomy as one partition of capacity (sim/core/taxonomy.py): cached blocks are free.
    *((f"KV {PART_LABELS[part]} (%)", f"kv_{part}_pct", ".1f") for part in SHOWN_PARTS),
    ("waste (% of allocated)", "waste_pct", ".1f"),
    ("mean / max concurrency (seqs)", "_concurrency", ""),
    ("mean / max queue length", "_queue", ""),
)

# Rows of runs with a CPU tier (--kv-offloading-size; docs/metrics.md "CPU tier"), after the others.
CPU_TIER_ROWS: tuple[tuple[str, str, str], ...] = (
    ("prefix hits on GPU / CPU (% tokens)", "_prefix_hits", ""),
    ("KV loaded / stored over PCIe (GiB)", "_offload_bytes", ""),
    ("CPU tier mean / peak used (%)", "_offload_used", ""),
)


def summary_rows_for(metrics_list: list[dict[str, Any]]) -> tuple[tuple[str, str, str], ...]:
    """SUMMARY_ROWS, with the CPU tier's rows when any of the runs had one."""
    if any("prefix_hit_cpu_pct" in metrics for metrics in metrics_list):
        return (*SUMMARY_ROWS, *CPU_TIER_ROWS)
    return SUMMARY_ROWS


def _gib(value: Any) -> Any:
    return None if value is None else value / 1024**3


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if spec == "int":
        return f"{int(value):,}"
    return format(value, spec) if spec else str(value)


def summary_cell(metrics: dict[str, Any], key: str, spec: str) -> str:
    """One cell of the summary table (composite rows start with '_')."""
    pairs = {
        "_ttft": ("mean_ttft_ms", "p99_ttft_ms"),
        "_tpot": ("mean_tpot_ms", "p99_tpot_ms"),
        "_e2el": ("mean_e2el_ms", "p99_e2el_ms"),
        "_prefix_hits": ("prefix_hit_gpu_pct", "prefix_hit_cpu_pct"),
        "_offload_used": ("kv_offload_mean_used_pct", "kv_offload_peak_used_pct"),
    }
    if key == "_requests":
        return f"{metrics['completed']:,} / {metrics['rejected']:,}"
    if key in pairs:
        a, b = pairs[key]
        return f"{_fmt(metrics.get(a), '.1f')} / {_fmt(metrics.get(b), '.1f')}"
    if key == "_offload_bytes":
        loaded, stored = (
            _gib(metrics.get("kv_offload_loaded_bytes")),
            _gib(metrics.get("kv_offload_stored_bytes")),
        )
        return f"{_fmt(loaded, '.1f')} / {_fmt(stored, '.1f')}"
    if key == "_concurrency":
        return f"{_fmt(metrics.get('mean_concurrency'), '.1f')} / {metrics.get('max_concurrency', 0)}"
    if key == "_queue":
        return f"{_fmt(metrics.get('mean_queue_length'), '.1f')} / {metrics.get('max_queue_length', 0)}"
    return _fmt(metrics.get(key), spec)


def _print_table(title: str, columns: list[str], rows: list[list[str]], wide: bool = False) -> None:
    """The summary table: one column per run, split into several tables to fit 80 columns unless wide."""
    from sim.cli.tables import console, print_column_chunks

    print_column_chunks(console(wide), title, "metric", columns, rows, wide)


def _show_progress(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


def say_clock(summary: dict[str, Any]) -> None:
    """One line above the results: which clock the workload ran on and how many rows it replayed.

    Why: a trace replayed at another rate or cut short answers another question (issue 20 §3), so the
    table says what was replayed. Printed after the run, so a bad scenario still gets one error line.
    """
    clock = summary.get("workload", {}).get("clock")
    if clock is not None:
        typer.echo(clock["line"])


QuietOpt = Annotated[bool, typer.Option("--quiet", help="No progress bar.")]
WideOpt = Annotated[
    bool, typer.Option("--wide", help="One table with every column, wider than 80 columns if need be.")
]


def register(app: typer.Typer) -> None:
    """Add `kvsim run`, `kvsim compare` and `kvsim presets` to the app."""

    @app.command("run")
    @scenario_options(ALLOCATOR_FLAG, LAYOUTS_FLAG)
    def run_command(
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Results folder.")] = None,
        quiet: QuietOpt = False,
        *,
        flags: dict[str, Any],
    ) -> None:
        """Simulate one scenario, print its summary and write its results folder."""
        from sim.api import simulate
        from sim.files import plain_name
        from sim.output_lock import claim_output
        from sim.results import check_run_dir, write_run

        scenario = scenario_from_flags(flags)
        if output is None:
            output = Path("results") / plain_name(scenario.name, what="scenario name")
        target = check_run_dir(output)
        with claim_output(target, what="results folder"):  # one writer; nothing left if it fails
            run = simulate(scenario, progress=_show_progress(quiet))
            say_clock(run.summary)
            target = write_run(run, target)
        label = run.allocator
        rows = [
            [name, summary_cell(run.metrics, key, spec)]
            for name, key, spec in summary_rows_for([run.metrics])
        ]
        _print_table(
            f"kvsim run: {scenario.name} ({label}, {scenario.engine}, seed {scenario.seed})", [label], rows
        )
        typer.echo(f"results written to {target}")

    @app.command("compare")
    @scenario_options(LAYOUTS_FLAG)
    def compare_command(
        allocators: Annotated[
            str | None,
            typer.Option("--allocators", help="Comma-separated allocators (default: the paper's six)."),
        ] = None,
        output: Annotated[
            Path, typer.Option("--output", "-o", help="Parent folder: one results folder per allocator.")
        ] = Path("results/compare"),
        quiet: QuietOpt = False,
        wide: WideOpt = False,
        *,
        flags: dict[str, Any],
    ) -> None:
        """Run the same workload and seed through several allocators and print them side by side."""
        from sim.api import DEFAULT_COMPARE_ALLOCATORS, compare, run_label
        from sim.errors import ScenarioError
        from sim.files import check_output_folder, ensure_folder
        from sim.output_lock import claim_output
        from sim.results import check_run_dir, write_run

        names = None
        if allocators is not None:
            names = [name.strip() for name in allocators.split(",") if name.strip()]
            if not names:
                raise ScenarioError("--allocators: give at least one allocator, e.g. paged,contiguous")
        scenario = scenario_from_flags(flags)
        # The folder and every run folder are checked before the first simulation (each may take
        # minutes): a compare folder holds only kvsim's runs and report (`sim.files`).
        output = check_output_folder(output, "compare", what="compare folder")
        for allocator_name in names or DEFAULT_COMPARE_ALLOCATORS:
            label = scenario.with_overrides(allocator=allocator_name).allocator.label
            check_run_dir(output / run_label(label))
        with claim_output(output, what="compare folder"):  # one writer; nothing left if it fails
            runs = compare(scenario, names, progress=_show_progress(quiet))
            say_clock(next(iter(runs.values())).summary)  # one table for every allocator: one clock
            ensure_folder(output, "compare", what="compare folder")
            written = [write_run(run, output / run_label(label)) for label, run in runs.items()]
            from sim.reports.publish import report

            report_path = report(written, Path(output))
        labels = list(runs)
        rows = [
            [name, *(summary_cell(runs[label].metrics, key, spec) for label in labels)]
            for name, key, spec in summary_rows_for([run.metrics for run in runs.values()])
        ]
        _print_table(
            f"kvsim compare: {scenario.name} ({scenario.engine}, seed {scenario.seed})", labels, rows, wide
        )
        typer.echo(f"report written to {report_path}")
        typer.echo(
            f"results written to {Path(output)} ({len(written)} runs: {', '.join(p.name for p in written)})"
        )

    @app.command("presets")
    def presets_command(
        model: Annotated[
            str | None,
            typer.Option("--model", help="One model (preset name or config.json): its KV per token."),
        ] = None,
        kv_cache_dtype: Annotated[
            str, typer.Option("--kv-cache-dtype", help="auto | fp8 | fp8_e4m3 | fp8_e5m2 (with --model).")
        ] = "auto",
        tensor_parallel_size: Annotated[
            int, typer.Option("--tensor-parallel-size", help="GPUs per replica (with --model).")
        ] = 1,
        wide: WideOpt = False,
    ) -> None:
        """List the model and GPU presets (and what they imply for KV memory); --model: one model."""
        if model is not None:
            from sim.scenario.model_report import model_kv_lines

            for line in model_kv_lines(model, kv_cache_dtype, tensor_parallel_size):
                typer.echo(line)
            return
        from sim.cli.presets_table import print_presets
        from sim.cli.tables import console

        print_presets(console(wide), wide)
