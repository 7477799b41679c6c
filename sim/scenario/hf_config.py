"""Read a HuggingFace `config.json` into a ModelSpec: `--model path/to/config.json`.

Why from the config and not a table: every model on the Hub ships one, and the numbers KV memory and
step time depend on (layers, KV heads, head dim, MLA ranks, window layout, experts) are all in it.
The parameter count is computed from the same fields (embeddings, attention, MLP or experts, norms),
so MoE models get both the weights held in memory (`num_params`) and the weights one token uses
(`active_params`, the cost model's FLOPs) and the routed experts a step reads only in part
(`routed_expert_params`, docs/cost_model.md "MoE"). Field names follow transformers' config classes
(LlamaConfig, Qwen2/3(Moe)Config, MistralConfig, Gemma3TextConfig, DeepseekV3Config, GptOssConfig).

Every problem is one `ScenarioError` line naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.errors import KvsimError, ScenarioError
from sim.files import read_text_bounded
from sim.scenario.config_checks import checked_config
from sim.scenario.presets import ModelSpec

# torch dtype names in config.json -> bytes per element (the KV cache's "auto" dtype, as in vLLM).
_DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
}


class _Fields:
    """Typed access to a config dict, with errors that name the file and the field."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def fail(self, field: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.where}: field '{field}': {message}")

    def int(self, *names: str, default: Any = ..., minimum: int = 1) -> Any:
        """The first of `names` present, as an int >= minimum; `default` when none is (else an error)."""
        for name in names:
            if name in self.data and self.data[name] is not None:
                value = self.data[name]
                if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                    raise self.fail(name, f"must be an integer >= {minimum} (got {value!r})")
                return value
        if default is ...:
            raise self.fail(names[0], "is required")
        return default

    def bool(self, name: str, default: bool) -> bool:
        value = self.data.get(name, default)
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false (got {value!r})")
        return value


def load_config(path: str | Path) -> dict[str, Any]:
    """The JSON object in `path` (a text_config inside a multimodal config is merged over the top).

    Read bounded (a regular file of at most `MAX_CONFIG_BYTES`: `/dev/zero` is refused, not read
    until memory runs out); nesting too deep for the parser is one line, not a RecursionError.
    """
    path = Path(path)
    try:
        data = json.loads(read_text_bounded(path, what="model config file"))
    except KvsimError as exc:
        raise ScenarioError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise ScenarioError(f"{path}: invalid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a model config must be a JSON object")
    return data


def window_layer_flags(data: dict[str, Any], num_layers: int, where: str = "config") -> list[bool]:
    """Which layers attend only within `sliding_window` (True), in layer order.

    Sources, in order: `layer_types` ("sliding_attention" / "full_attention"; Gemma 3, gpt-oss,
    Qwen3 in transformers >= 4.53); `sliding_window_pattern` N (Gemma 3's older configs: every N-th
    layer is global, the rest local); Gemma 2 (`model_type` gemma2: even layers local); otherwise a
    `sliding_window` applies to every layer (Mistral-7B-v0.1), unless `use_sliding_window` is false
    (Qwen2/3 ship a sliding_window value with use_sliding_window false).
    """
    fields = _Fields(data, where)
    if data.get("attention_chunk_size") is not None:
        return chunked_layer_flags(data, num_layers, where)
    window = data.get("sliding_window")
    if window is None:
        return [False] * num_layers
    fields.int("sliding_window")
    layer_types = data.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise fields.fail("layer_types", f"must be a list of {num_layers} layer types")
        known = {"sliding_attention", "full_attention"}
        for kind in layer_types:
            if kind not in known:
                raise fields.fail(
                    "layer_types", f"unknown layer type {kind!r} (known: {', '.join(sorted(known))})"
                )
        return [kind == "sliding_attention" for kind in layer_types]
    if "sliding_window_pattern" in data and data["sliding_window_pattern"] is not None:
        pattern = fields.int("sliding_window_pattern")
        return [(index + 1) % pattern != 0 for index in range(num_layers)]
    if data.get("model_type") == "gemma2":
        return [index % 2 == 0 for index in range(num_layers)]
    if not fields.bool("use_sliding_window", True):
        return [False] * num_layers
    return [True] * num_layers


