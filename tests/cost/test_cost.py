"""Cost model: hand-checked step times, the k-step closed form against stepping, calibration profiles."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sim.cost.gpu_fits import gpu_linear_fit
from sim.cost.model import CostModel, analytic_layout_factor, load_calibration, prefill_attention_pairs
from sim.errors import user_error_types
from sim.scenario.scenario import Scenario, default_scenario

PROFILE = Path(__file__).resolve().parents[1] / "data" / "calibration_small.json"
OPT13B_WEIGHT_BYTES = 12_853_473_280 * 2
OPT13B_KV_BYTES_PER_TOKEN = 819_200
A100_40_HBM = 1.555e12
A100_40_FLOPS = 312e12


def _scenario(**overrides: object) -> Scenario:
    return default_scenario().with_overrides(**overrides)


def _stepwise(cost: CostModel, n: int, context: int, k: int) -> list[float]:
    return [cost.step_time_s(0, n, context + i * n) for i in range(k)]


# --- the analytic roofline by hand ----------


def _opt13b_linear_by_hand(tokens: int, hbm_fraction: float, flops_fraction: float, p: float, fixed_s: float):
    """OPT-13B on an A100-40GB: the linear layers' time, re-derived from the model's numbers."""
    layers, hidden, heads = 40, 5120, 40
    attention_params = hidden * 3 * hidden + hidden * hidden  # QKV (MHA) + output projection
    mlp = round((12_853_473_280 / layers - attention_params) / (3 * hidden))  # gated-equivalent width
    gemm_io = (hidden + 3 * hidden) + (2 * hidden) + (hidden + 2 * mlp) + (mlp + hidden)
    elementwise = 4 * hidden + 2 * (2 * hidden) + (2 * mlp + mlp) + 3 * hidden
    bandwidth, flops = A100_40_HBM * hbm_fraction, A100_40_FLOPS * flops_fraction
    memory = (OPT13B_WEIGHT_BYTES + tokens * layers * 2 * gemm_io) / bandwidth
    compute = tokens * 2 * 12_853_473_280 / flops
    gemm = (memory**p + compute**p) ** (1 / p)
    assert heads * 128 == hidden
    return layers * fixed_s + gemm + tokens * layers * 2 * elementwise / bandwidth


def test_decode_step_is_the_sum_of_its_parts_by_hand() -> None:
    cost = CostModel.from_scenario(default_scenario())  # paged 16, vllm-v0, the A100 fit
    fit = gpu_linear_fit("A100-40GB")
    context = 10 * 500
    layout = 1 + 0.02 + 0.18 / 16
    linear = _opt13b_linear_by_hand(10, fit.hbm_fraction, fit.flops_fraction, fit.smooth_p, fit.fixed_s)
    kv_read = context * OPT13B_KV_BYTES_PER_TOKEN * layout / (A100_40_HBM * fit.hbm_fraction)
    attention_flops = context * 4 * 40 * 40 * 128 / (A100_40_FLOPS * fit.flops_fraction)
    overhead = 1.330e-3 + 10 * 0.1052e-3  # vllm-v0: Vidur's measured CPU overhead line
    assert kv_read > attention_flops  # decode attention is memory-bound
    assert cost.step_time_s(0, 10, context) == pytest.approx(overhead + linear + kv_read, rel=1e-12)
    assert cost.linear_time_s(10) == pytest.approx(linear, rel=1e-12)
    assert cost.overhead_time_s(10) == pytest.approx(overhead, rel=1e-12)
    assert cost.all_reduce_time_s(10) == 0.0  # TP 1


def test_explicit_knobs_replace_the_fit_and_the_engine_overhead() -> None:
    cost = CostModel.from_scenario(_scenario(hbm_efficiency=0.8, flops_efficiency=0.5, step_overhead_s="2ms"))
    fit = gpu_linear_fit("A100-40GB")
    context = 10 * 500
    layout = 1 + 0.02 + 0.18 / 16
    linear = _opt13b_linear_by_hand(10, 0.8, 0.5, fit.smooth_p, fit.fixed_s)
    kv_read = context * OPT13B_KV_BYTES_PER_TOKEN * layout / (A100_40_HBM * 0.8)
    assert cost.step_time_s(0, 10, context) == pytest.approx(0.002 + linear + kv_read, rel=1e-12)
    assert cost.overhead_time_s(200) == 0.002  # an explicit constant has no per-sequence term


def test_prefill_step_is_compute_bound_and_counts_attention_pairs() -> None:
    cost = CostModel.from_scenario(default_scenario())
    fit = gpu_linear_fit("A100-40GB")
    pairs = prefill_attention_pairs(2000)
    linear = _opt13b_linear_by_hand(2000, fit.hbm_fraction, fit.flops_fraction, fit.smooth_p, fit.fixed_s)
    attention = pairs * 4 * 40 * 40 * 128 / (A100_40_FLOPS * fit.flops_fraction)
    assert cost.step_time_s(2000, 0, 0, pairs) == pytest.approx(1.330e-3 + linear + attention, rel=1e-12)
    assert cost.step_time_s(2000, 0, 0, pairs) > cost.step_time_s(2000, 0, 0)
    compute_only = 2000 * 2 * 12_853_473_280 / (A100_40_FLOPS * fit.flops_fraction)
    assert linear > compute_only  # the smooth max and elementwise ops only add to the GEMM FLOPs


def test_prefill_attention_pairs_by_hand() -> None:
    assert prefill_attention_pairs(4) == 4 + 3 + 2 + 1
    assert prefill_attention_pairs(2, 3) == 4 + 5  # the two new tokens see 4 and 5 keys
    assert prefill_attention_pairs(np.array([4, 2]), np.array([0, 3])).tolist() == [10, 9]


def test_empty_step_takes_no_time_and_constant_mode_ignores_load() -> None:
    cost = CostModel.from_scenario(default_scenario())
    assert cost.step_time_s(0, 0, 0) == 0.0
    constant = CostModel.from_scenario(_scenario(constant_step_s="25ms"))
    assert constant.step_time_s(0, 3, 900) == pytest.approx(0.025)
    assert constant.step_time_s(4000, 100, 10**6) == pytest.approx(0.025)
    assert math.fsum(constant.decode_step_durations_s(7, 100, 40)) == pytest.approx(40 * 0.025)
    assert constant.source == "constant"


def test_tensor_parallelism_splits_weights_and_kv() -> None:
    one = CostModel.from_scenario(_scenario(model="Llama-3-70B", gpu="H100-80GB", tensor_parallel_size=4))
    assert one.weight_bytes == math.ceil(70_553_706_496 * 2 / 4)
    assert one.kv_bytes_per_token == 2 * 80 * (8 // 4) * 128 * 2
    # every token multiplies all weights but the embedding table and the LM head (2 x 128,256 x 8,192)
    assert one.flops_per_token == pytest.approx(2 * (70_553_706_496 - 2 * 128_256 * 8192) / 4)
    assert one.lm_head_flops_per_seq == pytest.approx(2 * 128_256 * 8192 / 4)


def test_layout_factor_shrinks_with_block_size() -> None:
    factors = [analytic_layout_factor(b) for b in (1, 2, 8, 16, 32, 128)]
    assert factors[0] == pytest.approx(1.2)
    assert factors == sorted(factors, reverse=True)
    assert 1.02 < analytic_layout_factor(16) < 1.04
    assert CostModel.from_scenario(_scenario(allocator="contiguous")).layout_factor == 1.0
    assert CostModel.from_scenario(_scenario(kv_layout_factor=1.25)).layout_factor == 1.25
    with pytest.raises(ValueError):
        analytic_layout_factor(0)


def test_paged_reads_kv_slower_than_contiguous_without_profile() -> None:
    paged = CostModel.from_scenario(_scenario(block_size=1))
    contiguous = CostModel.from_scenario(_scenario(allocator="contiguous"))
    assert paged.kv_read_time_s(8, 8000) == pytest.approx(1.2 * contiguous.kv_read_time_s(8, 8000))
    assert paged.kv_read_time_s(0, 0) == 0.0


def test_swap_time_uses_pcie() -> None:
    cost = CostModel.from_scenario(default_scenario())
    assert cost.swap_time_s(1000) == pytest.approx(1000 * OPT13B_KV_BYTES_PER_TOKEN / 32e9)
    assert cost.swap_time_s(0) == 0.0


# --- k decode steps at once == stepping one at a time ----------


def test_closed_form_crosses_from_memory_to_compute_bound_attention() -> None:
    # A calibrated KV read has an intercept; with a what-if tiny FLOPs fraction the attention FLOPs
    # line starts below it and overtakes it: the jump must split at the crossing.
    cost = CostModel.from_scenario(_scenario(calibration=str(PROFILE), flops_efficiency=0.001))
    n, context, k = 4, 4, 400
    steps = _stepwise(cost, n, context, k)
    batch = cost.batch_time_s(n, n)
    last_context = context + (k - 1) * n
    assert steps[0] == pytest.approx(batch + cost.memory_time_s(n, context))  # starts KV-read bound...
    assert steps[-1] == pytest.approx(batch + cost.attention_compute_time_s(last_context))  # ...ends FLOPs
    assert math.fsum(cost.decode_step_durations_s(n, context, k)) == pytest.approx(math.fsum(steps), rel=1e-9)
    assert np.allclose(cost.decode_step_durations_s(n, context, k), steps, rtol=1e-12)


@given(
    n=st.integers(1, 512),
    context_per_seq=st.integers(0, 4096),
    k=st.integers(0, 3000),
    hbm=st.floats(0.05, 1.0),
    flops=st.floats(0.01, 1.0),
    block=st.sampled_from([1, 8, 16, 32]),
    use_profile=st.booleans(),
    engine=st.sampled_from(["vllm-v0", "vllm-v1"]),
    tp=st.sampled_from([1, 2, 8]),
    fitted=st.booleans(),
)
@example(n=256, context_per_seq=10, k=3000, hbm=0.8, flops=0.5, block=16, use_profile=False,
         engine="vllm-v0", tp=1, fitted=False)  # fmt: skip
@example(n=256, context_per_seq=10, k=3000, hbm=0.8, flops=0.5, block=16, use_profile=True,
         engine="vllm-v1", tp=2, fitted=True)  # fmt: skip
def test_closed_form_equals_stepwise_sum(
    n: int,
    context_per_seq: int,
    k: int,
    hbm: float,
    flops: float,
    block: int,
    use_profile: bool,
    engine: str,
    tp: int,
    fitted: bool,
) -> None:
    knobs = {} if fitted else {"hbm_efficiency": hbm, "flops_efficiency": flops}
    scenario = _scenario(
        block_size=block,
        calibration=str(PROFILE) if use_profile else None,
        tensor_parallel_size=tp,
        **knobs,
    )
    cost = CostModel.from_scenario(scenario, engine=engine)
    assert (cost.all_reduce is not None) == (tp > 1)
    context = n * context_per_seq
    expected = math.fsum(_stepwise(cost, n, context, k))
    got = math.fsum(cost.decode_step_durations_s(n, context, k))
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-15)


# --- calibration profile ----------


def test_profile_replaces_kv_read_with_the_paged_fit_at_the_nearest_block_size() -> None:
    cost = CostModel.from_scenario(_scenario(block_size=12, calibration=str(PROFILE)))
    assert cost.kv_fit is not None and cost.kv_fit.layout == "paged_shuffled"
    assert cost.kv_fit.block_size == 16  # log-nearest to 12
    assert cost.layout_factor == pytest.approx(1.11)  # the measured attention ratio at 16
    assert cost.source.startswith("profile:Test GPU")
    seqs, context, blocks = 8, 8 * 1000, 8 * 63
    expected = 40 * (6e-6 + 2e-9 * blocks) + context * OPT13B_KV_BYTES_PER_TOKEN / 0.9e12
    assert cost.kv_read_time_s(seqs, context, blocks) == pytest.approx(expected, rel=1e-12)
    analytic = CostModel.from_scenario(_scenario(block_size=12))
    assert cost.kv_read_time_s(seqs, context, blocks) != pytest.approx(analytic.kv_read_time_s(seqs, context))


def test_profile_contiguous_family_uses_the_contiguous_fit() -> None:
    cost = CostModel.from_scenario(_scenario(allocator="request_limit:oracle", calibration=str(PROFILE)))
    assert cost.kv_fit is not None and cost.kv_fit.layout == "contiguous"
    assert cost.layout_factor == 1.0
    expected = 40 * (5e-6 + 1e-8 * 4) + 4000 * OPT13B_KV_BYTES_PER_TOKEN / 1.0e12  # one "block" per sequence
    assert cost.kv_read_time_s(4, 4000, 250) == pytest.approx(expected, rel=1e-12)
    assert cost.kv_read_time_s(4, 4000) == pytest.approx(expected, rel=1e-12)


def test_profile_with_only_a_contiguous_fit_scales_it_by_the_ratio(tmp_path: Path) -> None:
    profile = json.loads(PROFILE.read_text())
    profile["fits"] = [f for f in profile["fits"] if f["layout"] == "contiguous"]
    path = tmp_path / "contiguous_only.json"
    path.write_text(json.dumps(profile))
    paged = CostModel.from_scenario(_scenario(block_size=8, calibration=str(path)))
    contiguous = CostModel.from_scenario(_scenario(allocator="contiguous", calibration=str(path)))
    assert paged.layout_factor == pytest.approx(1.25)
    assert paged.kv_read_time_s(4, 4000, 500) == pytest.approx(1.25 * contiguous.kv_read_time_s(4, 4000, 500))


def test_profile_makes_step_time_follow_the_measured_bandwidth() -> None:
    slow = CostModel.from_scenario(_scenario(calibration=str(PROFILE)))  # 0.9 TB/s measured for paged 16
    fast = CostModel.from_scenario(_scenario())  # 1.555 TB/s x 0.8 x layout factor
    assert slow.step_time_s(0, 64, 64 * 1500) > fast.step_time_s(0, 64, 64 * 1500)


def _break(profile: dict, how: str) -> None:
    if how == "version":
        profile["schema_version"] = 99
    elif how == "no_layout":
        del profile["fits"][0]["layout"]
    elif how == "a_s":
        profile["fits"][1]["a_s"] = "fast"


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("missing", "cannot read"),
        ("not_json", "JSON"),
        ("version", "schema_version"),
        ("no_layout", "fits[0].layout"),
        ("a_s", "fits[1].a_s"),
    ],
)
def test_bad_profile_is_one_line_naming_the_file_and_key(tmp_path: Path, how: str, expected: str) -> None:
    path = tmp_path / "profile.json"
    if how == "not_json":
        path.write_text("{not json")
    elif how != "missing":
        profile = json.loads(PROFILE.read_text())
        _break(profile, how)
        path.write_text(json.dumps(profile))
    with pytest.raises(user_error_types()) as info:
        load_calibration(path)
    message = str(info.value)
    assert "\n" not in message and "profile.json" in message and expected in message
    with pytest.raises(user_error_types()):
        CostModel.from_scenario(_scenario(calibration=str(path)))


def test_gpu_default_profile_agrees_with_the_analytic_model() -> None:
    profile_module = pytest.importorskip("gpu.profile")
    scenario = default_scenario()
    analytic = CostModel.from_scenario(scenario)
    profile = profile_module.default_profile(scenario.gpu_spec().hbm_bandwidth_bytes_per_s, "A100 analytic")
    profiled = CostModel.from_scenario(scenario, profile=profile)
    assert profiled.source == "profile:A100 analytic (not measured)"
    read_analytic, read_profiled = analytic.kv_read_time_s(32, 32_000), profiled.kv_read_time_s(32, 32_000)
    assert read_profiled == pytest.approx(read_analytic, rel=0.15)
    contiguous = CostModel.from_scenario(scenario.with_overrides(allocator="contiguous"), profile=profile)
    assert contiguous.kv_read_time_s(32, 32_000) < read_profiled


def test_offload_loads_add_to_the_step_and_stores_only_bound_it() -> None:
    """CostModel.offload_step_s (docs/engines.md "CPU tier"): max(compute + load, store) over PCIe,
    each direction tokens x KV bytes per token per GPU / the GPU preset's PCIe bandwidth."""
    from sim.scenario import default_scenario

    scenario = default_scenario().with_overrides(engine="vllm-v1")
    cost = CostModel.from_scenario(scenario)
    per_token_s = scenario.kv_bytes_per_token_per_gpu() / scenario.gpu_spec().pcie_bandwidth_bytes_per_s
    assert cost.offload_step_s(0.02, 0, 0) == 0.02
    assert cost.offload_step_s(0.02, 1000, 0) == pytest.approx(0.02 + 1000 * per_token_s)
    assert cost.offload_step_s(0.02, 0, 100) == 0.02  # 100 tokens store in ~2.6 ms, under the step
    assert cost.offload_step_s(0.02, 0, 10_000) == pytest.approx(10_000 * per_token_s)  # ~0.26 s
