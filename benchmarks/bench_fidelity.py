"""Whole-server fidelity against measured vLLM runs (issue 21): the tables of the issue's targets.

Table 1: every complete run of ../shared/bench/vllm_bench (LambdaLabsML/vllm-benchmark, vLLM 0.5.4)
replayed with `kvsim bench replay`'s rules (sim/bench/lambda_set.py) and the shipped server terms
(sim/cost/server.py SHIPPED_TERMS), one row per file with the signed % error of mean TTFT, mean TPOT,
mean E2E and request throughput, then the median |error| per metric per run group and overall.

`--fit`: refits the shipped terms (`kvsim bench fit`'s grid) per GPU and run group, prints the
literal for SHIPPED_TERMS, and the in-sample and leave-one-file-out median |error| per group (the
held-out figure is the one that counts); then the earlier-script runs' own front end and per-chunk
stream cost per GPU (sim/bench/lambda_set.py EARLIER_TERMS) with the shipped GPU-side terms fixed.
Slow: ~150 simulations per file on one core (minutes).

Table 3: the BF16/FP8 pairs of the Lambda set (same prompts and layer shapes; sim/bench/lambda_set.py
FP8_PAIR_MODELS): measured vs simulated ratio of the burst's prefill span. On H100 a check of the FP8
W8A8 kernels (sim/scenario/quantization.py) that no fit touches; on A100 the calibration of
Marlin's rate (MARLIN_COMPUTE_SCALE).

Everything printed is deterministic (no wall clock); tests/bench/test_fidelity_pins.py pins Table 1.

Run: .venv/bin/python benchmarks/bench_fidelity.py [--fit] [--bench DIR]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sim.bench.fit import FitResult, GridTable, fit_members, grid_table  # noqa: E402
from sim.bench.lambda_set import (  # noqa: E402
    EARLIER_GRID,
    LAMBDA_GRID,
    LAMBDA_STACK,
    fit_earlier,
    fp8_span_ratios,
    group_of,
    lambda_scenario,
    load_set,
    replay_set,
)
from sim.bench.published_set import (  # noqa: E402
    BOARD_FLOP_SCALES,
    PUBLISHED_GRID,
    SHAREGPT_SAMPLE,
    published_gpu,
    published_runs,
    published_scenario,
    replay_published,
    throughput_ratios,
)
from sim.bench.replay import MAPE_METRICS  # noqa: E402
from sim.bench.table import many_files_table, median_abs_errors  # noqa: E402

DEFAULT_BENCH = REPO.parent / "shared" / "bench" / "vllm_bench"
PUBLISHED_METRICS = ("request_throughput", "mean_ttft_ms", "mean_tpot_ms")
FITTED_GPUS = ("A100-80GB", "H100-80GB")  # the published rows' GPUs with vllm-v1 terms of their own


def _medians_line(label: str, results: list) -> str:
    medians = median_abs_errors(results)
    cells = "  ".join(f"{metric} {medians[metric]:5.1f} %" for metric in MAPE_METRICS)
    return f"{label:<22} n={len(results):<3} {cells}"


def shipped_table(folder: Path) -> None:
    """Table 1: the shipped terms on every file, and median |error| per group."""
    files = load_set(folder)
    results = replay_set(files)
    print("Table 1: shipped server terms, kvsim bench replay on", folder)
    print(many_files_table(results))
    groups: dict[str, list] = {}
    for bench, result in zip(files, results, strict=True):
        groups.setdefault(group_of(bench), []).append(result)
    for label, members in sorted(groups.items()):
        print(_medians_line(label, members))
    print(_medians_line("all", results))


def fp8_table(folder: Path) -> None:
    """Table 3: the served prefill speed-up of FP8 weights, measured vs simulated (H100 not fitted)."""
    print("Table 3: BF16/FP8 burst prefill span (p90 - p10 TTFT), Llama-3-8B vs 3.1-8B-FP8")
    print(f"{'pair':<18} {'measured':>9} {'simulated':>10} {'error':>8}")
    for label, measured, simulated in fp8_span_ratios(load_set(folder)):
        print(f"{label:<18} {measured:>9.2f} {simulated:>10.2f} {100 * (simulated / measured - 1):>+7.1f}%")


def published_table(csv_path: Path, folder: Path) -> None:
    """Table 2: the gpustack rows with the shipped vllm-v1 terms, medians, and H100/A100 ratios."""
    runs = published_runs(csv_path, folder)
    results = replay_published(runs)
    print(f"Table 2: shipped server terms, published gpustack points ({csv_path.name}, vLLM v0.11)")
    print(f"{'row':<16} " + " ".join(f"{m:>20}" for m in PUBLISHED_METRICS))
    for (row, _run), result in zip(runs, results, strict=True):
        print(f"{row['id']:<16} " + " ".join(f"{result.error_pct(m):>+19.1f}%" for m in PUBLISHED_METRICS))
    medians = median_abs_errors(results)
    print(f"{'median |error|':<16} " + " ".join(f"{medians[m]:>19.1f}%" for m in PUBLISHED_METRICS))
    print(f"{'pair (H100/A100 req/s)':<44} {'measured':>9} {'simulated':>10} {'error':>8}")
    for label, measured, simulated in throughput_ratios(runs, results):
        print(f"{label:<44} {measured:>9.2f} {simulated:>10.2f} {100 * (simulated / measured - 1):>+7.1f}%")


def refit_published(csv_path: Path, folder: Path) -> None:
    """--fit: the vllm-v1 terms per GPU on the published rows, with leave-one-out: the 9 H100 SXM rows
    over PUBLISHED_GRID; the A100 rows (PUBLISHED_GRID's FLOP scales) and the 5 H100 PCIe rows
    (published_gpu; BOARD_FLOP_SCALES) with the SXM fit's front end, their FLOP scale fitted. Then the
    H100/A100 ratios with every row replayed under terms fitted without it (the figure that counts)."""
    all_runs = published_runs(csv_path, folder)
    runs = [(row, run) for row, run in all_runs if published_gpu(row) in FITTED_GPUS]
    rows = {run.name: row for row, run in all_runs}
    files = [run for _row, run in runs]
    table = grid_table(files, lambda run: published_scenario(rows[run.name]), grid=PUBLISHED_GRID)
    fits = {}
    for gpu in FITTED_GPUS:
        members = [i for i, run in enumerate(files) if published_gpu(rows[run.name]) == gpu]
        fits[gpu] = fit_members(table, members)
        _print_fit(f"vllm-v1 {gpu} (published, {len(members)} rows)", fits[gpu])
    h100 = fits["H100-80GB"].terms
    held_out = {
        run.name: result
        for run, result in zip(_members_of(files, rows, "H100-80GB"), fits["H100-80GB"].held_out, strict=True)
    }
    # The shipped A100 entry: the front end is the API server's (CPU), which the A100 rows (no
    # low-load run) do not identify, so it keeps the H100 fit's front-end terms and fits its FLOP scale.
    members = [i for i, run in enumerate(files) if published_gpu(rows[run.name]) == "A100-80GB"]
    a100 = fit_members(_with_frontend_of(table, h100), members)
    _print_fit("vllm-v1 A100, H100's front end", a100)
    held_out.update(zip((files[i].name for i in members), a100.held_out, strict=True))
    # The H100 PCIe board: the same rule on its own rows (BOARD_FLOP_SCALES).
    pcie_files = [run for row, run in all_runs if published_gpu(row) == "H100-PCIe-80GB"]
    pcie_grid = {name: (getattr(h100, name),) for name in PUBLISHED_GRID}
    pcie_grid["flops_efficiency_scale"] = BOARD_FLOP_SCALES
    pcie_table = grid_table(pcie_files, lambda run: published_scenario(rows[run.name]), grid=pcie_grid)
    pcie = fit_members(_with_frontend_of(pcie_table, h100), range(len(pcie_files)))
    _print_fit(f"vllm-v1 H100-PCIe-80GB, H100's front end ({len(pcie_files)} rows)", pcie)
    held_out.update(zip((run.name for run in pcie_files), pcie.held_out, strict=True))
    medians = median_abs_errors(list(held_out.values()))
    print(
        f"all {len(held_out)} rows, each held out  "
        + "  ".join(f"{m} {medians[m]:.1f} %" for m in PUBLISHED_METRICS)
    )
    paired = [(row, run) for row, run in all_runs if run.name in held_out]
    print("pair (H100/A100 req/s), every row held out        measured  simulated    error")
    for label, measured, simulated in throughput_ratios(paired, [held_out[run.name] for _row, run in paired]):
        print(f"{label:<48} {measured:>9.2f} {simulated:>10.2f} {100 * (simulated / measured - 1):>+7.1f}%")


def _members_of(files: list[Any], rows: dict[str, dict[str, str]], gpu: str) -> list[Any]:
    """The files of `files` whose row ran on `gpu`, in order (fit_members' order)."""
    return [run for run in files if published_gpu(rows[run.name]) == gpu]


def _with_frontend_of(table: GridTable, terms: Any) -> GridTable:
    """The grid table cut to the points whose front-end terms are `terms`' (the FLOP scale free)."""
    keep = [
        g
        for g, point in enumerate(table.points)
        if all(point[name] == getattr(terms, name) for name in point if name != "flops_efficiency_scale")
    ]
    k = int(np.argmin(np.abs(table.frontends_s - terms.frontend_s)))
    return replace(
        table,
        points=[table.points[g] for g in keep],
        frontends_s=table.frontends_s[k : k + 1],
        losses=table.losses[keep][:, :, k : k + 1],
    )


def _print_fit(label: str, result: FitResult) -> None:
    """The fitted terms, then in-sample and leave-one-file-out median |error| per metric."""
    errors = result.error_table()
    print(f"{label}: {result.terms.values()}")
    for metric in (*MAPE_METRICS, "median_file_mape"):
        inside, held = errors["in_sample"][metric], errors["leave_one_out"][metric]
        print(f"    {metric:<20} {inside:6.1f} {held:6.1f}" if math.isfinite(held) else f"    {metric:<20} -")


def refit(folder: Path) -> None:
    """--fit: one grid over all files, then a fit (and leave-one-file-out) per GPU and run group."""
    files = load_set(folder)
    done = {"n": 0}

    def progress(count: int, total: int) -> None:
        if count * 10 // total != done["n"]:
            done["n"] = count * 10 // total
            print(f"  grid {count}/{total}", file=sys.stderr, flush=True)

    table = grid_table(files, lambda_scenario, stack=LAMBDA_STACK, grid=LAMBDA_GRID, progress=progress)
    groups: dict[str, list[int]] = {}
    for index, bench in enumerate(files):
        groups.setdefault(group_of(bench), []).append(index)
        groups.setdefault(f"{group_of(bench).split()[0]} all", []).append(index)  # the GPU's files
    print("Fitted server terms per group (in sample / leave-one-file-out median |error|, %):")
    shipped_held_out = []  # every file held out of the fit of the terms it is replayed with
    for label, members in sorted(groups.items()):
        result = fit_members(table, members)
        if label.endswith("later script"):
            shipped_held_out.extend(result.held_out)
        errors = result.error_table()
        print(f"{label}: {result.terms.values()}")
        for metric in (*MAPE_METRICS, "median_file_mape"):
            inside, held = errors["in_sample"][metric], errors["leave_one_out"][metric]
            print(
                f"    {metric:<20} {inside:6.1f} {held:6.1f}"
                if math.isfinite(held)
                else f"    {metric:<20} -"
            )
    earlier_held_out = []
    for gpu in ("A100-80GB", "H100-80GB"):
        result = fit_earlier(files, gpu)
        earlier_held_out.extend(result.held_out)
        values = {name: result.terms.values()[name] for name in ("frontend_s", *EARLIER_GRID)}
        _print_fit(
            f"{gpu} earlier script, shipped GPU-side terms + own front end and stream (EARLIER_TERMS)", result
        )
        print(f"    EARLIER_TERMS[{gpu!r}] = {values}")
    held_out = [*shipped_held_out, *earlier_held_out]
    print("Each file held out of the fit of the terms it is replayed with (signed % error):")
    print(many_files_table(held_out))
    print(_medians_line("all, each held out", held_out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, default=DEFAULT_BENCH, help="vllm_bench folder")
    parser.add_argument("--fit", action="store_true", help="refit the shipped terms (slow)")
    args = parser.parse_args()
    if not args.bench.is_dir():
        print(f"error: {args.bench}: not a folder (the shared bench data)", file=sys.stderr)
        sys.exit(2)
    published = args.bench.parent / "published.csv"
    # Table 2 needs published.csv beside the folder and the ShareGPT sample its ShareGPT rows draw from
    # (published_set.SHAREGPT_SAMPLE) inside it: the shared data has both; another folder of runs
    # (`--bench` on your own files) gets Tables 1 and 3 and a line saying why Table 2 is left out.
    missing = [path for path in (published, args.bench / SHAREGPT_SAMPLE) if not path.is_file()]
    if args.fit:
        refit(args.bench)
        if not missing:
            refit_published(published, args.bench)
    shipped_table(args.bench)
    fp8_table(args.bench)
    if missing:
        print(f"Table 2 left out: {missing[0]} not found")
    else:
        published_table(published, args.bench)


if __name__ == "__main__":
    main()
