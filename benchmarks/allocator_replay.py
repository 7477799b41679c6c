"""The paged allocator alone, on the exact calls an engine run makes: time per method, results checked.

Why: in the engine benchmarks the allocator's share is mixed with the engine loop's, the cost model
and SimPy, and cProfile inflates small calls. This records every call the engine makes to the
allocator in one run (its arguments and results), then replays the calls on a fresh allocator built
with the same arguments and times each method. The replay must return exactly what the recording
did, so it is also a quick allocator-level identity check: record on the old code (`--save F`),
replay on the new (`--load F`).

Workloads: `v1` (benchmarks/engine_v1.py: vLLM v1, chunked prefill, prefix caching; 7,200 requests
by default) and `bench20k` (benchmarks/bench_workload.py: vLLM v0, no caching; 20,000 requests).

Run: .venv/bin/python -P benchmarks/allocator_replay.py [--workload v1|bench20k] [--num-prompts N]
     [--save F | --load F] [--repeat N]
"""

from __future__ import annotations

import argparse
import gc
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from allocators.paged import PagedAllocator  # noqa: E402

# What the engine and scheduler call (sim/core, sim/engines); nested calls the allocator makes to
# itself are not recorded (they replay inside the outer call).
METHODS: tuple[str, ...] = (
    "admit",
    "available_tokens",
    "breakdown",
    "breakdown_integral",
    "cached_prefix_tokens",
    "demand_tokens",
    "fork",
    "grow",
    "layout",
    "max_uniform_growth",
    "prefix_hit_tokens",
    "rejection_reason",
    "release",
)


def _copied(value: Any) -> Any:
    """A snapshot of an argument or result (arrays may be changed in place later)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return dict(value)
    return value


def record(workload: str, num_prompts: int) -> dict[str, Any]:
    """Run the workload once, recording the allocator's constructor arguments and every call."""
    from sim.api import simulate

    if workload == "v1":
        from benchmarks.engine_v1 import v1_scenario

        scenario = v1_scenario(num_prompts)
    else:
        from benchmarks.bench_workload import bench_scenario

        scenario = bench_scenario(num_prompts)
    requests = scenario.load_workload()
    built: list[tuple[tuple, dict]] = []
    calls: list[tuple[str, tuple, dict, Any]] = []
    depth = [0]
    originals = {name: getattr(PagedAllocator, name) for name in (*METHODS, "__init__")}

    def init(self: PagedAllocator, *args: Any, **kwargs: Any) -> None:
        built.append((args, kwargs))
        originals["__init__"](self, *args, **kwargs)

    def wrap(name: str) -> Any:
        method = originals[name]

        def recorded(self: PagedAllocator, *args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            try:
                arguments = tuple(_copied(arg) for arg in args)
                keywords = {key: _copied(arg) for key, arg in kwargs.items()}
                result = method(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                calls.append((name, arguments, keywords, _copied(result)))
            return result

        return recorded

    try:
        PagedAllocator.__init__ = init  # type: ignore[method-assign]
        for name in METHODS:
            setattr(PagedAllocator, name, wrap(name))
        simulate(scenario, workload=requests)
    finally:
        for name, method in originals.items():
            setattr(PagedAllocator, name, method)
    if len(built) != 1:
        raise SystemExit(f"expected one paged allocator in the run, got {len(built)}")
    return {"workload": workload, "num_prompts": num_prompts, "init": built[0], "calls": calls}


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == want.dtype and np.array_equal(got, want)
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(got[k] == want[k] for k in want)
    return type(got) is type(want) and got == want


def replay(recording: dict[str, Any]) -> tuple[dict[str, tuple[int, float]], int]:
    """Replay on a fresh allocator: {method: (calls, seconds)} and the index of the first mismatch (-1)."""
    args, kwargs = recording["init"]
    alloc = PagedAllocator(*args, **kwargs)
    times: dict[str, list] = {}
    clock = time.process_time  # CPU time: the machine may be shared
    mismatch = -1
    for index, (name, arguments, keywords, want) in enumerate(recording["calls"]):
        arguments = tuple(_copied(arg) for arg in arguments)
        method = getattr(alloc, name)
        start = clock()
        got = method(*arguments, **keywords)
        elapsed = clock() - start
        entry = times.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += elapsed
        if mismatch < 0 and not _same(got, want):
            mismatch = index
    return {name: (count, seconds) for name, (count, seconds) in times.items()}, mismatch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("v1", "bench20k"), default="v1")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--save", type=Path, help="record, write the recording here, then replay")
    parser.add_argument("--load", type=Path, help="replay this recording (made by --save)")
    parser.add_argument("--repeat", type=int, default=3, help="replays; the fastest total is shown")
    args = parser.parse_args()
    if args.load:
        with args.load.open("rb") as handle:
            recording = pickle.load(handle)
    else:
        num_prompts = args.num_prompts or (7200 if args.workload == "v1" else 20000)
        recording = record(args.workload, num_prompts)
        if args.save:
            with args.save.open("wb") as handle:
                pickle.dump(recording, handle, protocol=pickle.HIGHEST_PROTOCOL)
    gc.collect()
    gc.freeze()  # the recording's many objects are not the allocator's: keep them out of collections
    best: dict[str, tuple[int, float]] | None = None
    mismatch = -1
    for _ in range(max(1, args.repeat)):
        times, mismatch = replay(recording)
        if best is None or sum(s for _, s in times.values()) < sum(s for _, s in best.values()):
            best = times
    assert best is not None
    total_s = sum(seconds for _, seconds in best.values())
    print(
        f"{recording['workload']} at {recording['num_prompts']:,} requests: "
        f"{len(recording['calls']):,} allocator calls, {total_s:.3f} s (fastest of {args.repeat})"
    )
    print(f"{'method':<22}{'calls':>10}{'total s':>10}{'us/call':>10}{'share':>8}")
    for name, (count, seconds) in sorted(best.items(), key=lambda item: -item[1][1]):
        per_call_us = 1e6 * seconds / count
        print(f"{name:<22}{count:>10,}{seconds:>10.3f}{per_call_us:>10.2f}{seconds / total_s:>8.1%}")
    if mismatch >= 0:
        name = recording["calls"][mismatch][0]
        print(f"results: DIFFERENT from the recording, first at call {mismatch:,} ({name})")
        return 1
    print("results: identical to the recording")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
