"""Issue 23, items 2-3: a hostile config.json is one line naming the field; counting is O(1) in layers.

The fuzz test replaces fields of real Hub configs (model_configs.py) with values of every JSON type,
size and nesting, and runs `kvsim presets --model FILE` on the result: exit 0, or exit 2 with one
line; never a traceback. Its example count follows the repo's hypothesis profile (dev 50, ci 300).
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.cli import main
from sim.errors import ScenarioError
from sim.files import MAX_CONFIG_BYTES
from sim.scenario import hf_config
from sim.scenario.config_checks import FIELD_RULES, MAX_LAYERS, MAX_TOKENS
from sim.scenario.hf_config import count_params, model_spec_from_file, spec_from_config
from sim.scenario.model_configs import MODEL_CONFIGS


def cli(args: list[str]) -> tuple[int, str]:
    """`kvsim ARGS` in-process: (exit code, stderr)."""
    err = io.StringIO()
    code = 0
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            main(args)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue()


def assert_clean(code: int, err: str) -> None:
    assert "Traceback" not in err, err
    if code == 0:
        return
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err


# ------------------------------------------------------------------- the issue's cases, one line each

QWEN_MOE = MODEL_CONFIGS["Qwen3-235B-A22B"]
ISSUE_CASES = [
    ({"torch_dtype": ["bfloat16"]}, "field 'torch_dtype': must be a string (got ['bfloat16'])"),
    ({"model_type": 5}, "field 'model_type': must be a string (got 5)"),
    ({"mlp_only_layers": 5}, "field 'mlp_only_layers': must be a list of integers (got 5)"),
    (
        {"sliding_window": 10**30, "use_sliding_window": True},
        f"field 'sliding_window': must be from 1 to {MAX_TOKENS:,} (got 1000000000000000000000000000000)",
    ),
    (
        {"num_hidden_layers": 1_000_000_000},
        f"field 'num_hidden_layers': must be from 1 to {MAX_LAYERS:,} (got 1000000000)",
    ),
    ({"hidden_size": 4096.0}, "field 'hidden_size': must be an integer from 1 to 1,048,576 (got 4096.0)"),
    ({"tie_word_embeddings": "yes"}, "field 'tie_word_embeddings': must be true or false (got 'yes')"),
    ({"text_config": [1]}, "field 'text_config': must be a JSON object (got [1])"),
    ({"num_experts_per_tok": 500}, "field 'num_experts_per_tok': must be at most the 128 routed experts"),
]


@pytest.mark.parametrize(("change", "expected"), ISSUE_CASES)
def test_malformed_config_json_is_one_line_naming_the_field(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN_MOE, **change}), encoding="utf-8")
    for args in (["presets", "--model", str(path)], ["run", "--model", str(path), "--num-prompts", "3"]):
        code, err = cli([*args, "--output", str(tmp_path / "out")] if args[0] == "run" else args)
        assert_clean(code, err)
        assert code == 2 and f"{path}: {expected}" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text",
    ["[" * 200_000 + "]" * 200_000, '{"a":' * 100_000 + "1" + "}" * 100_000],
    ids=["200k nested lists", "100k nested objects"],
)
def test_deeply_nested_config_json_is_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    code, err = cli(["presets", "--model", str(path)])
    assert code == 2 and err == f"error: {path}: invalid JSON (nested too deeply)\n"


def test_a_sweep_base_model_gets_the_same_check(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**QWEN_MOE, "model_type": 5}), encoding="utf-8")
    spec = tmp_path / "s.toml"
    spec.write_text(f'[base]\nmodel = "{config}"\n[grid]\nnum_prompts = [3]\n', encoding="utf-8")
    code, err = cli(["sweep", str(spec), "--output", str(tmp_path / "out"), "--no-progress"])
    assert code == 2 and "field 'model_type': must be a string (got 5)" in err and err.count("\n") == 1, err


def test_a_config_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it for reading used to wait for a writer forever
    code, err = cli(["presets", "--model", str(fifo)])
    assert code == 2 and err == f"error: {fifo}: model config file must be a regular file (this is not)\n"
    for args in (["run", "--config", "/dev/zero"], ["run", "--config", str(fifo)], ["sweep", str(fifo)]):
        code, err = cli(args)  # /dev/zero used to be read until MemoryError
        assert code == 2 and err.count("\n") == 1 and "must be a regular file (this is not)" in err, err


def test_a_huge_config_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    code, err = cli(["run", "--config", str(path)])
    assert code == 2 and err == f"error: {path}: config file is larger than 16 MiB (not a config file?)\n"


# ---------------------------------------------------------------------------------------- fuzzing

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 10**30, MAX_LAYERS + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["bfloat16", "float8_e4m3fn", "gemma2", "qwen3_moe", "gpt_oss", "sliding_attention"]),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.sampled_from(sorted(FIELD_RULES)), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.sampled_from(sorted(FIELD_RULES) + ["quantization_config", "architectures"])


@given(
    base=st.sampled_from(sorted(MODEL_CONFIGS)),
    changes=st.dictionaries(FIELDS, JSON_VALUES, min_size=1, max_size=4),
    drop=st.lists(FIELDS, max_size=2),
    nesting=st.one_of(st.none(), st.integers(min_value=1, max_value=300_000)),
)
def test_fuzzed_config_json_never_gives_a_traceback(
    base: str, changes: dict[str, Any], drop: list[str], nesting: int | None
) -> None:
    config = {**MODEL_CONFIGS[base], **changes}
    for name in drop:
        config.pop(name, None)
    text = json.dumps(config, allow_nan=True)
    if nesting is not None:  # a deeply nested value under a field kvsim does not read
        text = text[:-1] + ', "extra": ' + "[" * nesting + "]" * nesting + "}"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(text, encoding="utf-8")
        code, err = cli(["presets", "--model", str(path)])
    assert_clean(code, err)


@given(changes=st.dictionaries(FIELDS, JSON_VALUES, max_size=3))
def test_fuzzed_config_either_passes_the_checks_or_names_a_field(changes: dict[str, Any]) -> None:
    """Every value the checks let through gives a spec with finite, positive sizes."""
    config = {**MODEL_CONFIGS["DeepSeek-V3"], **changes}
    try:
        spec = spec_from_config(config, where="fuzz")
    except ScenarioError as exc:
        assert str(exc).startswith("fuzz") and "\n" not in str(exc)
        return
    assert spec.num_params >= 1 and spec.num_layers >= 1
    assert math.isfinite(float(spec.num_params)) and spec.max_context_tokens <= MAX_TOKENS


# --------------------------------------------------------------------------- item 3: O(1) in layers


def _count_by_loop(data: dict[str, Any]) -> tuple[int, int]:
    """The per-layer loop `count_params` ran before issue 23 (the reference for its closed form)."""
    f = hf_config._Fields(data, "ref")
    hidden, heads = f.int("hidden_size"), f.int("num_attention_heads")
    kv_heads = f.int("num_key_value_heads", default=heads)
    head_dim = f.int("head_dim", default=None) or hidden // heads
    embed = f.int("vocab_size") * hidden * (1 if f.bool("tie_word_embeddings", False) else 2)
    attention = hf_config._attention_params(f, hidden, heads, kv_heads, head_dim)
    norms = (4 if data.get("model_type", "").startswith("gemma") else 2) * hidden
    total = active = embed + hidden
    for layer in range(f.int("num_hidden_layers")):
        mlp_all, mlp_active = hf_config._mlp_params(f, hidden, layer)
        total += attention + mlp_all + norms
        active += attention + mlp_active + norms
    return total, active


@given(
    base=st.sampled_from(sorted(MODEL_CONFIGS)),
    layers=st.integers(min_value=1, max_value=40),
    experts=st.sampled_from([0, 4, 16]),
    dense_first=st.integers(min_value=0, max_value=45),
    step=st.integers(min_value=1, max_value=5),
    mlp_only=st.lists(st.integers(min_value=0, max_value=45), max_size=8),
)
def test_closed_form_parameter_count_equals_the_per_layer_loop(
    base: str, layers: int, experts: int, dense_first: int, step: int, mlp_only: list[int]
) -> None:
    config = {**MODEL_CONFIGS[base], "num_hidden_layers": layers}
    config.pop("layer_types", None)
    for name in ("n_routed_experts", "num_local_experts", "num_experts"):
        config.pop(name, None)
    config.update(
        num_experts=experts,
        num_experts_per_tok=min(2, experts) or None,
        first_k_dense_replace=dense_first,
        decoder_sparse_step=step,
        mlp_only_layers=mlp_only,
        intermediate_size=config.get("intermediate_size", 1024),
    )
    assert count_params(config) == _count_by_loop(config)


@pytest.mark.parametrize("step_field", ["decoder_sparse_step", "interleave_moe_layer_step"])
def test_closed_form_reads_both_sparse_step_names(step_field: str) -> None:
    """Llama 4 Maverick names its MoE interleave `interleave_moe_layer_step`: with the closed form
    reading only Qwen's name, every layer was classed MoE and priced dense (17 B instead of ~400 B)."""
    config = {**MODEL_CONFIGS["Qwen3-235B-A22B"], "num_hidden_layers": 48}
    config.pop("decoder_sparse_step", None)
    config.update({step_field: 2, "mlp_only_layers": []})
    total, active = count_params(config)
    assert (total, active) == _count_by_loop(config)
    every_layer = count_params({**config, step_field: 1})
    assert every_layer[0] > total > active  # half the layers MoE: between all-MoE and dense


def test_parameter_count_does_not_loop_over_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = hf_config._mlp_params

    def counted(f: Any, hidden: int, layer: int) -> tuple[int, int]:
        calls.append(layer)
        if len(calls) > 10:
            raise AssertionError("count_params calls _mlp_params once per layer")
        return original(f, hidden, layer)

    monkeypatch.setattr(hf_config, "_mlp_params", counted)
    for base in ("DeepSeek-V3", "Qwen3-235B-A22B", "Llama-3.1-8B"):
        calls.clear()
        total, _ = count_params({**MODEL_CONFIGS[base], "num_hidden_layers": 1_000_000_000})
        assert total > 10**9 and len(calls) <= 2


def test_a_million_layers_say_the_weights_do_not_fit(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN_MOE, "num_hidden_layers": MAX_LAYERS}), encoding="utf-8")
    code, err = cli(["run", "--model", str(path), "--num-prompts", "3", "--output", str(tmp_path / "o")])
    assert code == 2 and err.count("\n") == 1 and "weights need" in err, err
    assert spec_from_config(json.loads(path.read_text()), where="x").num_layers == MAX_LAYERS
    assert model_spec_from_file(path).num_params > 10**15
