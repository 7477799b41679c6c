"""Model and GPU presets: the published numbers a capacity planner would otherwise look up by hand.

Why here and not in the scenario: the same numbers feed the KV budget (sim/scenario/scenario.py), the cost
model (sim/cost/model.py), `kvsim presets` and the capacity planner. Sources are cited in
docs/cost_model.md
("Presets"). Parameter counts are computed from each model's published config (they match the
model cards: OPT-13B 12.85 B, LLaMA-2-7B 6.74 B, Llama-3-8B 8.03 B, ...).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.scenario.units import parse_bytes


class ModelSpec(BaseModel):
    """A decoder-only transformer, described by what KV memory and step time depend on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    num_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    dtype_bytes: int = Field(default=2, ge=1, le=8)
    num_params: int = Field(ge=1)
    max_context_tokens: int = Field(ge=1)
    # Issue 14 (modern models), all optional so the older presets read as before; docs/cost_model.md.
    intermediate_size: int | None = Field(default=None, ge=1)
    vocab_size: int | None = Field(default=None, ge=1)
    # config.json's tie_word_embeddings: the LM head is the embedding table (counted once in
    # num_params). Read by the cost model to take the embedding and LM head out of the per-token FLOPs.
    tied_embeddings: bool = False
    kv_lora_rank: int = Field(default=0, ge=0)  # MLA latent width; 0: not MLA
    qk_rope_head_dim: int = Field(default=0, ge=0)  # MLA's decoupled RoPE key, cached next to the latent
    sliding_window_tokens: int | None = Field(default=None, ge=1)  # window of the windowed layers
    num_window_layers: int = Field(default=0, ge=0)  # layers that attend only within the window
    num_experts: int = Field(default=0, ge=0)  # routed experts per MoE layer; 0: dense
    experts_per_token: int = Field(default=0, ge=0)
    active_params: int | None = Field(default=None, ge=1)  # params one token's forward uses; None: all
    checkpoint_bytes: int | None = Field(
        default=None, ge=1
    )  # weights as stored (FP8, MXFP4); None: params x dtype
    # All routed experts of all MoE layers (sim/scenario/hf_config.py `count_routed_expert_params`): a
    # step reads only the experts its tokens are routed to (sim/cost/model.py `linear_time_s`). None: a
    # dense model, or a preset without it (every weight read every step, as before).
    routed_expert_params: int | None = Field(default=None, ge=1)
    # Those experts as stored when not params x dtype (DeepSeek-V3 FP8, gpt-oss MXFP4:
    # sim/scenario/model_configs.py `routed_expert_bytes`); None: params x dtype
    routed_expert_bytes: int | None = Field(default=None, ge=1)
    # The linear layers' --quantization ("fp8") when set by sim/scenario/quantization.py; the cost
    # model reads it for the GEMM FLOP rate (`linear_flops_scale`). None: the model dtype.
    weight_quantization: str | None = None

    @field_validator("num_kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, num_kv_heads: int, info) -> int:  # type: ignore[no-untyped-def]
        heads = info.data.get("num_attention_heads")
        if heads is not None and heads % num_kv_heads != 0:
            raise ValueError(f"must divide num_attention_heads={heads} (got {num_kv_heads})")
        return num_kv_heads

    @model_validator(mode="after")
    def _window_fields_agree(self) -> ModelSpec:
        if self.num_window_layers > self.num_layers:
            raise ValueError(
                f"num_window_layers={self.num_window_layers} exceeds num_layers={self.num_layers}"
            )
        if self.num_window_layers and self.sliding_window_tokens is None:
            raise ValueError("num_window_layers needs sliding_window_tokens")
        if (self.kv_lora_rank == 0) != (self.qk_rope_head_dim == 0):
            raise ValueError("MLA needs both kv_lora_rank and qk_rope_head_dim (or neither)")
        return self

    @model_validator(mode="after")
    def _routed_experts_fit(self) -> ModelSpec:
        """Routed experts need a routing (experts and experts per token) and fit in the parameters."""
        if self.routed_expert_params is None:
            return self
        if self.num_experts == 0 or self.experts_per_token == 0:
            raise ValueError("routed_expert_params needs num_experts and experts_per_token")
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}"
            )
        if self.routed_expert_params > self.num_params:
            raise ValueError(
                f"routed_expert_params={self.routed_expert_params:,} exceeds num_params={self.num_params:,}"
            )
        return self

    @model_validator(mode="after")
    def _vocabulary_fits_params(self) -> ModelSpec:
        """The embedding table and LM head must leave parameters for the decoder layers.

        Why: the cost model's per-token FLOPs are the compute parameters less these tables
        (sim/cost/linear.py `per_token_compute_params`); a vocabulary too large for `num_params` (a
        mistyped field, or a config whose counts disagree) would give zero or negative FLOPs.
        """
        if self.vocab_size is not None and self.embedding_params >= self.compute_params:
            kind = "active_params" if self.active_params is not None else "num_params"
            raise ValueError(
                f"vocab_size={self.vocab_size} x hidden_size={self.hidden_size} "
                f"({'one tied table' if self.tied_embeddings else 'embedding + LM head'}: "
                f"{self.embedding_params:,} parameters) leaves nothing of {kind}={self.compute_params:,}"
            )
        return self

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): one compressed latent per token per layer."""
        return self.kv_lora_rank > 0

    @property
    def num_full_layers(self) -> int:
        return self.num_layers - self.num_window_layers

    @property
    def kv_tensors_per_layer(self) -> int:
        """K and V (2), or MLA's one latent (1): vLLM's MLAAttentionSpec has no K/V pair."""
        return 1 if self.is_mla else 2

    def kv_bytes_per_token_per_layer(self, kv_dtype_bytes: int | None = None) -> int:
        """One layer's KV for one token (all heads, before tensor parallelism).

        MLA: (kv_lora_rank + qk_rope_head_dim) x dtype bytes (DeepSeek-V3: 576 x 2 = 1,152); otherwise
        2 x kv_heads x head_dim x dtype bytes. `kv_dtype_bytes` is the KV cache dtype (None: the model's).
        """
        width = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * width
        return 2 * self.num_kv_heads * self.head_dim * width

    @property
    def kv_bytes_per_token(self) -> int:
        """Every layer's KV for one token at the model dtype; window layers count at full size."""
        return self.num_layers * self.kv_bytes_per_token_per_layer()

    @property
    def embedding_params(self) -> int:
        """Embedding and LM-head parameters: vocab x hidden, twice unless tied (config.json
        `tie_word_embeddings`: one table, counted once in num_params as sim/scenario/hf_config.py
        `count_params` counts it); 0 when the vocabulary is unknown."""
        if self.vocab_size is None:
            return 0
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def compute_params(self) -> int:
        """Parameters one token's forward pass multiplies (MoE: the active experts only)."""
        return self.active_params if self.active_params is not None else self.num_params

    @property
    def weight_bytes(self) -> int:
        if self.checkpoint_bytes is not None:
            return self.checkpoint_bytes
        return self.num_params * self.dtype_bytes


class GpuSpec(BaseModel):
    """One accelerator: memory, HBM bandwidth, dense BF16/FP16 FLOP/s, host link for swapping."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    memory_bytes: int = Field(ge=1)
    hbm_bandwidth_bytes_per_s: float = Field(gt=0)
    peak_flops: float = Field(gt=0)
    pcie_bandwidth_bytes_per_s: float = Field(gt=0)

    @field_validator("memory_bytes", mode="before")
    @classmethod
    def _parse_memory(cls, value: object) -> object:
        if isinstance(value, str | float):
            return parse_bytes(value, field="gpu.memory_bytes")
        return value


MiB = 1024**2

MODEL_PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # facebook/opt-*: MHA, learned positions up to 2048.
        ModelSpec(
            name="OPT-13B", num_layers=40, num_attention_heads=40, num_kv_heads=40, head_dim=128,
            hidden_size=5120, num_params=12_853_473_280, max_context_tokens=2048,
        ),
        ModelSpec(
            name="OPT-66B", num_layers=64, num_attention_heads=72, num_kv_heads=72, head_dim=128,
            hidden_size=9216, num_params=65_719_701_504, max_context_tokens=2048,
        ),
        ModelSpec(
            name="OPT-175B", num_layers=96, num_attention_heads=96, num_kv_heads=96, head_dim=128,
            hidden_size=12288, num_params=174_604_468_224, max_context_tokens=2048,
        ),
        # meta-llama/Llama-2-*-hf: MHA, 4k context.
        ModelSpec(
            name="LLaMA-2-7B", num_layers=32, num_attention_heads=32, num_kv_heads=32, head_dim=128,
            hidden_size=4096, num_params=6_738_415_616, max_context_tokens=4096,
        ),
        ModelSpec(
            name="LLaMA-2-13B", num_layers=40, num_attention_heads=40, num_kv_heads=40, head_dim=128,
            hidden_size=5120, num_params=13_015_864_320, max_context_tokens=4096,
        ),
        # meta-llama/Meta-Llama-3-*: GQA with 8 KV heads, 8k context; config.json vocab_size 128256, untied.
        ModelSpec(
            name="Llama-3-8B", num_layers=32, num_attention_heads=32, num_kv_heads=8, head_dim=128,
            hidden_size=4096, num_params=8_030_261_248, max_context_tokens=8192, vocab_size=128_256,
        ),
        ModelSpec(
            name="Llama-3-70B", num_layers=80, num_attention_heads=64, num_kv_heads=8, head_dim=128,
            hidden_size=8192, num_params=70_553_706_496, max_context_tokens=8192, vocab_size=128_256,
        ),
        # mistralai/Mistral-7B-v0.1: GQA-8, max_position_embeddings 32768; vocab_size 32000, untied.
        ModelSpec(
            name="Mistral-7B", num_layers=32, num_attention_heads=32, num_kv_heads=8, head_dim=128,
            hidden_size=4096, num_params=7_241_732_096, max_context_tokens=32768, vocab_size=32_000,
        ),
        # Qwen/Qwen2.5-*: GQA (4 and 8 KV heads), 128k context per the model cards.
        ModelSpec(
            name="Qwen2.5-7B", num_layers=28, num_attention_heads=28, num_kv_heads=4, head_dim=128,
            hidden_size=3584, num_params=7_615_616_512, max_context_tokens=131072,
        ),
        ModelSpec(
            name="Qwen2.5-72B", num_layers=80, num_attention_heads=64, num_kv_heads=8, head_dim=128,
            hidden_size=8192, num_params=72_706_203_648, max_context_tokens=131072,
        ),
    )
}  # fmt: skip

GPU_PRESETS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        # Memory as nvidia-smi reports it (MiB); bandwidth and dense (no sparsity) BF16 FLOP/s from
        # NVIDIA's datasheets; PCIe one direction (Gen4 x16: 32 GB/s, Gen5 x16: 64 GB/s).
        GpuSpec(
            name="A100-40GB", memory_bytes=40960 * MiB, hbm_bandwidth_bytes_per_s=1.555e12,
            peak_flops=312e12, pcie_bandwidth_bytes_per_s=32e9,
        ),
        GpuSpec(
            name="A100-80GB", memory_bytes=81920 * MiB, hbm_bandwidth_bytes_per_s=2.039e12,
            peak_flops=312e12, pcie_bandwidth_bytes_per_s=32e9,
        ),
        GpuSpec(
            name="H100-80GB", memory_bytes=81559 * MiB, hbm_bandwidth_bytes_per_s=3.35e12,
            peak_flops=989.4e12, pcie_bandwidth_bytes_per_s=64e9,
        ),
        # NVIDIA H100 Tensor Core GPU datasheet, "H100 PCIe" column: 80 GB HBM2e, 2.0 TB/s, BF16 1,513
        # TFLOP/s with sparsity (756 dense), PCIe Gen5 x16 (128 GB/s both ways: 64 one way). Memory as
        # nvidia-smi shows it is taken as the SXM part's 81559 MiB (same 80 GB of HBM, same reservation).
        # The gpustack Qwen3-32B "1x H100" rows ran on one (sim/bench/published_set.py).
        GpuSpec(
            name="H100-PCIe-80GB", memory_bytes=81559 * MiB, hbm_bandwidth_bytes_per_s=2.0e12,
            peak_flops=756e12, pcie_bandwidth_bytes_per_s=64e9,
        ),
        GpuSpec(
            name="H200-141GB", memory_bytes=143771 * MiB, hbm_bandwidth_bytes_per_s=4.8e12,
            peak_flops=989.4e12, pcie_bandwidth_bytes_per_s=64e9,
        ),
        GpuSpec(
            name="L4", memory_bytes=23034 * MiB, hbm_bandwidth_bytes_per_s=300e9,
            peak_flops=121e12, pcie_bandwidth_bytes_per_s=32e9,
        ),
        # NVIDIA HGX B200 datasheet: 180 GB HBM3e, 8 TB/s, 2.25 PFLOP/s dense BF16 (4.5 with sparsity);
        # host link PCIe Gen5 x16.
        GpuSpec(
            name="B200", memory_bytes=180 * 10**9, hbm_bandwidth_bytes_per_s=8e12,
            peak_flops=2250e12, pcie_bandwidth_bytes_per_s=64e9,
        ),
        # AMD Instinct MI300X datasheet: 192 GB HBM3, 5.3 TB/s, 1307.4 TFLOP/s dense BF16; PCIe Gen5 x16.
        GpuSpec(
            name="MI300X", memory_bytes=192 * 10**9, hbm_bandwidth_bytes_per_s=5.3e12,
            peak_flops=1307.4e12, pcie_bandwidth_bytes_per_s=64e9,
        ),
    )
}  # fmt: skip

# Other spellings users type: Hugging Face ids and short GPU names.
_ALIASES: dict[str, str] = {
    "facebook/opt-13b": "OPT-13B",
    "facebook/opt-66b": "OPT-66B",
    "facebook/opt-175b": "OPT-175B",
    "meta-llama/llama-2-7b-hf": "LLaMA-2-7B",
    "meta-llama/llama-2-13b-hf": "LLaMA-2-13B",
    "llama-2-7b": "LLaMA-2-7B",
    "llama-2-13b": "LLaMA-2-13B",
    "meta-llama/meta-llama-3-8b": "Llama-3-8B",
    "meta-llama/meta-llama-3-70b": "Llama-3-70B",
    "mistralai/mistral-7b-v0.1": "Mistral-7B",
    "qwen/qwen2.5-7b": "Qwen2.5-7B",
    "qwen/qwen2.5-72b": "Qwen2.5-72B",
    "a100": "A100-40GB",
    "a100-40g": "A100-40GB",
    "a100-80g": "A100-80GB",
    "h100": "H100-80GB",
    "h100-sxm": "H100-80GB",
    "h100-pcie": "H100-PCIe-80GB",
    "h100-pcie-80g": "H100-PCIe-80GB",
    "h200": "H200-141GB",
    "h200-141g": "H200-141GB",
    "b200-180gb": "B200",
    "mi300": "MI300X",
    "meta-llama/llama-3.1-8b": "Llama-3.1-8B",
    "meta-llama/llama-3.1-70b": "Llama-3.1-70B",
    "meta-llama/llama-3.1-405b": "Llama-3.1-405B",
    "qwen/qwen3-32b": "Qwen3-32B",
    "qwen/qwen3-235b-a22b": "Qwen3-235B-A22B",
    "deepseek-ai/deepseek-v3": "DeepSeek-V3",
    "google/gemma-3-27b-it": "Gemma-3-27B",
    "gemma-3-27b-it": "Gemma-3-27B",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    # Held-out LambdaLabsML/vllm-benchmark models (issue 21); sim/bench/identify.py drops "-Instruct"
    # and keeps a date suffix ("-Instruct-2407" -> "-2407").
    "mistralai/mistral-nemo-2407": "Mistral-Nemo",
    "mistralai/mistral-nemo-base-2407": "Mistral-Nemo",
    "mistralai/mistral-large-2407": "Mistral-Large-2",
    "mistral-large-2407": "Mistral-Large-2",
    "mistralai/mixtral-8x7b": "Mixtral-8x7B",
    "mistralai/mixtral-8x7b-v0.1": "Mixtral-8x7B",
    "mistralai/mixtral-8x22b": "Mixtral-8x22B",
    "mistralai/mixtral-8x22b-v0.1": "Mixtral-8x22B",
    # NousResearch/Hermes-3-Llama-3.1-405B: a full-parameter fine-tune of Llama-3.1-405B with its
    # architecture and vocabulary (docs/cost_model.md "Presets")
    "nousresearch/hermes-3-llama-3.1-405b": "Llama-3.1-405B",
    "hermes-3-llama-3.1-405b": "Llama-3.1-405B",
}


def _key(name: str) -> str:
    return re.sub(r"\s+", "", name.strip().lower())


def _lookup(name: str, presets: dict[str, BaseModel], kind: str) -> str:
    key = _key(name)
    by_key = {_key(canonical): canonical for canonical in presets}
    if key in by_key:
        return by_key[key]
    if key in _ALIASES and _ALIASES[key] in presets:
        return _ALIASES[key]
    raise ValueError(f"unknown {kind} preset {name!r} (known: {', '.join(presets)})")


def canonical_model_name(name: str) -> str:
    """The preset's canonical spelling for a case-insensitive name or alias; ValueError if unknown."""
    return _lookup(name, MODEL_PRESETS, "model")  # type: ignore[arg-type]


def canonical_gpu_name(name: str) -> str:
    """The preset's canonical spelling for a case-insensitive name or alias; ValueError if unknown."""
    return _lookup(name, GPU_PRESETS, "gpu")  # type: ignore[arg-type]


def model_preset(name: str) -> ModelSpec:
    return MODEL_PRESETS[canonical_model_name(name)]


def gpu_preset(name: str) -> GpuSpec:
    return GPU_PRESETS[canonical_gpu_name(name)]


def kv_layer_bytes_per_gpu(model: ModelSpec, kv_dtype_bytes: int, tensor_parallel_size: int) -> int:
    """One layer's K (or V, or MLA latent) bytes for one token on one GPU.

    GQA/MHA: KV heads are split over the TP ranks (replicated when TP exceeds them, as in vLLM).
    MLA: the latent is not split: vLLM's ModelConfig.get_num_kv_heads (vllm/config/model.py) returns
    1 per GPU for MLA ("When using MLA during decode it becomes MQA"), not total KV heads / TP, with
    a head size of kv_lora_rank + qk_rope_head_dim, so every rank holds the whole latent.
    """
    if model.is_mla:
        return model.kv_bytes_per_token_per_layer(kv_dtype_bytes)
    kv_heads = max(1, model.num_kv_heads // tensor_parallel_size)
    return kv_heads * model.head_dim * kv_dtype_bytes


def kv_bytes_per_token_group(model: ModelSpec, kv_dtype_bytes: int, tensor_parallel_size: int) -> int:
    """Every layer's KV for one token over the whole TP group (window layers at their full size)."""
    per_gpu = (
        model.kv_tensors_per_layer
        * model.num_layers
        * kv_layer_bytes_per_gpu(model, kv_dtype_bytes, tensor_parallel_size)
    )
    return per_gpu * tensor_parallel_size


def model_rows() -> list[dict[str, object]]:
    """One row per model preset, with the derived KV bytes per token (for `kvsim presets`)."""
    return [
        {
            **spec.model_dump(),
            "kv_bytes_per_token": spec.kv_bytes_per_token,
            "weight_bytes": spec.weight_bytes,
        }
        for spec in MODEL_PRESETS.values()
    ]


def gpu_rows() -> list[dict[str, object]]:
    """One row per GPU preset (for `kvsim presets`)."""
    return [spec.model_dump() for spec in GPU_PRESETS.values()]


def _add_config_presets() -> None:
    """The issue-14 presets, built from their config.json fields (sim/scenario/model_configs.py) by the
    `--model config.json` reader, so both paths share one computation."""
    from sim.scenario.hf_config import spec_from_config
    from sim.scenario.model_configs import MODEL_CONFIGS, checkpoint_bytes, routed_expert_bytes

    for name, config in MODEL_CONFIGS.items():
        spec = spec_from_config(config, name=name, where=f"preset {name}")
        stored = checkpoint_bytes(name, spec.num_params, config)
        experts = routed_expert_bytes(name, spec.routed_expert_params, config)
        update = {"checkpoint_bytes": stored, "routed_expert_bytes": experts}
        MODEL_PRESETS[name] = spec.model_copy(update=update) if stored or experts else spec


_add_config_presets()
