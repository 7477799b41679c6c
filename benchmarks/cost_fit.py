"""Refit the cost model's GPU constants from ../shared/profiles and print them with their errors.

Prints, per measured GPU: the fitted `LinearFit` (the literal stored in sim/cost/gpu_fits.py
GPU_LINEAR_FITS), each file's MAPE before the fit (the old constants: hard max, HBM 0.8, FLOPs 0.5)
and after it, and the leave-one-model-out MAPE (fit on the GPU's other files, validate on this one).
Then the all-reduce tables (the literal stored in sim/cost/network.py ALL_REDUCE_TABLES).

Run: PYTHONPATH=. .venv/bin/python benchmarks/cost_fit.py [--profiles DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO)

from sim.cost.fit import fit_all_reduce, fit_linear, load_profiles, mape_pct  # noqa: E402
from sim.cost.profiles import gpu_from_file_name  # noqa: E402
from sim.scenario.presets import gpu_preset  # noqa: E402

DEFAULT_PROFILES = REPO.parent / "shared" / "profiles"
NETWORKS = ("a100_dgx", "h100_dgx")


def fits_by_gpu(profiles_dir: Path) -> dict[str, dict]:
    """For each measured GPU: its files' arrays, the fit on all of them, and leave-one-model-out fits."""
    files = sorted((profiles_dir / "vidur_mlp").glob("*.mlp.csv"))
    by_gpu: dict[str, list[Path]] = {}
    for path in files:
        by_gpu.setdefault(gpu_from_file_name(path) or "unknown", []).append(path)
    out = {}
    for gpu_name, paths in sorted(by_gpu.items()):
        gpu = gpu_preset(gpu_name)
        arrays = load_profiles(paths)
        source = "Vidur " + ", ".join(p.name.removesuffix(".mlp.csv") for p in paths)
        fit = fit_linear(list(arrays.values()), gpu.hbm_bandwidth_bytes_per_s, gpu.peak_flops, source)
        rows = []
        for name, a in arrays.items():
            before = mape_pct(
                a.roofline_s(0.8, 0.5, gpu.hbm_bandwidth_bytes_per_s, gpu.peak_flops), a.measured_s
            )
            after = mape_pct(a.predict_s(fit, gpu.hbm_bandwidth_bytes_per_s, gpu.peak_flops), a.measured_s)
            others = [b for other, b in arrays.items() if other != name]
            lomo = None
            if others:
                held_out = fit_linear(others, gpu.hbm_bandwidth_bytes_per_s, gpu.peak_flops, "lomo")
                lomo = mape_pct(
                    a.predict_s(held_out, gpu.hbm_bandwidth_bytes_per_s, gpu.peak_flops), a.measured_s
                )
            rows.append((name, len(a.measured_s), before, after, lomo))
        out[gpu_name] = {"fit": fit, "rows": rows}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    args = parser.parse_args()
    if not (args.profiles / "vidur_mlp").is_dir():
        sys.exit(f"error: {args.profiles}/vidur_mlp: not found")
    results = fits_by_gpu(args.profiles)
    print("| file | rows | MAPE before (0.8 / 0.5, hard max) | MAPE after | leave-one-model-out |")
    print("|---|---|---|---|---|")
    for result in results.values():
        for name, n, before, after, lomo in result["rows"]:
            lomo_text = "-" if lomo is None else f"{lomo:.2f} %"
            print(f"| {name} | {n} | {before:.2f} % | {after:.2f} % | {lomo_text} |")
    print("\n# sim/cost/gpu_fits.py GPU_LINEAR_FITS (measured GPUs)")
    for gpu_name, result in results.items():
        print(f"{gpu_name!r}: {result['fit']!r},")
    print("\n# sim/cost/network.py ALL_REDUCE_TABLES")
    for network in NETWORKS:
        path = args.profiles / "vidur_network" / f"{network}.all_reduce.csv"
        if path.is_file():
            print(f"{network!r}: {fit_all_reduce(path)!r},")


if __name__ == "__main__":
    main()
