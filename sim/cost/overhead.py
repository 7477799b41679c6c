"""Per-step framework overhead (CPU work between GPU steps) of each engine preset.

Why per engine: the paper-era vLLM engine (v0) ran scheduling, input preparation, sampling and output
processing in Python between forward passes, with Ray workers for tensor parallelism, so each step
paid milliseconds of CPU time that grew with the batch. vLLM v1 keeps a persistent batch, runs the
scheduler in its own busy-looping process and (since the async scheduler) overlaps most CPU work
with the GPU, so little of it is exposed. Sources and derivations: docs/cost_model.md "Framework
overhead"; the numbers are taken from public measurements, not tuned to kvsim's output.

The overhead depends only on the number of sequences in the step (and TP), never on context
length, so it is constant inside a multi-step decode jump and the jump's closed form stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ENGINE = "vllm-v0"


@dataclass(frozen=True, slots=True)
class EngineOverhead:
    """overhead_s(n) = base_s + per_seq_s x n, plus the multi-GPU terms when tensor_parallel_size > 1."""

    base_s: float
    per_seq_s: float
    multi_gpu_base_s: float
    multi_gpu_per_seq_s: float
    source: str

    def step_s(self, num_seqs: int, tensor_parallel_size: int = 1) -> float:
        """CPU time exposed in one step with `num_seqs` sequences."""
        seconds = self.base_s + self.per_seq_s * max(0, num_seqs)
        if tensor_parallel_size > 1:
            seconds += self.multi_gpu_base_s + self.multi_gpu_per_seq_s * max(0, num_seqs)
        return seconds


ENGINE_OVERHEADS: dict[str, EngineOverhead] = {
    # Least-squares line over batch sizes 8..64 of Vidur's measured vLLM CPU overheads on A100,
    # Llama-2-7B, TP 1 (microsoft/vidur data/profiling/a100/cpu_overheads.csv, rows 0-7, commit
    # 0633efaee2826c47b16741e57df0476b58136714): medians of SCHEDULE + SAMPLER_E2E +
    # PREPARE_INPUTS_E2E + PROCESS_MODEL_OUTPUTS = 1.202 ms + 0.1000 ms/seq (max residual 0.22 ms),
    # plus RAY_COMM_TIME at TP 1 (0.128 ms + 0.0052 ms/seq). Multi-GPU: RAY_COMM_TIME at TP 2
    # (rows 8-15: 2.042 ms + 0.0668 ms/seq) replaces the TP 1 value.
    "vllm-v0": EngineOverhead(
        base_s=1.330e-3,
        per_seq_s=0.1052e-3,
        multi_gpu_base_s=1.914e-3,
        multi_gpu_per_seq_s=0.0616e-3,
        source="Vidur a100/cpu_overheads.csv (vLLM v0 with Ray workers), Llama-2-7B",
    ),
    # vLLM v1: the V1 blog (2025-01-27) reports ~5 ms GPU time per step for Llama-8B on an H100 and
    # makes near-zero exposed CPU overhead the goal; vLLM PR #23569 (2025-08) expects 5-10 % more
    # speed from overlapping the CPU work that remained (input preparation, sampling) under async
    # scheduling, i.e. 0.25-0.5 ms of a ~5 ms step: midpoint 0.375 ms. Per-sequence work is batched
    # (persistent batch, NumPy input preparation) and overlapped, so no per-sequence term is modelled;
    # TP workers are multiprocess with shared-memory broadcast (no Ray), so no multi-GPU term.
    "vllm-v1": EngineOverhead(
        base_s=0.375e-3,
        per_seq_s=0.0,
        multi_gpu_base_s=0.0,
        multi_gpu_per_seq_s=0.0,
        source="vLLM V1 blog (2025-01) and PR #23569: 5-10 % of a ~5 ms Llama-8B H100 step",
    ),
}


def engine_overhead(engine: str | None) -> EngineOverhead:
    """The overhead model of an engine preset name ('vllm-v0' when None); ValueError if unknown."""
    name = DEFAULT_ENGINE if engine is None else str(engine).strip().lower()
    try:
        return ENGINE_OVERHEADS[name]
    except KeyError:
        known = ", ".join(ENGINE_OVERHEADS)
        raise ValueError(f"unknown engine preset {engine!r} (known: {known})") from None
