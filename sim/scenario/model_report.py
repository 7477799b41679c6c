"""`kvsim presets --model NAME_OR_CONFIG`: what one model's KV costs per token, in plain lines.

Why its own module: the numbers come from sim.scenario.presets (the same functions the scenario uses), and
the CLI only prints; notebooks can call `model_kv_lines` too.
"""

from __future__ import annotations

from sim.errors import ScenarioError
from sim.scenario.hf_config import looks_like_config_path, model_spec_from_file
from sim.scenario.presets import ModelSpec, kv_bytes_per_token_group, model_preset
from sim.scenario.scenario import KV_CACHE_DTYPE_BYTES


def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset by name/alias, or a HuggingFace config.json by path; ScenarioError if neither."""
    if looks_like_config_path(name_or_path):
        return model_spec_from_file(name_or_path)
    try:
        return model_preset(name_or_path)
    except ValueError as exc:
        raise ScenarioError(f"argument 'model': {exc}; or give a path to a config.json") from None


def model_kv_lines(
    name_or_path: str, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1
) -> list[str]:
    """Lines describing the model, ending with `KV bytes per token: N` and a note on window layers."""
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise ScenarioError(
            f"argument 'kv_cache_dtype': must be one of {', '.join(KV_CACHE_DTYPE_BYTES)} "
            f"(got {kv_cache_dtype!r})"
        )
    if tensor_parallel_size < 1:
        raise ScenarioError(f"argument 'tensor_parallel_size': must be >= 1 (got {tensor_parallel_size})")
    model = resolve_model(name_or_path)
    fixed = KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
    dtype_bytes = model.dtype_bytes if fixed is None else fixed
    per_token = kv_bytes_per_token_group(model, dtype_bytes, tensor_parallel_size)
    lines = [
        f"model: {model.name}",
        f"layers: {model.num_layers}, attention heads: {model.num_attention_heads}, "
        f"KV heads: {model.num_kv_heads}, head dim: {model.head_dim}, hidden: {model.hidden_size}",
        f"parameters: {model.num_params / 1e9:.2f} B"
        + (f" ({model.compute_params / 1e9:.2f} B active per token)" if model.active_params else ""),
        f"weights: {model.weight_bytes / 1e9:.1f} GB, max context: {model.max_context_tokens:,} tokens",
    ]
    if model.num_experts:
        lines.append(f"experts: {model.num_experts} routed, {model.experts_per_token} per token")
    if model.is_mla:
        lines.append(
            f"MLA: one latent of kv_lora_rank {model.kv_lora_rank} + qk_rope_head_dim "
            f"{model.qk_rope_head_dim} per token per layer, replicated on every TP rank (as in vLLM)"
        )
    lines.append(
        f"KV bytes per token: {per_token:,} (all {model.num_layers} layers, TP group of "
        f"{tensor_parallel_size} GPU{'s' if tensor_parallel_size > 1 else ''}, "
        f"kv-cache-dtype {kv_cache_dtype}: "
        f"{dtype_bytes} byte{'s' if dtype_bytes > 1 else ''} per element)"
    )
    if model.num_window_layers:
        lines.append(
            f"note: {model.num_window_layers} of {model.num_layers} layers use a sliding window of "
            f"{model.sliding_window_tokens:,} tokens; they are counted above at their full per-token size, "
            "and a window-aware allocator (hybrid, contiguous) keeps only the window on them"
        )
    else:
        lines.append("note: no windowed layers (every layer attends to the whole context)")
    return lines
