"""Function calls per engine turn on the benchmark workload, and who makes them (cProfile).

Why count calls rather than time them: at ~70 us per turn the engine's cost is the number of small
Python and NumPy calls it makes per turn, not any one heavy call. A call count is deterministic
(the same on any machine, at any load), so before/after figures compare exactly where wall times
would not. cProfile counts Python functions and C builtins (NumPy ufuncs and methods included).

Prints: total calls / engine turns, then the functions with the most calls per turn, each with the
callers that make most of those calls. The run is the benchmark workload (benchmarks/bench_workload.py)
at 20k requests by default; under the profiler it runs several times slower than normally.

Run: .venv/bin/python benchmarks/calls_per_turn.py [--num-prompts N] [--top K] [--save FILE.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO)
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_workload import bench_scenario, lengths_source  # noqa: E402


def func_name(func: tuple[str, int, str]) -> str:
    """`file:line(name)` with the path cut to the repository (or to the last two parts elsewhere)."""
    path, line, name = func
    if path == "~":  # a C builtin
        return name
    p = Path(path)
    try:
        short = str(p.resolve().relative_to(REPO))
    except ValueError:
        short = "/".join(p.parts[-2:])
    return f"{short}:{line}({name})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=25, help="functions to list")
    parser.add_argument("--callers", type=int, default=3, help="callers to list per function")
    parser.add_argument("--save", type=Path, default=None, help="write the raw profile (snakeviz, pstats)")
    args = parser.parse_args()

    from sim.api import simulate

    scenario = bench_scenario(args.num_prompts)
    requests = scenario.load_workload()
    profiler = cProfile.Profile()
    profiler.enable()
    run = simulate(scenario, workload=requests)
    profiler.disable()
    if args.save is not None:
        profiler.dump_stats(str(args.save))

    stats = pstats.Stats(profiler)
    turns = int(run.metrics["engine_turns"])
    total_calls = int(stats.total_calls)  # type: ignore[attr-defined]  (set by pstats, not in the stubs)
    print(
        f"workload: {len(requests):,} requests, lengths {lengths_source()}, Poisson 4 req/s; "
        f"{turns:,} engine turns, {int(run.metrics['iterations']):,} iterations"
    )
    print(f"calls per engine turn: {total_calls / turns:.1f} ({total_calls:,} calls / {turns:,} turns)")
    entries = stats.stats  # type: ignore[attr-defined]  {func: (prim calls, calls, tottime, cumtime, callers)}
    ranked = sorted(entries.items(), key=lambda kv: kv[1][1], reverse=True)[: args.top]
    print(f"\n{'calls/turn':>10}  {'share':>6}  function  <- top callers (calls/turn)")
    for func, (_, calls, _tt, _ct, callers) in ranked:
        top_callers = sorted(callers.items(), key=lambda kv: kv[1][1], reverse=True)[: args.callers]
        named = ", ".join(f"{func_name(c)} ({v[1] / turns:.2f})" for c, v in top_callers)
        print(f"{calls / turns:>10.2f}  {100 * calls / total_calls:>5.1f}%  {func_name(func)}  <- {named}")


if __name__ == "__main__":
    main()
