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
# loop (`AsyncLLMEngine`, vllm/engine/async_llm_engine.py), as the preset assumes: the
# `--disable-frontend-multiprocessing` reading. By default 0.5.4 moves HTTP and tokenisation to
# their own process (vLLM PR #6883, RPC server vllm/entrypoints/openai/rpc/server.py), which is not
# modelled yet (docs/cost_model.md "Does vLLM 0.5.4 take a burst in the same way?").
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


def auto_chunked(bench: BenchFile) -> bool:
    """Whether vLLM 0.5.4 ran the file's server with its automatic chunked prefill (max_model_len in the
    path above 32K; sim/bench/setup.py `v0_auto_chunked`).

    Why it matters here: its 512-token budget is below the later script's `--max-num-seqs 1024`, which
    vLLM 0.5.4 refuses (vllm/config.py `SchedulerConfig._verify_args`: max_num_batched_tokens must be
    >= max_num_seqs), so a server above 32K cannot have run with the later flags whatever the client
    wrote. Which flags it did run with is not recorded, so such a file is replayed under the v0.5.4
    defaults, the documented set of the older script's runs (gpu_memory_utilization 0.90 included:
    keeping the later 0.95 alone would be a third configuration that no script passes).
    """
    from sim.bench.identify import server_from_path
    from sim.bench.setup import v0_auto_chunked

    return v0_auto_chunked(server_from_path(bench.path).get("max_model_len"))


def lambda_scenario(bench: BenchFile) -> Any:
    """The scenario a Lambda file is replayed under (the CLI's rules plus the README's settings)."""
    from sim.bench.setup import scenario_for_file, scenario_from_fields

    fields: dict[str, Any] = {"engine": "vllm-v0", "config": None}
    if later_script(bench) and not auto_chunked(bench):
        fields.update(LATER_SCRIPT_FLAGS)
    return scenario_for_file(bench, fields, lambda filled: scenario_from_fields({**filled, "config": None}))


def group_of(bench: BenchFile) -> str:
    """The run group of a file: `<GPU> <later|earlier> script`, the README's two server configurations."""
    from sim.bench.identify import server_from_path

    gpu = server_from_path(bench.path).get("gpu", "unknown GPU")
    return f"{gpu} {'later' if later_script(bench) else 'earlier'} script"


# The earlier (2024-08-19) runs differ from the later ones in the client and in the stream, not in
# the GPUs or the vLLM version (../shared/bench/README.md: "The two run dates also differ in client
# version"), so they keep the later runs' GPU-side terms (FLOP scale, overhead scale: SHIPPED_TERMS)
# and get their own front end and per-chunk stream cost, per GPU (the A100 and H100 hosts' CPUs are
# not recorded):
# - the stream: they stream one chunk per token (mean ITL 23-58 ms, close to their TPOT), while the
#   later runs' chunks carry many tokens (mean ITL 90-1,400 ms against median TPOT 11-170 ms; README
#   "ITL is per streamed chunk"), so each step pays the front end's per-chunk cost for every decoding
#   sequence (sim/cost/server.py `stream_chunk_s`);
# - the front end: their first first-token comes 0.56-0.67 s after the burst on H100 and ~1.0 s on
#   A100, whatever the model and TP, where the later runs' terms put it 0.84-1.4 s on H100. Per
#   request (docs/cost_model.md "The earlier H100 runs request by request"): the engine's first step
#   holds only the few requests that reached it and the rest join the next steps, the interleaved
#   intake (`frontend_turn_share` < 1, sim/cost/server.py `intake_turn_share`) that the H100 fit takes
#   (0.5); the A100 one (4 of its 5 runs chunked above 32K, where the intake barely shows) keeps the
#   whole busy period (1). Which requests come first (measured: ones sent late in the burst) is not
#   modelled: replayed in the measured order, mean TTFT moves by at most 3 points.
# Fitted by `fit_earlier` on the earlier files of each GPU (EARLIER_GRID, frontend_s scanned from 0 in
# 1 ms steps, the shipped delay not added: sim/bench/fit.py `grid_table`; benchmarks/bench_fidelity.py
# --fit prints them and their leave-one-file-out error). Until the scan was made absolute the H100
# entry read 0.023 s with 1 ms: the fit had minimised its loss at 0.161 + 0.023 s and returned 0.023 s.
# With the FP8 GEMM rates at served figures (sim/scenario/quantization.py: Hopper W8A8 1.69x, not the
# datasheet's 2x; Marlin 0.8, not 0.85) the refit moved H100 0.215 -> 0.159 s and A100 0 s + 2 ms ->
# 0.112 s + 1 ms per request (the FP8 runs, 4 of the A100's 5 and 5 of the H100's 8, no longer
# simulated fast: a shorter front end had stood in for their prefill time on H100).
EARLIER_GRID: dict[str, tuple[float, ...]] = {
    "frontend_service_s": (0.001, 0.0015, 0.002, 0.003),
    "stream_chunk_s": (0.0, 100e-6, 150e-6, 200e-6, 250e-6, 300e-6, 400e-6),
    "frontend_turn_share": (0.25, 0.5, 1.0),
}
EARLIER_TERMS: dict[str, dict[str, float]] = {
    "A100-80GB": {
        "frontend_s": 0.112,
        "frontend_service_s": 0.001,
        "stream_chunk_s": 300e-6,
        "frontend_turn_share": 1.0,
    },
    "H100-80GB": {
        "frontend_s": 0.159,
        "frontend_service_s": 0.002,
        "stream_chunk_s": 150e-6,
        "frontend_turn_share": 0.5,
    },
}


