"""Where a run's memory goes, per request: tracemalloc over each stage of a run's per-request state.

Why stage by stage and not one RSS figure: the 1M-request bar (issue 16: <= 400 MB peak RSS) is met
by making every per-request structure compact, and each change must be measured on its own. A
full 1M simulation takes minutes; the per-request state does not depend on how the requests are
served, so this script builds it directly and fills the request log through its public methods
(arrive, admit, first token, finish) with realistic values, in seconds:

1. the request table (`Scenario.load_workload`): kept bytes and the generator's peak;
2. the engine's per-request state before the run (`Engine(...)`: RequestLog, RequestInfo,
   ArrivalSource, StepRecorder), then after filling the log;
3. `RequestLog.to_frame` (the requests table) and `summarize`: bytes added and peak.

Figures are tracemalloc bytes (Python objects and NumPy buffers), printed as MB and bytes per
request. Not traced: the steps table's anonymous memory map (StepRecorder, at most max_step_rows x
18 columns x 8 bytes = 28.8 MB, resident as rows are written) and the Arrow buffers of the two
string columns (~20 bytes a request). The peak RSS of the whole process is printed last; it
includes tracemalloc's bookkeeping (tens of bytes per live Python object), so use
benchmarks/engine.py for the RSS bar.

Run: .venv/bin/python benchmarks/memory.py [--num-prompts N]
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO)
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_workload import bench_scenario  # noqa: E402


class Stage:
    """tracemalloc bytes kept and peaked by one stage (peak relative to the stage's start)."""

    def __init__(self, num: int) -> None:
        self.num = num

    def __enter__(self) -> Stage:
        self.start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        return self

    def __exit__(self, *exc: object) -> None:
        now, peak = tracemalloc.get_traced_memory()
        self.kept = now - self.start
        self.peak = peak - self.start

    def line(self, name: str) -> str:
        per = self.num
        return (
            f"{name:<44} kept {self.kept / 1e6:8.1f} MB ({self.kept / per:6.1f} B/request)   "
            f"peak {self.peak / 1e6:8.1f} MB ({self.peak / per:6.1f} B/request)"
        )


def fill_log(log: object, requests: object) -> None:
    """Arrive, admit, sample a first token and finish every request through the log's own writes."""
    arrival = requests["arrival_s"].to_numpy().tolist()
    output = requests["output_tokens"].to_numpy().tolist()
    for req, (t, out) in enumerate(zip(arrival, output, strict=True)):
        log.arrival_s[req] = t
        log.admitted_s[req] = t + 0.25
        log.prefix_hit_tokens[req] = 0
        log.samples_left[req] = 1
        log.first_token_s[req] = t + 0.5
        log.finish_sample(req, t + 0.5 + 0.02 * out, out, "stop")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=1_000_000)
    args = parser.parse_args()

    from sim.api import engine_config
    from sim.core.engine import Engine
    from sim.core.metrics import summarize
    from sim.cost.model import CostModel

    scenario = bench_scenario(args.num_prompts)
    num = args.num_prompts
    tracemalloc.start()
    with Stage(num) as load:
        requests = scenario.load_workload()
    print(load.line("request table (load_workload)"))
    allocator = scenario.make_allocator()
    cost = CostModel.from_scenario(scenario)
    with Stage(num) as build:
        engine = Engine(requests, allocator, cost, engine_config(scenario))
    print(build.line("engine state before the run"))
    with Stage(num) as fill:
        fill_log(engine.log, requests)
    print(fill.line("request log filled"))
    with Stage(num) as frame:
        table = engine.log.to_frame(requests)
        steps = engine.recorder.to_frame()
    print(frame.line("requests table (RequestLog.to_frame)"))
    totals = {
        "duration_s": float(table["finish_s"].max()),
        "generated_tokens": 0,
        "prefill_tokens": 0,
        "iterations": 1,
        "turns": 1,
        "running_seq_s": 0.0,
        "busy_s": 0.0,
        "max_running": 0,
        "queue_request_s": 0.0,
        "max_queue_length": 0,
    }
    with Stage(num) as summary:
        summarize(table, steps, totals, capacity_tokens=1, kv_bytes_per_token=None, wall_s=0.0)
    print(summary.line("summarize"))
    del engine
    gc.collect()  # the engine holds reference cycles (bound methods as callbacks)
    current, _ = tracemalloc.get_traced_memory()
    print(
        f"{'kept at the end (table + requests table)':<44} {current / 1e6:8.1f} MB "
        f"({current / num:6.1f} B/request)"
    )
    tracemalloc.stop()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {rss_mb:.0f} MB (with tracemalloc's own bookkeeping)")


if __name__ == "__main__":
    main()
