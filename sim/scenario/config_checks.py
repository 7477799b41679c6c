"""Check every config.json field kvsim reads, by type and range, before anything uses it.

Why a separate step: the reader (`hf_config`) does arithmetic on these fields; a list where a dtype
name belongs (`"torch_dtype": ["bfloat16"]`) raised TypeError, a number where `model_type` belongs
AttributeError, and `"sliding_window": 10**30` passed and raised OverflowError in the middle of a
simulation (issue 23). Every field is checked here first, one line naming the file and the field;
the reader then only sees values of the right type and a sane size. A new field the reader learns
(a `quantization_config`, shared experts) adds one rule to `FIELD_RULES`.

Upper bounds: each is at least 100 times the largest value published in a Hub config.json that
kvsim knows (docs/cost_model.md, "Presets": 126 layers, hidden 16384, 128 query heads, 384
experts, 10M-token context), and small enough that every product the KV and parameter arithmetic
forms (layers x heads x head dim x bytes, tokens x bytes per token) stays inside int64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.errors import ScenarioError

MAX_LAYERS = 1_000_000
MAX_WIDTH = 2**20  # hidden, ranks, per-layer MLP widths
MAX_HEADS = 2**16  # heads, KV heads, head dims
MAX_TOKENS = 2**31 - 1  # context, window
MAX_EXPERTS = 2**16
MAX_VOCAB = 2**27


@dataclass(frozen=True)
class Rule:
    """What one field may hold: `kind` int | bool | str | int_list | str_list | object, and a range."""

    kind: str
    minimum: int = 0
    maximum: int = 0


def _int(minimum: int, maximum: int) -> Rule:
    return Rule("int", minimum, maximum)


FIELD_RULES: dict[str, Rule] = {
    "num_hidden_layers": _int(1, MAX_LAYERS),
    "hidden_size": _int(1, MAX_WIDTH),
    "num_attention_heads": _int(1, MAX_HEADS),
    "num_key_value_heads": _int(1, MAX_HEADS),
    "head_dim": _int(1, MAX_HEADS),
    "vocab_size": _int(1, MAX_VOCAB),
    "intermediate_size": _int(1, MAX_WIDTH * 16),
    "moe_intermediate_size": _int(1, MAX_WIDTH * 16),
    "max_position_embeddings": _int(1, MAX_TOKENS),
    "sliding_window": _int(1, MAX_TOKENS),
    "sliding_window_pattern": _int(1, MAX_LAYERS),
    "kv_lora_rank": _int(0, MAX_WIDTH),
    "q_lora_rank": _int(0, MAX_WIDTH),
    "qk_rope_head_dim": _int(0, MAX_HEADS),
    "qk_nope_head_dim": _int(0, MAX_HEADS),
    "v_head_dim": _int(0, MAX_HEADS),
    "n_routed_experts": _int(0, MAX_EXPERTS),
    "num_local_experts": _int(0, MAX_EXPERTS),
    "num_experts": _int(0, MAX_EXPERTS),
    "num_experts_per_tok": _int(0, MAX_EXPERTS),
    "experts_per_token": _int(0, MAX_EXPERTS),
    "n_shared_experts": _int(0, MAX_EXPERTS),
    "first_k_dense_replace": _int(0, MAX_LAYERS),
    "decoder_sparse_step": _int(1, MAX_LAYERS),
    "tie_word_embeddings": Rule("bool"),
    "attention_bias": Rule("bool"),
    "use_sliding_window": Rule("bool"),
    "model_type": Rule("str"),
    "torch_dtype": Rule("str"),
    "dtype": Rule("str"),
    "mlp_only_layers": Rule("int_list", 0, MAX_LAYERS),
    "layer_types": Rule("str_list"),
    "text_config": Rule("object"),
}

_EXPERT_FIELDS = ("n_routed_experts", "num_local_experts", "num_experts")  # the reader's order
_PER_TOKEN_FIELDS = ("num_experts_per_tok", "experts_per_token")

_KIND_WORDS = {
    "bool": "true or false",
    "str": "a string",
    "int_list": "a list of integers",
    "str_list": "a list of strings",
    "object": "a JSON object",
}


def _shown(value: Any) -> str:
    """The offending value, short: a 10**30 or a long list must not make the line a page."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_field(name: str, value: Any, rule: Rule, where: str) -> None:
    def fail(what: str) -> ScenarioError:
        return ScenarioError(f"{where}: field '{name}': {what} (got {_shown(value)})")

    if rule.kind == "int":
        if not _is_int(value):
            raise fail(f"must be an integer from {rule.minimum} to {rule.maximum:,}")
        if not rule.minimum <= value <= rule.maximum:
            raise fail(f"must be from {rule.minimum} to {rule.maximum:,}")
    elif rule.kind == "bool" and not isinstance(value, bool):
        raise fail(f"must be {_KIND_WORDS['bool']}")
    elif rule.kind == "str" and not isinstance(value, str):
        raise fail(f"must be {_KIND_WORDS['str']}")
    elif rule.kind == "object" and not isinstance(value, dict):
        raise fail(f"must be {_KIND_WORDS['object']}")
    elif rule.kind == "str_list" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise fail(f"must be {_KIND_WORDS['str_list']}")
    elif rule.kind == "int_list":
        if not (isinstance(value, list) and all(_is_int(v) for v in value)):
            raise fail(f"must be {_KIND_WORDS['int_list']}")
        if any(not rule.minimum <= v <= rule.maximum for v in value):
            raise fail(f"entries must be from {rule.minimum} to {rule.maximum:,}")


def checked_config(data: dict[str, Any], where: str = "config") -> dict[str, Any]:
    """`data` without the known fields set to null; ScenarioError (one line: file, field, allowed
    values) for the first known field of the wrong type or out of range.

    `null` counts as absent, as in transformers' configs (a null `model_type` or `torch_dtype` is the
    default), so the reader never sees one. Called on the config as the reader sees it (a
    multimodal config's `text_config` already merged over the top level).
    """
    for name, rule in FIELD_RULES.items():
        value = data.get(name)
        if value is not None:
            _check_field(name, value, rule, where)
    per_token = next((data[n] for n in _PER_TOKEN_FIELDS if data.get(n)), 0)
    experts = next((data[n] for n in _EXPERT_FIELDS if data.get(n)), 0)
    if experts and per_token > experts:
        raise ScenarioError(
            f"{where}: field 'num_experts_per_tok': must be at most the {experts} routed experts "
            f"(got {per_token})"
        )
    return {name: value for name, value in data.items() if value is not None or name not in FIELD_RULES}
