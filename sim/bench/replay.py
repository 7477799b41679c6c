"""Replay a measured `vllm bench serve` run through the simulator and compare, metric by metric.

Why exactly the file's requests: a benchmark's result depends on its request stream, so the replay
sends the file's own per-request prompt and output lengths, in send order, with the benchmark's
arrival process (vLLM `benchmark_serving.py` / `vllm bench serve`, `get_request`): request_rate inf
sends everything at t = 0; a finite rate draws gamma inter-arrival gaps with shape `burstiness` and
mean 1/rate (burstiness 1 is Poisson) from the scenario's one random stream; `max_concurrency` with
rate inf is a closed loop of that many clients (the benchmark's semaphore), each sending its next
request as soon as the previous response ends (plus the front end's time, sim/cost/server.py).

What is compared (docs/metrics.md "Bench replay"): throughputs; TTFT over the requests that streamed
text (a file's `ttfts` are 0.0 for empty answers); TPOT over requests with more than one output
token, as vLLM computes it; ITL and E2E from the file's aggregates. Per-request measured TTFTs are
used when the file has them (they reproduce vLLM's stored aggregates, which include the zeros).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sim.bench.results_file import AGGREGATE_FIELDS, BenchFile, BenchFileError
from sim.cost.server import ServerTerms

# The four metrics whose mean absolute percentage error is the replay's last line (issue 21).
MAPE_METRICS: tuple[str, ...] = ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "request_throughput")
# Rows of the side-by-side table, in order: every aggregate the reader keeps.
TABLE_METRICS: tuple[str, ...] = AGGREGATE_FIELDS


@dataclass(frozen=True)
class ReplayResult:
    """Measured and simulated values of one file, keyed as TABLE_METRICS (NaN where unknown)."""

    name: str
    measured: dict[str, float]
    simulated: dict[str, float]
    summary: dict[str, Any] = field(default_factory=dict)

    def error_pct(self, metric: str) -> float:
        """Signed (simulated - measured) / measured in %; NaN when either is unknown or measured is 0."""
        measured, simulated = self.measured.get(metric, math.nan), self.simulated.get(metric, math.nan)
        if not (math.isfinite(measured) and math.isfinite(simulated)) or measured == 0:
            return math.nan
        return 100.0 * (simulated - measured) / measured

    def mape_pct(self) -> float:
        """Mean absolute % error over MAPE_METRICS that the file measured."""
        errors = [abs(self.error_pct(metric)) for metric in MAPE_METRICS]
        known = [error for error in errors if math.isfinite(error)]
        return float(np.mean(known)) if known else math.nan


def arrival_times_s(bench: BenchFile, rng: np.random.Generator) -> np.ndarray:
    """Send times of the open loop: all 0 at rate inf, else cumulative gamma gaps (vLLM get_request)."""
    count = bench.num_prompts
    if math.isinf(bench.request_rate):
        return np.zeros(count, dtype=np.float64)
    theta = 1.0 / (bench.request_rate * bench.burstiness)
    gaps = rng.gamma(shape=bench.burstiness, scale=theta, size=count)
    gaps[0] = 0.0  # the benchmark sends its first request at once and sleeps after each send
    return np.cumsum(gaps)


def request_table(bench: BenchFile, rng: np.random.Generator, frontend_s: float = 0.0) -> pd.DataFrame:
    """The file's requests as a validated request table, with the benchmark's arrival process.

    An empty answer (output length 0) still ran its prefill and produced one token (EOS): it is
    replayed as one output token. `max_tokens` is the generated length (the file has no limits).
    """
    from workloads.schema import validate

    if (bench.input_lens < 1).any():
        row = int(np.flatnonzero(bench.input_lens < 1)[0])
        raise BenchFileError(
            f"{bench.path}: field 'input_lens' row {row}: expected a prompt of >= 1 token (got 0)"
        )
    if bench.max_concurrency is not None and not math.isinf(bench.request_rate):
        raise BenchFileError(
            f"{bench.path}: field 'max_concurrency': replaying a finite request_rate together with "
            "max_concurrency is not modelled (use one of them)"
        )
    outputs = np.maximum(bench.output_lens, 1)
    table = pd.DataFrame(
        {
            "request_id": np.arange(bench.num_prompts, dtype=np.int64),
            "arrival_s": arrival_times_s(bench, rng),
            "prompt_tokens": bench.input_lens.astype(np.int64),
            "output_tokens": outputs.astype(np.int64),
            "max_tokens": outputs.astype(np.int64),
        }
    )
    table = validate(table)
    table.attrs["source"] = bench.name
    if bench.max_concurrency is not None:
        # the client's next send follows the previous response; it reaches the engine frontend_s later
        table.attrs["closed_loop"] = {"users": int(bench.max_concurrency), "think_s": float(frontend_s)}
    return table


def _stats(values: np.ndarray, stem: str) -> dict[str, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {f"mean_{stem}": math.nan, f"median_{stem}": math.nan, f"p99_{stem}": math.nan}
    return {
        f"mean_{stem}": float(values.mean()),
        f"median_{stem}": float(np.median(values)),
        f"p99_{stem}": float(np.percentile(values, 99)),
    }


def streamed_mask(bench: BenchFile) -> np.ndarray:
    """Requests that streamed text: succeeded with an output (a 0.0 TTFT is an empty answer)."""
    mask = bench.ok & (bench.output_lens > 0)
    if bench.ttfts_s is not None:
        mask &= bench.ttfts_s > 0
    return mask


def measured_metrics(bench: BenchFile) -> dict[str, float]:
    """The file's values as compared: TTFT from per-request `ttfts` over streamed requests when present."""
    measured = dict(bench.measured)
    if bench.ttfts_s is not None:
        measured.update(_stats(bench.ttfts_s[streamed_mask(bench)] * 1e3, "ttft_ms"))
    return measured


