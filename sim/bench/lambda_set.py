"""The shared measured set (../shared/bench/vllm_bench, LambdaLabsML/vllm-benchmark) as replay inputs.

Why in the package: the fitted defaults (sim/cost/server.py SHIPPED_TERMS), benchmarks/bench_fidelity.py
and the regression test must replay these files under the same settings. The settings are those of
../shared/bench/README.md: vLLM v0.5.4 (engine vllm-v0), its defaults, and for the files that carry
`*_latency_ms` fields (the September runs of the later benchmark script, commit 29dd18a) that
script's extra flags `--gpu-memory-utilization 0.95 --max-num-seqs 1024`. Failed runs are left out.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

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

# The grid the shipped vllm-v0 terms were fitted on (36 points; sim/bench/fit.py GRID's form).
LAMBDA_GRID: dict[str, tuple[float, ...]] = {
    "frontend_service_s": (0.002, 0.003, 0.004),
    "flops_efficiency_scale": (0.7, 1.0, 1.25),
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


def replay_set(files: list[BenchFile]) -> list[Any]:
    """Each file replayed under `lambda_scenario` with the shipped terms of its GPU and group."""
    from sim.bench.replay import replay
    from sim.cost.server import shipped_terms

    results = []
    for bench in files:
        scenario = lambda_scenario(bench)
        terms = shipped_terms(scenario.engine, scenario.gpu_spec().name)
        results.append(replay(bench, scenario, terms))
    return results
