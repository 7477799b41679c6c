"""Trace reading speed and memory: the line-level reader ("lines") vs Arrow first ("auto"), one run.

Why (issue 23 item 10): `kvsim workload describe` on a 1M-row CSV took 68 s and 528 MB, and on a
91 MB Mooncake JSON-lines file 66 s and 1.2 GB. This script writes such files into a temporary
folder (nothing is read from the network or kept): a 1M-row generic CSV (~20 MB), a 1M-row Azure
CSV (~40 MB) and a ~90 MB Mooncake file with shared prefixes. Each (file, reader) pair is read in
its own child process, which reports wall seconds and its peak RSS (VmHWM) beside the peak it had
after imports, so one reader's memory never hides the other's. A last child reads each file
both ways and checks the tables are identical (`assert_frame_equal(check_exact=True)`, same attrs).

Readers: "lines" (the line-level reader, as before), "auto" (Arrow first), "describe" (what
`kvsim workload describe FILE` does: load with "auto", validate, describe).
Run: .venv/bin/python benchmarks/trace_read.py [--rows N] [--mooncake-mb M] [--keep DIR]
Targets: "auto" reads each file in seconds, with peak RSS in proportion to the kept columns.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def write_generic_csv(path: Path, rows: int, rng: np.random.Generator) -> None:
    """arrival_s (Poisson, 4 req/s, microseconds), prompt_tokens, output_tokens."""
    arrival_s = np.cumsum(rng.exponential(0.25, rows))
    arrival_s -= arrival_s[0]
    prompt = rng.integers(1, 4096, rows)
    output = rng.integers(1, 1024, rows)
    with path.open("w") as handle:
        handle.write("arrival_s,prompt_tokens,output_tokens\n")
        np.savetxt(
            handle, np.column_stack([arrival_s, prompt, output]), fmt=["%.6f", "%d", "%d"], delimiter=","
        )


def write_azure_csv(path: Path, rows: int, rng: np.random.Generator) -> None:
    """The Azure 2023 layout: zone-less stamps with 7 fractional digits, as in the published files."""
    start = np.datetime64("2023-11-16T18:15:46", "ns")
    gaps_ns = (rng.exponential(0.25, rows) * 1e9).astype(np.int64) // 100 * 100
    stamps = np.datetime_as_string(start + np.cumsum(gaps_ns).astype("timedelta64[ns]"), unit="ns")
    text = np.char.add(np.char.replace(stamps, "T", " "), "")
    prompt = rng.integers(1, 8192, rows)
    output = rng.integers(1, 1024, rows)
    with path.open("w") as handle:
        handle.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for i in range(0, rows, 100_000):
            end = min(rows, i + 100_000)
            handle.write(
                "".join(
                    f"{s[:-2]},{p},{o}\n"
                    for s, p, o in zip(
                        text[i:end], prompt[i:end].tolist(), output[i:end].tolist(), strict=True
                    )
                )
            )


def write_mooncake(path: Path, target_mb: float, rng: np.random.Generator) -> int:
    """Mooncake JSON lines: sessions whose turns repeat the session's earlier blocks, plus system prefixes."""
    rows = 0
    written = 0
    next_id = 0
    stamp_ms = 0
    system = [list(range(k * 40, k * 40 + int(rng.integers(2, 8)))) for k in range(50)]
    next_id = 50 * 40
    with path.open("w") as handle:
        while written < target_mb * 1e6:
            blocks = list(system[int(rng.integers(0, 50))])
            for _ in range(int(rng.integers(1, 6))):  # turns of one session grow its history
                new = int(rng.integers(1, 12))
                blocks += list(range(next_id, next_id + new))
                next_id += new
                input_length = len(blocks) * 512 - int(rng.integers(0, 512))
                stamp_ms += int(rng.integers(0, 400))
                line = json.dumps(
                    {
                        "timestamp": stamp_ms,
                        "input_length": input_length,
                        "output_length": int(rng.integers(1, 1000)),
                        "hash_ids": blocks,
                    }
                )
                handle.write(line + "\n")
                written += len(line) + 1
                rows += 1
    return rows


def _vm_mib(field: str) -> float:
    """VmHWM (peak) or VmRSS of this process from /proc, in MiB.

    Why not `ru_maxrss`: Linux carries it across fork and exec, so a child would report the parent's
    peak (the file generator's); VmHWM belongs to the child's own address space.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(path: str, reader: str) -> None:
    """Read one file one way ("describe": the whole `kvsim workload describe` path, Arrow first);
    print JSON: seconds, rows, peak RSS before the read and after it (MiB)."""
    import workloads
    from workloads.readers import read_trace

    base_mib = _vm_mib("VmHWM")
    start = time.perf_counter()
    if reader == "describe":
        rows = workloads.describe(workloads.load(path))["count"]
    else:
        rows = len(read_trace(path, reader=reader).table)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "rows": rows, "base_mib": base_mib, "peak_mib": _vm_mib("VmHWM")}))


def identity(path: str) -> None:
    """Exit 0 when both readers give the same table and attrs."""
    import pandas as pd

    from workloads.readers import read_trace

    fast, lines = read_trace(path, reader="auto"), read_trace(path, reader="lines")
    pd.testing.assert_frame_equal(fast.table, lines.table, check_exact=True)
    assert fast.attrs == lines.attrs, (fast.attrs, lines.attrs)
    print("identical")


def _run_child(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-P", __file__, *args], capture_output=True, text=True, check=False, cwd=REPO
    )
    if done.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of each CSV")
    parser.add_argument("--mooncake-mb", type=float, default=91.0, help="size of the Mooncake file")
    parser.add_argument("--keep", type=Path, help="write the files here (and keep them)")
    parser.add_argument("--child", nargs=2, metavar=("FILE", "READER"), help=argparse.SUPPRESS)
    parser.add_argument("--identity", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    if args.identity:
        identity(args.identity)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(23)
        files = {
            "generic CSV": folder / "generic.csv",
            "Azure CSV": folder / "azure.csv",
            "Mooncake JSONL": folder / "mooncake.jsonl",
        }
        write_generic_csv(files["generic CSV"], args.rows, rng)
        write_azure_csv(files["Azure CSV"], args.rows, rng)
        write_mooncake(files["Mooncake JSONL"], args.mooncake_mb, rng)
        head = ("file", "MB", "rows", "reader", "s", "peak RSS MiB", "+read")
        print("{:16s} {:>6s} {:>9s} {:>8s} {:>7s} {:>12s} {:>6s}".format(*head))
        for label, path in files.items():
            size_mb = path.stat().st_size / 1e6
            for reader in ("lines", "auto", "describe"):
                got = json.loads(_run_child("--child", str(path), reader))
                print(
                    f"{label:16s} {size_mb:6.1f} {got['rows']:9,d} {reader:>8s} {got['seconds']:7.2f} "
                    f"{got['peak_mib']:12.0f} {got['peak_mib'] - got['base_mib']:6.0f}"
                )
            print(f"{label:16s} tables of both readers: {_run_child('--identity', str(path))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
