"""Where the engine's time goes: one run with the paged allocator, one with an allocator that does nothing.

Why: issue 16 asks for the engine within 6x of a bare SimPy loop. This splits the gap, in one run on
one machine, into the part the paged allocator costs (block tables, growth, the exact jump
integral) and the part everything else costs (SimPy, scheduler, cost model, metrics): the
`NullAllocator` below accepts everything, holds nothing and reports an empty cache, so the engine
takes the same turns (the benchmark workload never runs out of memory, and the run prints both
turn counts to show it) and the difference between the two runs is the allocator's own work.

Run: .venv/bin/python benchmarks/engine_floor.py [--num-prompts N]   (default 20,000)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO)
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from allocators.base import AllocatorBase, MemoryBreakdown, SeqSpec  # noqa: E402
from benchmarks.bench_workload import bench_scenario  # noqa: E402
from benchmarks.engine import bare_simpy  # noqa: E402

_NO_IDS = np.zeros(0, dtype=np.int64)


class NullAllocator(AllocatorBase):
    """Admits and grows everything, holds nothing: the engine's cost without memory accounting."""

    name = "null"

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._empty = MemoryBreakdown(capacity_tokens, 0, 0, 0, 0, 0, capacity_tokens)

    def demand_tokens(self, seq: SeqSpec) -> int:
        return seq.prompt_tokens

    def admit(self, seq: SeqSpec) -> bool:
        return True

    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        return _NO_IDS

    def max_uniform_growth(self, seq_ids: np.ndarray, limit: int) -> int:
        return limit

    def release(self, seq_id: int) -> None:
        return None

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        return True

    def prefix_hit_tokens(self, seq_id: int) -> int:
        return 0

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        return self._empty


def timed_engine(requests, allocator, cost, config):  # -> (CPU s, turns, EngineResult)
    """CPU seconds, engine turns and the result of one engine run."""
    from sim.core.engine import Engine

    start = time.process_time()
    result = Engine(requests, allocator, cost, config).run()
    return time.process_time() - start, int(result.totals["turns"]), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=20_000)
    args = parser.parse_args()

    from sim.api import engine_config
    from sim.cost.model import CostModel

    scenario = bench_scenario(args.num_prompts)
    requests = scenario.load_workload()
    cost = CostModel.from_scenario(scenario)
    config = engine_config(scenario)
    paged = scenario.make_allocator()

    paged_s, paged_turns, paged_result = timed_engine(requests, paged, cost, config)
    null_s, null_turns, _ = timed_engine(requests, NullAllocator(int(paged.capacity_tokens)), cost, config)
    # the bare loop over the paged run's own arrivals and completions (as benchmarks/engine.py)
    table = paged_result.requests
    ok = ~table["rejected"].to_numpy()
    _, bare_s = bare_simpy(
        np.ascontiguousarray(table["arrival_s"].to_numpy()[ok]),
        np.ascontiguousarray(table["finish_s"].to_numpy()[ok]),
    )
    print(f"{args.num_prompts:,} requests of the issue-16 workload, CPU seconds in one process:")
    print(f"  bare SimPy (arrivals + completions): {bare_s:.2f} s")
    print(
        f"  engine, null allocator: {null_s:.2f} s ({null_turns:,} turns, "
        f"{1e6 * null_s / null_turns:.1f} us/turn): {null_s / bare_s:.1f}x bare SimPy"
    )
    print(
        f"  engine, paged allocator: {paged_s:.2f} s ({paged_turns:,} turns, "
        f"{1e6 * paged_s / paged_turns:.1f} us/turn): {paged_s / bare_s:.1f}x bare SimPy"
    )
    print(
        f"  the paged allocator's share: {100 * (paged_s - null_s) / paged_s:.0f} % of the engine's time "
        f"({1e6 * (paged_s - null_s) / paged_turns:.1f} us/turn)"
    )
    if null_turns != paged_turns:
        print("  (the two runs took different turns: the split above is approximate)")


if __name__ == "__main__":
    main()
