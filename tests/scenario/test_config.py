"""Scenario, presets and units: hand-computed KV budgets, one-line errors, TOML round trips."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.errors import ScenarioError
from sim.scenario.overrides import check_field, scenario_fields
from sim.scenario.presets import GPU_PRESETS, MODEL_PRESETS, gpu_preset, model_preset
from sim.scenario.scenario import Scenario, default_scenario, parse_allocator
from sim.scenario.units import UnitError, format_bytes, format_duration_s, parse_bytes, parse_duration_s

GiB = 1024**3
MiB = 1024**2

# --- units ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12GiB", 12 * GiB),
        ("12 gib", 12 * GiB),
        ("500MB", 500_000_000),
        ("1.5GiB", 3 * GiB // 2),
        ("0.5KiB", 512),
        ("64KiB", 65536),
        ("2e9", 2_000_000_000),
        ("100", 100),
        ("7B", 7),
        (4096, 4096),
        (2.0e9, 2_000_000_000),
    ],
)
def test_parse_bytes(text: str | int | float, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["12 GiBs", "twelve", "", "-1GiB", "1.5B", "nanGiB", True, -5, [12]])
def test_parse_bytes_refuses_with_the_field_named(text: object) -> None:
    with pytest.raises(UnitError, match="field 'kv_cache_memory'"):
        parse_bytes(text, field="kv_cache_memory")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected_s"),
    [
        ("2s", 2.0),
        ("100ms", 0.1),
        ("250 us", 250e-6),
        ("1.5min", 90.0),
        ("1h", 3600.0),
        (3, 3.0),
        ("0.5", 0.5),
    ],
)
def test_parse_duration(text: str | int, expected_s: float) -> None:
    assert parse_duration_s(text) == pytest.approx(expected_s)


@pytest.mark.parametrize("text", ["2 parsecs", "fast", "-1s", "", None])
def test_parse_duration_refuses_with_the_field_named(text: object) -> None:
    with pytest.raises(UnitError, match="field '--slo-ttft-p99'"):
        parse_duration_s(text, field="--slo-ttft-p99")  # type: ignore[arg-type]


def test_formatting() -> None:
    assert format_bytes(12 * GiB) == "12.00 GiB"
    assert format_bytes(800 * 1024) == "800.00 KiB"
    assert format_duration_s(0.0123) == "12.3 ms"
    assert format_duration_s(90) == "1.50 min"


# --- presets --------------------------------------------------------------------------------------------


def test_opt13b_has_800_kib_per_token_and_12gib_holds_15728_tokens() -> None:
    assert model_preset("opt-13b").kv_bytes_per_token == 2 * 40 * 40 * 128 * 2 == 819_200 == 800 * 1024
    scenario = default_scenario()
    assert scenario.kv_bytes_per_token() == 819_200
    assert scenario.kv_capacity_tokens() == 12 * GiB // 819_200 == 15_728
    assert scenario.max_concurrency() == pytest.approx(15_728 / 2048)


@pytest.mark.parametrize(
    ("name", "kv_bytes_per_token", "max_context"),
    [
        ("OPT-66B", 2 * 64 * 72 * 128 * 2, 2048),
        ("OPT-175B", 2 * 96 * 96 * 128 * 2, 2048),
        ("LLaMA-2-7B", 512 * 1024, 4096),
        ("LLaMA-2-13B", 800 * 1024, 4096),
        ("Llama-3-8B", 128 * 1024, 8192),
        ("Llama-3-70B", 320 * 1024, 8192),
        ("Mistral-7B", 128 * 1024, 32768),
        ("Qwen2.5-7B", 56 * 1024, 131072),
        ("Qwen2.5-72B", 320 * 1024, 131072),
    ],
)
def test_model_presets(name: str, kv_bytes_per_token: int, max_context: int) -> None:
    spec = model_preset(name.lower())
    assert spec.name == name
    assert spec.kv_bytes_per_token == kv_bytes_per_token
    assert spec.max_context_tokens == max_context
    assert spec.num_attention_heads % spec.num_kv_heads == 0


def test_every_preset_is_listed_and_names_are_case_insensitive() -> None:
    # issue 14 added 9 models, B200, MI300X; issue 21 the 4 held-out LambdaLabsML models and the H100 PCIe
    assert len(MODEL_PRESETS) == 23 and len(GPU_PRESETS) == 8
    assert model_preset("meta-llama/Meta-Llama-3-8B").name == "Llama-3-8B"
    assert gpu_preset("h100").name == "H100-80GB"
    assert gpu_preset("a100-80gb").memory_bytes == 80 * GiB
    assert Scenario(model="qwen2.5-7b", gpu="l4", max_model_len=8192).model == "Qwen2.5-7B"
    with pytest.raises(ValueError, match="unknown gpu preset 'TPU-v5e'"):
        gpu_preset("TPU-v5e")


# --- KV budget ------------------------------------------------------------------------------------------


def test_budget_from_utilization_is_memory_minus_weights_minus_reserve() -> None:
    scenario = Scenario(model="LLaMA-2-7B", gpu="A100-80GB", activation_reserve="1GiB", max_model_len=4096)
    budget = math.floor(80 * GiB * 0.9) - 6_738_415_616 * 2 - GiB
    assert scenario.kv_budget_bytes_per_gpu() == budget
    assert scenario.kv_capacity_tokens() == budget // (512 * 1024)
    estimated = Scenario(model="LLaMA-2-7B", gpu="A100-80GB", max_num_batched_tokens=8192)
    # reserve: 512 MiB + 8192 x 4096 x 2 x 10
    assert estimated.activation_reserve_bytes_per_gpu() == 512 * MiB + 8192 * 4096 * 2 * 10


def test_tensor_parallelism_splits_kv_heads_and_keeps_group_capacity() -> None:
    scenario = Scenario(model="Llama-3-70B", gpu="H100-80GB", tensor_parallel_size=4, activation_reserve=0)
    per_gpu_bytes = 2 * 80 * 2 * 128 * 2  # 8 KV heads / 4 ranks = 2 per GPU
    assert scenario.kv_bytes_per_token_per_gpu() == per_gpu_bytes
    assert scenario.kv_bytes_per_token() == 320 * 1024
    budget = math.floor(81559 * MiB * 0.9) - math.ceil(70_553_706_496 * 2 / 4)
    assert scenario.kv_capacity_tokens() == budget // per_gpu_bytes
    # More ranks than KV heads: heads are replicated (as in vLLM), one per GPU.
    replicated = Scenario(model="Llama-3-8B", gpu="L4", tensor_parallel_size=16)
    assert replicated.kv_heads_per_gpu() == 1
    assert replicated.kv_bytes_per_token() == 2 * 32 * 1 * 128 * 2 * 16


@given(
    memory_gib=st.integers(8, 200),
    utilization=st.floats(0.5, 1.0),
    layers=st.integers(1, 96),
    kv_heads=st.sampled_from([1, 2, 4, 8, 16, 32]),
    head_dim=st.sampled_from([64, 128, 256]),
)
def test_capacity_is_the_floor_of_budget_over_bytes_per_token(
    memory_gib: int, utilization: float, layers: int, kv_heads: int, head_dim: int
) -> None:
    model = {
        "num_layers": layers,
        "num_attention_heads": 32,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_size": 4096,
        "num_params": 10**9,
        "max_context_tokens": 64,
    }
    gpu = {
        "memory_bytes": f"{memory_gib}GiB",
        "hbm_bandwidth_bytes_per_s": 1e12,
        "peak_flops": 1e14,
        "pcie_bandwidth_bytes_per_s": 3e10,
    }
    scenario = Scenario(model=model, gpu=gpu, gpu_memory_utilization=utilization, allocator="contiguous")
    budget, per_token = scenario.kv_budget_bytes_per_gpu(), scenario.kv_bytes_per_token_per_gpu()
    capacity = scenario.kv_capacity_tokens()
    assert capacity * per_token <= budget < (capacity + 1) * per_token
    assert capacity >= scenario.max_model_len


# --- validation: one line naming the field --------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"block_size": 0}, "field 'block_size': must be >= 1 (got 0)"),
        ({"gpu_memory_utilization": 1.5}, "field 'gpu_memory_utilization': must be <= 1"),
        ({"max_num_seqs": "many"}, "field 'max_num_seqs': must be an integer"),
        (
            {"preemption_mode": "pause"},
            "field 'preemption_mode': must be one of 'recompute', 'swap' or 'auto'",
        ),
        ({"model": "GPT-5"}, "field 'model': unknown model preset 'GPT-5'"),
        ({"gpu": "TPU"}, "field 'gpu': unknown gpu preset"),
        ({"kv_cache_memory": "12 gigs"}, "field 'kv_cache_memory'"),
        ({"allocator": "pagd"}, "field 'allocator': unknown allocator 'pagd'"),
        ({"allocator": "request_limit:orcle"}, "unexpected 'orcle'"),
        ({"allocator": {"name": "paged", "params": {"block_size": 8}}}, "field 'allocator.params'"),
        ({"workload": {"request_rate": 0}}, "field 'workload.request_rate': must be > 0"),
        ({"workload": {"rate": 3}}, "field 'workload.rate': unknown field (valid: source, request_rate"),
        ({"max_num_batched_tokens": 100}, "field 'max_num_batched_tokens': must be >= max_model_len=2048"),
        ({"duration_s": "soon"}, "field 'duration_s'"),
        ({"colour": "blue"}, "field 'colour': unknown field"),
    ],
)
def test_validation_errors_are_one_line_naming_the_field(overrides: dict, expected: str) -> None:
    data = default_scenario().to_dict() | overrides
    with pytest.raises(ScenarioError) as info:
        Scenario(**data)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"model": "OPT-175B"}, "field 'tensor_parallel_size': OPT-175B's weights need 325.23 GiB per GPU"),
        ({"kv_cache_memory": "30GiB"}, "field 'kv_cache_memory': must be <= 16.06 GiB"),
        ({"kv_cache_memory": "1GiB", "allocator": "contiguous"}, "less than one max_model_len=2048 sequence"),
        ({"kv_cache_memory": "100KiB", "block_size": 256}, "less than one block of block_size=256"),
        ({"max_model_len": 4096}, "field 'max_model_len': must be <= 2048, OPT-13B's max context"),
        (
            {"tensor_parallel_size": 3},
            "field 'tensor_parallel_size': must divide OPT-13B's num_attention_heads=40",
        ),
        ({"model": "Qwen2.5-7B", "tensor_parallel_size": 2, "gpu": "L4"}, None),
        ({"model": "Qwen2.5-7B", "tensor_parallel_size": 7}, "must divide Qwen2.5-7B's num_kv_heads=4"),
        (
            {"allocator": "virtual:64KiB"},
            "field 'allocator.params.page_bytes': must be a positive multiple of 10240",
        ),
    ],
)
def test_impossible_scenarios_are_refused(overrides: dict, expected: str | None) -> None:
    base = default_scenario().with_overrides
    if expected is None:
        base(**overrides)  # possible: must not raise
        return
    with pytest.raises(ScenarioError) as info:
        base(**overrides)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_no_memory_left_for_kv_names_utilization() -> None:
    with pytest.raises(
        ScenarioError, match="field 'gpu_memory_utilization': no memory left for the KV cache"
    ):
        Scenario(model="OPT-13B", gpu="A100-40GB", gpu_memory_utilization=0.6)


def test_long_max_model_len_needs_the_explicit_override() -> None:
    scenario = Scenario(max_model_len=4096, allow_long_max_model_len=True)
    assert scenario.max_model_len == 4096


# --- derived defaults, overrides, round trips -----------------------------------------------------------


def test_default_scenario_is_the_vllm_paper_setting() -> None:
    scenario = default_scenario()
    assert (scenario.model, scenario.gpu, scenario.max_model_len) == ("OPT-13B", "A100-40GB", 2048)
    assert scenario.kv_cache_memory == 12 * GiB
    assert (scenario.workload.source, scenario.workload.request_rate) == ("sharegpt-paper", 2.0)
    # vllm-v0's budget (vllm/config.py SchedulerConfig, v0.2): max(max_model_len, 2048) = 2048
    assert scenario.engine == "vllm-v0"
    assert scenario.num_prompts == 1000 and scenario.max_num_batched_tokens == 2048


def test_derived_defaults_follow_overrides() -> None:
    scenario = Scenario()
    assert scenario.max_model_len == 2048 and scenario.num_prompts == 1000
    llama = scenario.with_overrides(model="llama-3-8b")
    assert llama.max_model_len == 8192 and llama.max_num_batched_tokens == 8192
    assert Scenario(duration_s="10min").num_prompts is None
    assert Scenario(max_num_seqs=10_000).max_num_batched_tokens == 10_000


def test_with_overrides_takes_dotted_keys_and_none_means_leave_it() -> None:
    scenario = default_scenario()
    changed = scenario.with_overrides(
        **{"workload.request_rate": 4, "allocator": "request_limit:pow2:best_fit", "block_size": None}
    )
    assert changed.workload.request_rate == 4.0 and changed.workload.source == "sharegpt-paper"
    assert changed.allocator.params == {"reservation": "pow2", "placement": "best_fit"}
    assert changed.block_size == 16
    assert scenario.workload.request_rate == 2.0  # the original is untouched
    placed = changed.with_overrides(**{"allocator.params.placement": "buddy"})
    assert placed.allocator.label == "request_limit:pow2:buddy"
    halved = scenario.with_overrides(**{"model.num_layers": 20})
    assert halved.model_spec().name == "OPT-13B-custom" and halved.kv_bytes_per_token() == 819_200 // 2
    with pytest.raises(ScenarioError, match="unknown scenario field 'workload.rate'"):
        scenario.with_overrides(**{"workload.rate": 4})


def test_scenario_fields_and_check_field() -> None:
    fields = scenario_fields()
    for key in (
        "block_size",
        "workload.request_rate",
        "allocator.name",
        "model.num_layers",
        "gpu.peak_flops",
    ):
        assert key in fields
        check_field(key)
    check_field("allocator.params.placement")
    check_field("workload.params.system_prompt_tokens")
    for bad in ("blocksize", "workload.rate", "allocator.params", "allocator.params."):
        if bad in fields:
            continue
        with pytest.raises(ScenarioError, match="valid:"):
            check_field(bad)


def test_to_dict_is_json_safe_and_round_trips() -> None:
    scenario = default_scenario().with_overrides(**{"workload.request_rate": math.inf}, model="llama-2-7b")
    data = json.loads(json.dumps(scenario.to_dict(), allow_nan=False))
    assert data["workload"]["request_rate"] == "inf"
    assert Scenario.from_dict(data) == scenario


def test_toml_round_trip(tmp_path: Path) -> None:
    custom_gpu = {
        "name": "my-gpu",
        "memory_bytes": 48 * GiB,
        "hbm_bandwidth_bytes_per_s": 9.6e11,
        "peak_flops": 1.8e14,
        "pcie_bandwidth_bytes_per_s": 3.2e10,
    }
    scenario = default_scenario().with_overrides(
        gpu=custom_gpu,
        allocator="request_limit:oracle:buddy",
        calibration="profile.json",
        **{"workload.params.system_prompt_tokens": 900, "workload.arrival": "gamma(cv=2)"},
    )
    path = tmp_path / "scenario.toml"
    path.write_text(scenario.to_toml())
    assert Scenario.from_toml(path) == scenario
    assert Scenario.from_toml(path, block_size=32, **{"workload.request_rate": None}).block_size == 32


def test_toml_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n")
    path = tmp_path / "s.toml"
    path.write_text('workload = "trace.csv"\n')
    assert Scenario.from_toml(path).workload.source == str((tmp_path / "trace.csv").resolve())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('model = "opt-13b\n', "invalid TOML"),
        ("block_size = 0\n", "field 'block_size': must be >= 1 (got 0)"),
        ("[workload]\nrate = 3\n", "field 'workload.rate': unknown field"),
        ('kv_cache_memory = "lots"\n', "field 'kv_cache_memory'"),
        ("block_size = 16\nblock_size = 32\n", "invalid TOML"),
    ],
)
def test_bad_toml_is_one_line_naming_the_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        Scenario.from_toml(path)
    message = str(info.value)
    assert message.startswith(str(path)) and expected in message and "\n" not in message


def test_missing_toml_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="config file not found"):
        Scenario.from_toml(tmp_path / "nope.toml")


# --- what other packages are called with ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "params"),
    [
        ("paged", "paged", {}),
        ("contiguous", "contiguous", {}),
        ("contiguous:buddy", "contiguous", {"placement": "buddy"}),
        ("request_limit:oracle", "request_limit", {"reservation": "oracle"}),
        ("request-limit:pow2:best_fit", "request_limit", {"reservation": "pow2", "placement": "best_fit"}),
        ("virtual:40KiB", "virtual", {"page_bytes": 40960}),
    ],
)
def test_allocator_strings(text: str, name: str, params: dict) -> None:
    assert parse_allocator(text) == {"name": name, "params": params}


@pytest.mark.parametrize(
    "allocator",
    ["paged", "contiguous", "contiguous:buddy", "request_limit:oracle", "request_limit:pow2", "virtual"],
)
def test_allocator_params_build_a_real_allocator(allocator: str) -> None:
    from allocators import registry

    scenario = default_scenario().with_overrides(allocator=allocator, enable_prefix_caching=False)
    params = scenario.allocator_params()
    assert params["capacity_tokens"] == 15_728
    built = registry.make_allocator(scenario.allocator.name, **params)
    assert built.capacity_tokens == 15_728
    if allocator == "virtual":
        assert params["bytes_per_token_per_layer"] == 40 * 128 * 2
        assert params["page_bytes"] == (2 * MiB // 10240) * 10240


def test_load_workload_uses_the_scenario_seed_and_size() -> None:
    scenario = default_scenario().with_overrides(num_prompts=50, seed=7)
    first, second = scenario.load_workload(), scenario.load_workload()
    assert len(first) == 50 and first.equals(second)
    assert not first.equals(scenario.with_overrides(seed=8).load_workload())
