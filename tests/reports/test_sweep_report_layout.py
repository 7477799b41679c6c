"""A sweep's report: labels name every varied field, rows follow the varied values, figure 5 draws one
line per (allocator, other varied fields), and figures stay readable for many runs (issue 20 §4).

Before: labels named at most two differing fields (a varied `workload.request_rate` was dropped),
rows came in cell-hash order, figure 5 joined the runs of two models into one saw-tooth line per
allocator, and 18 cells drew a 3,367 px wide bar chart.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from sim.reports import figures
from sim.reports.load import expand_results_dirs
from sim.reports.render import render_figures, sweep_points
from sim.reports.types import LoadedRun
from sim.reports.varied import order_runs, run_labels, varied_fields

ALLOCATORS = ("paged", "contiguous", "request_limit:oracle")
RATES = (10.0, 2.0, 1.0)  # 10 sorts before 2 as text: the order must be numeric
MODELS = (("LLaMA-2-7B", "A100-40GB"), ("LLaMA-2-13B", "A100-80GB"))


def _run(allocator: str, rate: float, model: str, gpu: str, cell: str) -> LoadedRun:
    """A sweep cell as the report loads it: what labels, order and figure 5 read, plus small tables."""
    latency = rate / 100.0 + (0.05 if model == "LLaMA-2-13B" else 0.0)  # two clearly separate curves
    metrics = {
        "mean_normalized_latency_s_per_token": latency,
        "waste_pct": 1.0,
        "output_throughput": 100.0 * rate,
        **{f"kv_{part}_pct": 0.0 for part in figures.PART_COLORS},
        "kv_free_pct": 100.0,
    }
    scenario = {
        "name": "alloc-vs-rate",
        "model": model,
        "gpu": gpu,
        "block_size": 16,
        "allocator": {"name": allocator.split(":")[0], "params": {}},
        "workload": {"source": "sharegpt", "request_rate": rate},
    }
    steps = pd.DataFrame(
        {
            "time_s": np.arange(4.0),
            "duration_s": np.ones(4),
            "num_running": np.ones(4),
            "queue_length": np.zeros(4),
            "capacity": np.full(4, 100),
            **{part: np.zeros(4) for part in figures.PART_COLORS if part != "free"},
            "free": np.full(4, 100),
        }
    )
    requests = pd.DataFrame(
        {"ttft_ms": [10.0, 20.0], "tpot_ms": [5.0, 6.0], "normalized_latency_s_per_token": [0.1, 0.2]}
    )
    summary = {"allocator": allocator, "scenario": scenario, "metrics": metrics}
    return LoadedRun(path=Path("cells") / cell, summary=summary, requests=requests, steps=steps)


def sweep_runs() -> list[LoadedRun]:
    """18 cells in a hash-like order (not grid order)."""
    cells = list(itertools.product(ALLOCATORS, RATES, MODELS))
    order = np.random.default_rng(7).permutation(len(cells))
    return [
        _run(allocator, rate, model, gpu, f"{index:012x}")
        for index, (allocator, rate, (model, gpu)) in ((i, cells[i]) for i in order)
    ]


def test_labels_name_every_varied_field() -> None:
    runs = sweep_runs()
    assert varied_fields(runs) == ["gpu", "model", "workload.request_rate"]
    labels = run_labels(runs)
    assert len(set(labels)) == len(labels) == 18
    assert "paged (gpu=A100-40GB, model=LLaMA-2-7B, request_rate=10.0)" in labels
    assert all("request_rate=" in label and "model=" in label for label in labels)


def test_rows_are_ordered_by_allocator_then_varied_values() -> None:
    runs = sweep_runs()
    ordered = order_runs(runs)
    first_seen = list(dict.fromkeys(run.summary["allocator"] for run in runs))
    keys = [
        (
            first_seen.index(run.summary["allocator"]),
            run.summary["scenario"]["gpu"],
            run.summary["scenario"]["workload"]["request_rate"],
        )
        for run in ordered
    ]
    assert keys == sorted(keys)
    assert [k[2] for k in keys[:3]] == [1.0, 2.0, 10.0]  # numbers in numeric order, not as text


def test_a_sweep_folder_lists_its_cells_in_grid_order(tmp_path: Path) -> None:
    """Cell folders are named by hash; the report takes sweep.parquet's (grid) order."""
    sweep = tmp_path / "sweep"
    grid_order = ["ffff00000000", "000000000001", "88880000aaaa"]
    for cell_id in grid_order:
        (sweep / "cells" / cell_id).mkdir(parents=True)
        (sweep / "cells" / cell_id / "summary.json").write_text("{}")
    pd.DataFrame({"cell_id": grid_order, "status": "ok"}).to_parquet(sweep / "sweep.parquet")
    assert [p.name for p in expand_results_dirs([sweep])] == grid_order


def test_a_compare_keeps_its_order() -> None:
    runs = [_run(name, 2.0, "OPT-13B", "A100-40GB", name) for name in ("paged", "contiguous")]
    assert order_runs(runs) == runs
    assert run_labels(runs) == ["paged", "contiguous"]


def test_figure_5_draws_one_line_per_allocator_and_model() -> None:
    rate_points, _ = sweep_points(sweep_runs())
    assert len(rate_points) == len(ALLOCATORS) * len(MODELS)
    assert "paged (gpu=A100-40GB, model=LLaMA-2-7B)" in rate_points
    for pairs in rate_points.values():
        ordered = sorted(pairs)
        assert [rate for rate, _ in ordered] == sorted(RATES)
        latencies = [latency for _, latency in ordered]
        assert latencies == sorted(latencies)  # one model per line: no saw-tooth


def test_figures_stay_readable_for_many_runs() -> None:
    runs = order_runs(sweep_runs())
    labels = run_labels(runs)
    pngs = render_figures(labels, runs)
    for name, png in pngs.items():
        width_px = int.from_bytes(png[16:20], "big")
        height_px = int.from_bytes(png[20:24], "big")
        assert width_px <= figures.MAX_FIGURE_WIDTH_IN * 130, name
        assert height_px <= figures.MAX_FIGURE_HEIGHT_IN * 130, name
    assert "rate_sweep" in pngs
    assert max(len(line) for label in labels for line in figures.wrap_label(label).splitlines()) <= (
        figures.LABEL_WRAP_CHARS
    )
