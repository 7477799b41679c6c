"""Each part of the step time on its own: engine overhead, linear layers, TP all-reduce, and how a
scenario picks them (fitted fractions, explicit knobs, engine preset read defensively)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sim.cost.gpu_fits import GPU_LINEAR_FITS, gpu_linear_fit, gpu_network
from sim.cost.linear import LayerCoefficients, LayerShape, LinearFit, layer_time_s, smooth_max
from sim.cost.model import CostModel
from sim.cost.network import ALL_REDUCE_TABLES, AllReduceModel
from sim.cost.overhead import ENGINE_OVERHEADS, engine_overhead
from sim.cost.parts import explicit_value, scenario_engine
from sim.errors import ScenarioError
from sim.scenario.presets import GPU_PRESETS, model_preset
from sim.scenario.scenario import default_scenario

# --- framework overhead per engine preset ----------


def test_engine_overheads_are_lines_in_batch_size_and_v1_is_much_smaller() -> None:
    v0, v1 = engine_overhead("vllm-v0"), engine_overhead("vllm-v1")
    assert v0.step_s(0) == pytest.approx(1.330e-3)
    assert v0.step_s(64) == pytest.approx(1.330e-3 + 64 * 0.1052e-3)  # Vidur's batch 64: 7.6 + 0.45 ms
    assert v0.step_s(8, tensor_parallel_size=2) == pytest.approx(
        1.330e-3 + 1.914e-3 + 8 * (0.1052e-3 + 0.0616e-3)
    )
    for batch in (1, 16, 256):
        assert v1.step_s(batch) < v0.step_s(batch) / 3
    assert engine_overhead(None) is ENGINE_OVERHEADS["vllm-v0"]
    with pytest.raises(ValueError, match="unknown engine preset 'vllm-v9'"):
        engine_overhead("vllm-v9")


def test_engine_is_read_defensively_and_defaults_to_v0() -> None:
    assert scenario_engine(default_scenario()) in (
        "vllm-v0",
        getattr(default_scenario(), "engine", "vllm-v0"),
    )
    assert scenario_engine(SimpleNamespace()) == "vllm-v0"
    assert scenario_engine(SimpleNamespace(engine="vllm-v1")) == "vllm-v1"
    assert scenario_engine(SimpleNamespace(engine="vllm-v1"), engine="vllm-v0") == "vllm-v0"
    v0 = CostModel.from_scenario(default_scenario(), engine="vllm-v0")
    v1 = CostModel.from_scenario(default_scenario(), engine="vllm-v1")
    assert v0.step_time_s(0, 32, 32 * 500) - v1.step_time_s(0, 32, 32 * 500) == pytest.approx(
        engine_overhead("vllm-v0").step_s(32) - engine_overhead("vllm-v1").step_s(32), rel=1e-9
    )
    with pytest.raises(ScenarioError, match="field 'engine'"):
        CostModel.from_scenario(default_scenario(), engine="tgi")


def test_only_explicitly_set_knobs_override_the_fit() -> None:
    scenario = default_scenario()
    assert explicit_value(scenario, "hbm_efficiency") is None  # the 0.8 default is not "set"
    assert explicit_value(scenario.with_overrides(hbm_efficiency=0.8), "hbm_efficiency") == 0.8
    fitted = CostModel.from_scenario(scenario)
    fit = gpu_linear_fit("A100-40GB")
    assert fitted.hbm_bytes_per_s == pytest.approx(1.555e12 * fit.hbm_fraction)
    assert fitted.flops_per_s == pytest.approx(312e12 * fit.flops_fraction)
    forced = CostModel.from_scenario(scenario.with_overrides(hbm_efficiency=0.5, flops_efficiency=0.25))
    assert forced.hbm_bytes_per_s == pytest.approx(1.555e12 * 0.5)
    assert forced.flops_per_s == pytest.approx(312e12 * 0.25)
    constant = CostModel.from_scenario(scenario.with_overrides(step_overhead_s=0.0))
    assert constant.overhead_time_s(100) == 0.0


# --- linear layers ----------


def test_smooth_max_bounds_and_limit() -> None:
    a, b = np.array([1.0, 3.0, 0.0, 2.0]), np.array([2.0, 1.0, 0.0, 2.0])
    value = smooth_max(a, b, 1.5)
    assert np.all(value >= np.maximum(a, b)) and np.all(value <= 2 ** (1 / 1.5) * np.maximum(a, b) + 1e-15)
    assert value[2] == 0.0
    assert np.allclose(smooth_max(a, b, 200.0), np.maximum(a, b), rtol=1e-2)


def test_layer_coefficients_by_hand_for_llama2_7b_at_tp2() -> None:
    shape = LayerShape(hidden_size=4096, num_attention_heads=32, num_kv_heads=32, mlp_size=11008)
    assert shape.params() == 4096 * 3 * 4096 + 4096 * 4096 + 3 * 4096 * 11008
    c = LayerCoefficients.of(shape, 2)
    assert c.weight_bytes == pytest.approx(shape.params() * 2 / 2)
    assert c.flops_per_token == pytest.approx(2 * shape.params() / 2)
    q = kv = 2048
    up, f = 11008, 5504
    assert c.gemm_bytes_per_token == pytest.approx(
        2 * ((4096 + q + 2 * kv) + (q + 4096) + (4096 + up) + (f + 4096))
    )
    assert c.elementwise_bytes_per_token == pytest.approx(2 * (4 * 4096 + 2 * (q + kv) + (up + f) + 3 * 4096))


def test_layer_time_memory_bound_then_compute_bound() -> None:
    shape = LayerShape(hidden_size=4096, num_attention_heads=32, num_kv_heads=8, mlp_size=14336)
    c = LayerCoefficients.of(shape, 1)
    hard = LinearFit(0.8, 0.7, 1e6, 0.0, "test")  # a near-hard max: plain roofline sides
    one = float(layer_time_s(c, 1, hard, 2e12, 312e12))
    assert one == pytest.approx(
        (c.weight_bytes + c.gemm_bytes_per_token) / 1.6e12 + c.elementwise_bytes_per_token / 1.6e12
    )
    big = float(layer_time_s(c, 8192, hard, 2e12, 312e12))
    assert big == pytest.approx(
        8192 * c.flops_per_token / (0.7 * 312e12) + 8192 * c.elementwise_bytes_per_token / 1.6e12
    )
    smooth = LinearFit(0.8, 0.7, 1.5, 30e-6, "test")
    assert float(layer_time_s(c, 1, smooth, 2e12, 312e12)) > one + 30e-6 - 1e-12


def test_model_layer_shape_recovers_llama_mlp_size() -> None:
    shape = LayerShape.from_model(model_preset("LLaMA-2-7B"))
    # 6.74 B over 32 layers includes the embeddings and LM head: a little above the true 11008.
    assert 11008 <= shape.mlp_size <= 11008 * 1.08
    assert LayerShape.from_model(model_preset("Llama-3-8B")).num_kv_heads == 8


# --- TP all-reduce ----------


def test_all_reduce_interpolates_the_measured_table() -> None:
    sizes, times = ALL_REDUCE_TABLES["a100_dgx"][8]
    model = AllReduceModel.for_group("a100_dgx", 8)
    for size, seconds in zip(sizes, times, strict=True):
        assert model.time_s(size) == pytest.approx(seconds)
    middle = (sizes[5] + sizes[6]) / 2
    assert model.time_s(middle) == pytest.approx((times[5] + times[6]) / 2)
    assert model.time_s(1) == pytest.approx(times[0])  # the latency floor below the table
    beyond = model.time_s(2 * sizes[-1])
    assert beyond > times[-1]
    grid = np.geomspace(1, 4 * sizes[-1], 60)
    assert np.all(np.diff([model.time_s(s) for s in grid]) >= 0)
    assert model.time_s(0) == 0.0


def test_all_reduce_group_sizes_without_a_table() -> None:
    eight = AllReduceModel.for_group("h100_dgx", 8)
    sixteen = AllReduceModel.for_group("h100_dgx", 16)  # no 16-GPU table for H100: ring-factor scaled
    assert sixteen.group == 8
    assert sixteen.time_s(1e6) == pytest.approx(eight.time_s(1e6) * (2 * 15 / 16) / (2 * 7 / 8))
    assert AllReduceModel.for_group("a100_dgx", 3).group == 4  # next larger measured group
    with pytest.raises(ValueError, match="no all-reduce table"):
        AllReduceModel.for_group("tpu_pod", 2)


def test_tp_step_time_includes_two_all_reduces_per_layer() -> None:
    scenario = default_scenario().with_overrides(
        model="Llama-3-70B", gpu="H100-80GB", tensor_parallel_size=4, kv_cache_memory="20GiB"
    )
    cost = CostModel.from_scenario(scenario)
    table = AllReduceModel.for_group("h100_dgx", 4)
    tokens = 256
    expected = 2 * 80 * table.time_s(tokens * 8192)
    assert cost.all_reduce_time_s(tokens) == pytest.approx(expected)
    assert cost.describe()["all_reduce_network"] == "h100_dgx"
    parts = (
        cost.overhead_time_s(tokens)
        + cost.linear_time_s(tokens, tokens)  # each decoding sequence through the LM head
        + expected
        + cost.memory_time_s(tokens, tokens * 1000)
    )
    assert cost.step_time_s(0, tokens, tokens * 1000) == pytest.approx(parts, rel=1e-12)
    single = CostModel.from_scenario(
        scenario.with_overrides(tensor_parallel_size=1, gpu="H200-141GB", kv_cache_memory="8GiB")
    )
    assert single.all_reduce_time_s(tokens) == 0.0


# --- where GPUs without a measured file get their values ----------


def test_every_gpu_preset_has_a_fit_and_a_network() -> None:
    for name in GPU_PRESETS:
        fit = gpu_linear_fit(name)
        assert 0 < fit.hbm_fraction <= 1 and 0 < fit.flops_fraction <= 1 and fit.smooth_p > 1
        assert fit.source
        assert gpu_network(name)[0] in ALL_REDUCE_TABLES
    assert gpu_linear_fit("H200-141GB").hbm_fraction == GPU_LINEAR_FITS["H100-80GB"].hbm_fraction
    assert gpu_linear_fit("A100-40GB").flops_fraction == GPU_LINEAR_FITS["A100-80GB"].flops_fraction
    assert gpu_linear_fit("A100-80GB").mape_pct is not None and gpu_linear_fit("L4").mape_pct is None
    assert gpu_linear_fit("H100-80GB-custom") is GPU_LINEAR_FITS["H100-80GB"]
    assert "mean" in gpu_linear_fit("my-own-gpu").source


def test_a_scenario_read_back_from_its_toml_keeps_the_fitted_cost_model(tmp_path) -> None:
    """The what-if knobs default to None, so writing a scenario out and reading it back does not turn
    the GPU's fitted fractions and the preset's overhead into the pre-fit constants."""
    from sim.cost.model import CostModel
    from sim.scenario.scenario import Scenario, default_scenario

    scenario = default_scenario()
    path = tmp_path / "s.toml"
    path.write_text(scenario.to_toml())
    again = Scenario.from_toml(path)
    assert again.hbm_efficiency is None and again.step_overhead_s is None
    assert CostModel.from_scenario(again).describe() == CostModel.from_scenario(scenario).describe()
