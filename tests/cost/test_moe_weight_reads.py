"""An MoE step reads only the experts its tokens are routed to (issue 21, docs/cost_model.md "MoE").

vLLM's fused MoE (vllm/model_executor/layers/fused_moe/fused_moe.py) groups the batch's tokens by
expert (`moe_align_block_size`) and launches blocks only for the experts that got tokens, so a step
reads the dense part (attention, norms, router, shared experts, dense layers, embeddings) plus the
routed experts x E (1 - (1 - k/E)^tokens) / E (uniform independent routing, a modelling choice).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from sim.cost.linear import routed_expert_weight_bytes
from sim.cost.model import CostModel, expected_experts_touched
from sim.scenario.hf_config import spec_from_config
from sim.scenario.model_configs import MODEL_CONFIGS
from sim.scenario.presets import MODEL_PRESETS, ModelSpec
from sim.scenario.quantization import quantized_model
from sim.scenario.scenario import default_scenario

MIXTRAL_ROUTED = 32 * 8 * 3 * 4096 * 14336  # layers x experts x (gate, up, down) x hidden x width
DEEPSEEK_ROUTED = (61 - 3) * 256 * 3 * 7168 * 2048  # MoE layers (the first 3 are dense) x 256 experts
DEEPSEEK_SHARED = (61 - 3) * 3 * 7168 * 2048  # one shared expert per MoE layer, read every step


def _cost(model: object, tp: int, gpu: str = "H100-80GB") -> CostModel:
    scenario = default_scenario().with_overrides(model=model, gpu=gpu, tensor_parallel_size=tp)
    return CostModel.from_scenario(scenario)


def _all_weights(cost: CostModel) -> CostModel:
    """The same model reading every weight every step (the rule before issue 21's MoE change)."""
    return dataclasses.replace(cost, routed_expert_bytes=0.0)


@pytest.mark.parametrize(("tokens", "fraction"), [(1, 0.25), (4, 1 - 0.75**4), (16, 1 - 0.75**16)])
def test_mixtral_touches_the_expected_fraction_of_its_experts(tokens: int, fraction: float) -> None:
    assert expected_experts_touched(tokens, 8, 2) / 8 == pytest.approx(fraction, rel=1e-12)
    cost = _cost("Mixtral-8x7B", tp=2)
    routed = MIXTRAL_ROUTED * 2 / 2  # bf16, split over TP 2
    assert cost.routed_expert_bytes == routed
    dense = cost.weight_bytes - routed
    assert cost.weight_read_bytes(tokens) == pytest.approx(dense + routed * fraction, rel=1e-12)


def test_sixteen_tokens_touch_almost_every_mixtral_expert() -> None:
    assert expected_experts_touched(16, 8, 2) / 8 == pytest.approx(0.99, abs=0.005)
    assert expected_experts_touched(0, 8, 2) == 0.0
    assert expected_experts_touched(10**6, 8, 2) == 8.0  # (3/4)^n underflows to 0: every expert


def test_mixtral_routed_params_come_from_the_config() -> None:
    model = MODEL_PRESETS["Mixtral-8x7B"]
    assert model.routed_expert_params == MIXTRAL_ROUTED
    assert model.routed_expert_bytes is None  # bf16: params x dtype
    assert routed_expert_weight_bytes(model) == MIXTRAL_ROUTED * 2
    # what is left is read every step: attention, router, norms, embedding and LM head
    assert model.num_params - MIXTRAL_ROUTED == 32 * (
        4096 * 4096 * 2 + 2 * 4096 * 1024 + 4096 * 8 + 2 * 4096
    ) + (2 * 32000 * 4096 + 4096)


def test_deepseek_v3_at_batch_1_reads_dense_shared_and_8_of_256_routed() -> None:
    model = MODEL_PRESETS["DeepSeek-V3"]
    assert model.routed_expert_params == DEEPSEEK_ROUTED
    assert model.routed_expert_bytes == DEEPSEEK_ROUTED  # FP8 checkpoint: 1 byte per parameter
    cost = _cost("DeepSeek-V3", tp=8, gpu="H200-141GB")
    routed = DEEPSEEK_ROUTED / 8
    dense = cost.weight_bytes - routed
    # the part read every step holds the shared experts and the first 3 dense layers' MLPs (FP8)
    assert dense * 8 >= DEEPSEEK_SHARED + 3 * 3 * 7168 * 18432
    assert dense == pytest.approx((model.num_params - DEEPSEEK_ROUTED) / 8, abs=1.0)
    assert cost.weight_read_bytes(1) == pytest.approx(dense + routed * 8 / 256, rel=1e-12)


def test_gpt_oss_reads_its_experts_as_stored_in_mxfp4() -> None:
    model = MODEL_PRESETS["gpt-oss-120b"]
    weights, biases = 36 * 128 * 3 * 2880 * 2880, 36 * 128 * 3 * 2880
    assert model.routed_expert_params == weights + biases
    assert model.routed_expert_bytes == round(weights * 4.25 / 8 + biases * 2)
    assert routed_expert_weight_bytes(model) < model.weight_bytes


def test_fp8_quantization_stores_the_experts_at_one_byte() -> None:
    model = quantized_model(MODEL_PRESETS["Mixtral-8x7B"], "fp8")
    assert routed_expert_weight_bytes(model) == MIXTRAL_ROUTED
    assert routed_expert_weight_bytes(model) < model.weight_bytes


def test_a_dense_model_reads_every_weight_whatever_the_batch() -> None:
    model = MODEL_PRESETS["Llama-3.1-8B"]
    assert model.routed_expert_params is None and routed_expert_weight_bytes(model) == 0
    cost = _cost("Llama-3.1-8B", tp=1)
    assert cost.routed_expert_bytes == 0.0
    for tokens in (1, 8, 64, 4096):
        assert cost.weight_read_bytes(tokens) == cost.weight_bytes
        assert cost.linear_time_s(tokens, tokens) == _all_weights(cost).linear_time_s(tokens, tokens)


def test_a_mixtral_decode_step_is_cheaper_at_batch_1_than_at_64() -> None:
    cost = _cost("Mixtral-8x7B", tp=2)
    before = _all_weights(cost)
    one, many = cost.step_time_s(0, 1, 1000), cost.step_time_s(0, 64, 64_000)
    # reading all experts, batch 1's linear layers cost almost what batch 64's do; with 2 of 8
    # experts read they cost about a third
    assert before.linear_time_s(1, 1) > 0.95 * before.linear_time_s(64, 64)
    assert cost.linear_time_s(1, 1) < 0.4 * cost.linear_time_s(64, 64)
    assert one < before.step_time_s(0, 1, 1000) - 0.005  # at least 5 ms less
    # 64 tokens miss an expert with probability (3/4)^64 ~ 1e-8: the same step as reading all
    assert many == pytest.approx(before.step_time_s(0, 64, 64_000), rel=1e-6)


def test_the_sparse_step_counts_only_moe_layers() -> None:
    """Qwen3-MoE's decoder_sparse_step 2: every second layer has experts, the others a dense MLP."""
    config = {**MODEL_CONFIGS["Qwen3-235B-A22B"], "decoder_sparse_step": 2}
    model = spec_from_config(config, name="sparse")
    assert model.routed_expert_params == 47 * 128 * 3 * 4096 * 1536
    assert spec_from_config(MODEL_CONFIGS["Qwen3-32B"]).routed_expert_params is None


def test_routed_params_need_a_routing_and_fit_in_the_model() -> None:
    base = MODEL_PRESETS["Llama-3.1-8B"].model_dump()
    with pytest.raises(ValueError, match="needs num_experts and experts_per_token"):
        ModelSpec(**{**base, "routed_expert_params": 1000})
    with pytest.raises(ValueError, match="exceeds num_params"):
        ModelSpec(**{**base, "num_experts": 8, "experts_per_token": 2, "routed_expert_params": 10**12})
    with pytest.raises(ValueError, match="experts_per_token=8 exceeds num_experts=4"):
        ModelSpec(**{**base, "num_experts": 4, "experts_per_token": 8, "routed_expert_params": 1000})


def test_the_touched_count_never_exceeds_the_experts() -> None:
    """E x (1 - (1 - k/E)^t) rises with t toward E and stays in [k, E] for t >= 1 (k <= E)."""
    counts = [expected_experts_touched(tokens, 8, 2) for tokens in range(1, 40)]
    assert counts[0] == pytest.approx(2.0) and all(a <= b <= 8.0 for a, b in itertools.pairwise(counts))
    assert expected_experts_touched(3, 8, 8) == 8.0


def test_a_config_whose_layers_are_all_dense_has_no_routed_experts() -> None:
    """DeepSeek's first_k_dense_replace covering every layer: expert fields, but no MoE layer."""
    config = {**MODEL_CONFIGS["DeepSeek-V3"], "first_k_dense_replace": 61}
    assert spec_from_config(config, name="all-dense").routed_expert_params is None
