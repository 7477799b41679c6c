"""The scenario a result file is replayed under: the user's flags, then what the file tells.

Why one function for the CLI and the benchmarks: `kvsim bench replay`, `kvsim bench fit` and
benchmarks/bench_fidelity.py must replay a file under the same rules, or the errors they print
would not be the same figure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.bench.identify import model_from_id, server_from_path
from sim.bench.results_file import BenchFile
from sim.errors import ScenarioError

# vLLM v0.5 turns chunked prefill on by itself for contexts over 32K (vllm/engine/arg_utils.py
# `EngineArgs.create_engine_config`, v0.5.1-v0.6: "Chunked prefill is enabled by default for models
# with max_model_len > 32K"), with its 512-token budget (vllm/config.py SchedulerConfig).
V0_AUTO_CHUNKED_PREFILL_ABOVE_TOKENS = 32 * 1024


def v0_auto_chunked(max_model_len: int | None) -> bool:
    """Whether vLLM v0.5 turns chunked prefill on by itself for this max_model_len (> 32K)."""
    return int(max_model_len or 0) > V0_AUTO_CHUNKED_PREFILL_ABOVE_TOKENS


def file_flags(bench: BenchFile, flags: dict[str, Any]) -> dict[str, Any]:
    """The flags with model (and its quantization), GPU, TP and max_model_len filled in from the
    file where not given."""
    filled = dict(flags)
    if filled.get("config") is None:
        if filled.get("model") is None:
            preset, guessed = model_from_id(bench.model_id)
            if preset is None:
                raise ScenarioError(
                    f"{bench.path}: model_id {bench.model_id!r} is not a preset; "
                    "give --model (a preset or config.json)"
                )
            filled["model"] = preset
            filled["quantization"] = filled.get("quantization") or guessed
        for key, value in server_from_path(bench.path).items():
            if filled.get(key) is None:
                filled[key] = value
        if filled.get("gpu") is None:
            raise ScenarioError(f"{bench.path}: cannot tell the GPU from the file; give --gpu")
    return filled


def scenario_for_file(bench: BenchFile, flags: dict[str, Any], build: Callable[[dict[str, Any]], Any]) -> Any:
    """The Scenario to replay `bench` under: `build(flags)` (the CLI's scenario_from_flags) on the
    flags completed by `file_flags` (FP8 weights from the model id unless --quantization says
    otherwise), and vLLM v0.5's automatic chunked prefill above 32K for the vllm-v0 engine when the
    user did not set it."""
    filled = file_flags(bench, flags)
    if (
        (filled.get("engine") or "vllm-v0") == "vllm-v0"
        and filled.get("enable_chunked_prefill") is None
        and filled.get("max_num_batched_tokens") is None
        and v0_auto_chunked(filled.get("max_model_len"))
    ):
        filled.update(enable_chunked_prefill=True, max_num_batched_tokens=512)
    return build(filled)


def scenario_from_fields(fields: dict[str, Any]) -> Any:
    """A Scenario from field values (None: not given; `quantization` applied to the model first):
    the `build` of `scenario_for_file` for callers without command-line flags (the benchmarks)."""
    from sim.scenario.quantization import quantized_flag_model
    from sim.scenario.scenario import Scenario

    given = {key: value for key, value in fields.items() if value is not None}
    quantization = given.pop("quantization", None)
    if quantization not in (None, "none"):
        given["model"] = quantized_flag_model(given.get("model"), quantization)
    return Scenario(**{"name": "bench", **given})
