"""The shared measured set (../shared/bench/vllm_bench, LambdaLabsML/vllm-benchmark) as replay inputs.

Why in the package: the fitted defaults (sim/cost/server.py SHIPPED_TERMS), benchmarks/bench_fidelity.py
and the regression test must replay these files under the same settings. The settings are those of
../shared/bench/README.md: vLLM v0.5.4 (engine vllm-v0), its defaults, and for the files that carry
`*_latency_ms` fields (the September runs of the later benchmark script, commit 29dd18a) that
script's extra flags `--gpu-memory-utilization 0.95 --max-num-seqs 1024`; the others (the 2024-08-19
runs) the older script's v0.5.4 defaults (tests/bench/test_lambda_set.py: the two splits agree, and
the older runs above 32K could not have started with the later flags). Failed runs are left out.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from sim.bench.results_file import BenchFile, read_bench_file
from sim.cost.server import ServerTerms

# vLLM v0.5.4's serving stack at TP > 1: its custom all-reduce is on by default (vLLM PR #2192,
# v0.3.0; `EngineArgs.disable_custom_all_reduce` False), and a single-node TP group runs in
# multiprocessing workers, not Ray (vllm/config.py `ParallelConfig.__init__`, v0.5.1+: backend "mp"
# unless Ray is already initialised or the GPUs span nodes). The vllm-v0 preset's own defaults are
# the paper's stack (NCCL, Ray), so the set states this one. Its front end shares the engine's event
# loop (`AsyncLLMEngine`, vllm/engine/async_llm_engine.py), as the preset assumes.
LAMBDA_STACK = ServerTerms(
    custom_all_reduce=True, ray_workers=False, frontend_in_engine_process=True, source="vLLM v0.5.4 stack"
)

# The grid the shipped vllm-v0 terms were fitted on (48 points; sim/bench/fit.py GRID's form).
LAMBDA_GRID: dict[str, tuple[float, ...]] = {
    "frontend_service_s": (0.002, 0.003, 0.004),
    "flops_efficiency_scale": (0.7, 0.85, 1.0, 1.25),
    "overhead_scale": (0.15, 0.3, 0.5, 1.0),
}

LATER_SCRIPT_FLAGS: dict[str, Any] = {"gpu_memory_utilization": 0.95, "max_num_seqs": 1024}


def later_script(bench: BenchFile) -> bool:
    """Whether the file comes from the later script (it alone writes the end-to-end latency fields)."""
    return math.isfinite(bench.measured.get("mean_e2el_ms", math.nan))


def load_set(folder: str | Path) -> list[BenchFile]:
    """Every complete run under `folder` (sorted by path); failed server runs left out."""
    files = [read_bench_file(path) for path in sorted(Path(folder).glob("*/*.json"))]
    return [bench for bench in files if not bench.failed_run]


def lambda_scenario(bench: BenchFile) -> Any:
    """The scenario a Lambda file is replayed under (the CLI's rules plus the README's settings)."""
    from sim.bench.setup import scenario_for_file, scenario_from_fields

    fields: dict[str, Any] = {"engine": "vllm-v0", "config": None}
    if later_script(bench):
        fields.update(LATER_SCRIPT_FLAGS)
    return scenario_for_file(bench, fields, lambda filled: scenario_from_fields({**filled, "config": None}))


def group_of(bench: BenchFile) -> str:
    """The run group of a file: `<GPU> <later|earlier> script`, the README's two server configurations."""
    from sim.bench.identify import server_from_path

    gpu = server_from_path(bench.path).get("gpu", "unknown GPU")
    return f"{gpu} {'later' if later_script(bench) else 'earlier'} script"


# The earlier (2024-08-19) runs stream one chunk per token: their mean ITL (23-58 ms) is close to
# their TPOT, while the later runs' chunks carry many tokens (mean ITL 90-1,400 ms against median TPOT
# 11-170 ms; ../shared/bench/README.md "ITL is per streamed chunk"). So the earlier runs pay the front
# end's per-chunk cost (sim/cost/server.py `stream_chunk_s`) for every decoding sequence of every step;
# the later runs' coalesced streams are in the shipped terms' overhead. One value for both GPUs (it is
# CPU work), fitted on the 13 earlier files with every other term at its shipped value
# (`fit_stream_chunk`; benchmarks/bench_fidelity.py --fit prints it and its leave-one-file-out error;
# every fold picks 150 us; fitted per GPU it would be 325 us on the A100 files, 150 us on the H100 ones).
EARLIER_STREAM_CHUNK_S = 150e-6
STREAM_CHUNK_GRID: tuple[float, ...] = tuple(round(step * 25e-6, 9) for step in range(17))  # 0-400 us


def file_terms(bench: BenchFile, scenario: Any, stream_chunk_s: float | None = None) -> ServerTerms:
    """The terms a file is replayed with: the shipped terms of its engine and GPU, plus the per-chunk
    stream cost for the runs that stream every token (`stream_chunk_s`; None: EARLIER_STREAM_CHUNK_S)."""
    from dataclasses import replace

    from sim.cost.server import shipped_terms

    terms = shipped_terms(scenario.engine, scenario.gpu_spec().name)
    if later_script(bench):
        return terms
    chunk = EARLIER_STREAM_CHUNK_S if stream_chunk_s is None else stream_chunk_s
    return replace(terms, stream_chunk_s=chunk, source=f"{terms.source} + stream_chunk_s {chunk:g}")


