"""Modern models (issue 14): KV bytes per token by hand, KV dtype, MLA under TP, HF config.json reading.

Config files are written by the tests; the hand computations are the issue's "Done when" figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.errors import ScenarioError
from sim.scenario.hf_config import count_params, model_spec_from_file, window_layer_flags
from sim.scenario.model_configs import MODEL_CONFIGS
from sim.scenario.presets import GPU_PRESETS, MODEL_PRESETS
from sim.scenario.scenario import Scenario

GEMMA_STYLE = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
    "sliding_window": 256,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def write_config(tmp_path: Path, data: dict, name: str = "config.json") -> Path:
    path = tmp_path / "tiny-model" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_deepseek_v3_bf16_mla_bytes_per_token() -> None:
    scenario = Scenario(model="DeepSeek-V3", gpu="H200-141GB", tensor_parallel_size=8)
    assert MODEL_PRESETS["DeepSeek-V3"].kv_bytes_per_token == 61 * 576 * 2 == 70_272
    # vLLM replicates the MLA latent on every rank: per GPU the same 70,272, the TP group 8x that
    assert scenario.kv_bytes_per_token_per_gpu() == 70_272
    assert scenario.kv_bytes_per_token() == 8 * 70_272


def test_llama_31_70b_fp8_bytes_per_token() -> None:
    scenario = Scenario(model="Llama-3.1-70B", gpu="H100-80GB", tensor_parallel_size=4, kv_cache_dtype="fp8")
    assert scenario.kv_bytes_per_token() == 80 * 8 * 128 * 2 * 1 == 163_840
    assert scenario.kv_bytes_per_token_per_gpu() == 163_840 // 4
    auto = scenario.with_overrides(kv_cache_dtype="auto")
    assert auto.kv_bytes_per_token() == 2 * 163_840
    assert scenario.kv_capacity_tokens() >= 2 * auto.kv_capacity_tokens() - 1  # fp8 doubles the slots


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_every_fp8_name_is_one_byte(dtype: str) -> None:
    assert Scenario(model="Llama-3.1-8B", gpu="H100", kv_cache_dtype=dtype).kv_dtype_bytes() == 1


def test_unknown_kv_dtype_is_one_line() -> None:
    with pytest.raises(ScenarioError, match="kv_cache_dtype"):
        Scenario(model="Llama-3.1-8B", gpu="H100", kv_cache_dtype="int4")


def test_gemma_style_config_windowed_and_global_layers(tmp_path: Path) -> None:
    spec = model_spec_from_file(write_config(tmp_path, GEMMA_STYLE))
    assert spec.name == "tiny-model"
    # every 6th layer global: layers 5 and 11 -> 2 global, 10 windowed
    assert (spec.num_window_layers, spec.num_full_layers, spec.sliding_window_tokens) == (10, 2, 256)
    per_layer = 2 * 4 * 64 * 2
    assert spec.kv_bytes_per_token_per_layer() == per_layer == 1024
    assert spec.num_window_layers * per_layer == 10_240  # window layers, at their full per-token size
    assert spec.num_full_layers * per_layer == 2_048
    assert spec.kv_bytes_per_token == 12_288


def test_layer_types_and_mistral_style_windows() -> None:
    alternating = {"sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 3}
    assert window_layer_flags(alternating, 6) == [True, False] * 3
    assert window_layer_flags({"sliding_window": 4096}, 4) == [True] * 4
    assert window_layer_flags({"sliding_window": 4096, "use_sliding_window": False}, 4) == [False] * 4
    assert window_layer_flags({"sliding_window": None}, 4) == [False] * 4


def test_param_counts_match_the_model_cards() -> None:
    # model cards: Llama-3.1-8B 8.03 B; Qwen3-235B-A22B 235 B / 22 B active; DeepSeek-V3 671 B / 37 B
    # active; gpt-oss-120b 116.8 B total; Gemma-3-27B ~27 B (text decoder)
    assert MODEL_PRESETS["Llama-3.1-8B"].num_params == 8_030_261_248
    qwen = MODEL_PRESETS["Qwen3-235B-A22B"]
    assert round(qwen.num_params / 1e9) == 235 and round(qwen.compute_params / 1e9) == 22
    deepseek = MODEL_PRESETS["DeepSeek-V3"]
    assert round(deepseek.num_params / 1e9) == 671 and round(deepseek.compute_params / 1e9) in (37, 38)
    assert round(MODEL_PRESETS["gpt-oss-120b"].num_params / 1e8) == 1168
    assert round(MODEL_PRESETS["Gemma-3-27B"].num_params / 1e9) == 27
    total, active = count_params(MODEL_CONFIGS["Llama-3.1-70B"])
    assert total == active == MODEL_PRESETS["Llama-3-70B"].num_params


def test_modern_presets_have_their_window_layouts() -> None:
    gemma, oss, mistral = (MODEL_PRESETS[n] for n in ("Gemma-3-27B", "gpt-oss-120b", "Mistral-7B-v0.1"))
    assert (gemma.num_window_layers, gemma.num_full_layers, gemma.sliding_window_tokens) == (52, 10, 1024)
    assert (oss.num_window_layers, oss.num_full_layers, oss.sliding_window_tokens) == (18, 18, 128)
    assert (mistral.num_window_layers, mistral.sliding_window_tokens) == (32, 4096)
    assert oss.num_experts == 128 and oss.experts_per_token == 4
    assert {"B200", "MI300X"} <= set(GPU_PRESETS)


def test_moe_cost_model_uses_active_params() -> None:
    from sim.cost.model import CostModel

    scenario = Scenario(model="Qwen3-235B-A22B", gpu="H200", tensor_parallel_size=8)
    cost = CostModel.from_scenario(scenario)
    model = scenario.model_spec()
    vocab_params = 2 * model.vocab_size * model.hidden_size  # embedding lookup + LM head per sample
    assert cost.flops_per_token == pytest.approx(2.0 * (model.active_params - vocab_params) / 8)
    assert scenario.weight_bytes_per_gpu() == -(-model.num_params * 2 // 8)  # memory: all experts


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"num_attention_heads": "eight"}, "num_attention_heads"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"torch_dtype": "int3"}, "torch_dtype"),
        ({"layer_types": ["sliding_attention"]}, "layer_types"),
        ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ],
)
def test_unreadable_config_names_the_field(tmp_path: Path, change: dict, field: str) -> None:
    data = {k: v for k, v in {**GEMMA_STYLE, **change}.items() if v is not None}
    path = write_config(tmp_path, data)
    with pytest.raises(ScenarioError, match=f"field '{field}'") as info:
        Scenario(model=str(path), gpu="H100")
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_cli_bad_config_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, {"hidden_size": 64})
    code, output = run_cli(["presets", "--model", str(path)], capsys)
    assert code == 2
    assert "field 'num_hidden_layers'" in output and "Traceback" not in output
    assert len(output.strip().splitlines()) == 1
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    code, output = run_cli(["presets", "--model", str(broken)], capsys)
    assert code == 2 and "invalid JSON" in output


def test_cli_presets_prints_kv_bytes_per_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = run_cli(["presets", "--model", "DeepSeek-V3"], capsys)
    assert code == 0, output
    assert "KV bytes per token: 70,272" in output
    code, output = run_cli(["presets", "--model", "Llama-3.1-70B", "--kv-cache-dtype", "fp8"], capsys)
    assert "KV bytes per token: 163,840" in output
    code, output = run_cli(["presets", "--model", str(write_config(tmp_path, GEMMA_STYLE))], capsys)
    assert code == 0, output
    assert "KV bytes per token: 12,288" in output
    assert "10 of 12 layers" in output
    code, output = run_cli(["presets", "--model", "Llama-3.1-70B", "--kv-cache-dtype", "int4"], capsys)
    assert code == 2 and "--kv-cache-dtype" in output


def test_config_model_runs_end_to_end(tmp_path: Path) -> None:
    from sim.api import simulate

    path = write_config(tmp_path, GEMMA_STYLE)
    scenario = Scenario(
        model=str(path), gpu="L4", kv_cache_memory="64MiB", allocator="hybrid", num_prompts=40, seed=3
    )
    run = simulate(scenario)
    assert run.metrics["completed"] == 40
    assert run.metrics["kv_slots_per_token"] == 12
    assert Scenario.from_dict(scenario.to_dict()).model_spec() == scenario.model_spec()


def test_cli_run_with_kv_cache_dtype_and_hybrid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["run", "--model", "Gemma-3-27B", "--gpu", "H200", "--kv-cache-memory", "4GiB", "--quiet"]
    base += ["--max-model-len", "8192", "--num-prompts", "20", "--allocator", "hybrid"]
    code, output = run_cli([*base, "--kv-cache-dtype", "fp8", "-o", str(tmp_path / "fp8")], capsys)
    assert code == 0, output
    metrics = json.loads((tmp_path / "fp8" / "summary.json").read_text())["metrics"]
    assert metrics["kv_bytes_per_token"] == 507_904 // 2
    assert metrics["kv_capacity_tokens"] == 4 * 1024**3 // (507_904 // 2)
    assert metrics["kv_slots_per_token"] == 62 and "kv_out_of_window_pct" in metrics
    assert "KV out of window (%)" in output
    code, output = run_cli(
        ["run", "--model", "Llama-3.1-8B", "--gpu", "H100", "--allocator", "hybrid", "--quiet"]
        + ["--num-prompts", "5", "-o", str(tmp_path / "full")],
        capsys,
    )
    assert code == 2 and "no sliding-window layers" in output and len(output.strip().splitlines()) == 1


def test_held_out_lambda_presets_match_the_model_cards() -> None:
    """Issue 21: the LambdaLabsML models kept out of ../shared/bench. Model cards: Mistral NeMo 12 B,
    Mistral Large 2 123 B, Mixtral 8x7B 46.7 B total / 12.9 B active, Mixtral 8x22B 141 B / 39 B."""
    nemo, large = MODEL_PRESETS["Mistral-Nemo"], MODEL_PRESETS["Mistral-Large-2"]
    assert round(nemo.num_params / 1e9) == 12 and nemo.head_dim == 128  # not hidden / heads = 160
    assert round(large.num_params / 1e9) == 123 and large.active_params is None
    small, big = MODEL_PRESETS["Mixtral-8x7B"], MODEL_PRESETS["Mixtral-8x22B"]
    assert round(small.num_params / 1e8) == 467 and round(small.compute_params / 1e8) == 129
    assert round(big.num_params / 1e9) == 141 and round(big.compute_params / 1e9) == 39
    assert (small.num_experts, small.experts_per_token, small.sliding_window_tokens) == (8, 2, None)
    # KV bytes per token (bf16): 2 x layers x 8 KV heads x 128 x 2
    assert [MODEL_PRESETS[n].kv_bytes_per_token for n in ("Mistral-Nemo", "Mixtral-8x22B")] == [
        2 * 40 * 8 * 128 * 2,
        2 * 56 * 8 * 128 * 2,
    ]
