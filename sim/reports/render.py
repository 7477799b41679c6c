"""The report's content, rendered in memory: the summary table, labels, figures, HTML and Markdown.

Why in memory: a report is complete or absent, so everything is rendered before any file is written
(`sim.reports.publish`). The HTML is one self-contained file (figures as base64 data URIs, inline
CSS, no scripts) so it reads offline.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sim.core.taxonomy import PART_LABELS, SHOWN_PARTS, shown_shares_pct
from sim.reports import diagnosis, figures
from sim.reports.types import LoadedRun
from sim.reports.varied import allocator_name as allocator_name  # re-exported: used by tests, notebooks
from sim.reports.varied import line_labels
from sim.reports.varied import run_labels as run_labels  # re-exported

RESULT_FILES: tuple[str, ...] = ("summary.json", "requests.parquet", "steps.parquet")

# The summary table: (metric key in summary.json, column header, number format).
# Headers are short so that the table fits a page; UNITS_NOTE and docs/metrics.md say what each means.
TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("waste_pct", "waste %", "pct"),
    # The shown partition of capacity (sim/core/taxonomy.py): cached blocks are free, not allocated.
    *((f"kv_{part}_pct", f"{PART_LABELS[part]} %", "pct") for part in SHOWN_PARTS),
    ("mean_concurrency", "mean conc.", "float2"),
    ("max_concurrency", "max conc.", "count"),
    ("request_throughput", "req/s", "float3"),
    ("output_throughput", "output tok/s", "float1"),
    ("median_ttft_ms", "p50 TTFT", "ms"),
    ("p99_ttft_ms", "p99 TTFT", "ms"),
    ("median_tpot_ms", "p50 TPOT", "ms"),
    ("p99_tpot_ms", "p99 TPOT", "ms"),
    ("mean_normalized_latency_s_per_token", "norm. latency s/token", "sig4"),
    ("preemptions", "preemptions", "count"),
    ("rejected", "rejections", "count"),
)
# Not required of a results folder: the window part (issue 14) is absent from older results ("-").
# Nor the free split (issue 20): results without `kv_cached_pct` cached nothing, and older results
# have no `kv_empty_pct` (taxonomy.shown_shares_pct derives it as free - cached).
OPTIONAL_METRICS: frozenset[str] = frozenset({"kv_out_of_window_pct", "kv_cached_pct", "kv_empty_pct"})
# Appended to the table only when `kvsim report --gpu-hour-cost` gives a price.
COST_COLUMN: tuple[str, str, str] = ("usd_per_million_output_tokens", "USD / 1M output tok.", "float3")


# Appended when a run had a CPU tier (--kv-offloading-size; docs/metrics.md "CPU tier").
CPU_TIER_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("prefix_hit_gpu_pct", "GPU hit % tok.", "pct"),
    ("prefix_hit_cpu_pct", "CPU hit % tok.", "pct"),
    ("kv_offload_loaded_bytes", "loaded GiB", "gib"),
    ("kv_offload_stored_bytes", "stored GiB", "gib"),
    ("kv_offload_mean_used_pct", "CPU tier used %", "pct"),
)


def table_columns(runs: Sequence[LoadedRun]) -> tuple[tuple[str, str, str], ...]:
    """TABLE_COLUMNS, plus the CPU tier's columns and the cost column when the runs have them."""
    columns = TABLE_COLUMNS
    if any(CPU_TIER_COLUMNS[0][0] in run.summary["metrics"] for run in runs):
        columns = (*columns, *CPU_TIER_COLUMNS)
    if any(COST_COLUMN[0] in run.summary["metrics"] for run in runs):
        columns = (*columns, COST_COLUMN)
    return columns


