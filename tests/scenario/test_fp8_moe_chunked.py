"""Issue 21: models users have today: FP8 weights from quantization_config, MoE shared experts,
Llama 4's chunked local attention as a window-like layer type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.errors import ScenarioError
from sim.scenario.hf_config import model_spec_from_file
from sim.scenario.presets import model_preset
from sim.scenario.quantization import quantized_model
from sim.scenario.scenario import Scenario

# meta-llama/Llama-4-Scout-17B-16E-Instruct text_config (the fields kvsim reads).
SCOUT_TEXT = {
    "model_type": "llama4_text",
    "hidden_size": 5120,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_local_experts": 16,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 202048,
    "max_position_embeddings": 10485760,
    "interleave_moe_layer_step": 1,
    "attention_chunk_size": 8192,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic: compressed-tensors, FP8 weights.
FP8_DYNAMIC = {
    "quant_method": "compressed-tensors",
    "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}},
}


def write_config(tmp_path: Path, data: dict, name: str = "config.json") -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def test_scout_counts_its_shared_expert(tmp_path: Path) -> None:
    """Model card: 17 B active, 109 B total (with the ~1 B vision tower, which kvsim does not count)."""
    spec = model_spec_from_file(write_config(tmp_path, {"model_type": "llama4", "text_config": SCOUT_TEXT}))
    assert spec.num_params == pytest.approx(107.77e9, rel=1e-3)
    assert spec.active_params == pytest.approx(17.17e9, rel=1e-3)


def test_fp8_quantization_config_halves_linear_weights_and_fits_tp2(tmp_path: Path) -> None:
    bf16 = model_spec_from_file(write_config(tmp_path, {"model_type": "llama4", "text_config": SCOUT_TEXT}))
    data = {"model_type": "llama4", "quantization_config": FP8_DYNAMIC, "text_config": SCOUT_TEXT}
    fp8 = model_spec_from_file(write_config(tmp_path, data, "fp8.json"))
    embeddings = 202048 * 5120 * 2
    assert fp8.weight_bytes == pytest.approx((bf16.num_params - embeddings) * 1 + embeddings * 2, rel=1e-3)
    with pytest.raises(ValueError, match="weights need"):  # BF16 does not fit two H100s
        Scenario(model=bf16, gpu="H100-80GB", tensor_parallel_size=2, max_model_len=8192)
    scenario = Scenario(model=fp8, gpu="H100-80GB", tensor_parallel_size=2, max_model_len=8192)
    assert scenario.kv_capacity_tokens() > 0


def test_unmodelled_quantization_is_one_line(tmp_path: Path) -> None:
    data = {**SCOUT_TEXT, "quantization_config": {"quant_method": "awq", "bits": 4}}
    with pytest.raises(ScenarioError, match="quantization_config.quant_method.*'awq' is not modelled"):
        model_spec_from_file(write_config(tmp_path, data))


@pytest.mark.parametrize(
    ("groups", "field"),
    [([{"weights": {"num_bits": 8}}], "config_groups'"), ({"g": {"weights": "fp8"}}, "weights'")],
)
def test_malformed_compressed_tensors_config_is_one_line(tmp_path: Path, groups: object, field: str) -> None:
    """A list of groups or a string `weights` used to raise AttributeError (a traceback)."""
    config = {"quant_method": "compressed-tensors", "config_groups": groups}
    data = {**SCOUT_TEXT, "quantization_config": config}
    with pytest.raises(ScenarioError, match=field):
        model_spec_from_file(write_config(tmp_path, data))


def test_chunked_local_attention_is_a_window_layer_type(tmp_path: Path) -> None:
    """RoPE layers (3 of every 4) attend within their 8192-token chunk; NoPE layers globally."""
    spec = model_spec_from_file(write_config(tmp_path, SCOUT_TEXT))
    assert spec.num_window_layers == 36 and spec.sliding_window_tokens == 8192
    explicit = {**SCOUT_TEXT, "no_rope_layers": [1, 0] * 24}
    assert model_spec_from_file(write_config(tmp_path, explicit, "x.json")).num_window_layers == 24
    with pytest.raises(ScenarioError, match="field 'no_rope_layers'"):
        model_spec_from_file(write_config(tmp_path, {**SCOUT_TEXT, "no_rope_layers": [1, 2]}, "y.json"))


def test_quantization_flag_on_a_preset() -> None:
    """--quantization fp8 on Llama-3.1-70B: linear layers 1 byte, embeddings and norms 2 bytes."""
    model = model_preset("Llama-3.1-70B")
    fp8 = quantized_model(model, "fp8")
    kept = 128256 * 8192 * 2 + (2 * 80 + 1) * 8192
    assert fp8.weight_bytes == (model.num_params - kept) + 2 * kept
    assert quantized_model(model, None) is model
    with pytest.raises(ScenarioError, match="argument 'quantization'"):
        quantized_model(model, "int3")


def test_quantization_flag_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--quantization fp8` quantizes --model's weights before the memory check; bad values are one line."""
    from sim.cli import main
    from sim.cli.scenario_flags import SCENARIO_FLAGS, scenario_from_flags

    flags = {flag.param: None for flag in SCENARIO_FLAGS}
    flags.update(model="Llama-3.1-70B", gpu="H100-80GB", tensor_parallel_size=2, max_model_len=8192)
    bf16 = scenario_from_flags(flags)
    fp8 = scenario_from_flags({**flags, "quantization": "fp8"})
    assert fp8.weight_bytes_per_gpu() < 0.52 * bf16.weight_bytes_per_gpu()
    assert fp8.kv_capacity_tokens() > 5 * bf16.kv_capacity_tokens()
    with pytest.raises(SystemExit) as info:
        main(["run", "--model", "Llama-3.1-70B", "--quantization", "int2", "--output", str(tmp_path / "r")])
    assert info.value.code == 2
    assert (
        capsys.readouterr().err.strip() == "error: --quantization: unknown method 'int2' (known: fp8, none)"
    )
