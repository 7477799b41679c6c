"""Quantized weights: what an FP8 checkpoint changes in a model's description.

Why a separate step: a checkpoint's `quantization_config` (or vLLM's `--quantization fp8`) stores
the linear layers' weights in 1 byte instead of 2, while embeddings, the LM head and norms stay in
the model dtype (vLLM `vllm/model_executor/layers/quantization/fp8.py` `Fp8LinearMethod` applies to
`LinearBase` layers only; neuralmagic / RedHatAI "FP8-dynamic" checkpoints quantize every Linear but
`lm_head`). So weight memory, and the weight bytes every step reads, shrink to about half; the KV
cache keeps its own dtype (`--kv-cache-dtype`).

The GEMM FLOP rate (`linear_flops_scale`): where the GPU has FP8 tensor cores (compute capability
>= 8.9: Ada, Hopper, Blackwell) vLLM runs FP8 linear layers as W8A8 FP8 GEMMs (activations quantized
per token or per tensor on the fly; `Fp8LinearMethod.apply` -> `apply_fp8_linear`, CUTLASS
`cutlass_scaled_mm` / `torch._scaled_mm`), whose dense peak is twice the BF16 one on those parts;
taken on Hopper as 1.69x (`HOPPER_W8A8_SPEEDUP`, a value inside vLLM's measured kernel range).
Below 8.9 (A100) there are no FP8 tensor cores: vLLM runs the FP8 weights weight-only (W8A16)
through the Marlin kernel (vllm/model_executor/layers/quantization/fp8.py `Fp8LinearMethod.__init__`:
`self.use_marlin = capability < 89`, v0.5.x; utils/marlin_utils_fp8.py `apply_fp8_marlin_linear`:
"For GPUs that lack FP8 hardware support, we can leverage the Marlin kernel for fast weight-only FP8
quantization"), which dequantizes to BF16 and multiplies on BF16 tensor cores: the FLOP rate stays
the BF16 one and only the weight bytes shrink. Attention (QK^T, PV) keeps the KV dtype and the BF16
rate in both cases.

What the two kernel paths cost beyond the weight bytes (issue 21: with the datasheet rates alone the
served FP8 runs decoded 7-35 % faster than measured, ../shared/bench/vllm_bench):
- W8A8 (Hopper, Ada, Blackwell) quantizes each GEMM's input activations on the fly: one
  `ops.scaled_fp8_quant` kernel before every `cutlass_scaled_mm` (vLLM `apply_fp8_linear`), four per
  decoder layer (the merged QKV, the output projection, the merged gate/up and the down projection).
  At decode batch sizes such a kernel costs its launch/latency floor, not its bytes
  (`activation_quant_kernels_per_layer`).
- Weight-only Marlin (A100) dequantizes in registers with integer/SIMT arithmetic before each
  tensor-core MMA; once a GEMM is compute-bound that work caps it well below cuBLAS BF16
  (`FP8_GEMM_SPEEDUP`'s A100 entries).
"""

from __future__ import annotations

from typing import Any

from sim.errors import ScenarioError
from sim.scenario.presets import ModelSpec

# vLLM --quantization names read here -> bytes per linear-layer weight.
QUANTIZATION_BYTES: dict[str, int] = {"fp8": 1}


def embedding_params(model: ModelSpec) -> int:
    """Embedding and LM-head parameters (kept in the model dtype; not per-token GEMM weights: the
    cost model's sim/cost/linear.py `per_token_compute_params`); 0 when the vocabulary is unknown.

    A tied model (config.json `tie_word_embeddings`, `ModelSpec.tied_embeddings`) has one table, as
    sim/scenario/hf_config.py `count_params` counts it in `num_params`.
    """
    return model.embedding_params


def quantized_model(model: ModelSpec, quantization: str | None) -> ModelSpec:
    """`model` with its linear layers stored at `quantization` (None: unchanged).

    Weight bytes = linear params x quantized bytes + (embeddings + norms) x dtype bytes. Norms are
    2 x hidden per layer plus the final one (a fraction of a per mille). A model without a known
    vocabulary counts all parameters as linear (embeddings are < 10 % of any preset's weights).
    """
    if quantization is None or quantization == "none":
        return model
    name = quantization.strip().lower()
    if name not in QUANTIZATION_BYTES:
        known = ", ".join(QUANTIZATION_BYTES)
        raise ScenarioError(
            f"argument 'quantization': unknown method {quantization!r} (known: {known}, none)"
        )
    kept = embedding_params(model) + (2 * model.num_layers + 1) * model.hidden_size
    linear = max(0, model.num_params - kept)
    weight_bytes = linear * QUANTIZATION_BYTES[name] + kept * model.dtype_bytes
    return model.model_copy(
        update={
            "checkpoint_bytes": weight_bytes,
            "name": f"{model.name}-{name.upper()}",
            "weight_quantization": name,
        }
    )


