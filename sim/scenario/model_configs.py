"""The `config.json` fields of the issue-14 model presets, as published on the Hugging Face Hub.

Why the config and not finished numbers: the presets are built by `sim.scenario.hf_config.spec_from_config`,
the same reader `--model path/to/config.json` uses, so the parameter counts (total and active) and the
window layout come from one computation that the tests check against the model cards. Sources (repo
and file) are listed per model in docs/cost_model.md ("Presets").
"""

from __future__ import annotations

from typing import Any

_LLAMA_31 = {
    "model_type": "llama",
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "num_key_value_heads": 8,
}

# name -> (config.json fields, weight bytes as stored when not params x dtype, or None)
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.1-8B / -70B / -405B config.json
    "Llama-3.1-8B": {**_LLAMA_31, "hidden_size": 4096, "intermediate_size": 14336,
                     "num_attention_heads": 32, "num_hidden_layers": 32},
    "Llama-3.1-70B": {**_LLAMA_31, "hidden_size": 8192, "intermediate_size": 28672,
                      "num_attention_heads": 64, "num_hidden_layers": 80},
    "Llama-3.1-405B": {**_LLAMA_31, "hidden_size": 16384, "intermediate_size": 53248,
                       "num_attention_heads": 128, "num_hidden_layers": 126},
    # Qwen/Qwen3-32B config.json (use_sliding_window false: full attention everywhere)
    "Qwen3-32B": {"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600,
                  "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                  "num_hidden_layers": 64, "vocab_size": 151936, "max_position_embeddings": 40960,
                  "torch_dtype": "bfloat16", "tie_word_embeddings": False, "sliding_window": None,
                  "use_sliding_window": False},
    # Qwen/Qwen3-235B-A22B config.json: 128 experts, 8 per token, every layer MoE
    "Qwen3-235B-A22B": {"model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288,
                        "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8,
                        "decoder_sparse_step": 1, "mlp_only_layers": [], "num_attention_heads": 64,
                        "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 94,
                        "vocab_size": 151936, "max_position_embeddings": 40960, "torch_dtype": "bfloat16",
                        "tie_word_embeddings": False, "sliding_window": None, "use_sliding_window": False},
    # deepseek-ai/DeepSeek-V3 config.json: MLA (kv_lora_rank 512 + rope 64), 256 routed + 1 shared
    # expert, 8 per token, first 3 layers dense; weights stored in FP8 (quantization_config fp8)
    "DeepSeek-V3": {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "num_attention_heads": 128,
                    "num_key_value_heads": 128, "num_hidden_layers": 61, "kv_lora_rank": 512,
                    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
                    "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    # google/gemma-3-27b-it config.json, text_config: 5 local (window 1024) : 1 global
    "Gemma-3-27B": {"model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
                    "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
                    "num_hidden_layers": 62, "sliding_window": 1024, "sliding_window_pattern": 6,
                    "vocab_size": 262208, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
                    "tie_word_embeddings": True},
    # mistralai/Mistral-7B-v0.1 config.json: sliding_window 4096 on every layer
    "Mistral-7B-v0.1": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
                        "sliding_window": 4096, "vocab_size": 32000, "max_position_embeddings": 32768,
                        "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    # openai/gpt-oss-120b config.json: layer_types alternate sliding (128) and full; 128 experts, 4 per
    # token; experts stored in MXFP4
    "gpt-oss-120b": {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
                     "num_local_experts": 128, "num_experts_per_tok": 4, "num_attention_heads": 64,
                     "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 36,
                     "sliding_window": 128,
                     "layer_types": ["sliding_attention", "full_attention"] * 18,
                     "attention_bias": True, "vocab_size": 201088, "max_position_embeddings": 131072,
                     "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    # Held-out LambdaLabsML/vllm-benchmark models (issue 21); sources per field in docs/cost_model.md
    # "Presets". mistralai/Mistral-Nemo-Instruct-2407 config.json: head_dim 128 is not hidden / heads
    # (5120 / 32 = 160); max_position_embeddings 1024000 in the Instruct config (128000 in -Base-2407)
    "Mistral-Nemo": {"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336,
                         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                         "num_hidden_layers": 40, "vocab_size": 131072, "max_position_embeddings": 1024000,
                         "sliding_window": None, "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    # mistralai/Mistral-Large-Instruct-2407 config.json (Mistral Large 2, 123B)
    "Mistral-Large-2": {"model_type": "mistral", "hidden_size": 12288, "intermediate_size": 28672,
                           "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
                           "num_hidden_layers": 88, "vocab_size": 32768, "max_position_embeddings": 131072,
                           "sliding_window": None, "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    # mistralai/Mixtral-8x7B-Instruct-v0.1 config.json: 8 experts (num_local_experts), 2 per token,
    # every layer MoE; sliding_window null (full attention)
    "Mixtral-8x7B": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
                     "max_position_embeddings": 32768, "sliding_window": None, "torch_dtype": "bfloat16",
                     "tie_word_embeddings": False},
    # mistralai/Mixtral-8x22B-Instruct-v0.1 config.json: 8 experts, 2 per token; vocab 32768 (the v3
    # tokenizer with control tokens; the base mistral-community/Mixtral-8x22B-v0.1 has 32000)
    "Mixtral-8x22B": {"model_type": "mixtral", "hidden_size": 6144, "intermediate_size": 16384,
                      "num_local_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 48,
                      "num_key_value_heads": 8, "num_hidden_layers": 56, "vocab_size": 32768,
                      "max_position_embeddings": 65536, "sliding_window": None, "torch_dtype": "bfloat16",
                      "tie_word_embeddings": False},
}  # fmt: skip


def _stored_bytes(name: str, params: int, config: dict[str, Any]) -> int | None:
    """`params` of `name` as its checkpoint stores them (None: params x dtype bytes).

    DeepSeek-V3: FP8, 1 byte per parameter (block scales ignored). gpt-oss-120b: the expert weights
    in MXFP4 (4-bit values + one 8-bit scale per 32 = 4.25 bits), everything else (the experts'
    biases included) in bf16; `params` must contain all the expert weights.
    """
    if name == "DeepSeek-V3":
        return params
    if name == "gpt-oss-120b":
        hidden, width = config["hidden_size"], config["intermediate_size"]
        expert_weights = config["num_hidden_layers"] * config["num_local_experts"] * 3 * hidden * width
        return round(expert_weights * 4.25 / 8 + (params - expert_weights) * 2)
    return None


def checkpoint_bytes(name: str, num_params: int, config: dict[str, Any]) -> int | None:
    """Weights as stored when the checkpoint is not in the model dtype (None: params x dtype bytes)."""
    return _stored_bytes(name, num_params, config)


def routed_expert_bytes(name: str, routed_params: int | None, config: dict[str, Any]) -> int | None:
    """The routed experts as stored, where `checkpoint_bytes` stores the model other than params x dtype
    (gpt-oss-120b: their weights in MXFP4, their biases, 3 x width per expert, in bf16). None otherwise."""
    if routed_params is None:
        return None
    return _stored_bytes(name, routed_params, config)
