"""The device procedure behind gpu/run_device.sh: checks, ceilings, GEMMs, grid, fit -- losing nothing.

Why a module and not `kvsim calibrate`: the GPU machine has CuPy and NumPy but not necessarily the
simulator's dependencies (SimPy, pydantic, typer), so this entry point needs only gpu/ and argparse.

A device run is scarce (one try, ~15 minutes of device time, start-up included), so every result goes
to $OUT the moment it exists, and a failure of any kind still leaves a profile:

* `checks.csv`: every check result (kernels, grid shape families, GEMMs), written BEFORE any timing,
  also when a check failed (then nothing is timed and the exit code is 1);
* `raw.csv` and `linear.mlp.csv`: one line appended (and flushed) per grid point / linear row as it is
  measured, so even a killed process leaves every measured row;
* `errors.csv`: one line per point that raised (only created when one did); the run goes on;
* `profile.json`: written at the end, or -- on any exception, SIGTERM or SIGINT -- a partial profile
  built from what was measured (`"complete": false`, `"failure"`, `"stage"`);
* `table.txt`: the summary table, printed last.

Exit codes (one per cause): 0 complete; 1 a kernel or GEMM disagreed with the reference (nothing
timed); 2 no device; 3 complete, but some points raised (see errors.csv); 4 stopped by an unexpected
error (partial profile); 5 stopped by SIGTERM/SIGINT, e.g. the call's time limit (partial profile).
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from gpu.errors import KernelCheckError, NoDeviceError

EXIT_OK = 0
EXIT_KERNEL_MISMATCH = 1
EXIT_NO_DEVICE = 2
EXIT_POINT_ERRORS = 3
EXIT_CRASHED = 4
EXIT_INTERRUPTED = 5
EXIT_MEANINGS: dict[int, str] = {
    EXIT_OK: "complete",
    EXIT_KERNEL_MISMATCH: "a kernel or GEMM disagreed with the reference; nothing was timed (see checks.csv)",
    EXIT_NO_DEVICE: "no CUDA device",
    EXIT_POINT_ERRORS: "complete, but some points raised (see errors.csv)",
    EXIT_CRASHED: "stopped by an unexpected error; partial profile written",
    EXIT_INTERRUPTED: "stopped by a signal (time limit?); partial profile written",
}
CHECK_COLUMNS: tuple[str, ...] = (
    "kernel", "paged", "dtype", "head_dim", "group", "block_size", "family", "rel_err", "tolerance", "ok",
)  # fmt: skip
ERROR_COLUMNS: tuple[str, ...] = ("what", "error")


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived: unwind (so the partial profile is written), then exit 5."""


class CsvAppender:
    """A CSV file that gets its header at once and each row flushed as it comes (0644, like any file)."""

    def __init__(self, path: Path, columns: tuple[str, ...]) -> None:
        self.path = path
        self.columns = columns
        self._handle: TextIO | None = None
        self.count = 0

    def append(self, row: dict[str, Any]) -> None:
        self.open_with_header()
        self._writer.writerow({k: row.get(k, "") for k in self.columns})
        self._handle.flush()
        self.count += 1

    def open_with_header(self) -> CsvAppender:
        if self._handle is None:
            self._handle = self.path.open("w", newline="")
            self._writer = csv.DictWriter(self._handle, fieldnames=list(self.columns), lineterminator="\n")
            self._writer.writeheader()
            self._handle.flush()
        return self

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def _recorder(out: Path) -> Any:
    """A gpu.calibrate.Recorder that writes every result to `out` as it arrives."""
    from gpu.calibrate import RAW_COLUMNS, Recorder
    from gpu.linear import CSV_COLUMNS

    class FileRecorder(Recorder):
        def __init__(self) -> None:
            self.raw = CsvAppender(out / "raw.csv", RAW_COLUMNS).open_with_header()
            self.linear = CsvAppender(out / "linear.mlp.csv", CSV_COLUMNS)
            self.errors = CsvAppender(out / "errors.csv", ERROR_COLUMNS)

        def on_checks(self, results: list[Any], linear_checks: list[dict[str, Any]]) -> None:
            checks = CsvAppender(out / "checks.csv", CHECK_COLUMNS)
            for r in results:
                checks.append(r.as_dict())
            for c in linear_checks:
                checks.append(
                    {"kernel": "gemm", "dtype": "bf16", "family": f"{c['model']} tp={c['tp']} {c['op']}",
                     "rel_err": c["rel_err"], "tolerance": _linear_tol(), "ok": c["ok"]}
                )  # fmt: skip
            checks.open_with_header().close()

        def on_row(self, row: dict[str, Any]) -> None:
            self.raw.append(row)

        def on_linear_row(self, row: dict[str, Any]) -> None:
            self.linear.append(row)

        def on_error(self, entry: dict[str, Any]) -> None:
            self.errors.append(entry)

        def close(self) -> None:
            for f in (self.raw, self.linear, self.errors):
                f.close()

    return FileRecorder()