def simulated_metrics(bench: BenchFile, requests: pd.DataFrame, metrics: dict[str, Any]) -> dict[str, float]:
    """The simulation's values over the same requests as `measured_metrics` (vLLM's definitions)."""
    ordered = requests.sort_values("request_id")
    ttft = ordered["ttft_ms"].to_numpy(np.float64)
    tpot = ordered["tpot_ms"].to_numpy(np.float64)
    e2el = ordered["e2el_ms"].to_numpy(np.float64)
    itl = ordered["itl_ms"].to_numpy(np.float64) if "itl_ms" in ordered else np.full(len(ordered), math.nan)
    ttft_set = streamed_mask(bench) if bench.ttfts_s is not None else bench.ok
    simulated = {
        "request_throughput": float(metrics.get("request_throughput", math.nan)),
        "output_throughput": float(bench.output_lens[bench.ok].sum() / metrics["duration_s"])
        if metrics.get("duration_s")
        else math.nan,
    }
    simulated.update(_stats(ttft[ttft_set], "ttft_ms"))
    simulated.update(_stats(tpot[bench.ok & (bench.output_lens > 1)], "tpot_ms"))
    simulated.update(_stats(itl[bench.ok & (bench.output_lens > 1)], "itl_ms"))
    simulated.update(_stats(e2el[bench.ok], "e2el_ms"))
    return simulated


def replay(bench: BenchFile, scenario: Any, server: ServerTerms | None = None) -> ReplayResult:
    """Simulate the file's requests under `scenario` (model, GPU, TP, engine flags) and compare.

    `server`: the server-level terms (None: the scenario's bench profile, else neutral). A failed
    run (most requests errored) is refused: its throughput and latencies measure a crash.
    """
    from sim.api import simulate
    from sim.cost.server import scenario_terms

    if bench.failed_run:
        raise BenchFileError(bench.failed_run_line())
    terms = scenario_terms(scenario) if server is None else server
    table = request_table(bench, scenario.rng(), terms.frontend_s + terms.frontend_service_s)
    scenario = scenario.with_overrides(num_prompts=bench.num_prompts)
    run = simulate(scenario, workload=table, server=terms)
    rejected = int(run.metrics.get("rejected", 0))
    if rejected:
        raise BenchFileError(
            f"{bench.path}: {rejected} of {bench.num_prompts} requests cannot run under this scenario "
            "(prompt + output longer than --max-model-len, or larger than the KV cache)"
        )
    return ReplayResult(
        name=bench.name,
        measured=measured_metrics(bench),
        simulated=simulated_metrics(bench, run.requests, run.metrics),
        summary={"cost_model": run.summary["cost_model"], "server_terms": terms.describe()},
    )