def add_gpu_cost(runs: Sequence[LoadedRun], gpu_hour_cost: float | None) -> None:
    """Each run's USD per million output tokens at its own throughput: price x TP / 3600 / (tok/s) x 1e6."""
    if gpu_hour_cost is None:
        return
    for run in runs:
        metrics = run.summary["metrics"]
        gpus = int(_scenario_value(run.summary, "tensor_parallel_size") or 1)
        throughput = float(metrics.get("output_throughput") or 0.0)
        metrics["usd_per_million_output_tokens"] = (
            gpu_hour_cost * gpus / 3600.0 / throughput * 1e6 if throughput > 0 else math.nan
        )


# Every metric the report reads: the table's, plus what the diagnosis and the runs table use.
REQUIRED_METRICS: tuple[str, ...] = (
    *(key for key, _, _ in TABLE_COLUMNS if key not in OPTIONAL_METRICS),
    "num_requests",
    "completed",
    "duration_s",
    "mean_queue_length",
    "max_queue_length",
    "kv_capacity_tokens",
)
# File names of every figure the report may write (stale ones from an earlier report are removed).
FIGURE_FILES: dict[str, str] = {
    "taxonomy": "fig1_taxonomy.png",
    "taxonomy_over_time": "fig2_taxonomy_over_time.png",
    "concurrency": "fig3_concurrency_queue.png",
    "latency": "fig4_latency_cdf.png",
    "rate_sweep": "fig5_rate_sweep.png",
    "block_size_sweep": "fig5_block_size_sweep.png",
}
FIGURE_CAPTIONS: dict[str, str] = {
    "taxonomy": "Figure 1. Time-averaged KV memory taxonomy per allocator, in % of KV capacity.",
    "taxonomy_over_time": "Figure 2. The taxonomy over simulated time (time-weighted bin averages).",
    "concurrency": "Figure 3. Admitted concurrency and queue length over simulated time.",
    "latency": "Figure 4. CDFs of TTFT, TPOT and normalized latency over completed requests.",
    "rate_sweep": "Figure 5a. Mean normalized latency against request rate (sweep).",
    "block_size_sweep": "Figure 5b. Waste % and output throughput against block size (sweep).",
}


UNITS_NOTE = (
    "Taxonomy parts (token states ... free) are time-averaged % of KV capacity over the whole run, idle "
    "time included (they sum to 100); cached blocks hold reusable prefix KV but are free for the next "
    "allocation, so they are neither allocated nor waste; waste is % of allocated KV slot-time holding "
    "no token state; "
    "concurrency counts running sequences; latencies are per completed request (p50/p99, in ms or s as "
    "marked), normalized latency is the mean end-to-end latency per output token."
)


# ---------------------------------------------------------------------------------------------- labels


# ---------------------------------------------------------------------------------------------- tables


def format_value(value: Any, kind: str) -> str:
    """A metric as the table shows it; '–' for a missing value (e.g. no completed requests)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    number = float(value)
    if kind == "count":
        return f"{number:.0f}" if number.is_integer() else f"{number:.2f}"
    if kind == "pct" or kind == "float2":
        return f"{number:.2f}"
    if kind == "float1":
        return f"{number:.1f}"
    if kind == "float3":
        return f"{number:.3f}"
    if kind == "sig4":
        return f"{number:.4g}"
    if kind == "gib":
        return f"{number / 1024**3:.1f}"
    if kind == "ms":
        return format_duration_ms(number)
    raise ValueError(f"unknown number format {kind!r}")


def format_duration_ms(value_ms: float) -> str:
    """A latency in the unit a reader takes in at a glance: '45.7 ms', '2.88 s', '288 s', '3.2 h'.

    Why: a saturated run's TTFT of 287858.72 ms is 288 s; milliseconds stay for sub-second values.
    Three significant digits, as the figures' axes; the raw ms value stays in the cell's data-value.
    """
    if value_ms < 999.5:  # what rounds to 1000 ms is shown as 1 s
        return f"{value_ms:.3g} ms"
    seconds = value_ms / 1000.0
    if seconds < 99.95:
        return f"{seconds:.3g} s"
    if seconds < 3600.0:
        return f"{seconds:.0f} s"
    hours = seconds / 3600.0
    return f"{hours:.3g} h" if hours < 99.95 else f"{hours:,.0f} h"


def summary_rows(labels: Sequence[str], runs: Sequence[LoadedRun]) -> list[tuple[str, list[tuple[Any, str]]]]:
    """(label, [(raw value, shown text) per TABLE_COLUMNS]) for each run."""
    rows = []
    for label, run in zip(labels, runs, strict=True):
        metrics = run.summary["metrics"]
        cells = [
            (metrics.get(key, math.nan), format_value(metrics.get(key, math.nan), kind))
            for key, _, kind in table_columns(runs)
        ]
        rows.append((label, cells))
    return rows


def _scenario_value(summary: Mapping[str, Any], *path: str) -> Any:
    node: Any = summary.get("scenario", {})
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def request_rate(summary: Mapping[str, Any]) -> float | None:
    """The scenario's request rate (req/s), or None for closed-loop/trace-timed workloads."""
    value = _scenario_value(summary, "workload", "request_rate")
    return None if value is None else float(value)