def _linear_tol() -> float:
    from gpu.linear import LINEAR_REL_TOL

    return LINEAR_REL_TOL


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def write_profile(profile: dict[str, Any], path: Path) -> bool:
    """Validated and atomic when the profile is valid (True); otherwise written as is (False)."""
    from gpu.errors import GpuError
    from gpu.profile import save_profile, write_text_atomic

    try:
        save_profile(profile, path)
        return True
    except GpuError as exc:
        profile = {**profile, "invalid": str(exc)}
        write_text_atomic(path, json.dumps(profile, indent=1) + "\n")
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for every output file")
    parser.add_argument("--quick", action="store_true", help="small grid (smoke run)")
    parser.add_argument("--max-point-gb", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--time-budget-s", type=float, default=270.0, help="stop timing (linear layers, grid) after this"
    )
    parser.add_argument("--no-linear", action="store_true", help="skip the linear layers (GEMMs)")
    parser.add_argument("--warm-up-s", type=float, default=1.0, help="streaming reads before the ceilings")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    def log(message: str) -> None:
        """Print with the elapsed time; a closed stdout (tee killed with the call) must not stop the run."""
        try:
            print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)
        except OSError:
            pass

    from gpu.calibrate import CalibrationState, build_profile, run_calibration, summary_table

    args.out.mkdir(parents=True, exist_ok=True)
    state = CalibrationState()
    recorder = _recorder(args.out)
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    code, failure = EXIT_OK, None
    profile: dict[str, Any] | None = None
    try:
        profile, rows = run_calibration(
            seed=args.seed,
            quick=args.quick,
            max_point_bytes=int(args.max_point_gb * 1e9),
            repeats=max(args.repeats, 20),
            time_budget_s=args.time_budget_s,
            log=log,
            linear=not args.no_linear,
            warm_up_s=args.warm_up_s,
            state=state,
            recorder=recorder,
        )
        if state.errors:
            code = EXIT_POINT_ERRORS
    except NoDeviceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NO_DEVICE
    except KernelCheckError as exc:
        print(f"STOP: {exc} (nothing timed; check results in {args.out / 'checks.csv'})", file=sys.stderr)
        return EXIT_KERNEL_MISMATCH
    except Interrupted as exc:
        code, failure = EXIT_INTERRUPTED, f"interrupted by {exc} during {state.stage}"
    except Exception as exc:
        traceback.print_exc()
        code, failure = (
            EXIT_CRASHED,
            f"{type(exc).__name__} during {state.stage}: {str(exc).splitlines()[0] if str(exc) else ''}",
        )
    finally:
        recorder.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if profile is None:
        profile = build_profile(state, complete=False, failure=failure)
    valid = write_profile(profile, args.out / "profile.json")  # first: the log may be gone
    table = summary_table(profile) if profile.get("ceilings") else f"no ceilings measured ({failure})"
    (args.out / "table.txt").write_text(table + "\n")
    if failure:
        log(f"FAILED: {failure}; wrote a partial profile from {len(state.rows)} grid rows")
    rows_note = f"{len(state.rows)} grid rows, {len(state.linear_rows)} linear rows"
    if not valid:
        rows_note += ", NOT a valid profile: see its key 'invalid'"
    log(f"wrote {args.out / 'profile.json'} ({rows_note}), raw.csv, linear.mlp.csv, checks.csv")
    log(f"table:\n{table}")
    log(f"exit {code}: {EXIT_MEANINGS[code]}")
    return code


if __name__ == "__main__":
    sys.exit(main())
