"""Plot measured vs predicted linear-layer time per GPU (docs/img/cost_validation.png).

Top row: per-layer time against batch tokens for each shared file at TP 1 and TP 8 (dots: Vidur's
measured medians; lines: kvsim's fitted model from sim/cost/gpu_fits.py). Bottom row: every row's predicted
against measured time, with the +-10 % band. Reads ../shared/profiles; writes nothing else.

Run: PYTHONPATH=. .venv/bin/python benchmarks/cost_plot.py [--profiles DIR] [--output PNG]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sim.cost.profiles import gpu_from_file_name  # noqa: E402
from sim.cost.validate import validate_profile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=REPO.parent / "shared" / "profiles")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "img" / "cost_validation.png")
    args = parser.parse_args()
    files = sorted((args.profiles / "vidur_mlp").glob("*.mlp.csv"))
    if not files:
        sys.exit(f"error: {args.profiles}/vidur_mlp: no *.mlp.csv files")
    gpus = sorted({gpu_from_file_name(p) for p in files})
    fig, axes = plt.subplots(2, len(gpus), figsize=(6.5 * len(gpus), 10), squeeze=False)
    for column, gpu in enumerate(gpus):
        top, bottom = axes[0][column], axes[1][column]
        all_measured, all_predicted = [], []
        for index, path in enumerate(p for p in files if gpu_from_file_name(p) == gpu):
            result = validate_profile(path)
            rows = result.rows.sort_values("num_tokens")
            label = path.name.split("_", 1)[1].removesuffix(".mlp.csv")
            for tp, marker in ((1, "o"), (8, "s")):
                part = rows[rows["tp"] == tp]
                color = f"C{2 * index + (tp == 8)}"
                top.scatter(
                    part["num_tokens"], 1e3 * part["measured_s"], s=6, marker=marker, color=color, alpha=0.4
                )
                top.plot(
                    part["num_tokens"],
                    1e3 * part["predicted_s"],
                    color=color,
                    lw=1.2,
                    label=f"{label} TP{tp}",
                )
            all_measured.append(rows["measured_s"].to_numpy())
            all_predicted.append(rows["predicted_s"].to_numpy())
            bottom.scatter(1e3 * rows["measured_s"], 1e3 * rows["predicted_s"], s=4, alpha=0.35, label=label)
        measured, predicted = np.concatenate(all_measured), np.concatenate(all_predicted)
        mape = 100 * np.mean(np.abs(predicted / measured - 1))
        top.set(xscale="log", yscale="log", xlabel="batch tokens", ylabel="linear ops per layer per GPU (ms)")
        top.set_title(f"{gpu}: measured (dots) vs kvsim (lines)")
        top.legend(fontsize=7)
        low, high = 1e3 * measured.min() * 0.8, 1e3 * measured.max() * 1.2
        grid = np.geomspace(low, high, 50)
        bottom.plot(grid, grid, color="k", lw=0.8)
        bottom.fill_between(grid, 0.9 * grid, 1.1 * grid, color="k", alpha=0.08, label="+-10 %")
        bottom.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)")
        bottom.set_title(f"{gpu}: all {len(measured)} rows, MAPE {mape:.2f} %")
        bottom.legend(fontsize=7)
    fig.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
