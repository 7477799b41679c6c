"""The 24 published gpustack points (../shared/bench/published.csv, vLLM v0.11, Qwen3 8B/14B/32B on
H100/A100) as replayable runs.

Why synthetic request lists: the published table gives aggregates only. "random fixed N in / M out"
rows are exact (every request N in, M out). ShareGPT rows give mean lengths only, so their requests
are the ShareGPT sample of a Lambda file (`vllm bench serve`'s own sampler, Llama-3 tokenizer:
../shared/bench/vllm_bench) resampled with the one seeded generator and scaled to the row's mean
input and output lengths (Qwen3's tokenizer counts differently). Arrivals: `rate=inf` sends all at
once, `max-concurrency N` is a closed loop of N clients. Server: `vllm serve` defaults (engine
vllm-v1, its per-GPU budgets, prefix caching and chunked prefill on), `--max-model-len` where the
row's `extra_server_flags` give one. GPU: "1x H100 SXM" rows on H100-80GB, bare "1x H100" rows (the
Qwen3-32B page) on H100-PCIe-80GB (`published_gpu` gives the evidence), A100 rows on A100-80GB.
"""

from __future__ import annotations

import csv
import hashlib
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from sim.bench.results_file import BenchFile, read_bench_file

# Qwen/Qwen3-8B and Qwen/Qwen3-14B config.json (the fields kvsim reads); Qwen3-32B is a preset.
QWEN3_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-8B": {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                      "num_hidden_layers": 36, "vocab_size": 151936, "max_position_embeddings": 40960,
                      "torch_dtype": "bfloat16", "tie_word_embeddings": False, "use_sliding_window": False},
    "Qwen/Qwen3-14B": {"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 17408,
                       "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                       "num_hidden_layers": 40, "vocab_size": 151936, "max_position_embeddings": 40960,
                       "torch_dtype": "bfloat16", "tie_word_embeddings": False, "use_sliding_window": False},
}  # fmt: skip
# The grid the shipped vllm-v1 terms were fitted on: vLLM v1's exposed step overhead is small
# (sim/cost/overhead.py), so its scale stays 1; the front end's serial work can reach tens of ms
# per request on the chat endpoint (128-in/4-out runs top out at 20-44 req/s). The API-server loop
# (sim/cost/server.py `interleaved_leave_s`, sim/cost/output_path.py): the share of a request's intake
# in its handler's last turn (1: one request after another, as before the loop was modelled) and the
# loop's time per request-output.
PUBLISHED_GRID: dict[str, tuple[float, ...]] = {
    "frontend_service_s": (0.01, 0.015, 0.02, 0.03),
    "flops_efficiency_scale": (0.35, 0.45, 0.5, 0.6, 0.8, 1.0),
    "overhead_scale": (1.0,),
    "frontend_turn_share": (0.25, 0.5, 1.0),
    "output_service_s": (0.0, 1e-4),
}
# A board without a front-end fit of its own (the A100, the H100 PCIe) keeps the H100 SXM fit's
# front-end terms (the API server's CPU work) and fits only its FLOP scale, the served step's FLOP rate
# over the operator fit's (docs/cost_model.md "Whole server": sustained clocks under the board's power
# limit are part of it). The PCIe board's values: 0.05 steps from the SXM's 0.5 to the operator
# fit's own rate (1.0).
BOARD_FLOP_SCALES: tuple[float, ...] = tuple(round(0.5 + 0.05 * step, 2) for step in range(11))
# The ShareGPT sample the ShareGPT rows are drawn from (Llama-3-8B-Instruct, vllm bench's sampler).
SHAREGPT_SAMPLE = "1xH100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json"
_MEASURED = {
    "request_throughput": "req_per_s",
    "output_throughput": "out_tok_per_s",
    "mean_ttft_ms": "mean_ttft_ms",
    "median_ttft_ms": "median_ttft_ms",
    "mean_tpot_ms": "mean_tpot_ms",
    "median_tpot_ms": "median_tpot_ms",
}


