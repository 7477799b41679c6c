"""`kvsim workload describe|list`: look at a workload before simulating it.

Why a thin layer: everything here is `workloads.load`, `workloads.describe` and `workloads.plot`;
this module only parses flags and prints. Errors are `WorkloadError`s, which sim.cli turns into
`error: ...` and exit code 2.
"""

from __future__ import annotations

import json
import math
from typing import Any

import typer

from workloads.errors import WorkloadError


def _parse_params(pairs: list[str]) -> dict[str, Any]:
    """`--param key=value` pairs; values become int, float or stay text (e.g. 'gamma(cv=3)')."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise WorkloadError(f"expected KEY=VALUE (got {pair!r})", field="param")
        value: Any = text.strip()
        for convert in (int, float):
            try:
                value = convert(text)
                break
            except ValueError:
                continue
        params[key] = value
    return params


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def format_summary(summary: dict[str, Any]) -> str:
    """The describe() dict as aligned text lines."""
    lines = [
        f"source            {summary['source']}"
        + (f"  (format: {summary['format']})" if summary["format"] else ""),
        f"requests          {summary['count']:,}",
        f"time span         {_fmt(summary['span_s'])} s",
        f"mean rate         {_fmt(summary['mean_rate'], 3)}" + (" req/s" if summary["mean_rate"] else ""),
        f"inter-arrival CV  {_fmt(summary['interarrival_cv'], 3)}  (1 = Poisson, > 1 bursty)",
    ]
    if "closed_loop" in summary:
        loop = summary["closed_loop"]
        lines.append(
            f"closed loop       {loop['users']} users, think {loop['think_s']} s (arrivals set by the engine)"
        )
    header = f"{'tokens':<16}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}"
    lines += ["", header]
    for column in ("prompt_tokens", "output_tokens", "max_tokens"):
        stats = summary[column]
        cells = "".join(
            f"{_fmt(stats[k], 0 if k != 'mean' else 1):>10}" for k in ("mean", "p50", "p90", "p99", "max")
        )
        lines.append(f"{column:<16}{cells}")
    lines.append("")
    ratio = summary["prefix_hit_ratio"]
    if ratio is not None:
        lines.append(f"prefix hit ratio  {100 * ratio:.1f} % of prompt tokens (infinite prefix cache)")
    else:
        lines.append("prefix hit ratio  n/a (no prefix information)")
    lines.append(f"clipped requests  {summary['clipped_requests']:,}")
    lines.append(f"skipped rows      {summary['skipped_rows']:,}")
    labels = {
        "over_length_prompts": "over-long prompts",  # longer than --max-model-len, left for the engine
        "clipped_max_tokens": "clipped limits",  # max_tokens cut to fit --max-model-len
        "sessions": "sessions",
        "n_mean": "mean n",
    }
    for key, label in labels.items():
        if key in summary:
            lines.append(f"{label:<18}{summary[key]:,}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add the `workload` command group to the kvsim app."""
    group = typer.Typer(
        help="Inspect workloads: presets and real traces.", no_args_is_help=True, rich_markup_mode=None
    )

    @group.command("describe")
    def describe_cmd(
        spec_or_file: str = typer.Argument(
            ..., help="A preset name (see `kvsim workload list`) or a trace file."
        ),
        plot: str | None = typer.Option(
            None, "--plot", help="Write length histograms and arrivals to FILE.png."
        ),
        num_prompts: int | None = typer.Option(None, "--num-prompts", help="Keep the first N requests."),
        request_rate: float | None = typer.Option(
            None, "--request-rate", help="Rescale to this mean rate (req/s)."
        ),
        time_scale: float = typer.Option(
            1.0, "--time-scale", help="Multiply arrival times (2 = half as fast)."
        ),
        duration_s: float | None = typer.Option(
            None, "--duration-s", help="Keep requests arriving before this."
        ),
        max_model_len: int | None = typer.Option(
            None, "--max-model-len", help="Clip or count over-long requests."
        ),
        clip: bool | None = typer.Option(
            None, "--clip/--no-clip", help="Clip to --max-model-len (default: presets yes, traces no)."
        ),
        fmt: str | None = typer.Option(
            None, "--format", help="Trace format; detected from content by default."
        ),
        on_bad_row: str = typer.Option("error", "--on-bad-row", help="error (default) or skip (and count)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the one random generator."),
        param: list[str] = typer.Option([], "--param", "-p", help="Preset parameter KEY=VALUE (repeatable)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    ) -> None:
        """Print count, time span, rate, burstiness, length percentiles and the prefix hit ratio."""
        import workloads
        from workloads.plot import check_plot_path

        if plot:
            from sim.files import check_output_file

            check_plot_path(plot)  # before any work: never print a summary and then fail on the figure
            check_output_file(plot, "describe-plot", what="--plot")  # never over a file kvsim did not write
        df = workloads.load(
            spec_or_file,
            seed=seed,
            num_prompts=num_prompts,
            duration_s=duration_s,
            request_rate=request_rate,
            time_scale=time_scale,
            max_model_len=max_model_len,
            clip=clip,
            fmt=fmt,
            on_bad_row=on_bad_row,
            **_parse_params(param),
        )
        summary = workloads.describe(df)
        if as_json:
            typer.echo(json.dumps(summary, indent=2, default=str))
        else:
            typer.echo(format_summary(summary))
        if plot:
            from sim.files import adopt_files, write_file_atomic
            from sim.output_lock import claim_output

            # one writer of the figure; drawn in a staging folder (cleared if this process is killed)
            with claim_output(plot, what="--plot") as target:
                written = write_file_atomic(target, lambda path: workloads.plot(df, path), what="--plot")
                adopt_files([written], "describe-plot")
            typer.echo(f"figure written to {written}")

    @group.command("list")
    def list_cmd() -> None:
        """List presets (with their sources) and readable trace formats."""
        import workloads

        typer.echo("presets:")
        for name in workloads.presets():
            preset = workloads.PRESETS.get(name)
            typer.echo(f"  {name:<20}{preset.description}")
            typer.echo(f"  {'':<20}source: {preset.source}")
        typer.echo("trace formats:")
        for name in workloads.FORMATS.names():
            typer.echo(f"  {name:<20}{workloads.FORMATS.get(name).description}")

    app.add_typer(group, name="workload")
