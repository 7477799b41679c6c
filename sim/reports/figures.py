"""The report's figures: pure functions from results tables to matplotlib Figures.

Why a module of its own: the report, the notebooks and anyone's script draw the same pictures, so
each figure is a function of plain data (labels, DataFrames, dicts) that returns a Figure; nothing
here reads files or knows about HTML. One colour (and one hatch, for black-and-white print) per
taxonomy part is defined once in PART_COLORS / PART_HATCHES and used by every figure.

Figures are built as plain `matplotlib.figure.Figure` objects, not through pyplot: no backend is
selected or changed (the report renders PNGs on a head-less machine, a notebook displays the same
object inline), and nothing is left open in pyplot's figure manager. `figure_style()` fixes font
sizes and a white background so they read the same on screen and on paper.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from sim.core.taxonomy import PART_LABELS, SHOWN_PARTS
from sim.reports.diagnosis import step_hold_s

if TYPE_CHECKING:
    from sim.reports.types import RunLike

# One colour per taxonomy part, everywhere (Okabe-Ito palette: distinguishable for colour-blind readers).
PART_COLORS: dict[str, str] = {
    "token_states": "#009E73",  # green: memory doing its job
    "reservation": "#56B4E9",  # sky blue: reserved, will be filled
    "internal": "#E69F00",  # orange: reserved, never filled
    "external": "#D55E00",  # vermillion: free but the wrong shape
    "duplicated": "#CC79A7",  # purple: second copies of shared prefixes
    "out_of_window": "#0072B2",  # blue: tokens slid out of a sliding window, still held
    "cached": "#F0E442",  # yellow: free, but holding reusable prefix KV (evictable on demand)
    "empty": "#D9D9D9",  # light grey: free and empty
}
# Hatches keep the parts apart when the page is printed in grey.
PART_HATCHES: dict[str, str] = {
    "token_states": "",
    "reservation": "..",
    "internal": "//",
    "external": "xx",
    "duplicated": "\\\\",
    "out_of_window": "--",
    "cached": "oo",
    "empty": "",
}
# Allocators get their own cycle (never a taxonomy colour), in the order the runs are given.
# Dark enough to read on white and in grey print; different line styles tell identical curves apart.
ALLOCATOR_COLORS: tuple[str, ...] = (
    "#0072B2",
    "#000000",
    "#882255",
    "#999933",
    "#332288",
    "#AA4499",
    "#44AA99",
)
ALLOCATOR_LINESTYLES: tuple[str, ...] = ("-", "--", "-.", ":")

# Figures stay readable on a page and a screen however many runs a sweep has (issue 20: 18 cells drew
# a 3,367 px wide bar chart): no figure is wider or taller than this (inches, at 130 dpi: 1,560 x 1,820 px).
MAX_FIGURE_WIDTH_IN = 12.0
MAX_FIGURE_HEIGHT_IN = 14.0
# More runs than this: bars turn horizontal, panels go into columns, legends go under the axes.
MANY_RUNS = 8
# Legend and tick labels wrap at this many characters ("request_limit:oracle (gpu=..., model=...)").
LABEL_WRAP_CHARS = 34

# Time series longer than this are averaged into this many time bins before plotting.
MAX_TIME_POINTS = 600
# CDFs are drawn through at most this many quantiles.
MAX_CDF_POINTS = 1000
# A millisecond latency axis is drawn in seconds once its largest value reaches this many ms.
SECONDS_FROM_MS = 10_000.0
# A latency axis turns logarithmic when its values span at least this factor.
LOG_SCALE_SPAN = 30.0

_STYLE: dict[str, object] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "savefig.facecolor": "white",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "hatch.linewidth": 0.6,
}


@contextmanager
def figure_style() -> Iterator[None]:
    """Apply the house style (print-readable sizes, white background) for the figures drawn inside."""
    with matplotlib.rc_context(_STYLE):
        yield


def _subplots(
    nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **kwargs: object
) -> tuple[Figure, Any]:
    """pyplot.subplots without pyplot: a standalone Figure and its axes."""
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots(nrows, ncols, **kwargs)


def allocator_color(index: int) -> str:
    """Colour of the index-th allocator in a figure (cycles after seven)."""
    return ALLOCATOR_COLORS[index % len(ALLOCATOR_COLORS)]


def allocator_style(index: int) -> dict[str, object]:
    """Colour and line style of the index-th allocator: curves that coincide (two allocators that
    behave the same) stay visible as dashes over a solid line."""
    return {
        "color": allocator_color(index),
        "linestyle": ALLOCATOR_LINESTYLES[index % len(ALLOCATOR_LINESTYLES)],
    }


def figure_png_bytes(fig: Figure, dpi: int = 130) -> bytes:
    """Render a figure to PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def wrap_label(label: str) -> str:
    """A run label on lines of at most LABEL_WRAP_CHARS, broken after ', ' or at spaces."""
    return "\n".join(textwrap.wrap(label, LABEL_WRAP_CHARS, break_on_hyphens=False)) or label