# The linear layers' GEMM FLOP rate with FP8 weights over the BF16 GEMM rate, per GPU preset.
# - Hopper (H100 SXM and PCIe, H200), W8A8 as vLLM runs it: HOPPER_W8A8_SPEEDUP, a value inside the
#   measured kernel range (below), not the datasheet's 2x (1,979 / 989.4 dense TFLOP/s, NVIDIA H100
#   Tensor Core GPU datasheet, SXM column; the PCIe column's 1,513 / 756 is the same 2x); H200 is the
#   same Hopper die, clocks and kernels (NVIDIA H200 datasheet: 3,958 / 1,979 sparse).
# - Other parts with FP8 tensor cores, no kernel figure found, the datasheet's dense FP8 over dense
#   BF16 peak: L4 485 / 242 sparse (NVIDIA L4 datasheet); B200 4.5 / 2.25 PFLOP/s dense (NVIDIA DGX
#   B200 datasheet, per GPU).
# - A100 (sm_80) has no FP8 tensor cores: FP8 runs weight-only through Marlin (module docstring),
#   whose rate once compute-bound is MARLIN_COMPUTE_SCALE of cuBLAS BF16.
# A GPU not listed (a custom spec, MI300X whose FP8 path vLLM 0.5 lacks) gets 1: no change claimed
# without a source.
# vLLM's W8A8 FP8 GEMM over its BF16 GEMM on an H100, a value chosen inside the range that measurements
# give, not one measurement (docs/cost_model.md "FP8 prefill at served shapes"):
# - the kernels: vLLM's GEMM benchmark (benchmarks/kernels/bench_fp8_gemm.py) on an H100 reads
#   1.43x (N = 12,288, K = 5,376) and 1.69x (N = 43,008) at 128 tokens with the per-token activation
#   quantization timed inside the GEMM (vllm-project/vllm PR #49363, `fp8-tensor-w-token-a`), and
#   1.65x / 1.77x without it (`-noquant`); Llama-3.1-8B's N = 6,144 reads 1.40x with and 1.76x
#   without at 256 tokens (PR #17126's example output; its GPU is not stated there). kvsim charges
#   the quantization as kernels of their own (W8A8_QUANT_KERNELS_PER_LAYER), so the no-quant figures
#   are the matching ones; none of these tables was found at 2,048+ tokens, the prefill steps here.
# - served, the whole step: the Lambda BF16/FP8 pairs' prefill steps (the median gap between
#   first-token levels of a burst, tests/bench/test_prefill_span.py) are 1.37x apart at TP 1 and 1.23x
#   at TP 2 (attention, norms and quantization included), where the datasheet's 2x gives 1.64x and
#   1.46x and 1.69 gives 1.46x and 1.34x (Table 3).
# 1.69 lies inside the kernel range (the with-quantization figure of the wider shape); the served TP 1
# steps would take a lower one (1.69 simulates them at +6.3 %). It is not fitted, and the held-out
# target holds over 1.43-1.69 (the sensitivity table in the docs): the choice does not decide it.
HOPPER_W8A8_SPEEDUP = 1.69
# Marlin's compute-bound rate over cuBLAS BF16 on an A100. The kernel alone: 4-bit Marlin levels off
# at ~141 TFLOP/s from 128 tokens on, 0.60-0.61 of torch FP16 at 2,048-4,000 tokens (Marlin's
# bench.py on an A100, vllm-project/vllm PR #2497, comment of 2024-01-24; the Marlin author: above 64
# tokens "it will just run the batch 64 kernel repeatedly", IST-DASLab/marlin issue #2). vLLM's FP8
# Marlin is that kernel's 8-bit GPTQ path with an FP8-to-BF16 bit-trick dequantization
# (vllm-project/vllm PR #5975); no 8-bit A100 kernel measurement was found. Served, it does better than
# 0.61: the two A100 BF16/FP8 pairs of ../shared/bench/vllm_bench (same prompts and layer shapes;
# benchmarks/bench_fidelity.py Table 3) measure the burst's prefill span (p10 to p90 first token) at
# 0.81 (TP 1) and 0.82 (TP 2) of the BF16 one. The value is the point of a 0.05 grid over [0.6, 1.0]
# whose replayed ratios are nearest both (+1.7 and +1.8 %; 0.85 gives +7.5 / +7.0 %, 0.75 -4.3 /
# -3.8 %). So Table 3's A100 rows are its calibration, no longer a check; the H100 rows still are.
# (Until the span's end was the p90 first token, not the last one, the same procedure gave 0.85: the
# last first token of a burst can be a straggler's: each BF16 run of the four pairs has two first
# tokens 0.2-0.4 s after all the others, no FP8 run has one.)
MARLIN_COMPUTE_SCALE = 0.8
FP8_GEMM_SPEEDUP: dict[str, float] = {
    "A100-40GB": MARLIN_COMPUTE_SCALE,
    "A100-80GB": MARLIN_COMPUTE_SCALE,
    "H100-80GB": HOPPER_W8A8_SPEEDUP,
    "H100-PCIe-80GB": HOPPER_W8A8_SPEEDUP,
    "H200-141GB": HOPPER_W8A8_SPEEDUP,
    "L4": 485.0 / 242.0,
    "B200": 4.5 / 2.25,
}
# Activation-quantization kernels per decoder layer on the W8A8 path (module docstring): one per
# GEMM input, four GEMMs per layer (vLLM merges Q, K, V and gate, up).
W8A8_QUANT_KERNELS_PER_LAYER = 4


