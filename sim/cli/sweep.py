"""`kvsim sweep SPEC.toml` and `kvsim capacity`: thin flag parsing over sim.sweep and sim.capacity.

Why thin: notebooks call `sim.sweep(...)` and `sim.capacity(...)` with the same arguments. Bad specs,
flags and scenarios raise KvsimError subclasses, which `sim.cli.main` prints as one line with exit 2;
a sweep whose cells failed (after the others finished) exits 1.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated

import typer

_HUMAN_INT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
_HUMAN_SCALE = {"": 1, "k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}


def parse_human_int_list(text: str, flag: str) -> list[int]:
    """'2K,4096,8k' -> [2048, 4096, 8000]: vLLM's convention (k = 1000, K = 1024)."""
    from sim.planning.capacity import CapacityError

    values = []
    for item in text.split(","):
        if not item.strip():
            continue
        match = _HUMAN_INT.match(item)
        if match is None:
            raise CapacityError(
                f"{flag}: {item.strip()!r} is not an integer such as 4096, 4K (4096) or 4k (4000)"
            )
        number = float(match.group(1)) * _HUMAN_SCALE[match.group(2)]
        if number != int(number) or number < 1:
            raise CapacityError(f"{flag}: {item.strip()!r} must be a whole number >= 1")
        values.append(int(number))
    if not values:
        raise CapacityError(f"{flag}: give at least one value (comma-separated)")
    return values


def register(app: typer.Typer) -> None:
    """Add `kvsim sweep` and `kvsim capacity` to the app."""

    @app.command("sweep")
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
    ) -> None:
        """Run every cell of a sweep (resumable: finished cells are skipped) and write sweep.parquet."""
        from sim.sweeps.runner import SWEEP_TABLE, run_sweep

        table, report = run_sweep(
            spec, jobs=jobs, scheduler=scheduler, dask_local=dask_local, output_dir=output, progress=progress
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
    def capacity_command(
        scenario: Annotated[
            Path | None, typer.Option("--scenario", help="Base scenario TOML (default: the paper's setting).")
        ] = None,
        model: Annotated[str | None, typer.Option("--model", help="Model preset, e.g. Llama-3-8B.")] = None,
        gpu: Annotated[str | None, typer.Option("--gpu", help="GPU preset, e.g. H100-80GB.")] = None,
        workload: Annotated[
            str | None, typer.Option("--workload", help="Workload preset or trace path (e.g. sharegpt).")
        ] = None,
        num_prompts: Annotated[
            int | None, typer.Option("--num-prompts", help="Requests per simulation.")
        ] = None,
        seed: Annotated[int | None, typer.Option("--seed", help="Seed of every simulation.")] = None,
        kv_cache_memory: Annotated[
            str | None, typer.Option("--kv-cache-memory", help="KV budget per GPU, e.g. 12GiB.")
        ] = None,
        gpu_memory_utilization: Annotated[
            float | None, typer.Option("--gpu-memory-utilization", help="Fraction of GPU memory for vLLM.")
        ] = None,
        max_model_len: Annotated[
            int | None, typer.Option("--max-model-len", help="The scenario's own max_model_len.")
        ] = None,
        max_num_seqs: Annotated[int | None, typer.Option("--max-num-seqs")] = None,
        block_size: Annotated[int | None, typer.Option("--block-size")] = None,
        allocators: Annotated[
            str | None,
            typer.Option(
                "--allocators", help="Comma-separated, e.g. contiguous,request_limit,paged (default: all)."
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
            typer.Option("--tensor-parallel-size", help="TP sizes to try for the GPU count, e.g. 1,2."),
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
    ) -> None:
        """Per allocator: max sustainable rate, max concurrency, GPUs needed, max_model_len trade-off."""
        wall_start_s = time.perf_counter()  # printed at the end: what one capacity answer costs (issue 16)
        from rich.console import Console

        from sim.planning.capacity import CapacityError, Slo, capacity, check_plan_output
        from sim.scenario.scenario import Scenario, default_scenario
        from sim.scenario.units import parse_duration_s

        if (rate_min is None) != (rate_max is None):
            raise CapacityError("--rate-min and --rate-max go together: give both or neither")
        if output is not None:  # refused now, not after every simulation has run
            check_plan_output(output)
        slo = Slo(
            ttft_p99_s=None
            if slo_ttft_p99 is None
            else parse_duration_s(slo_ttft_p99, field="--slo-ttft-p99"),
            tpot_p99_s=None
            if slo_tpot_p99 is None
            else parse_duration_s(slo_tpot_p99, field="--slo-tpot-p99"),
            normalized_latency_s_per_token=(
                None
                if slo_normalized_latency is None
                else parse_duration_s(slo_normalized_latency, field="--slo-normalized-latency")
            ),
        )
        if scenario is not None:
            base = Scenario.from_toml(scenario)
        elif model is None and gpu is None:
            base = default_scenario()  # the vLLM paper's setting: OPT-13B, A100-40GB, 12 GiB of KV
        else:  # another model or GPU: vLLM's defaults (budget from gpu_memory_utilization, model's context)
            base = Scenario(name="capacity")
        overrides = {
            "model": model,
            "gpu": gpu,
            "workload.source": workload,
            "num_prompts": num_prompts,
            "seed": seed,
            "kv_cache_memory": kv_cache_memory,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "block_size": block_size,
        }
        base = base.with_overrides(**{k: v for k, v in overrides.items() if v is not None})
        plan = capacity(
            base,
            slo=slo,
            allocators=None
            if allocators is None
            else [a.strip() for a in allocators.split(",") if a.strip()],
            target_rate_req_s=target_rate,
            tensor_parallel_sizes=(
                None
                if tensor_parallel_size is None
                else parse_human_int_list(tensor_parallel_size, "--tensor-parallel-size")
            ),
            max_model_lens=None
            if max_model_lens is None
            else parse_human_int_list(max_model_lens, "--max-model-lens"),
            rate_bracket=None if rate_min is None else (rate_min, rate_max),
            rel_tol=rate_tol,
            jobs=jobs,
            scheduler=scheduler,
            dask_local=dask_local,
        )
        console = Console()
        if not console.is_terminal:  # a pipe or a file: do not squeeze the table into 80 columns
            console.width = max(console.width, 160)
        console.print(plan.rich_table())
        for name, best in plan.gpu_plan().items():
            console.print(
                f"{name}: {best['gpus']} GPU(s) = {best['replicas']} replica(s) "
                f"x TP {best['tensor_parallel_size']} "
                f"for {target_rate:g} req/s ({best['max_rate_per_replica_req_s']:.3g} req/s per replica)",
                highlight=False,
            )
        for key, error in plan.failures.items():
            console.print(f"[red]failed[/] {key}: {error}", highlight=False)
        if output is not None:
            typer.echo(f"plan written to {plan.write(output)}")
        typer.echo(f"wall time: {time.perf_counter() - wall_start_s:.2f} s")
        if plan.failures:
            raise SystemExit(1)
