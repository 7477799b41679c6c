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
    ("KV token states (%)", "kv_token_states_pct", ".1f"),
    ("KV reservation (%)", "kv_reservation_pct", ".1f"),
    ("KV internal frag. (%)", "kv_internal_pct", ".1f"),
    ("KV external frag. (%)", "kv_external_pct", ".1f"),
    ("KV duplicated (%)", "kv_duplicated_pct", ".1f"),
    ("KV out of window (%)", "kv_out_of_window_pct", ".1f"),
    ("KV free (%)", "kv_free_pct", ".1f"),
    ("waste (% of allocated)", "waste_pct", ".1f"),
    ("mean / max concurrency (seqs)", "_concurrency", ""),
    ("mean / max queue length", "_queue", ""),
)


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
    }
    if key == "_requests":
        return f"{metrics['completed']:,} / {metrics['rejected']:,}"
    if key in pairs:
        a, b = pairs[key]
        return f"{_fmt(metrics.get(a), '.1f')} / {_fmt(metrics.get(b), '.1f')}"
    if key == "_concurrency":
        return f"{_fmt(metrics.get('mean_concurrency'), '.1f')} / {metrics.get('max_concurrency', 0)}"
    if key == "_queue":
        return f"{_fmt(metrics.get('mean_queue_length'), '.1f')} / {metrics.get('max_queue_length', 0)}"
    return _fmt(metrics.get(key), spec)


def build_scenario(config: Path | None, overrides: dict[str, Any]) -> Any:
    """The scenario from --config (or the embedded default) with the given flags on top.

    Overrides go through `with_overrides` in both cases, so a dotted key into a preset
    (`model.num_layers`) works the same with and without a config file.
    """
    from sim.scenario.scenario import default_scenario

    given = {key: value for key, value in overrides.items() if value is not None}
    base = _load_config(config) if config is not None else default_scenario()
    scenario = base.with_overrides(**given)
    if "workload.time_scale" in given and "workload.request_rate" not in given:
        scenario = _keep_trace_rate(scenario)
    return scenario


def _keep_trace_rate(scenario: Any) -> Any:
    """The scenario with workload.request_rate cleared: a time scale replays the trace's own timestamps.

    Why: `workloads.load` refuses time_scale together with request_rate (ambiguous), and the default
    scenario has a rate, so `--time-scale 2` alone would always fail. None cannot travel through
    `with_overrides` (None means "not given" there), hence the explicit rebuild.
    """
    from sim.scenario.scenario import Scenario

    data = scenario.model_dump(exclude_unset=True)
    workload = data.get("workload")
    data["workload"] = dict(workload) if isinstance(workload, dict) else scenario.workload.model_dump()
    data["workload"]["request_rate"] = None
    return Scenario(**data)


def _load_config(config: Path) -> Any:
    from sim.scenario.scenario import Scenario

    return Scenario.from_toml(config)


def parse_set_value(text: str) -> Any:
    """A `--set` value: a TOML literal (0.7, true, [1, 2], "x") when it parses as one, else the text.

    Why TOML: scenario files are TOML, so `--set k=v` means what `k = v` means in a file; bare words
    (`paged`, `12GiB`, `gamma(cv=3)`) stay strings so nobody has to quote them in a shell. TOML dates
    are kept as text: no scenario field is a date.
    """
    import datetime
    import tomllib

    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text
    if isinstance(value, datetime.date | datetime.time):
        return text
    return value


def parse_set_pairs(pairs: list[str]) -> dict[str, Any]:
    """`--set dotted.key=value` pairs as overrides; an unknown key raises ScenarioError listing valid ones."""
    from sim.errors import ScenarioError
    from sim.scenario.scenario import check_field

    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ScenarioError(f"--set: expected KEY=VALUE, e.g. hbm_efficiency=0.7 (got {pair!r})")
        check_field(key)
        overrides[key] = parse_set_value(text.strip())
    return overrides