def block_size(summary: Mapping[str, Any]) -> int | None:
    """The scenario's paged block size in tokens (allocator params win over the top-level field)."""
    value = _scenario_value(summary, "allocator", "params", "block_size")
    if value is None:
        value = _scenario_value(summary, "block_size")
    return None if value is None else int(value)


def _run_facts(run: LoadedRun) -> list[str]:
    """The runs table's cells for one run: what was simulated, in the scenario's own words."""
    summary = run.summary
    metrics = summary["metrics"]
    values = [
        run.path.name,
        _scenario_value(summary, "model"),
        _scenario_value(summary, "gpu"),
        _scenario_value(summary, "workload", "source"),
        request_rate(summary),
        block_size(summary),
        _scenario_value(summary, "max_model_len"),
        metrics["kv_capacity_tokens"],
        metrics["num_requests"],
        metrics["completed"],
        metrics["duration_s"],
        summary.get("seed", _scenario_value(summary, "seed")),
    ]
    shown = []
    for value in values:
        if isinstance(value, Mapping):
            value = value.get("name", json.dumps(value, sort_keys=True))
        if isinstance(value, float):
            value = f"{value:.4g}"
        shown.append("–" if value is None else str(value))
    return shown


RUN_FACT_HEADERS: tuple[str, ...] = (
    "folder",
    "model",
    "gpu",
    "workload",
    "request rate (req/s)",
    "block size (tokens)",
    "max_model_len (tokens)",
    "KV capacity (tokens)",
    "requests",
    "completed",
    "simulated time (s)",
    "seed",
)


# --------------------------------------------------------------------------------------------- figures


def render_figures(labels: Sequence[str], runs: Sequence[LoadedRun]) -> dict[str, bytes]:
    """Every figure the runs support, as PNG bytes keyed like FIGURE_FILES (figure 5 only for sweeps)."""
    by_label = dict(zip(labels, runs, strict=True))
    part_pct = {label: shown_shares_pct(run.summary["metrics"]) for label, run in by_label.items()}
    pngs = {
        "taxonomy": figures.figure_png_bytes(figures.taxonomy_bars(labels, part_pct)),
        "taxonomy_over_time": figures.figure_png_bytes(figures.taxonomy_over_time(by_label)),
        "concurrency": figures.figure_png_bytes(figures.concurrency_and_queue(by_label)),
        "latency": figures.figure_png_bytes(figures.latency_cdfs(by_label)),
    }
    rate_points, size_points = sweep_points(runs)
    if rate_points:
        pngs["rate_sweep"] = figures.figure_png_bytes(figures.rate_sweep(rate_points))
    if size_points:
        pngs["block_size_sweep"] = figures.figure_png_bytes(figures.block_size_sweep(size_points))
    return pngs


