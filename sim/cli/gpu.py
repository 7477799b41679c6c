"""`kvsim calibrate` and `kvsim replay`: the GPU side of kvsim (gpu/), as two thin commands.

Why here and not in gpu/: gpu/ must not import sim/ (it runs on bare GPU machines), but `replay`
wants the simulated model's attention shape, which only the run's summary.json and sim.scenario.presets know.
Both commands exit 2 with one line ("error: no CUDA device: ...") on a machine without a GPU; replay
validates the results folder first, so a bad folder is reported even there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def _model_from_results(results_dir: Path) -> dict[str, Any]:
    """Attention shape of the simulated model (per GPU of the TP group) from the first summary.json found."""
    from sim.errors import ResultsError
    from sim.files import read_summary

    for candidate in [results_dir / "summary.json", *sorted(results_dir.glob("*/summary.json"))]:
        if not candidate.is_file():
            continue
        try:
            scenario = read_summary(candidate.parent).get("scenario", {})
        except ResultsError:
            continue
        if not isinstance(scenario, dict):
            continue
        model = scenario.get("model")
        try:
            from sim.scenario.presets import ModelSpec, model_preset

            spec = model_preset(model) if isinstance(model, str) else ModelSpec(**model)
        except Exception:  # an unknown/old model entry: fall back to flags/defaults
            continue
        tp = int(scenario.get("tensor_parallel_size", 1) or 1)
        return {
            "num_q_heads": max(1, spec.num_attention_heads // tp),
            "num_kv_heads": max(1, spec.num_kv_heads // tp),
            "head_dim": spec.head_dim,
            "num_layers": spec.num_layers,
        }
    return {}


def _check_range(flag: str, value: float, low: float, high: float) -> None:
    """One-line GpuError (exit 2) for a flag outside [low, high]."""
    from gpu.errors import GpuError

    if not low <= value <= high:
        raise GpuError(f"{flag} must be in [{low:g}, {high:g}], got {value:g}")


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate(
        output: Path = typer.Option(..., "--output", "-o", help="Profile JSON to write (schema v1)."),
        raw_csv: Path | None = typer.Option(
            None, "--raw-csv", help="Raw timings CSV (default: next to --output)."
        ),
        quick: bool = typer.Option(False, "--quick", help="A small grid for a smoke run."),
        max_point_gb: float = typer.Option(8.0, "--max-point-gb", help="KV memory cap per point."),
        repeats: int = typer.Option(20, "--repeats", help="Timed repeats per point (>= 20)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the random data and shuffled layouts."),
    ) -> None:
        """Measure gather and decode-attention costs on this GPU and write a calibration profile."""
        _check_range("--max-point-gb", max_point_gb, 0.5, 64.0)
        _check_range("--repeats", repeats, 20, 1000)
        from gpu.backend import require_cupy
        from sim.files import adopt_files, check_output_file

        raw_path = raw_csv if raw_csv is not None else output.with_suffix(".raw.csv")
        # gpu/ writes the files (it may not import sim/); the rule on whose files they may replace is
        # checked here, before any measurement, and what was written is recorded as kvsim's after.
        check_output_file(output, "calibrate", what="--output")
        check_output_file(raw_path, "calibrate", what="--raw-csv")
        require_cupy()  # one line and exit 2 without a device, before any work
        from gpu.calibrate import run_calibration, summary_table, write_outputs

        profile, rows = run_calibration(
            seed=seed, quick=quick, max_point_bytes=int(max_point_gb * 1e9), repeats=repeats, log=typer.echo
        )
        write_outputs(profile, rows, output, raw_path)
        adopt_files([output, raw_path], "calibrate")
        typer.echo(summary_table(profile))
        typer.echo(f"wrote {output} and {raw_path}")

    @app.command("replay")
    def replay_cmd(
        results_dir: Path = typer.Argument(..., help="A run (or compare) folder with layouts/ exported."),
        output: Path | None = typer.Option(
            None, "--output", "-o", help="CSV to write (default: RESULTS_DIR/replay.csv)."
        ),
        num_q_heads: int | None = typer.Option(None, "--num-q-heads", help="Default: from summary.json."),
        num_kv_heads: int | None = typer.Option(None, "--num-kv-heads", help="Default: from summary.json."),
        head_dim: int | None = typer.Option(
            None, "--head-dim", help="64 or 128. Default: from summary.json."
        ),
        num_layers: int | None = typer.Option(None, "--num-layers", help="Default: from summary.json."),
        dtype: str | None = typer.Option(None, "--dtype", help="bf16 or fp16."),
        budget_gb: float = typer.Option(8.0, "--budget-gb", help="Replay pool cap (K+V)."),
        max_steps: int | None = typer.Option(None, "--max-steps", help="Replay only the first N steps."),
        repeats: int = typer.Option(20, "--repeats"),
    ) -> None:
        """Time gather and attention on every exported step, next to the cost model's prediction."""
        _check_range("--budget-gb", budget_gb, 0.01, 64.0)
        _check_range("--repeats", repeats, 20, 1000)
        for flag, value in (("--num-q-heads", num_q_heads), ("--num-kv-heads", num_kv_heads),
                            ("--num-layers", num_layers), ("--max-steps", max_steps)):  # fmt: skip
            if value is not None:
                _check_range(flag, value, 1, 1_000_000)
        from gpu.replay import ReplayModel, load_snapshots, replay, replay_table, rows_to_csv
        from sim.files import check_output_file, publish_files, write_error

        load_snapshots(results_dir)  # validate the folder first: a bad folder is reported on any machine
        target = check_output_file(
            output if output is not None else results_dir / "replay.csv", "replay", what="--output"
        )
        model = ReplayModel.resolve(
            _model_from_results(results_dir), num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim, num_layers=num_layers, dtype=dtype,
        )  # fmt: skip
        from gpu.backend import require_cupy

        require_cupy()
        rows = replay(
            results_dir, model, budget_bytes=int(budget_gb * 1e9), repeats=repeats, max_steps=max_steps
        )
        try:
            publish_files(target.parent, "replay", [(target.name, rows_to_csv(rows))])
        except OSError as exc:
            raise write_error("--output", target, exc) from None
        typer.echo(replay_table(rows))
        typer.echo(f"wrote {target}")