def merge_overrides(flags: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    """Named flags plus `--set` pairs; the same field given both ways is refused (which one would win?)."""
    from sim.errors import ScenarioError

    both = [key for key in sets if flags.get(key) is not None]
    if both:
        raise ScenarioError(f"--set {both[0]}: already given by its own flag; give it once")
    return {**flags, **sets}


def _print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    Console(width=max(100, 36 + 22 * len(columns))).print(table)


def _show_progress(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


# Shared flags (typer needs them spelled out per command; these helpers keep them identical).
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Scenario TOML file; flags override it.")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Model preset (kvsim presets).")]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help="GPU preset (kvsim presets).")]
BlockOpt = Annotated[int | None, typer.Option("--block-size", help="Tokens per KV block (paged).")]
KvDtypeOpt = Annotated[
    str | None,
    typer.Option("--kv-cache-dtype", help="KV cache dtype as in vLLM: auto | fp8 | fp8_e4m3 | fp8_e5m2."),
]
UtilOpt = Annotated[
    float | None, typer.Option("--gpu-memory-utilization", help="Fraction of GPU memory used.")
]
KvMemOpt = Annotated[str | None, typer.Option("--kv-cache-memory", help="KV budget per GPU, e.g. 12GiB.")]
MaxLenOpt = Annotated[int | None, typer.Option("--max-model-len", help="Max context (prompt + output).")]
SeqsOpt = Annotated[int | None, typer.Option("--max-num-seqs", help="Max running sequences per step.")]
BatchOpt = Annotated[int | None, typer.Option("--max-num-batched-tokens", help="Token budget per step.")]
ChunkOpt = Annotated[
    bool | None, typer.Option("--enable-chunked-prefill/--no-enable-chunked-prefill", help="Chunked prefill.")
]
PrefixOpt = Annotated[
    bool | None, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching", help="Prefix caching.")
]
PreemptOpt = Annotated[
    str | None, typer.Option("--preemption-mode", help="recompute | swap | auto (vllm-v0's own choice).")
]
EngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help="Engine preset: vllm-v0 (the vLLM paper's, default) or vllm-v1 (today's); docs/engines.md.",
    ),
]
RateOpt = Annotated[float | None, typer.Option("--request-rate", help="Mean arrival rate (req/s).")]
PromptsOpt = Annotated[int | None, typer.Option("--num-prompts", help="Number of requests.")]
DurationOpt = Annotated[
    str | None, typer.Option("--duration", help="Keep requests arriving within, e.g. 10m.")
]
WorkloadOpt = Annotated[str | None, typer.Option("--workload", help="Workload preset or trace file.")]
AllocatorOpt = Annotated[str | None, typer.Option("--allocator", help="e.g. paged, request_limit:oracle.")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed.")]
TpOpt = Annotated[int | None, typer.Option("--tensor-parallel-size", help="GPUs per model replica.")]
CalibOpt = Annotated[
    str | None, typer.Option("--calibration", help="Calibration profile JSON (kvsim calibrate).")
]
LayoutsOpt = Annotated[
    int | None, typer.Option("--export-layouts", help="Write a layout snapshot every N steps.")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="No progress bar.")]
NameOpt = Annotated[str | None, typer.Option("--name", help="Scenario name (default results folder).")]
SwapOpt = Annotated[
    str | None,
    typer.Option("--swap-space", help="CPU swap space per GPU: GiB as in vLLM (4) or a size (8GiB)."),
]
TimeScaleOpt = Annotated[
    float | None, typer.Option("--time-scale", help="Multiply trace arrival times (2 = half as fast).")
]
FormatOpt = Annotated[str | None, typer.Option("--format", help="Trace format; detected by default.")]
BadRowOpt = Annotated[
    str | None, typer.Option("--on-bad-row", help="Bad trace rows: error (default) or skip (and count).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Any scenario field, dotted: --set hbm_efficiency=0.7 --set workload.params.lengths=... "
        "(TOML values; repeatable).",
    ),
]


def _swap_space(text: str | None) -> str | None:
    """vLLM's --swap-space is in GiB; a plain number here means the same, a unit is taken as given."""
    if text is None:
        return None
    try:
        return f"{float(text)}GiB"
    except ValueError:
        return text