def linear_flops_scale(model: ModelSpec, gpu_name: str) -> float:
    """The linear layers' GEMM FLOP rate over the BF16 one for `model`'s weight format on `gpu_name`:
    FP8_GEMM_SPEEDUP for FP8 weights (1 where the GPU is not listed), 1 for the model dtype."""
    if model.weight_quantization == "fp8":
        return FP8_GEMM_SPEEDUP.get(gpu_name, 1.0)
    return 1.0


def activation_quant_kernels_per_layer(model: ModelSpec, gpu_name: str) -> int:
    """Extra kernels per decoder layer that quantize GEMM inputs: W8A8_QUANT_KERNELS_PER_LAYER for
    FP8 weights on a GPU with FP8 tensor cores (the W8A8 path), else 0 (weight-only Marlin reads
    BF16 activations as they are; an unlisted GPU claims nothing)."""
    if model.weight_quantization == "fp8" and FP8_GEMM_SPEEDUP.get(gpu_name, 1.0) > 1.0:
        return W8A8_QUANT_KERNELS_PER_LAYER
    return 0


# quantization_config.quant_method values that store linear weights in 8-bit floats (vLLM's
# vllm/model_executor/layers/quantization/: `fp8` Fp8Config, `fbgemm_fp8` FBGEMMFp8Config, and
# `compressed-tensors` with float 8-bit weights, the RedHatAI / neuralmagic "FP8-dynamic" checkpoints).
_FP8_METHODS = ("fp8", "fbgemm_fp8")


def config_quantization(data: dict[str, Any], where: str) -> str | None:
    """The --quantization a config.json's `quantization_config` implies: "fp8", or None when absent.

    Any other method (int4 AWQ/GPTQ, MXFP4 outside the presets, ...) is refused with one line rather
    than read as BF16 weights, which would overstate weight memory by 2-4x.
    """
    config = data.get("quantization_config")
    if config is None:
        return None
    if not isinstance(config, dict):
        raise ScenarioError(f"{where}: field 'quantization_config': must be an object")
    method = str(config.get("quant_method", "")).lower()
    if method in _FP8_METHODS:
        return "fp8"
    if method == "compressed-tensors":
        groups = config.get("config_groups") or {}
        if not isinstance(groups, dict):
            raise ScenarioError(f"{where}: field 'quantization_config.config_groups': must be an object")
        weights = [group.get("weights") or {} for group in groups.values() if isinstance(group, dict)]
        if not all(isinstance(w, dict) for w in weights):
            raise ScenarioError(
                f"{where}: field 'quantization_config.config_groups.*.weights': must be an object"
            )
        if weights and all(w.get("num_bits") == 8 and w.get("type") == "float" for w in weights):
            return "fp8"
    raise ScenarioError(
        f"{where}: field 'quantization_config.quant_method': {method or 'missing'!r} is not modelled "
        "(known: fp8, fbgemm_fp8, compressed-tensors with 8-bit float weights)"
    )


def model_spec_of(model: Any) -> ModelSpec:
    """The ModelSpec a --model value names: a spec, a config.json path or a preset name."""
    from sim.scenario.hf_config import looks_like_config_path, model_spec_from_file
    from sim.scenario.presets import model_preset

    if isinstance(model, ModelSpec):
        return model
    if looks_like_config_path(str(model)):
        return model_spec_from_file(str(model))
    try:
        return model_preset(str(model))
    except (KeyError, ValueError):
        raise ScenarioError(f"field 'model': unknown preset {model!r} (kvsim presets)") from None


def quantized_flag_model(model: Any, quantization: str) -> ModelSpec:
    """`--quantization Q` with `--model M`: M's spec with its weights at Q, before the scenario checks
    that they fit (a 70B model fits two 80 GB GPUs only in FP8)."""
    if model is None:
        raise ScenarioError("--quantization: give --model too (the weights it quantizes)")
    return quantized_model(model_spec_of(model), quantization)