def chunked_layer_flags(data: dict[str, Any], num_layers: int, where: str = "config") -> list[bool]:
    """Llama 4's chunked local attention: the RoPE layers attend only within their
    `attention_chunk_size` chunk, the NoPE layers (every `no_rope_layer_interval`-th, default 4)
    globally (transformers Llama4TextConfig `no_rope_layers`: 1 = RoPE; vLLM
    vllm/model_executor/models/llama4.py: `use_chunked_local_attn = not self.nope and
    attention_chunk_size`). A chunk keeps at most `attention_chunk_size` tokens, so kvsim treats these
    layers as window layers of that size (an upper bound: a chunk restarts at every boundary).
    """
    fields = _Fields(data, where)
    fields.int("attention_chunk_size")
    flags = data.get("no_rope_layers")
    if flags is None:
        interval = fields.int("no_rope_layer_interval", default=4)
        return [(index + 1) % interval != 0 for index in range(num_layers)]
    if not isinstance(flags, list) or len(flags) != num_layers or any(flag not in (0, 1) for flag in flags):
        raise fields.fail("no_rope_layers", f"must be a list of {num_layers} entries, each 0 or 1")
    return [flag == 1 for flag in flags]


def _attention_params(f: _Fields, hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Per layer: Q, K, V, O projections (plus biases and per-head norms where the config has them)."""
    if f.int("kv_lora_rank", default=0, minimum=0):  # MLA (DeepSeek-V2/V3 modeling code)
        kv_rank = f.int("kv_lora_rank")
        rope = f.int("qk_rope_head_dim")
        nope = f.int("qk_nope_head_dim")
        v_dim = f.int("v_head_dim")
        q_rank = f.int("q_lora_rank", default=0, minimum=0)
        q_head = nope + rope
        query = hidden * heads * q_head if q_rank == 0 else hidden * q_rank + q_rank + q_rank * heads * q_head
        kv = hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim)
        return query + kv + heads * v_dim * hidden
    q, kv = heads * head_dim, kv_heads * head_dim
    params = hidden * q + 2 * hidden * kv + q * hidden
    if f.bool("attention_bias", False) or f.data.get("model_type") in ("qwen2", "qwen2_moe"):
        params += q + 2 * kv + (hidden if f.data.get("model_type") == "gpt_oss" else 0)
    if f.data.get("model_type", "").startswith(("qwen3", "gemma3")):
        params += 2 * head_dim  # q_norm and k_norm
    if f.data.get("model_type") == "gpt_oss":
        params += heads  # attention sinks
    return params


def _sparse_step(f: _Fields) -> int:
    """Every how many layers one is MoE: Qwen's `decoder_sparse_step`, Llama 4's
    `interleave_moe_layer_step` (Maverick: 2). One reader, so the per-layer rule and the closed-form
    layer classes can never disagree."""
    return f.int("decoder_sparse_step", "interleave_moe_layer_step", default=1, minimum=1)


def _num_experts(f: _Fields) -> int:
    """Routed experts per MoE layer (0: dense), under the names the config families use: DeepSeek's
    `n_routed_experts`, Mixtral's and gpt-oss's `num_local_experts`, Qwen-MoE's `num_experts`."""
    return f.int("n_routed_experts", "num_local_experts", "num_experts", default=0, minimum=0)


def _is_moe_layer(f: _Fields, layer: int) -> bool:
    """Whether decoder layer `layer` has routed experts: experts > 0, index >= first_k_dense_replace,
    not in mlp_only_layers, and (index + 1) divisible by the sparse step (`_sparse_step`)."""
    experts = _num_experts(f)
    dense_first = f.int("first_k_dense_replace", default=0, minimum=0)
    mlp_only = f.data.get("mlp_only_layers") or []
    return not (
        experts == 0 or layer < dense_first or layer in mlp_only or (layer + 1) % _sparse_step(f) != 0
    )


def _expert_params(f: _Fields, hidden: int) -> int:
    """One routed expert's parameters: gate, up and down projections (gpt-oss: and their biases)."""
    width = f.int("moe_intermediate_size", default=None) or f.int("intermediate_size")
    expert = 3 * hidden * width
    if f.data.get("model_type") == "gpt_oss":  # biased gate_up and down projections
        expert += 3 * width
    return expert


def _mlp_params(f: _Fields, hidden: int, layer: int) -> tuple[int, int]:
    """(all, active) MLP parameters of one layer: a gated MLP, or routed + shared experts and a router."""
    experts = _num_experts(f)
    if not _is_moe_layer(f, layer):
        dense = 3 * hidden * f.int("intermediate_size_mlp", "intermediate_size")  # Llama 4 names both
        return dense, dense
    per_token = f.int("num_experts_per_tok", "experts_per_token")
    expert = _expert_params(f, hidden)
    shared = f.int("n_shared_experts", default=0, minimum=0) * expert
    if f.int("shared_expert_intermediate_size", default=0, minimum=0):  # Qwen2-MoE: one shared expert
        shared += 3 * hidden * f.int("shared_expert_intermediate_size")
    if f.data.get("model_type") in ("llama4", "llama4_text"):  # Llama 4: one shared expert per MoE layer
        shared += expert
    router = hidden * experts + (experts if f.data.get("model_type") == "gpt_oss" else 0)
    return experts * expert + shared + router, per_token * expert + shared + router


def count_params(data: dict[str, Any], where: str = "config") -> tuple[int, int]:
    """(total, active per token) parameters of the decoder as the config describes it.

    Embeddings (and an untied LM head) + per layer attention, MLP or experts and two norms (Gemma:
    four) + the final norm. MTP heads and vision towers are not counted (not used to serve text).
    """
    f = _Fields(data, where)
    hidden = f.int("hidden_size")
    heads = f.int("num_attention_heads")
    kv_heads = f.int("num_key_value_heads", default=heads)
    head_dim = f.int("head_dim", default=None) or hidden // heads
    vocab = f.int("vocab_size")
    layers = f.int("num_hidden_layers")
    embed = vocab * hidden * (1 if f.bool("tie_word_embeddings", False) else 2)
    attention = _attention_params(f, hidden, heads, kv_heads, head_dim)
    norms = (4 if data.get("model_type", "").startswith("gemma") else 2) * hidden
    if f.int("kv_lora_rank", default=0, minimum=0) and f.int("q_lora_rank", default=0, minimum=0):
        norms += 0  # the MLA latent norms are counted with attention
    total = active = embed + hidden + layers * (attention + norms)
    for representative, count in _mlp_layer_classes(f, layers):
        mlp_all, mlp_active = _mlp_params(f, hidden, representative)
        total += count * mlp_all
        active += count * mlp_active
    return total, active


def count_routed_expert_params(data: dict[str, Any], where: str = "config") -> int:
    """Parameters of all routed experts of all MoE layers (0 for a dense model): what a step reads
    only for the experts its tokens are routed to (sim/cost/model.py `CostModel.linear_time_s`).

    Shared experts, the router, attention, norms, dense layers (DeepSeek's first three) and the
    embeddings are not in it: every step reads them whatever the routing.
    """
    f = _Fields(data, where)
    experts = _num_experts(f)
    if experts == 0:
        return 0
    hidden = f.int("hidden_size")
    moe_layers = sum(
        count
        for representative, count in _mlp_layer_classes(f, f.int("num_hidden_layers"))
        if _is_moe_layer(f, representative)
    )
    return moe_layers * experts * _expert_params(f, hidden)


def _mlp_layer_classes(f: _Fields, layers: int) -> list[tuple[int, int]]:
    """(a representative layer index, how many layers have its MLP) for dense and MoE layers.

    Why: every dense layer has the same MLP, and so has every MoE layer, so the count needs one
    `_mlp_params` call per kind, not one per layer; a config with 10**9 layers used to loop for
    minutes (issue 23). A layer is MoE when `_mlp_params` says so: experts > 0, index >=
    first_k_dense_replace, not in mlp_only_layers, and (index + 1) divisible by
    the sparse step (`_sparse_step`).
    """
    experts = _num_experts(f)
    if experts == 0:
        return [(0, layers)]
    dense_first = min(f.int("first_k_dense_replace", default=0, minimum=0), layers)
    step = _sparse_step(f)
    mlp_only = {layer for layer in f.data.get("mlp_only_layers") or [] if dense_first <= layer < layers}
    # MoE candidates: indices in [dense_first, layers) with (index + 1) % step == 0
    moe = layers // step - dense_first // step - sum(1 for layer in mlp_only if (layer + 1) % step == 0)
    first_moe = None
    if moe:  # the first candidate not in mlp_only_layers (at most len(mlp_only) + 1 tries)
        start = -(-(dense_first + 1) // step) * step - 1
        first_moe = next(i for i in range(start, layers, step) if i not in mlp_only)
    first_dense = None
    if layers - moe:  # layer 0 is dense unless every layer from 0 on is a candidate
        first_dense = 0 if dense_first > 0 or step > 1 else min(mlp_only)
    classes = [(first_moe, moe), (first_dense, layers - moe)]
    return [(index, count) for index, count in classes if index is not None and count > 0]


def spec_from_config(data: dict[str, Any], name: str = "custom", where: str = "config") -> ModelSpec:
    """A ModelSpec from a config dict (`where` names it in errors)."""
    if isinstance(data.get("text_config"), dict):
        data = {**data, **data["text_config"]}
    data = checked_config(data, where)  # types and ranges first: the arithmetic below trusts them
    f = _Fields(data, where)
    layers = f.int("num_hidden_layers")
    heads = f.int("num_attention_heads")
    hidden = f.int("hidden_size")
    kv_heads = f.int("num_key_value_heads", default=heads)
    if heads % kv_heads != 0:
        raise f.fail("num_key_value_heads", f"must divide num_attention_heads={heads} (got {kv_heads})")
    head_dim = f.int("head_dim", default=None) or hidden // heads
    if f.int("kv_lora_rank", default=0, minimum=0):  # MLA: a query head is nope + rope wide
        head_dim = f.int("qk_nope_head_dim") + f.int("qk_rope_head_dim")
    dtype = data.get("torch_dtype", data.get("dtype", "bfloat16"))
    if dtype not in _DTYPE_BYTES:
        raise f.fail("torch_dtype", f"unknown dtype {dtype!r} (known: {', '.join(_DTYPE_BYTES)})")
    flags = window_layer_flags(data, layers, where)
    total, active = count_params(data, where)
    experts = _num_experts(f)
    return ModelSpec(
        name=name,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        dtype_bytes=_DTYPE_BYTES[dtype],
        num_params=total,
        max_context_tokens=f.int("max_position_embeddings"),
        intermediate_size=f.int("intermediate_size", default=None),
        vocab_size=f.int("vocab_size"),
        tied_embeddings=f.bool("tie_word_embeddings", False),
        kv_lora_rank=f.int("kv_lora_rank", default=0, minimum=0),
        qk_rope_head_dim=f.int("qk_rope_head_dim", default=0, minimum=0) if data.get("kv_lora_rank") else 0,
        sliding_window_tokens=f.int("attention_chunk_size", "sliding_window") if any(flags) else None,
        num_window_layers=sum(flags),
        num_experts=experts,
        experts_per_token=f.int("num_experts_per_tok", "experts_per_token", default=0, minimum=0)
        if experts
        else 0,
        active_params=active if active != total else None,
        # None where the config names experts but no layer routes to them (e.g. first_k_dense_replace
        # covering every layer): a dense model, whatever its expert fields say.
        routed_expert_params=(count_routed_expert_params(data, where) or None) if experts else None,
    )


def model_spec_from_file(path: str | Path) -> ModelSpec:
    """`--model path/to/config.json`: the spec, named after the file's folder (or the file); FP8
    weights when its `quantization_config` says so (sim/scenario/quantization.py)."""
    from sim.scenario.quantization import config_quantization, quantized_model

    path = Path(path)
    data = load_config(path)
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    spec = spec_from_config(data, name=name or "custom", where=str(path))
    quantization = config_quantization(data, str(path))
    return (
        quantized_model(spec, quantization).model_copy(update={"name": spec.name}) if quantization else spec
    )


def looks_like_config_path(text: str) -> bool:
    """Whether a --model value names a file rather than a preset (ends in .json or is a file)."""
    return text.strip().lower().endswith(".json") or Path(text).is_file()
