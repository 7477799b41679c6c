"""`kvsim sweep SPEC.toml` and `kvsim capacity`: thin flag parsing over sim.sweep and sim.capacity.

Why thin: notebooks call `sim.sweep(...)` and `sim.capacity(...)` with the same arguments. Bad specs,
flags and scenarios raise KvsimError subclasses, which `sim.cli.main` prints as one line with exit 2;
a sweep whose cells failed (after the others finished) exits 1.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from sim.cli.scenario_flags import scenario_from_flags, scenario_options


def parse_count_list(text: str, flag: str) -> list[int]:
    """'2K,4096,8k' -> [2048, 4096, 8000] with the one count parser (`sim.scenario.units.parse_count`)."""
    from sim.errors import CapacityError
    from sim.scenario.units import parse_count

    values = [parse_count(item, field=flag) for item in text.split(",") if item.strip()]
    if not values:
        raise CapacityError(f"{flag}: give at least one value (comma-separated)")
    return values


def register(app: typer.Typer) -> None:
    """Add `kvsim sweep` and `kvsim capacity` to the app."""

    @app.command("sweep")
    @scenario_options()
    def sweep_command(
        spec: Annotated[
            Path, typer.Argument(help="Sweep spec TOML: a base scenario plus grid and zip tables.")
        ],
        jobs: Annotated[
            int | None, typer.Option("--jobs", "-j", help="Local worker processes (default: all cores).")
        ] = None,
        scheduler: Annotated[
            str | None, typer.Option("--scheduler", help="Run on a Dask cluster: tcp://HOST:PORT.")
        ] = None,
        dask_local: Annotated[
            int | None, typer.Option("--dask-local", help="Start a Dask LocalCluster with N workers.")
        ] = None,
        output: Annotated[
            Path | None, typer.Option("--output", "-o", help="Sweep folder (default: results/<name>).")
        ] = None,
        progress: Annotated[
            bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")
        ] = True,
        *,
        flags: dict[str, Any],
    ) -> None:
        """Run every cell of a sweep (resumable: finished cells are skipped) and write sweep.parquet.

        The scenario flags (--config, --model, --set, ...) change the spec's base scenario for every cell.
        """
        from sim.sweeps.runner import SWEEP_TABLE, run_sweep
        from sim.sweeps.spec import parse_spec

        parsed = parse_spec(spec)
        if any(value not in (None, []) for value in flags.values()):
            parsed = parse_spec(spec, base=scenario_from_flags(flags, base=parsed.base))
        table, report = run_sweep(
            parsed,
            jobs=jobs,
            scheduler=scheduler,
            dask_local=dask_local,
            output_dir=output,
            progress=progress,
        )
        typer.echo(
            f"{report.total} cells: {report.ran} ran, {report.skipped} already done, "
            f"{len(report.failed)} failed; table: {report.sweep_dir / SWEEP_TABLE} ({len(table)} rows)"
        )
        if report.failed:
            if not progress:  # the progress display already listed them
                for cell_id, error in report.failed.items():
                    typer.echo(f"failed {cell_id}: {error}", err=True)
            raise SystemExit(1)  # typer.Exit's code is lost under standalone_mode=False

    @app.command("capacity")
    @scenario_options(skip=("tensor_parallel_size",))
    def capacity_command(
        allocators: Annotated[
            str | None,
            typer.Option(
                "--allocators", help="Comma-separated, e.g. contiguous,request_limit,paged (default: all)."
            ),
        ] = None,
        slo: Annotated[
            str | None,
            typer.Option(
                "--slo",
                help="'none': no latency bound; the max rate is then the saturation rate "
                "(highest rate with a stationary queue and batch).",
            ),
        ] = None,
        slo_ttft_p99: Annotated[
            str | None, typer.Option("--slo-ttft-p99", help="Bound on p99 time to first token, e.g. 2s.")
        ] = None,
        slo_tpot_p99: Annotated[
            str | None, typer.Option("--slo-tpot-p99", help="Bound on p99 time per output token, e.g. 100ms.")
        ] = None,
        slo_normalized_latency: Annotated[
            str | None,
            typer.Option(
                "--slo-normalized-latency", help="Bound on mean normalized latency, s/token (e.g. 0.2)."
            ),
        ] = None,
        target_rate: Annotated[
            float | None, typer.Option("--target-rate", help="Request rate to serve: GPUs needed (req/s).")
        ] = None,
        tensor_parallel_size: Annotated[
            str | None,
            typer.Option(
                "--tensor-parallel-size",
                help="TP sizes to plan, e.g. 2,4,8 (a size the model does not fit is a skipped row).",
            ),
        ] = None,
        gpu_hour_cost: Annotated[
            float | None,
            typer.Option(
                "--gpu-hour-cost", help="USD per GPU-hour: prints cost per 1M output tokens and per month."
            ),
        ] = None,
        max_model_lens: Annotated[
            str | None,
            typer.Option("--max-model-lens", help="Trade-off values, e.g. 2K,4K,8K (K=1024, k=1000)."),
        ] = None,
        rate_min: Annotated[
            float | None, typer.Option("--rate-min", help="Bisection bracket low (req/s).")
        ] = None,
        rate_max: Annotated[
            float | None, typer.Option("--rate-max", help="Bisection bracket high (req/s).")
        ] = None,
        rate_tol: Annotated[float, typer.Option("--rate-tol", help="Stop when high/low - 1 <= this.")] = 0.05,
        jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Local worker processes.")] = None,
        scheduler: Annotated[
            str | None, typer.Option("--scheduler", help="Dask scheduler tcp://HOST:PORT.")
        ] = None,
        dask_local: Annotated[
            int | None, typer.Option("--dask-local", help="Dask LocalCluster workers.")
        ] = None,
        output: Annotated[
            Path | None, typer.Option("--output", "-o", help="Also write the plan as .json or .csv.")
        ] = None,
        wide: Annotated[
            bool, typer.Option("--wide", help="Every column (default: the key ones, 80 wide).")
        ] = False,
        progress: Annotated[
            bool, typer.Option("--progress/--no-progress", help="Rows and simulations done, on stderr.")
        ] = True,
        *,
        flags: dict[str, Any],
    ) -> None:
        """Per allocator: max sustainable rate, max concurrency, GPUs needed, max_model_len trade-off."""
        wall_start_s = time.perf_counter()  # printed at the end: what one capacity answer costs (issue 16)
        from rich.console import Console

        from sim.cli.capacity_setup import CapacityProgress, capacity_base_scenario, slo_from_flags
        from sim.errors import CapacityError
        from sim.planning.capacity import capacity, check_plan_output

        if (rate_min is None) != (rate_max is None):
            raise CapacityError("--rate-min and --rate-max go together: give both or neither")
        if output is not None:  # refused now, not after every simulation has run
            check_plan_output(output)
        plan_slo = slo_from_flags(slo, slo_ttft_p99, slo_tpot_p99, slo_normalized_latency)
        tp_sizes = (
            None
            if tensor_parallel_size is None
            else parse_count_list(tensor_parallel_size, "--tensor-parallel-size")
        )
        base, notes = capacity_base_scenario(flags, tp_sizes)
        for note in notes:
            typer.echo(note)
        with CapacityProgress(progress) as show:
            plan = capacity(
                base,
                slo=plan_slo,
                allocators=None
                if allocators is None
                else [a.strip() for a in allocators.split(",") if a.strip()],
                target_rate_req_s=target_rate,
                tensor_parallel_sizes=tp_sizes,
                max_model_lens=None
                if max_model_lens is None
                else parse_count_list(max_model_lens, "--max-model-lens"),
                rate_bracket=None if rate_min is None else (rate_min, rate_max),
                rel_tol=rate_tol,
                jobs=jobs,
                scheduler=scheduler,
                dask_local=dask_local,
                gpu_hour_cost=gpu_hour_cost,
                progress=show,
                tally_path=show.tally_path,
            )
        console = Console()
        # never cut a number: a table wider than the terminal is wrapped by it, not cropped by rich
        console.width = max(console.width, plan.table_width(wide=wide))
        console.print(plan.rich_table(wide=wide))
        for name, best in plan.gpu_plan().items():
            console.print(
                f"{name}: {best['gpus']} GPU(s) = {best['replicas']} replica(s) "
                f"x TP {best['tensor_parallel_size']} "
                f"for {target_rate:g} req/s ({best['max_rate_per_replica_req_s']:.3g} req/s per replica)",
                highlight=False,
                soft_wrap=True,
            )
        for line in plan.cost_lines():
            console.print(line, highlight=False, soft_wrap=True)
        for name, reason in plan.skipped.items():
            console.print(f"skipped {name}: {reason}", highlight=False, markup=False, soft_wrap=True)
        for key, reason in plan.skipped_rows.items():
            console.print(f"skipped {key}: {reason}", highlight=False, markup=False, soft_wrap=True)
        size_line = plan.probe_size_line()
        if size_line is not None:
            console.print(size_line, highlight=False, markup=False, soft_wrap=True)
        for line in plan.unmet_lines():
            console.print(line, highlight=False, markup=False, soft_wrap=True)
        for key, error in plan.failures.items():
            console.print(f"[red]failed[/] {key}: {error}", highlight=False, soft_wrap=True)
        if output is not None:
            typer.echo(f"plan written to {plan.write(output)}")
        typer.echo(f"wall time: {time.perf_counter() - wall_start_s:.2f} s")
        if plan.failures:
            raise SystemExit(1)