def _overrides(**flags: Any) -> dict[str, Any]:
    """Flag values keyed by scenario field (dotted where nested); None = not given."""
    return {
        "model": flags["model"],
        "gpu": flags["gpu"],
        "block_size": flags["block_size"],
        "kv_cache_dtype": flags.get("kv_cache_dtype"),
        "gpu_memory_utilization": flags["gpu_memory_utilization"],
        "kv_cache_memory": flags["kv_cache_memory"],
        "max_model_len": flags["max_model_len"],
        "max_num_seqs": flags["max_num_seqs"],
        "max_num_batched_tokens": flags["max_num_batched_tokens"],
        "enable_chunked_prefill": flags["enable_chunked_prefill"],
        "enable_prefix_caching": flags["enable_prefix_caching"],
        "preemption_mode": flags["preemption_mode"],
        "engine": flags["engine"],
        "workload.request_rate": flags["request_rate"],
        "num_prompts": flags["num_prompts"],
        "duration_s": flags["duration"],
        "workload.source": flags["workload"],
        "allocator": flags.get("allocator"),
        "seed": flags["seed"],
        "tensor_parallel_size": flags["tensor_parallel_size"],
        "calibration": flags["calibration"],
        "export_layouts_every": flags["export_layouts"],
        "name": flags["name"],
        "swap_space": _swap_space(flags["swap_space"]),
        "workload.time_scale": flags["time_scale"],
        "workload.fmt": flags["fmt"],
        "workload.on_bad_row": flags["on_bad_row"],
    }


def scenario_from_flags(flags: dict[str, Any]) -> Any:
    """The Scenario a command's flags describe (--config, named flags, then --set pairs)."""
    from sim.files import plain_name

    if flags["name"] is not None:
        plain_name(flags["name"])  # it names the default results folder: results/<name>
    overrides = merge_overrides(_overrides(**flags), parse_set_pairs(flags["set_pairs"] or []))
    return build_scenario(flags["config"], overrides)


