"""`make demo` on a fresh clone: this commit against a base commit, timed back to back in one run.

Why: issue 24 asks that `make demo` on a fresh clone be no slower once the compiled core exists. A fresh
clone's `make demo` creates `.venv`, installs kvsim (which now compiles the core) and runs the demo, so
the figure that matters is the whole command. Both clones are timed on the same machine in the same run
(with pip's cache as warm for one as for the other: the base goes first, then this commit, then the base
again with `--repeat 2`...), so the machine's speed and load cancel out in the ratio. Tests never time it.

Prints, per run: wall seconds, CPU seconds of make and everything it started (user + system), and the
demo's last line; then this commit (and each --also commit) / base for the fastest wall time of each,
and the fastest CPU seconds of each (the figure to compare on a shared machine).

Run: .venv/bin/python benchmarks/fresh_demo.py [--base REV] [--head REV] [--also REV]... [--repeat N]
     [--keep DIR]
(default base: 3d06d69, the last commit before issue 24's compiled core; each run takes 1-3 minutes.)
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASE = "3d06d69"  # main before issue 24 (no compiled core; `make demo` installed the dev extras)


def clone_at(revision: str, folder: Path) -> None:
    """A fresh clone of this repository at `revision` in `folder` (no venv, no build outputs)."""
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "checkout", "-q", "--detach", revision], check=True)


def resolve(revision: str) -> str:
    """`revision` as a short commit hash, resolved once: a commit made while the runs go on (HEAD moves)
    must not change what the later rounds measure."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", f"{revision}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def children_cpu_s() -> float:
    """CPU seconds (user + system) of every finished child process so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_make_demo(folder: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds of `make demo` in `folder`, and its output's last non-empty line."""
    env = {key: value for key, value in os.environ.items() if key not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env["MPLBACKEND"] = "Agg"
    cpu_before_s = children_cpu_s()
    start_s = time.perf_counter()
    done = subprocess.run(["make", "demo"], cwd=folder, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - start_s
    cpu_s = children_cpu_s() - cpu_before_s
    if done.returncode != 0:
        sys.exit(f"make demo failed in {folder} (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return wall_s, cpu_s, lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help="the commit to compare with")
    parser.add_argument("--head", default="HEAD", help="the commit measured (default: HEAD)")
    parser.add_argument(
        "--also", action="append", default=[], help="another commit timed in each round (repeatable)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, alternating")
    parser.add_argument("--keep", type=Path, help="clone into this new folder and keep it")
    args = parser.parse_args()
    if args.keep is not None and args.keep.exists():
        sys.exit(f"--keep {args.keep}: already exists; give a new folder")
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="kvsim-fresh-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    best_wall_s: dict[str, float] = {}
    best_cpu_s: dict[str, float] = {}
    runs = [("base", resolve(args.base)), ("head", resolve(args.head))]
    runs += [(f"also{index + 1}", resolve(revision)) for index, revision in enumerate(args.also)]
    try:
        for round_index in range(args.repeat):
            for label, revision in runs:
                folder = workdir / f"{label}-{round_index}"
                clone_at(revision, folder)
                wall_s, cpu_s, last_line = time_make_demo(folder)
                best_wall_s[label] = min(best_wall_s.get(label, wall_s), wall_s)
                best_cpu_s[label] = min(best_cpu_s.get(label, cpu_s), cpu_s)
                figures = f"wall {wall_s:6.1f} s  cpu {cpu_s:6.1f} s"
                print(f"{label} ({revision}) run {round_index + 1}: {figures}  | {last_line[:90]}")
                sys.stdout.flush()
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    base_s = best_wall_s["base"]
    for label, revision in runs[1:]:
        ratio = best_wall_s[label] / base_s
        verdict = "not slower" if ratio <= 1.0 else "SLOWER"
        print(f"fresh-clone make demo, best wall: {label} ({revision}) {best_wall_s[label]:.1f} s", end="")
        print(f" / base {base_s:.1f} s = {ratio:.2f} {verdict}", end="")
        print(f"; best cpu {best_cpu_s[label]:.1f} s / {best_cpu_s['base']:.1f} s")


if __name__ == "__main__":
    main()
