"""Engine speed: 100k Azure-conversation requests, Poisson 4 req/s, LLaMA-2-7B on an A100-80GB, paged/16.

Prints wall seconds, requests per wall-second and peak RSS of the simulation, and -- in the same
process, as the baseline -- a bare SimPy loop that schedules only the same arrival and completion
events (the floor any SimPy-based engine pays), plus the ratio between the two.

Bar (issue 4): < 10 s and < 300 MB peak RSS. Goal: 2.3 s (100x Vidur's 436 req/s), within 3x of bare SimPy.
Run: .venv/bin/python benchmarks/engine.py [--num-prompts N] [--stepping]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import simpy

REPO = Path(__file__).resolve().parents[1]
# Running `python benchmarks/engine.py` puts benchmarks/ first on sys.path, where sibling benchmark
# scripts (e.g. benchmarks/workloads.py) would shadow the packages of the same name.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO)
AZURE_CONV = REPO.parent / "shared" / "traces" / "azure_conv_2023" / "AzureLLMInferenceTrace_conv.csv"


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bare_simpy(arrival_s: np.ndarray, finish_s: np.ndarray) -> float:
    """Wall seconds of a SimPy run scheduling one timeout per arrival and one per completion, nothing else."""
    env = simpy.Environment()
    done = [0]

    def request(delay_s: float, service_s: float):  # SimPy generator
        yield env.timeout(delay_s)
        yield env.timeout(service_s)
        done[0] += 1

    def arrivals():  # SimPy generator
        now = 0.0
        for a, f in zip(arrival_s.tolist(), finish_s.tolist(), strict=True):
            yield env.timeout(a - now)
            now = a
            env.process(request(0.0, max(0.0, f - a)))

    start = time.perf_counter()
    env.process(arrivals())
    env.run()
    wall = time.perf_counter() - start
    assert done[0] == len(arrival_s)
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=100_000)
    parser.add_argument("--stepping", action="store_true", help="also time multi_step=False (slow)")
    args = parser.parse_args()

    from sim.api import simulate
    from sim.scenario.scenario import Scenario, WorkloadSpec

    if AZURE_CONV.is_file():
        params = {"lengths": f"empirical(source='{AZURE_CONV}')"}
        lengths_from = f"resampled from {AZURE_CONV.name}"
    else:
        params, lengths_from = {}, "azure-conv preset (trace not found)"
    scenario = Scenario(
        name="bench-engine",
        model="LLaMA-2-7B",
        gpu="A100-80GB",
        max_num_seqs=128,
        block_size=16,
        allocator="paged",
        num_prompts=args.num_prompts,
        workload=WorkloadSpec(source="azure-conv", request_rate=4.0, params=params),
    )
    load_start = time.perf_counter()
    requests = scenario.load_workload()
    load_s = time.perf_counter() - load_start
    rss_before = peak_rss_mb()
    print(
        f"workload: {len(requests):,} requests, lengths {lengths_from}, Poisson 4 req/s "
        f"(generated in {load_s:.2f} s); peak RSS before the run {rss_before:.0f} MB"
    )

    cpu_start = time.process_time()
    run = simulate(scenario, workload=requests)
    cpu_s = time.process_time() - cpu_start
    metrics = run.metrics
    wall_s = metrics["wall_s"]
    rss_mb = peak_rss_mb()
    print(
        f"kvsim engine: {wall_s:.2f} s wall ({cpu_s:.2f} s CPU), "
        f"{len(requests) / wall_s:,.0f} requests/wall-s, "
        f"peak RSS {rss_mb:.0f} MB (process)"
    )
    print(
        f"  simulated {metrics['duration_s']:,.0f} s, {metrics['iterations']:,} iterations in "
        f"{metrics['engine_turns']:,} engine turns "
        f"({metrics['iterations'] / metrics['engine_turns']:.1f} it/turn), "
        f"{metrics['completed']:,} completed, {metrics['preemptions']:,} preemptions, "
        f"mean concurrency {metrics['mean_concurrency']:.1f}"
    )

    table = run.requests
    ok = ~table["rejected"].to_numpy()
    bare_s = bare_simpy(table["arrival_s"].to_numpy()[ok], table["finish_s"].to_numpy()[ok])
    print(f"bare SimPy (same {int(ok.sum()):,} arrivals + completions): {bare_s:.2f} s wall")
    print(f"ratio engine / bare SimPy: {wall_s / bare_s:.2f}x")
    print(
        f"vs Vidur anchor (229 s, 436 req/s): {229.0 / wall_s:.0f}x faster; "
        f"bar <10 s and <300 MB: {'PASS' if wall_s < 10 and rss_mb < 300 else 'FAIL'}; "
        f"goal 2.3 s: {'met' if wall_s <= 2.3 else 'not met'}"
    )
    if args.stepping:
        step_run = simulate(scenario, workload=requests, multi_step=False)
        print(
            f"stepping (multi_step=False): {step_run.metrics['wall_s']:.2f} s wall "
            f"(jumps are {step_run.metrics['wall_s'] / wall_s:.1f}x faster)"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