def _capped(width_in: float, height_in: float) -> tuple[float, float]:
    return min(width_in, MAX_FIGURE_WIDTH_IN), min(height_in, MAX_FIGURE_HEIGHT_IN)


def legend_below(names: Sequence[str]) -> bool:
    """Many runs, or labels longer than a line: the legend goes under the axes, in columns."""
    return len(names) > MANY_RUNS or any(len(name) > LABEL_WRAP_CHARS for name in names)


# A wrapped legend entry (marker + LABEL_WRAP_CHARS characters at 8 pt) takes about this much width.
LEGEND_ENTRY_WIDTH_IN = 2.9


def _legend_columns(count: int, figure_width_in: float) -> int:
    return max(1, min(count, int(figure_width_in // LEGEND_ENTRY_WIDTH_IN)))


def legend_height_in(names: Sequence[str], figure_width_in: float) -> float:
    """The height a legend under the axes takes (0 when it sits beside them), added to the figure's."""
    if not legend_below(names):
        return 0.0
    lines_per_entry = max(wrap_label(name).count("\n") + 1 for name in names)
    rows = math.ceil(len(names) / _legend_columns(len(names), figure_width_in))
    return rows * lines_per_entry * 0.16 + 0.3


def add_run_legend(fig: Figure, ax: Any) -> None:
    """The runs' legend: beside the axes for a few short labels, under them (in columns) otherwise."""
    handles, names = ax.get_legend_handles_labels()
    if not legend_below(names):
        ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        return
    columns = _legend_columns(len(names), float(fig.get_figwidth()))
    fig.legend(handles, [wrap_label(name) for name in names], loc="outside lower center", ncols=columns)


def resample_steps(
    steps: pd.DataFrame, columns: Sequence[str], max_points: int = MAX_TIME_POINTS
) -> pd.DataFrame:
    """Time-weighted averages of `columns` in at most `max_points` equal time bins.

    Why: a long run has ~10^5 recorded steps; plotting them all is slow and unreadable. Each row's
    values hold until the next recorded row (`step_hold_s`), so the bin average weights by that time
    (by count when every weight is zero). Short tables are returned unchanged (time_s and the columns).
    """
    table = steps[["time_s", "duration_s", *columns]]
    if len(table) <= max_points:
        return table[["time_s", *columns]].reset_index(drop=True)
    time_s = table["time_s"].to_numpy(dtype=float)
    start_s, end_s = float(time_s[0]), float(time_s[-1])
    width_s = (end_s - start_s) / max_points or 1.0
    bin_index = np.minimum(((time_s - start_s) / width_s).astype(np.int64), max_points - 1)
    weights = step_hold_s(table)
    if not np.any(weights > 0):
        weights = np.ones_like(weights)
    weight_per_bin = np.bincount(bin_index, weights=weights, minlength=max_points)
    occupied = weight_per_bin > 0
    out = {"time_s": start_s + (np.arange(max_points)[occupied] + 0.5) * width_s}
    for column in columns:
        values = table[column].to_numpy(dtype=float)
        sums = np.bincount(bin_index, weights=values * weights, minlength=max_points)
        out[column] = sums[occupied] / weight_per_bin[occupied]
    return pd.DataFrame(out)


def shown_step_parts(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps table with free split into `cached` and `empty` (sim/core/taxonomy.py), for stacking.

    The steps table keeps the allocator's parts (`free` includes `cached`); a figure stacks the shown
    partition, so the two free parts are derived here, never stored twice.
    """
    if "free" not in steps.columns:
        return steps
    cached = steps["cached"] if "cached" in steps.columns else 0
    return steps.assign(cached=cached, empty=(steps["free"] - cached).clip(lower=0))


def taxonomy_bars(labels: Sequence[str], part_pct: Mapping[str, Mapping[str, float]]) -> Figure:
    """Figure 1: one stacked bar per allocator of the time-averaged taxonomy, in % of KV capacity.

    Up to MANY_RUNS runs the bars stand upright; more (a sweep) lie down, one row per run with its
    label wrapped beside it, so the figure grows in height (capped) rather than to thousands of pixels
    of width.
    """
    horizontal = len(labels) > MANY_RUNS
    with figure_style():
        if horizontal:
            lines = sum(wrap_label(label).count("\n") + 1 for label in labels)
            size = _capped(9.0, 1.8 + 0.17 * lines + 0.12 * len(labels))
        else:
            size = _capped(max(4.5, 1.3 * len(labels) + 2.5), 4.0)
        fig, ax = _subplots(figsize=size)
        positions = np.arange(len(labels))
        bottoms = np.zeros(len(labels))
        draw = ax.barh if horizontal else ax.bar
        for part in SHOWN_PARTS:
            heights = np.array([float(part_pct[label].get(part, 0.0)) for label in labels])
            draw(
                positions,
                heights,
                0.6,
                bottoms,
                color=PART_COLORS[part],
                hatch=PART_HATCHES[part],
                edgecolor="#333333",
                linewidth=0.5,
                label=PART_LABELS[part],
            )
            for x, bottom, height in zip(positions, bottoms, heights, strict=True):
                if height >= 6.0:
                    middle = bottom + height / 2
                    ax.text(
                        middle if horizontal else x,
                        x if horizontal else middle,
                        f"{height:.0f}%",
                        ha="center",
                        va="center",
                        fontsize=7,
                        bbox={
                            "boxstyle": "round,pad=0.15",
                            "facecolor": "white",
                            "edgecolor": "none",
                            "alpha": 0.85,
                        },
                    )
            bottoms += heights
        if horizontal:
            ax.set_yticks(positions, [wrap_label(label) for label in labels], fontsize=7)
            ax.invert_yaxis()  # the first run on top, as in the summary table
            ax.set_xlabel("KV cache capacity, time-averaged (%)")
            ax.set_xlim(0, 100)
            ax.grid(axis="y", visible=False)
            handles, names = ax.get_legend_handles_labels()
            fig.legend(handles, names, loc="outside lower center", ncols=4)
        else:
            ax.set_xticks(
                positions,
                labels,
                rotation=20 if len(labels) > 4 else 0,
                ha="right" if len(labels) > 4 else "center",
            )
            ax.set_ylabel("KV cache capacity, time-averaged (%)")
            ax.set_ylim(0, 100)
            ax.grid(axis="x", visible=False)
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), reverse=True)
        ax.set_title("Where the KV memory went")
    return fig


def taxonomy_over_time(runs: Mapping[str, RunLike]) -> Figure:
    """Figure 2: the taxonomy over simulated time, one stacked-area panel per allocator.

    Many runs (a sweep) are laid out in two or three columns of panels so the figure stays within
    MAX_FIGURE_HEIGHT_IN instead of one 35-inch column.
    """
    labels = list(runs)
    columns = 1 if len(labels) <= 4 else 2 if len(labels) <= MANY_RUNS else 3
    rows = math.ceil(len(labels) / columns)
    panel_height_in = 1.9 if columns == 1 else 1.7
    with figure_style():
        fig, axes = _subplots(
            rows,
            columns,
            figsize=_capped(7.5 if columns == 1 else 4.6 * columns, panel_height_in * rows + 0.8),
            sharex=True,
            sharey=True,
            squeeze=False,
        )
        flat_axes = list(axes.flat)
        for ax, label in zip(flat_axes, labels, strict=False):
            steps = runs[label].steps
            steps = shown_step_parts(steps)
            # results written before issue 14 have no out_of_window column (it was 0 there)
            parts = [part for part in SHOWN_PARTS if part in steps.columns]
            series = resample_steps(steps, [*parts, "capacity"])
            capacity = series["capacity"].to_numpy(dtype=float, copy=True)
            capacity[capacity <= 0] = np.nan
            layers = [100.0 * series[part].to_numpy(dtype=float) / capacity for part in parts]
            polys = ax.stackplot(
                series["time_s"].to_numpy(dtype=float),
                *layers,
                colors=[PART_COLORS[p] for p in parts],
                labels=[PART_LABELS[p] for p in parts],
                edgecolor="none",
            )
            for poly, part in zip(polys, parts, strict=True):
                poly.set_hatch(PART_HATCHES[part])
            ax.set_ylim(0, 100)
            ax.set_title(label if columns == 1 else wrap_label(label), loc="left", fontsize=8)
        for ax in flat_axes[len(labels) :]:
            ax.set_visible(False)
        for ax in axes[:, 0]:
            ax.set_ylabel("% of KV")
        for ax in axes[-1, :]:
            ax.set_xlabel("simulated time (s)")
        if columns == 1:
            axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), reverse=True)
        else:
            handles, names = axes[0, 0].get_legend_handles_labels()
            fig.legend(handles[::-1], names[::-1], loc="outside lower center", ncols=len(handles))
        fig.suptitle("KV memory taxonomy over time")
    return fig


def concurrency_and_queue(runs: Mapping[str, RunLike]) -> Figure:
    """Figure 3: admitted concurrency and queue length on one shared time axis across allocators."""
    with figure_style():
        fig, (ax_running, ax_queue) = _subplots(
            2, 1, figsize=_capped(7.5, 5.0 + legend_height_in(list(runs), 7.5)), sharex=True
        )
        for index, (label, run) in enumerate(runs.items()):
            series = resample_steps(run.steps, ["num_running", "queue_length"])
            time_s = series["time_s"].to_numpy(dtype=float)
            style = allocator_style(index)
            ax_running.step(time_s, series["num_running"], where="post", label=label, linewidth=1.2, **style)
            ax_queue.step(time_s, series["queue_length"], where="post", label=label, linewidth=1.2, **style)
        ax_running.set_ylabel("admitted sequences")
        ax_running.set_title("Admitted concurrency")
        ax_queue.set_ylabel("waiting requests")
        ax_queue.set_title("Queue length")
        ax_queue.set_xlabel("simulated time (s)")
        ax_running.set_ylim(bottom=0)
        ax_queue.set_ylim(bottom=0)
        add_run_legend(fig, ax_running)
    return fig


LATENCY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("ttft_ms", "TTFT (ms)"),
    ("tpot_ms", "TPOT (ms)"),
    ("normalized_latency_s_per_token", "normalized latency (s/token)"),
)


def _cdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their cumulative fractions, thinned to MAX_CDF_POINTS quantiles."""
    ordered = np.sort(values)
    fractions = np.arange(1, len(ordered) + 1) / len(ordered)
    if len(ordered) > MAX_CDF_POINTS:
        keep = np.unique(np.linspace(0, len(ordered) - 1, MAX_CDF_POINTS).astype(np.int64))
        ordered, fractions = ordered[keep], fractions[keep]
    return ordered, fractions


def latency_cdfs(runs: Mapping[str, RunLike]) -> Figure:
    """Figure 4: CDFs of TTFT, TPOT and normalized latency over completed requests, per allocator."""
    with figure_style():
        size = _capped(10.0, 3.4 + legend_height_in(list(runs), 10.0))
        fig, axes = _subplots(1, len(LATENCY_COLUMNS), figsize=size)
        for ax, (column, axis_label) in zip(axes, LATENCY_COLUMNS, strict=True):
            smallest, largest = math.inf, 0.0
            per_run = {
                label: pd.to_numeric(run.requests[column], errors="coerce").to_numpy(dtype=float)
                for label, run in runs.items()
            }
            per_run = {label: values[np.isfinite(values)] for label, values in per_run.items()}
            largest_value = max((float(v.max()) for v in per_run.values() if len(v)), default=0.0)
            scale = 1.0
            if column.endswith("_ms") and largest_value >= SECONDS_FROM_MS:  # 288 s, not 287,859 ms
                scale, axis_label = 1e-3, axis_label.replace("(ms)", "(s)")
            for index, (label, values) in enumerate(per_run.items()):
                if len(values) == 0:
                    continue
                xs, ys = _cdf_points(values * scale)
                smallest, largest = min(smallest, float(xs[0])), max(largest, float(xs[-1]))
                ax.step(xs, ys, where="post", label=label, linewidth=1.2, **allocator_style(index))
            ax.set_xlabel(axis_label)
            ax.set_ylim(0, 1.0)
            if 0 < smallest and largest >= LOG_SCALE_SPAN * smallest:
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(NullFormatter())
        axes[0].set_ylabel("fraction of completed requests")
        handles, names = axes[0].get_legend_handles_labels()
        if legend_below(names):
            wrapped = [wrap_label(name) for name in names]
            columns = _legend_columns(len(names), size[0])
            fig.legend(handles, wrapped, loc="outside lower center", ncols=columns)
        else:
            fig.legend(handles, names, loc="outside right upper")
        fig.suptitle("Latency CDFs")
    return fig


def rate_sweep(points: Mapping[str, Sequence[tuple[float, float]]]) -> Figure:
    """Figure 5a: mean normalized latency against request rate, one line per allocator (and
    combination of the other varied fields: `sim.reports.varied.line_labels`).

    `points[label]` holds (request_rate, normalized_latency_s_per_token) pairs.
    """
    with figure_style():
        fig, ax = _subplots(figsize=_capped(6.0, 3.8 + legend_height_in(list(points), 6.0)))
        for index, (label, pairs) in enumerate(points.items()):
            ordered = sorted(pairs)
            ax.plot(
                [p[0] for p in ordered],
                [p[1] for p in ordered],
                marker="o",
                label=label,
                **allocator_style(index),
            )
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("mean normalized latency (s/token)")
        ax.set_title("Normalized latency vs request rate")
        ax.set_ylim(bottom=0)
        add_run_legend(fig, ax)
    return fig


def block_size_sweep(points: Mapping[str, Sequence[tuple[float, float, float]]]) -> Figure:
    """Figure 5b: waste % and throughput against block size, one line per allocator (and
    combination of the other varied fields).

    `points[label]` holds (block_size_tokens, waste_pct, output_throughput_tok_per_s) triples.
    """
    with figure_style():
        size = _capped(9.0, 3.6 + legend_height_in(list(points), 9.0))
        fig, (ax_waste, ax_throughput) = _subplots(1, 2, figsize=size)
        for index, (label, triples) in enumerate(points.items()):
            ordered = sorted(triples)
            sizes = [t[0] for t in ordered]
            style = allocator_style(index)
            ax_waste.plot(sizes, [t[1] for t in ordered], marker="o", label=label, **style)
            ax_throughput.plot(sizes, [t[2] for t in ordered], marker="o", label=label, **style)
        all_sizes = sorted({t[0] for triples in points.values() for t in triples})
        for ax in (ax_waste, ax_throughput):
            ax.set_xscale("log", base=2)
            ax.set_xticks(all_sizes, [f"{size:g}" for size in all_sizes])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel("block size (tokens)")
            ax.set_ylim(bottom=0)
        ax_waste.set_ylabel("waste (% of allocated KV)")
        ax_waste.set_title("Waste vs block size")
        ax_throughput.set_ylabel("output throughput (tokens/s)")
        ax_throughput.set_title("Throughput vs block size")
        add_run_legend(fig, ax_throughput)
    return fig