def replay_set(files: list[BenchFile]) -> list[Any]:
    """Each file replayed under `lambda_scenario` with the shipped terms of its GPU and group."""
    from sim.bench.replay import replay

    results = []
    for bench in files:
        scenario = lambda_scenario(bench)
        results.append(replay(bench, scenario, file_terms(bench, scenario)))
    return results


def fit_stream_chunk(
    files: list[BenchFile], grid: tuple[float, ...] = STREAM_CHUNK_GRID
) -> tuple[float, list[Any], list[Any]]:
    """`stream_chunk_s` on the files that stream every token (the earlier runs), every other term
    shipped: (the value with the least mean file MAPE, in-sample replays, leave-one-file-out replays).

    The held-out replay of file i is the replay at the value fitted on the other files (a grid
    argmin, so no new simulation)."""
    from sim.bench.replay import replay

    members = [bench for bench in files if not later_script(bench)]
    if not members:
        raise ValueError("argument 'files': no run that streams every token (earlier script)")
    scenarios = [lambda_scenario(bench) for bench in members]
    table = [
        [replay(b, s, file_terms(b, s, value)) for b, s in zip(members, scenarios, strict=True)]
        for value in grid
    ]
    losses = np.array([[result.mape_pct() for result in row] for row in table])
    best = int(np.argmin(losses.mean(axis=1)))
    held_out = []
    for i in range(len(members)):
        others = np.delete(losses, i, axis=1) if len(members) > 1 else losses
        held_out.append(table[int(np.argmin(others.mean(axis=1)))][i])
    return grid[best], table[best], held_out


# Pairs of runs that differ only in the weight format: Meta-Llama-3-8B-Instruct (BF16) and
# neuralmagic Meta-Llama-3.1-8B-FP8 have the same layer shapes, the Llama-3/3.1 files share one list
# of 320 prompts (../shared/bench/README.md: "Same 320 prompts in every file of a tokenizer family"),
# and each pair shares GPU, TP, max_model_len and script. A check of the FP8 GEMM rate that no fit
# touches (benchmarks/bench_fidelity.py Table 3).
FP8_PAIR_MODELS = ("Meta-Llama-3-8B-Instruct", "Meta-Llama-3.1-8B-FP8")


def burst_prefill_span_ms(ttft_ms: np.ndarray) -> float:
    """Last first token minus the 10th-percentile TTFT of a burst (all requests sent at t = 0).

    Why this span: the first tenth of the burst waits mostly for the front end (vLLM 0.5.4 handles
    the burst's requests before the engine runs, sim/cost/server.py `frontend_arrivals`); from there
    to the last first token the engine prefills the rest of the burst. Its BF16/FP8 ratio on the
    same prompts is the served prefill speed-up, with the front end's delay cancelled.
    """
    ordered = np.sort(np.asarray(ttft_ms, dtype=np.float64))
    return float(ordered[-1] - ordered[ordered.size // 10])


def fp8_pairs(files: list[BenchFile]) -> list[tuple[BenchFile, BenchFile]]:
    """(BF16 file, FP8 file) of every FP8_PAIR_MODELS pair in `files` (same folder, TP and length)."""
    by_name = {bench.name: bench for bench in files}
    pairs = []
    for name, bench in sorted(by_name.items()):
        if f"/{FP8_PAIR_MODELS[0]}_" in f"/{name}":
            partner = by_name.get(name.replace(FP8_PAIR_MODELS[0], FP8_PAIR_MODELS[1]))
            if partner is not None:
                pairs.append((bench, partner))
    return pairs


def simulated_ttfts_ms(bench: BenchFile) -> np.ndarray:
    """Per-request simulated TTFT (ms) over the file's streamed requests, as `replay_set` runs it."""
    from sim.api import simulate
    from sim.bench.replay import request_table, streamed_mask
    from sim.cost.server import shipped_terms

    scenario = lambda_scenario(bench)
    terms = shipped_terms(scenario.engine, scenario.gpu_spec().name)
    table = request_table(bench, scenario.rng(), terms.frontend_s + terms.frontend_service_s)
    run = simulate(scenario.with_overrides(num_prompts=bench.num_prompts), workload=table, server=terms)
    ttft = run.requests.sort_values("request_id")["ttft_ms"].to_numpy(np.float64)
    return ttft[streamed_mask(bench)]


def fp8_span_ratios(files: list[BenchFile]) -> list[tuple[str, float, float]]:
    """(folder, measured, simulated) BF16/FP8 ratio of `burst_prefill_span_ms` for each FP8 pair."""
    from sim.bench.replay import streamed_mask

    rows = []
    for bf16, fp8 in fp8_pairs(files):
        measured = [burst_prefill_span_ms(b.ttfts_s[streamed_mask(b)] * 1e3) for b in (bf16, fp8)]
        simulated = [burst_prefill_span_ms(simulated_ttfts_ms(b)) for b in (bf16, fp8)]
        rows.append((bf16.name.split("/")[0], measured[0] / measured[1], simulated[0] / simulated[1]))
    return rows
