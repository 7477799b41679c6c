"""Synthetic `vllm bench serve` result files for the bench tests, written from a simulation.

Why simulate the "measurement": a file produced by kvsim under known server terms is a case with a
known answer: replaying it under the same terms must reproduce it exactly, and a fit must find the
terms back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from sim.bench.replay import replay
from sim.bench.results_file import read_bench_file
from sim.cost.server import ServerTerms
from sim.scenario.scenario import Scenario

SMALL_GPU = "H100-80GB"
SMALL_MODEL = "Llama-3-8B"


def small_scenario(**overrides: Any) -> Scenario:
    """Llama-3-8B on one H100, vllm-v1, a short max_model_len: fast to simulate."""
    fields = dict(model=SMALL_MODEL, gpu=SMALL_GPU, engine="vllm-v1", max_model_len=2048, name="bench")
    fields.update(overrides)
    return Scenario(**fields)


def bench_document(
    input_lens: list[int], output_lens: list[int], *, request_rate: Any = "inf", **extra: Any
) -> dict[str, Any]:
    """A minimal result document (the fields vLLM writes that the replay reads); aggregates NaN-free zeros."""
    count = len(input_lens)
    document: dict[str, Any] = {
        "model_id": "meta-llama/Meta-Llama-3-8B-Instruct",
        "num_prompts": count,
        "request_rate": request_rate,
        "burstiness": 1.0,
        "max_concurrency": None,
        "completed": count,
        "duration": 1.0,
        "input_lens": input_lens,
        "output_lens": output_lens,
        "errors": [""] * count,
    }
    document.update(extra)
    return document


def write_json(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document))
    return path


def simulated_file(
    path: Path, scenario: Scenario, terms: ServerTerms, seed: int = 0, count: int = 24
) -> Path:
    """A result file whose aggregates are kvsim's own under `terms` (so the truth is known)."""
    rng = np.random.default_rng(seed)
    inputs = [int(x) for x in rng.integers(20, 400, count)]
    outputs = [int(x) for x in rng.integers(2, 200, count)]
    draft = write_json(path, bench_document(inputs, outputs))
    result = replay(read_bench_file(draft), scenario, terms)
    aggregates = {key: value for key, value in result.simulated.items() if math.isfinite(value)}
    document = bench_document(inputs, outputs, **aggregates)
    document["mean_latency_ms"] = aggregates["mean_e2el_ms"]
    return write_json(path, document)