def file_terms(bench: BenchFile, scenario: Any, earlier: dict[str, float] | None = None) -> ServerTerms:
    """The terms a file is replayed with: the shipped terms of its engine and GPU; for the runs that
    stream every token (earlier script) with their own front end and stream cost (`earlier`; None:
    EARLIER_TERMS of the GPU)."""
    from dataclasses import replace

    from sim.cost.server import shipped_terms

    gpu = scenario.gpu_spec().name
    terms = shipped_terms(scenario.engine, gpu)
    if later_script(bench):
        return terms
    values = EARLIER_TERMS.get(gpu, {}) if earlier is None else earlier
    return replace(terms, **values, source=f"{terms.source} + earlier-script front end {values}")


def replay_set(files: list[BenchFile]) -> list[Any]:
    """Each file replayed under `lambda_scenario` with the shipped terms of its GPU and group."""
    from sim.bench.replay import replay

    results = []
    for bench in files:
        scenario = lambda_scenario(bench)
        results.append(replay(bench, scenario, file_terms(bench, scenario)))
    return results


def fit_earlier(files: list[BenchFile], gpu: str, grid: dict[str, tuple[float, ...]] | None = None) -> Any:
    """The earlier-script terms of `gpu` (EARLIER_TERMS' form) fitted on its earlier files, every
    GPU-side term at its shipped value: a sim.bench.fit.FitResult (terms, in-sample and
    leave-one-file-out replays)."""
    from sim.bench.fit import fit_members, grid_table
    from sim.cost.server import shipped_terms

    members = [b for b in files if not later_script(b) and group_of(b).startswith(gpu)]
    if not members:
        raise ValueError(f"argument 'files': no earlier-script run on {gpu}")
    base = shipped_terms("vllm-v0", gpu)
    table = grid_table(members, lambda_scenario, stack=base, grid=EARLIER_GRID if grid is None else grid)
    return fit_members(table, range(len(members)))


# Pairs of runs that differ only in the weight format: Meta-Llama-3-8B-Instruct (BF16) and
# neuralmagic Meta-Llama-3.1-8B-FP8 have the same layer shapes, the Llama-3/3.1 files share one list
# of 320 prompts (../shared/bench/README.md: "Same 320 prompts in every file of a tokenizer family"),
# and each pair shares GPU, TP, max_model_len and script. On H100 a check of the FP8 W8A8 kernels
# that no fit touches; on A100 the calibration of Marlin's rate (sim/scenario/quantization.py
# MARLIN_COMPUTE_SCALE; benchmarks/bench_fidelity.py Table 3).
FP8_PAIR_MODELS = ("Meta-Llama-3-8B-Instruct", "Meta-Llama-3.1-8B-FP8")


def burst_prefill_span_ms(ttft_ms: np.ndarray) -> float:
    """90th- minus 10th-percentile TTFT of a burst (all requests sent at t = 0).

    Why this span: the first tenth of the burst waits mostly for the front end (vLLM 0.5.4 handles
    the burst's requests before the engine runs, sim/cost/server.py `frontend_arrivals`); from there
    to the 90th percentile the engine prefills the burst, one step after another. Its BF16/FP8 ratio
    on the same prompts is the served prefill speed-up, with the front end's delay cancelled. The
    last tenth is cut as the first is: a burst's last first tokens can be stragglers (each BF16 run
    of the Lambda pairs has two, 0.2-0.4 s after all the others; no FP8 run has one), and a span to
    the last first token read the 1xH100 pair at 1.65 where its prefill steps' median gap is 1.37.
    """
    ordered = np.sort(np.asarray(ttft_ms, dtype=np.float64))
    cut = ordered.size // 10  # the same count of first tokens cut at each end
    return float(ordered[-1 - cut] - ordered[cut])


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

    scenario = lambda_scenario(bench)
    terms = file_terms(bench, scenario)
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