def sweep_points(
    runs: Sequence[LoadedRun],
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[tuple[float, float, float]]]]:
    """Figure 5's data, empty unless the folders form a sweep (rate or block size varies across them).

    One line per allocator and combination of the other varied fields (`varied.line_labels`: a sweep
    over models and rates draws one rate curve per model, not one saw-tooth through all of them):
    (rate, mean normalized latency) and (block size, waste %, output throughput). Runs with a missing
    value (e.g. no completed requests) are left out of a line.
    """
    rates = {request_rate(run.summary) for run in runs} - {None}
    sizes = {block_size(run.summary) for run in runs} - {None}
    rate_lines, size_lines = line_labels(runs, RATE_FIELDS), line_labels(runs, BLOCK_SIZE_FIELDS)
    rate_points: dict[str, list[tuple[float, float]]] = {}
    size_points: dict[str, list[tuple[float, float, float]]] = {}
    for run, rate_line, size_line in zip(runs, rate_lines, size_lines, strict=True):
        metrics = run.summary["metrics"]
        rate, size = request_rate(run.summary), block_size(run.summary)
        latency = metrics["mean_normalized_latency_s_per_token"]
        if len(rates) > 1 and rate is not None and _finite(latency):
            rate_points.setdefault(rate_line, []).append((rate, float(latency)))
        waste, throughput = metrics["waste_pct"], metrics["output_throughput"]
        if len(sizes) > 1 and size is not None and _finite(waste) and _finite(throughput):
            size_points.setdefault(size_line, []).append((float(size), float(waste), float(throughput)))
    return rate_points, size_points


# The scenario fields on figure 5's x axes (`request_rate`, `block_size` read them).
RATE_FIELDS: frozenset[str] = frozenset({"workload.request_rate"})
BLOCK_SIZE_FIELDS: frozenset[str] = frozenset({"block_size", "allocator.params.block_size"})


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