def _lengths(
    row: dict[str, str], sample: BenchFile, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    count = int(row["num_prompts"])
    fixed = re.search(r"random fixed (\d+) in / (\d+) out", row["dataset"])
    if fixed:
        return np.full(count, int(fixed.group(1))), np.full(count, int(fixed.group(2)))
    pick = rng.integers(0, sample.num_prompts, count)
    inputs = sample.input_lens[pick].astype(np.float64)
    outputs = np.maximum(sample.output_lens[pick], 1).astype(np.float64)
    inputs *= float(row["mean_in_tokens"]) / inputs.mean()
    outputs *= float(row["mean_out_tokens"]) / outputs.mean()
    return np.maximum(np.rint(inputs), 1).astype(np.int64), np.maximum(np.rint(outputs), 1).astype(np.int64)


def request_throughput(row: dict[str, str]) -> float:
    """The row's request throughput as output throughput over mean output length.

    Why not `req_per_s`: the source prints it with two decimals (0.06, 0.09 req/s on the 32K-token
    rows: up to 8 % off), while `out_tok_per_s` has four or more significant digits; the two are
    one figure (completed / duration = output tokens / duration / mean output tokens). Where the
    printed value is precise they agree: q14-h100-sg 15.74 = 3,173.92 / 201.648.
    """
    return float(row["out_tok_per_s"]) / float(row["mean_out_tokens"])


def published_runs(
    csv_path: str | Path, bench_folder: str | Path, seed: int = 0
) -> list[tuple[dict[str, str], BenchFile]]:
    """(row, run) for every row of published.csv; lengths drawn from one Generator(seed), in row order."""
    sample = read_bench_file(Path(bench_folder) / SHAREGPT_SAMPLE)
    rng = np.random.default_rng(seed)
    runs = []
    with open(csv_path, newline="") as handle:
        for row in csv.DictReader(handle):
            inputs, outputs = _lengths(row, sample, rng)
            concurrency = re.search(r"max-concurrency (\d+)", row["arrival"])
            measured = {key: float(row[column]) for key, column in _MEASURED.items()}
            measured["request_throughput"] = request_throughput(row)
            run = BenchFile(
                path=Path(str(csv_path)) / row["id"],
                sha256=hashlib.sha256(repr(sorted(row.items())).encode()).hexdigest(),
                model_id=row["model"],
                num_prompts=len(inputs),
                completed=len(inputs),
                input_lens=inputs,
                output_lens=outputs,
                ttfts_s=None,
                ok=np.ones(len(inputs), dtype=bool),
                request_rate=math.inf,
                burstiness=1.0,
                max_concurrency=int(concurrency.group(1)) if concurrency else None,
                duration_s=math.nan,
                measured={**{key: math.nan for key in ("p99_ttft_ms", "mean_e2el_ms")}, **measured},
            )
            runs.append((row, run))
    return runs


def published_gpu(row: dict[str, str]) -> str:
    """The GPU preset a row ran on: "H100 SXM" is the SXM part (H100-80GB), a bare "H100" the PCIe
    board (H100-PCIe-80GB), an "A100 (80GB)" the A100-80GB SXM.

    Why the bare "H100" rows (Qwen3-32B, gpustack docs/performance-lab/qwen3-32b/h100.md@10e9444) are
    taken as PCIe: their own numbers. With a 32K prompt the KV cache holds one sequence, so decode is
    one sequence at a time and a step reads the ~65.5 GB of BF16 weights: the page's random-32K case
    prints mean TPOT 43.42 ms, median ITL 43.30 ms. An SXM H100 (HBM3, 3.35 TB/s) reads the weights in
    ~20 ms, an H100 PCIe (HBM2e, 2.0 TB/s; NVIDIA H100 datasheet) in ~33 ms, plus ~4 ms of KV and the
    step's overhead: ~40-45 ms. The A100-80GB SXM (2.039 TB/s) page (qwen3-32b/a100.md@10e9444) prints
    48.55 ms for the same case, within 12 % of the "H100" one, as two ~2 TB/s parts would be. The
    Qwen3-8B "1x H100 SXM" rows are SXM-consistent (16.4 GB of weights, TPOT 7.28 ms at concurrency 1).
    """
    gpus = row["gpus"]
    if "H100" in gpus:
        return "H100-80GB" if "SXM" in gpus else "H100-PCIe-80GB"
    return "A100-80GB"


def published_scenario(row: dict[str, str]) -> Any:
    """`vllm serve` defaults for the row's model and GPU (engine vllm-v1)."""
    from sim.scenario.hf_config import spec_from_config
    from sim.scenario.scenario import Scenario

    model: Any = row["model"]
    if model in QWEN3_CONFIGS:
        model = spec_from_config(QWEN3_CONFIGS[model], name=model.split("/")[-1])
    gpu = published_gpu(row)
    fields: dict[str, Any] = {"model": model, "gpu": gpu, "engine": "vllm-v1", "name": "published"}
    length = re.search(r"--max-model-len (\d+)", row.get("extra_server_flags") or "")
    if length:
        fields["max_model_len"] = int(length.group(1))
    return Scenario(**fields)


def replay_published(runs: list[tuple[dict[str, str], BenchFile]]) -> list[Any]:
    """Each published row replayed under `published_scenario` with the shipped vllm-v1 terms of its GPU."""
    from sim.bench.replay import replay
    from sim.cost.server import shipped_terms

    results = []
    for row, run in runs:
        scenario = published_scenario(row)
        results.append(replay(run, scenario, shipped_terms(scenario.engine, scenario.gpu_spec().name)))
    return results


def throughput_ratios(
    runs: list[tuple[dict[str, str], BenchFile]], results: list[Any]
) -> list[tuple[str, float, float]]:
    """(model and dataset, measured H100/A100 request-throughput ratio, simulated ratio) for every pair
    of rows that differ only in the GPU (the max-concurrency rows have no A100 twin)."""
    by_key: dict[tuple[str, str, str], dict[str, Any]] = {}
    for (row, _run), result in zip(runs, results, strict=True):
        gpu = "H100" if "H100" in row["gpus"] else "A100"
        by_key.setdefault((row["model"], row["dataset"], row["arrival"]), {})[gpu] = result
    ratios = []
    for (model, dataset, _arrival), pair in by_key.items():
        if "H100" in pair and "A100" in pair:
            h, a = pair["H100"], pair["A100"]
            measured = h.measured["request_throughput"] / a.measured["request_throughput"]
            simulated = h.simulated["request_throughput"] / a.simulated["request_throughput"]
            ratios.append((f"{model.split('/')[-1]} {dataset}", measured, simulated))
    return ratios
