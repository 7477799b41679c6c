"""`kvsim bench replay FILE.json...` and `kvsim bench fit FILE.json... -o PROFILE.json`.

Why a command: a capacity answer is only as good as the whole server's match, so a user must be able
to hold kvsim against their own `vllm bench serve --save-result` files and fit the server-level
terms to them (sim/bench/, sim/cost/server.py). Thin: flags -> sim.bench functions -> text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sim.cli.scenario_flags import scenario_options


def _scenarios(paths: list[Path], flags: dict[str, Any]) -> tuple[list[Any], list[Any], list[str]]:
    """(files, their scenarios, one line per skipped failed run); a single failed run is an error."""
    from sim.bench.results_file import BenchFileError, read_bench_file
    from sim.bench.setup import scenario_for_file
    from sim.cli.scenario_flags import scenario_from_flags

    benches = [read_bench_file(path) for path in paths]
    skipped = [b.failed_run_line() for b in benches if b.failed_run]
    kept = [b for b in benches if not b.failed_run]
    if not kept:
        raise BenchFileError(skipped[0])
    scenarios = [scenario_for_file(b, flags, lambda f: scenario_from_flags(f, name="bench")) for b in kept]
    return kept, scenarios, skipped


STACK_HELP = "Serving stack; default: the shipped terms' or the engine preset's (sim/cost/server.py)."
CustomAllReduce = Annotated[
    bool | None, typer.Option("--custom-all-reduce/--no-custom-all-reduce", help=STACK_HELP)
]
RayWorkers = Annotated[bool | None, typer.Option("--ray-workers/--no-ray-workers", help=STACK_HELP)]
FrontendInEngine = Annotated[
    bool | None, typer.Option("--frontend-in-engine-process/--no-frontend-in-engine-process", help=STACK_HELP)
]


def _given_stack(
    custom_all_reduce: bool | None, ray_workers: bool | None, in_engine: bool | None
) -> dict[str, bool]:
    """The serving-stack flags the user gave, as ServerTerms fields."""
    stack = {
        "custom_all_reduce": custom_all_reduce,
        "ray_workers": ray_workers,
        "frontend_in_engine_process": in_engine,
    }
    return {name: value for name, value in stack.items() if value is not None}


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Replay measured `vllm bench serve` runs and fit the server-level terms.", no_args_is_help=True
    )

    @group.command("replay")
    @scenario_options()
    def replay_command(
        files: Annotated[list[Path], typer.Argument(help="vllm bench serve --save-result JSON files.")],
        flags: dict[str, Any],
        custom_all_reduce: CustomAllReduce = None,
        ray_workers: RayWorkers = None,
        frontend_in_engine_process: FrontendInEngine = None,
    ) -> None:
        """Measured vs simulated per metric (one file), or a row per file and a total; ends `MAPE <n> %`.

        Model, GPU, TP and max_model_len not given as flags are taken from the file's model id and
        a `<N>x<GPU>/..._tp<N>_len<L>.json` path. Server terms: --calibration PROFILE.json (kvsim bench
        fit), else the shipped defaults for the engine and GPU (sim/cost/server.py); the stack flags
        override the serving stack of either.
        """
        from dataclasses import replace as with_fields

        from sim.bench.replay import replay
        from sim.bench.table import many_files_table, one_file_table
        from sim.cost.server import is_bench_profile, scenario_terms, shipped_terms

        kept, scenarios, skipped = _scenarios(files, flags)
        results = []
        for bench, scenario in zip(kept, scenarios, strict=True):
            if is_bench_profile(scenario.calibration):
                terms = scenario_terms(scenario)
            else:
                terms = shipped_terms(scenario.engine, scenario.gpu_spec().name)
            stack = _given_stack(custom_all_reduce, ray_workers, frontend_in_engine_process)
            results.append(replay(bench, scenario, with_fields(terms, **stack)))
        if len(results) == 1 and not skipped:
            typer.echo(one_file_table(results[0]))
        else:
            typer.echo(many_files_table(results, skipped))

    @group.command("fit")
    @scenario_options()
    def fit_command(
        files: Annotated[list[Path], typer.Argument(help="vllm bench serve --save-result JSON files.")],
        output: Annotated[Path, typer.Option("-o", "--output", help="Profile JSON to write.")],
        flags: dict[str, Any],
        custom_all_reduce: CustomAllReduce = None,
        ray_workers: RayWorkers = None,
        frontend_in_engine_process: FrontendInEngine = None,
    ) -> None:
        """Fit frontend_s, frontend_service_s, flops_efficiency_scale and overhead_scale (the stack
        flags fixed); print in-sample and leave-one-file-out error; write a profile for --calibration."""
        from sim.bench.fit import fit_members, grid_table
        from sim.cost.server import ServerTerms, profile_document
        from sim.files import adopt_files, check_output_file, dumps_json, write_file_atomic

        target = check_output_file(output, "calibrate", what="--output")
        if flags.get("calibration") is not None:
            from sim.errors import ScenarioError

            raise ScenarioError(
                "--calibration: bench fit starts from the operator model; do not give a profile"
            )
        kept, scenarios, skipped = _scenarios(files, flags)
        by_file = dict(zip([b.name for b in kept], scenarios, strict=True))
        stack = ServerTerms(**_given_stack(custom_all_reduce, ray_workers, frontend_in_engine_process))
        result = fit_members(grid_table(kept, lambda b: by_file[b.name], stack=stack), range(len(kept)))
        errors = result.error_table()
        fitted_on = [{"file": str(b.path), "sha256": b.sha256, "model_id": b.model_id} for b in kept]
        write_file_atomic(target, dumps_json(profile_document(result.terms, fitted_on, errors)))
        adopt_files([target], "calibrate")
        values = result.terms.values()
        typer.echo("terms: " + ", ".join(f"{name} = {value:g}" for name, value in values.items()))
        typer.echo(f"{'median |error| %':<18} {'in sample':>10} {'leave-one-out':>14}")
        for metric in errors["in_sample"]:
            typer.echo(
                f"{metric:<18} {errors['in_sample'][metric]:>10.1f} {errors['leave_one_out'][metric]:>14.1f}"
            )
        for line in skipped:
            typer.echo(f"skipped {line}")
        typer.echo(f"wrote {target}")

    app.add_typer(group, name="bench")