# ------------------------------------------------------------------------------------------- rendering

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; margin: 2em auto;
       max-width: 1500px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } .meta { color: #555; margin-top: 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #bbb; padding: 0.2em 0.4em; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; vertical-align: bottom; white-space: normal; }
td.label, th.label { text-align: left; }
tbody tr:nth-child(even) { background: #fafafa; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #444; font-size: 0.9em; }
.threshold { color: #666; font-size: 0.9em; }
#summary { font-size: 0.7em; }
#summary th, #summary td { padding: 0.2em 0.3em; }
#summary td.label { white-space: normal; min-width: 8em; max-width: 13em; }
#summary .label { position: sticky; left: 0; z-index: 1; background: #fff; }
#summary th.label { background: #f0f0f0; }
#summary tbody tr:nth-child(even) td.label { background: #fafafa; }
#diagnosis .detail { margin: 0.1em 0; }
@media print { body { max-width: none; } figure { page-break-inside: avoid; } }
"""


def _breakable(label: str) -> str:
    """An allocator label, escaped, that may wrap after ':' (request_limit:oracle:best_fit).

    Why: the summary table must fit a 1280 px window with every column visible (issue 11); the label
    column is the one that can give up width.
    """
    return html.escape(label).replace(":", ":<wbr>")


def render_html(
    labels: Sequence[str],
    runs: Sequence[LoadedRun],
    statements: Sequence[diagnosis.Statement],
    pngs: Mapping[str, bytes],
) -> str:
    """The self-contained report page: summary table, diagnosis, figures (data URIs), runs table."""
    esc = html.escape
    out: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',
        "<title>kvsim report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>kvsim report</h1>",
        f'<p class="meta">{len(runs)} run(s): {esc(", ".join(labels))}. {esc(UNITS_NOTE)}</p>',
        "<h2>Summary</h2>",
        '<div class="scroll"><table id="summary"><thead><tr><th class="label">allocator</th>',
    ]
    out += [f'<th data-metric="{esc(key)}">{esc(header)}</th>' for key, header, _ in table_columns(runs)]
    out.append("</tr></thead><tbody>")
    for label, cells in summary_rows(labels, runs):
        out.append(f'<tr><td class="label">{_breakable(label)}</td>')
        for (key, _, _), (raw, shown) in zip(table_columns(runs), cells, strict=True):
            out.append(f'<td data-metric="{esc(key)}" data-value="{esc(json.dumps(raw))}">{esc(shown)}</td>')
        out.append("</tr>")
    out.append("</tbody></table></div>")
    out.append("<h2>Diagnosis</h2>")
    if statements:
        out.append('<ul id="diagnosis">')
        for finding in diagnosis.findings(list(statements)):
            out.append(
                f'<li class="finding" data-finding="{esc(finding.kind)}">'
                f"<strong>{esc(finding.headline)}</strong> — {esc(', '.join(finding.labels))} "
                f'<span class="threshold">(threshold: {esc(finding.threshold)})</span><ul>'
            )
            out += [
                f'<li class="detail" data-kind="{esc(s.kind)}"><strong>{esc(s.label)}</strong>: '
                f"{esc(s.detail or s.text)}</li>"
                for s in finding.details
            ]
            out.append("</ul></li>")
        out.append("</ul>")
    else:
        out.append(f'<p id="diagnosis">{esc(diagnosis.NOTHING_TO_REPORT)}</p>')
    out.append("<h2>Figures</h2>")
    for key, png in pngs.items():
        data = base64.b64encode(png).decode("ascii")
        caption = FIGURE_CAPTIONS[key]
        out.append(
            f'<figure id="{esc(key)}"><img src="data:image/png;base64,{data}" alt="{esc(caption)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>"
        )
    out.append(
        '<h2>Runs</h2><div class="scroll"><table id="runs"><thead><tr><th class="label">allocator</th>'
    )
    out += [f"<th>{esc(header)}</th>" for header in RUN_FACT_HEADERS]
    out.append("</tr></thead><tbody>")
    for label, run in zip(labels, runs, strict=True):
        cells = "".join(f"<td>{esc(cell)}</td>" for cell in _run_facts(run))
        out.append(f'<tr><td class="label">{esc(label)}</td>{cells}</tr>')
    out.append("</tbody></table></div>")
    version = runs[0].summary.get("kvsim_version", "?")
    out.append(
        f'<p class="meta">Generated by kvsim {esc(str(version))} from {len(runs)} results folder(s).</p>'
    )
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(
    labels: Sequence[str],
    runs: Sequence[LoadedRun],
    statements: Sequence[diagnosis.Statement],
    figure_names: Mapping[str, str],
) -> str:
    """The Markdown twin of the page; figures are linked as figures/*.png next to it."""
    headers = ["allocator", *(header for _, header, _ in table_columns(runs))]
    lines = [
        "# kvsim report",
        "",
        UNITS_NOTE,
        "",
        "## Summary",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "|".join([":---"] + ["---:"] * len(table_columns(runs))) + "|",
    ]
    for label, cells in summary_rows(labels, runs):
        lines.append("| " + " | ".join([_md_cell(label), *(shown for _, shown in cells)]) + " |")
    lines += ["", "## Diagnosis", ""]
    if statements:
        for finding in diagnosis.findings(list(statements)):
            lines.append(
                f"- **{finding.headline}** — {', '.join(finding.labels)} (threshold: {finding.threshold})"
            )
            lines += [f"  - {s.label}: {s.detail or s.text}" for s in finding.details]
    else:
        lines.append(diagnosis.NOTHING_TO_REPORT)
    lines += ["", "## Figures", ""]
    for key, name in figure_names.items():
        lines += [f"![{FIGURE_CAPTIONS[key]}](figures/{name})", "", f"*{FIGURE_CAPTIONS[key]}*", ""]
    lines += ["## Runs", "", "| " + " | ".join(["allocator", *RUN_FACT_HEADERS]) + " |"]
    lines.append("|" + "|".join([":---"] * (len(RUN_FACT_HEADERS) + 1)) + "|")
    for label, run in zip(labels, runs, strict=True):
        lines.append("| " + " | ".join(_md_cell(c) for c in [label, *_run_facts(run)]) + " |")
    return "\n".join(lines) + "\n"
