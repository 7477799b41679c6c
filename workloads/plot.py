"""`plot(df, path)`: length histograms and arrivals over time, in one PNG.

Why these three panels: the prompt and output histograms show how much KV each request asks for
(and how long the tail is), and the arrival rate over time shows bursts that averages hide.
Uses the Agg backend (no display needed) and writes atomically (temp file, then os.replace).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError


def check_plot_path(path: str | os.PathLike[str]) -> str:
    """The figure's image type (from the suffix), or a WorkloadError if `path` cannot take the figure.

    Why a separate check: the CLI calls it before loading and summarising a workload, so a bad --plot
    path fails at once instead of after the whole summary was printed. Writability is tested by
    creating (and removing) a temporary file in the folder, the only test that also holds for root
    and for read-only mounts.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    target = os.fspath(path)
    suffix = os.path.splitext(target)[1].lstrip(".").lower() or "png"
    supported = plt.gcf().canvas.get_supported_filetypes()
    plt.close("all")
    if suffix not in supported:
        raise WorkloadError(f"unsupported image type {suffix!r} (use .png, .svg or .pdf)", field="plot")
    if os.path.isdir(target):
        raise WorkloadError("is a folder; give a file name such as workload.png", file=target)
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        raise WorkloadError(f"folder {directory} does not exist", file=target)
    try:
        handle, probe = tempfile.mkstemp(prefix=".plot-probe-", dir=directory)
    except OSError as exc:
        raise WorkloadError(f"cannot write the figure ({exc.strerror})", file=target) from None
    os.close(handle)
    os.unlink(probe)
    return suffix


def plot(df: pd.DataFrame, path: str | os.PathLike[str], *, title: str | None = None) -> str:
    """Draw the figure to `path` (format from its suffix, e.g. .png or .svg); return the path."""
    suffix = check_plot_path(path)
    target = os.fspath(path)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4), constrained_layout=True)
    for ax, column in zip(axes[:2], ("prompt_tokens", "output_tokens"), strict=True):
        values = df[column].to_numpy()
        ax.hist(values, bins=min(100, max(10, int(np.sqrt(len(values))))), color="#4472c4")
        ax.set_xlabel(f"{column} (tokens)")
        ax.set_ylabel("requests")
        ax.set_title(f"{column}: mean {values.mean():,.0f}, p99 {np.percentile(values, 99):,.0f}")
    arrival_s = df["arrival_s"].to_numpy(dtype=np.float64)
    span_s = float(arrival_s[-1] - arrival_s[0]) if len(arrival_s) else 0.0
    ax = axes[2]
    if span_s > 0:
        bins = min(200, max(10, len(arrival_s) // 20))
        counts, edges = np.histogram(arrival_s, bins=bins)
        width_s = edges[1] - edges[0]
        ax.step(edges[:-1], counts / width_s, where="post", color="#c55a11")
        ax.set_ylabel("requests / s")
    else:
        ax.text(0.5, 0.5, "all requests at t = 0\n(closed loop or infinite rate)", ha="center", va="center")
    ax.set_xlabel("arrival time (s)")
    ax.set_title("arrivals over time")
    fig.suptitle(title or str(df.attrs.get("source", "workload")))
    directory = os.path.dirname(os.path.abspath(target))
    try:
        handle, temp = tempfile.mkstemp(prefix=".plot-", suffix=f".{suffix}", dir=directory)
    except OSError as exc:
        plt.close(fig)
        raise WorkloadError(f"cannot write the figure ({exc.strerror})", file=target) from None
    os.close(handle)
    try:
        fig.savefig(temp, format=suffix, dpi=110)
        os.replace(temp, target)
    finally:
        plt.close(fig)
        if os.path.exists(temp):
            os.unlink(temp)
    return target
