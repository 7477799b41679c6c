"""FP8 linear layers: the GEMM FLOP rate rises where the GPU has FP8 tensor cores (on Hopper by a
value inside vLLM's measured W8A8 kernel range, not the datasheet's 2x), and each GEMM input is quantized by a
kernel of its own first; on A100 weight-only Marlin runs below cuBLAS BF16
once compute-bound.

Sources: sim/scenario/quantization.py (vLLM `Fp8LinearMethod`: W8A8 FP8 GEMMs at compute capability
>= 8.9, weight-only Marlin below; NVIDIA datasheets for the dense FP8/BF16 peaks; vLLM's GEMM
benchmark for Hopper's achieved W8A8 rate; Marlin's measured compute-bound rate).
"""

from __future__ import annotations

import pytest

from sim.cost.linear import LAYER_OPS, LayerShape, gemm_input_elements
from sim.cost.model import CostModel
from sim.scenario.quantization import (
    FP8_GEMM_SPEEDUP,
    HOPPER_W8A8_SPEEDUP,
    MARLIN_COMPUTE_SCALE,
    W8A8_QUANT_KERNELS_PER_LAYER,
    activation_quant_kernels_per_layer,
    linear_flops_scale,
    quantized_model,
)
from sim.scenario.scenario import default_scenario


def _cost(gpu: str, quantization: str | None) -> CostModel:
    base = default_scenario().with_overrides(gpu=gpu, model="llama-3-8b", engine="vllm-v0")
    model = quantized_model(base.model_spec(), quantization)
    return CostModel.from_scenario(base.with_overrides(model=model))


def test_fp8_weights_carry_their_format_and_bf16_weights_none() -> None:
    model = default_scenario().with_overrides(model="llama-3-8b").model_spec()
    assert model.weight_quantization is None
    assert quantized_model(model, "fp8").weight_quantization == "fp8"
    assert linear_flops_scale(model, "H100-80GB") == 1.0


def test_hopper_fp8_gemms_run_at_the_measured_w8a8_rate_not_the_datasheet_peak() -> None:
    # a value inside vLLM's measured FP8-over-BF16 GEMM range (1.40-1.77x by shape and by whether the
    # activation quantization is timed inside; sim/scenario/quantization.py), below the datasheet's
    # 1,979 / 989.4 TFLOP/s = 2x
    assert HOPPER_W8A8_SPEEDUP == 1.69
    assert 1.43 <= HOPPER_W8A8_SPEEDUP < 1979.0 / 989.4
    assert FP8_GEMM_SPEEDUP["H100-80GB"] == FP8_GEMM_SPEEDUP["H200-141GB"] == HOPPER_W8A8_SPEEDUP
    cost = _cost("H100-80GB", "fp8")
    assert cost.linear_flops_scale == HOPPER_W8A8_SPEEDUP
    # a large prefill batch is compute-bound: its GEMM part falls by the rate, attention keeps BF16's
    bf16 = _cost("H100-80GB", None)
    assert cost.attention_compute_time_s(10**6) == pytest.approx(bf16.attention_compute_time_s(10**6))
    tokens = 16384
    fp8_compute = tokens * cost.flops_per_token / (cost.flops_per_s * cost.linear_flops_scale)
    bf16_compute = tokens * bf16.flops_per_token / bf16.flops_per_s
    assert fp8_compute == pytest.approx(bf16_compute / HOPPER_W8A8_SPEEDUP, rel=1e-3)
    assert bf16.linear_time_s(tokens) / 2.0 < cost.linear_time_s(tokens) < bf16.linear_time_s(tokens)
    # memory-bound decode still gains by the weight bytes, which the FLOP rate does not touch
    assert cost.linear_time_s(1) - cost.linear_fixed_s < 0.6 * (bf16.linear_time_s(1) - bf16.linear_fixed_s)


def test_a100_runs_fp8_weight_only_through_marlin() -> None:
    cost = _cost("A100-80GB", "fp8")
    # Marlin W8A16: dequantize in registers, multiply on BF16 tensor cores, below cuBLAS once compute-bound
    assert cost.linear_flops_scale == MARLIN_COMPUTE_SCALE
    assert 0.6 <= MARLIN_COMPUTE_SCALE < 1.0  # between the 4-bit kernel's measured ceiling and cuBLAS
    bf16 = _cost("A100-80GB", None)
    assert cost.weight_bytes < 0.6 * bf16.weight_bytes  # the weight bytes still halve
    # memory-bound decode: faster by the weight bytes (the kernels' latency floor is the same in both;
    # the embedding and LM head stay BF16, so the bytes fall to 0.57, not 0.5, on Llama-3-8B)
    assert cost.linear_time_s(1) - cost.linear_fixed_s < 0.6 * (bf16.linear_time_s(1) - bf16.linear_fixed_s)
    assert cost.linear_time_s(16384) > bf16.linear_time_s(16384)  # compute-bound prefill: slower
    assert cost.linear_fixed_s == bf16.linear_fixed_s  # no activation quantization kernels


def test_hopper_fp8_quantizes_each_gemm_input_in_its_own_kernel() -> None:
    """W8A8: four quantization kernels per layer, each at the fitted per-kernel latency floor, plus
    reading each GEMM input at 2 bytes and writing it at 1."""
    fp8, bf16 = _cost("H100-80GB", "fp8"), _cost("H100-80GB", None)
    model = quantized_model(default_scenario().with_overrides(model="llama-3-8b").model_spec(), "fp8")
    assert activation_quant_kernels_per_layer(model, "H100-80GB") == W8A8_QUANT_KERNELS_PER_LAYER == 4
    assert activation_quant_kernels_per_layer(model, "A100-80GB") == 0
    assert (
        activation_quant_kernels_per_layer(
            model.model_copy(update={"weight_quantization": None}), "H100-80GB"
        )
        == 0
    )
    assert fp8.linear_fixed_s == pytest.approx(bf16.linear_fixed_s * (1 + 4 / len(LAYER_OPS)))
    # each layer's GEMM inputs (hidden for QKV and gate/up, the heads for O, the MLP for down), TP 1;
    # the preset's MLP width is the gated equivalent solved from its parameter count (LayerShape)
    shape = LayerShape.from_model(model)
    assert gemm_input_elements(shape, 1) == 4096 * 3 + shape.mlp_size
    extra = 32 * gemm_input_elements(shape, 1) * 3
    assert fp8.elementwise_bytes_per_token - bf16.elementwise_bytes_per_token == pytest.approx(
        extra, rel=1e-3
    )


def test_unknown_gpu_claims_no_fp8_speed_up() -> None:
    model = quantized_model(default_scenario().with_overrides(model="llama-3-8b").model_spec(), "fp8")
    assert linear_flops_scale(model, "custom") == 1.0
