"""The device procedure behind gpu/run_device.sh: environment, checks, ceilings, grid, fit, outputs.

Why a module and not `kvsim calibrate`: the GPU machine has CuPy and NumPy but not necessarily the
simulator's dependencies (SimPy, pydantic, typer), so this entry point needs only gpu/ and argparse.
It writes $OUT/profile.json, $OUT/raw.csv and $OUT/table.txt and prints the table last.
Exit codes: 0 done, 1 a kernel disagreed with the reference (nothing timed), 2 no device.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpu.errors import KernelCheckError, NoDeviceError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for profile.json, raw.csv, table.txt")
    parser.add_argument("--quick", action="store_true", help="small grid (smoke run)")
    parser.add_argument("--max-point-gb", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--time-budget-s", type=float, default=270.0, help="stop timing grid points after this"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    from gpu.calibrate import run_calibration, summary_table, write_outputs

    try:
        profile, rows = run_calibration(
            seed=args.seed,
            quick=args.quick,
            max_point_bytes=int(args.max_point_gb * 1e9),
            repeats=max(args.repeats, 20),
            time_budget_s=args.time_budget_s,
            log=log,
        )
    except NoDeviceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KernelCheckError as exc:
        print(f"STOP: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    write_outputs(profile, rows, args.out / "profile.json", args.out / "raw.csv")
    table = summary_table(profile)
    (args.out / "table.txt").write_text(table + "\n")
    log(f"wrote {args.out / 'profile.json'} ({len(rows)} rows) and {args.out / 'raw.csv'}")
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