def register(app: typer.Typer) -> None:
    """Add `kvsim run`, `kvsim compare` and `kvsim presets` to the app."""

    @app.command("run")
    def run_command(
        config: ConfigOpt = None,
        model: ModelOpt = None,
        gpu: GpuOpt = None,
        block_size: BlockOpt = None,
        gpu_memory_utilization: UtilOpt = None,
        kv_cache_memory: KvMemOpt = None,
        max_model_len: MaxLenOpt = None,
        max_num_seqs: SeqsOpt = None,
        max_num_batched_tokens: BatchOpt = None,
        enable_chunked_prefill: ChunkOpt = None,
        enable_prefix_caching: PrefixOpt = None,
        preemption_mode: PreemptOpt = None,
        engine: EngineOpt = None,
        request_rate: RateOpt = None,
        num_prompts: PromptsOpt = None,
        duration: DurationOpt = None,
        workload: WorkloadOpt = None,
        allocator: AllocatorOpt = None,
        seed: SeedOpt = None,
        tensor_parallel_size: TpOpt = None,
        calibration: CalibOpt = None,
        export_layouts: LayoutsOpt = None,
        name: NameOpt = None,
        swap_space: SwapOpt = None,
        time_scale: TimeScaleOpt = None,
        fmt: FormatOpt = None,
        on_bad_row: BadRowOpt = None,
        set_pairs: SetOpt = None,
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Results folder.")] = None,
        quiet: QuietOpt = False,
        kv_cache_dtype: KvDtypeOpt = None,
    ) -> None:
        """Simulate one scenario, print its summary and write its results folder."""
        from sim.api import simulate
        from sim.files import plain_name
        from sim.results import check_run_dir, write_run

        flags = dict(locals())
        scenario = scenario_from_flags(flags)
        if output is None:
            output = Path("results") / plain_name(scenario.name, what="scenario name")
        target = check_run_dir(output)
        run = simulate(scenario, progress=_show_progress(quiet))
        target = write_run(run, target)
        label = run.allocator
        rows = [[name, summary_cell(run.metrics, key, spec)] for name, key, spec in SUMMARY_ROWS]
        _print_table(
            f"kvsim run: {scenario.name} ({label}, {scenario.engine}, seed {scenario.seed})", [label], rows
        )
        typer.echo(f"results written to {target}")

    @app.command("compare")
    def compare_command(
        config: ConfigOpt = None,
        allocators: Annotated[
            str | None,
            typer.Option("--allocators", help="Comma-separated allocators (default: the paper's six)."),
        ] = None,
        model: ModelOpt = None,
        gpu: GpuOpt = None,
        block_size: BlockOpt = None,
        gpu_memory_utilization: UtilOpt = None,
        kv_cache_memory: KvMemOpt = None,
        max_model_len: MaxLenOpt = None,
        max_num_seqs: SeqsOpt = None,
        max_num_batched_tokens: BatchOpt = None,
        enable_chunked_prefill: ChunkOpt = None,
        enable_prefix_caching: PrefixOpt = None,
        preemption_mode: PreemptOpt = None,
        engine: EngineOpt = None,
        request_rate: RateOpt = None,
        num_prompts: PromptsOpt = None,
        duration: DurationOpt = None,
        workload: WorkloadOpt = None,
        seed: SeedOpt = None,
        tensor_parallel_size: TpOpt = None,
        calibration: CalibOpt = None,
        export_layouts: LayoutsOpt = None,
        name: NameOpt = None,
        swap_space: SwapOpt = None,
        time_scale: TimeScaleOpt = None,
        fmt: FormatOpt = None,
        on_bad_row: BadRowOpt = None,
        set_pairs: SetOpt = None,
        output: Annotated[
            Path, typer.Option("--output", "-o", help="Parent folder: one results folder per allocator.")
        ] = Path("results/compare"),
        quiet: QuietOpt = False,
        kv_cache_dtype: KvDtypeOpt = None,
    ) -> None:
        """Run the same workload and seed through several allocators and print them side by side."""
        from sim.api import DEFAULT_COMPARE_ALLOCATORS, compare, run_label
        from sim.errors import ScenarioError
        from sim.files import check_output_folder, ensure_folder
        from sim.results import check_run_dir, write_run

        flags = dict(locals())
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
        runs = compare(scenario, names, progress=_show_progress(quiet))
        ensure_folder(output, "compare", what="compare folder")
        written = [write_run(run, output / run_label(label)) for label, run in runs.items()]
        labels = list(runs)
        rows = [
            [name, *(summary_cell(runs[label].metrics, key, spec) for label in labels)]
            for name, key, spec in SUMMARY_ROWS
        ]
        _print_table(
            f"kvsim compare: {scenario.name} ({scenario.engine}, seed {scenario.seed})", labels, rows
        )
        from sim.reports.report import report

        report_path = report(written, Path(output))
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
    ) -> None:
        """List the model and GPU presets (and what they imply for KV memory); --model: one model."""
        from rich.console import Console
        from rich.table import Table

        from sim.scenario.presets import gpu_rows, model_rows

        if model is not None:
            from sim.scenario.model_report import model_kv_lines

            for line in model_kv_lines(model, kv_cache_dtype, tensor_parallel_size):
                typer.echo(line)
            return

        console = Console(width=140)
        models = Table(title="models", title_justify="left")
        for column in (
            "name",
            "layers",
            "heads",
            "kv heads",
            "head dim",
            "params (B)",
            "max context",
            "KV/token",
        ):
            models.add_column(column, justify="left" if column == "name" else "right")
        for row in model_rows():
            models.add_row(
                str(row["name"]),
                str(row["num_layers"]),
                str(row["num_attention_heads"]),
                str(row["num_kv_heads"]),
                str(row["head_dim"]),
                f"{row['num_params'] / 1e9:.1f}",
                f"{row['max_context_tokens']:,}",
                f"{row['kv_bytes_per_token'] / 1024:,.0f} KiB",
            )
        console.print(models)
        gpus = Table(title="GPUs", title_justify="left")
        for column in ("name", "memory", "HBM (TB/s)", "dense BF16 (TFLOP/s)", "PCIe (GB/s)"):
            gpus.add_column(column, justify="left" if column == "name" else "right")
        for row in gpu_rows():
            gpus.add_row(
                str(row["name"]),
                f"{row['memory_bytes'] / 1024**3:.0f} GiB",
                f"{row['hbm_bandwidth_bytes_per_s'] / 1e12:.2f}",
                f"{row['peak_flops'] / 1e12:.0f}",
                f"{row['pcie_bandwidth_bytes_per_s'] / 1e9:.0f}",
            )
        console.print(gpus)
