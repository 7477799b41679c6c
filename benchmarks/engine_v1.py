"""Engine speed where the jump cannot help: vLLM v1 with chunked prefill and prefix caching (issue 24).

The workload is a synthetic stand-in for a real-workload replay (Qwen2.5-7B on an H100-80GB, 7,200
requests over ~1,200 s): Poisson 6 req/s, prompts of ~600 tokens of which a 150-token system prompt
is shared within each of 10 groups, 250 output tokens, max_num_seqs 128, a 2,048-token step budget,
chunked prefill and prefix caching on. Every iteration is an engine turn here, so the figure that
matters is CPU microseconds per simulated step.

Prints: steps, CPU seconds and CPU us per step of the engine run (`run_engine` alone, workload and
cost model built before the clock starts), wall seconds of the whole `simulate` call, and peak RSS.
Targets (issue 24): <= 20 us per step, goal 10 us. `--repeat N` takes the fastest of N runs.
Run: .venv/bin/python benchmarks/engine_v1.py [--num-prompts N] [--repeat N] [--pure]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO)
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TARGET_US, GOAL_US = 20.0, 10.0


def v1_scenario(num_prompts: int = 7200):  # returns sim.Scenario
    """The issue-24 v1 workload (also a results_identity.py run)."""
    from sim.scenario.scenario import Scenario, WorkloadSpec

    return Scenario(
        name="bench-v1",
        model="Qwen2.5-7B",
        gpu="H100-80GB",
        engine="vllm-v1",
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        block_size=16,
        allocator="paged",
        num_prompts=num_prompts,
        workload=WorkloadSpec(
            source="sharegpt",
            request_rate=6.0,
            params={
                "prompt_len": "lognormal(mean=450, cv=0.5, max=4000)",
                "output_len": "fixed(250)",
                "system_prompt_tokens": 150,
                "system_prompt_fraction": 1.0,
                "system_prompt_groups": 10,
            },
        ),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=7200)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--pure", action="store_true", help="force the pure-Python path (KVSIM_PURE=1)")
    args = parser.parse_args()
    if args.pure:
        os.environ["KVSIM_PURE"] = "1"
    import sim
    from sim.api import simulate

    scenario = v1_scenario(args.num_prompts)
    requests = scenario.load_workload()
    best_cpu_s = best_wall_s = float("inf")
    run = None
    for _ in range(max(1, args.repeat)):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        run = simulate(scenario, workload=requests)
        best_cpu_s = min(best_cpu_s, time.process_time() - cpu0)
        best_wall_s = min(best_wall_s, time.perf_counter() - wall0)
    assert run is not None
    steps = int(run.metrics["iterations"])  # simulated engine steps (iterations), not engine turns
    turns = int(run.metrics["engine_turns"])
    us_per_step = best_cpu_s / max(steps, 1) * 1e6
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"kvsim {sim.__version__}  core: {getattr(sim, 'core_path', lambda: 'python')()}")
    print(
        f"requests {len(requests):,}  steps {steps:,}  engine turns {turns:,}  "
        f"simulated {run.metrics['duration_s']:.0f} s"
    )
    print(f"simulate: cpu {best_cpu_s:.2f} s  wall {best_wall_s:.2f} s  peak RSS {rss_mb:.0f} MB")
    verdict = "goal met" if us_per_step <= GOAL_US else ("target met" if us_per_step <= TARGET_US else "MISS")
    print(f"cpu us per step {us_per_step:.1f}  (target <= {TARGET_US:.0f}, goal {GOAL_US:.0f}): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
