"""Time of a transformer's linear layers (GEMMs, norms, activation, residual add) for a batch of tokens.

Why its own module: this is the part of a step that measured files can check directly. Vidur's
profiles (`../shared/profiles/vidur_mlp`, docs/cost_model.md "Fitted coefficients") time exactly these
ops per layer and per GPU of the TP group, by batch tokens; `sim.cost.fit` fits the coefficients of
`LinearFit` to them and `kvsim cost validate` checks a file against them.

The model, per layer and per GPU (all ops of one layer run one after another, so their times add):

    gemm_s        = smooth_max(gemm_bytes / (hbm_fraction x HBM), gemm_flops / (flops_fraction x FLOPs))
    elementwise_s = elementwise_bytes / (hbm_fraction x HBM)
    layer_s       = fixed_s + gemm_s + elementwise_s

`gemm_bytes` = the layer's weights read once plus each token's GEMM inputs and outputs; `gemm_flops`
= 2 x weights x tokens; `smooth_max(a, b) = (a^p + b^p)^(1/p)`, which is the hard roofline max for
large p and bends smoothly through the ridge (small GEMMs neither stream weights at full bandwidth
nor run at full tensor-core rate near it). `fixed_s` is the per-layer launch/latency floor of the
layer's ~9 kernels. Norms, RoPE, the activation and the residual add are memory-bound elementwise
kernels: they are not in the max, they add.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.scenario.quantization import QUANTIZATION_BYTES, embedding_params

# Vidur's per-layer ops that make up "the linear part of one layer" (the embedding is once per model,
# not per layer, so it is left out). Columns are `time_stats.<op>.median`, in milliseconds.
LAYER_OPS: tuple[str, ...] = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One decoder layer's shape: what its linear ops' bytes and FLOPs depend on (whole layer, TP 1)."""

    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    mlp_size: int  # intermediate size (of each of gate and up when gated)
    gated_mlp: bool = True
    dtype_bytes: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def params(self) -> int:
        """Weights of QKV, output projection and the MLP (norm weights are negligible)."""
        h, d = self.hidden_size, self.head_dim
        qkv = h * (self.num_attention_heads + 2 * self.num_kv_heads) * d
        mlp = (3 if self.gated_mlp else 2) * h * self.mlp_size
        return qkv + h * h + mlp

    @classmethod
    def from_model(cls, model: Any) -> LayerShape:
        """A `sim.scenario.presets.ModelSpec`'s layer, its MLP size estimated from the parameter count.

        Why estimated: ModelSpec has no intermediate size. Taking all of the model's parameters per
        layer (num_params / layers, so embeddings and the LM head are spread over the layers and their
        weight reads counted) and solving `params = attention + 3 x hidden x mlp` gives the gated-MLP
        equivalent; its elementwise bytes equal a plain MLP's of the same weights (OPT: f = 4h reads and
        writes 8h per token, the gated equivalent f' = 8h/3 reads 2f' and writes f' = 8h).
        """
        h, heads, kv = model.hidden_size, model.num_attention_heads, model.num_kv_heads
        d = model.head_dim
        attention = h * (heads + 2 * kv) * d + heads * d * h
        per_layer = _compute_params(model) / model.num_layers
        mlp = max(1, round((per_layer - attention) / (3 * h)))
        return cls(
            hidden_size=h,
            num_attention_heads=heads,
            num_kv_heads=kv,
            mlp_size=mlp,
            gated_mlp=True,
            dtype_bytes=model.dtype_bytes,
        )


def _compute_params(model: Any) -> int:
    """Parameters whose weights every token multiplies: all of them for a dense model, the active
    experts' for a mixture of experts (`ModelSpec.compute_params`). What an MoE step reads is the
    dense part plus the experts its tokens touch (`routed_expert_weight_bytes`, sim/cost/model.py
    `CostModel.linear_time_s`).
    """
    return int(model.compute_params)


def routed_expert_weight_bytes(model: Any) -> int:
    """Stored bytes of all routed experts (whole model, before TP); 0 when not known (dense models,
    presets without `routed_expert_params`: every weight is read every step, as before).

    An FP8 `--quantization` stores every linear layer, experts included, at its bytes per weight
    (sim/scenario/quantization.py `quantized_model`); else the checkpoint's stored experts
    (`ModelSpec.routed_expert_bytes`: DeepSeek-V3 FP8, gpt-oss MXFP4); else params x dtype. Never more
    than the model's weight bytes, so the dense part read every step is never negative.
    """
    params = getattr(model, "routed_expert_params", None)
    if not params:
        return 0
    if model.weight_quantization in QUANTIZATION_BYTES:
        stored = params * QUANTIZATION_BYTES[model.weight_quantization]
    elif model.routed_expert_bytes is not None:
        stored = model.routed_expert_bytes
    else:
        stored = params * model.dtype_bytes
    return min(int(stored), int(model.weight_bytes))


def lm_head_params(model: Any) -> int:
    """Weights of the LM head (vocabulary x hidden); 0 when the model has no vocabulary (older presets).

    Why separate: vLLM multiplies the LM head only for the positions it samples, not for every token
    of the batch. v0.5.4's `LogitsProcessor.forward` (vllm/model_executor/layers/logits_processor.py)
    first runs `_prune_hidden_states`, `hidden_states.index_select(0,
    sampling_metadata.selected_token_indices)` (each prompt's last position and each decoding
    sequence's one token), then `_get_logits` (the matmul with `lm_head.weight`, vocabulary split over
    the TP ranks by `ParallelLMHead`, then gathered).
    """
    vocab = getattr(model, "vocab_size", None)
    return 0 if vocab is None else int(vocab) * int(model.hidden_size)


def per_token_compute_params(model: Any) -> int:
    """Parameters every batch token multiplies: `_compute_params` less the embedding table and the
    LM head (for a tied model the one table counted once in num_params).

    Why: the embedding is a lookup, not a GEMM (vLLM `VocabParallelEmbedding.forward`: `F.embedding`
    on the rank's rows, then an all-reduce; vllm/model_executor/models/llama.py `LlamaModel.forward`
    calls `embed_tokens(input_ids)`), and the LM head runs per sampled position (`lm_head_params`).
    A model without a vocabulary keeps all its parameters per token, as before.
    """
    return _compute_params(model) - embedding_params(model)


@dataclass(frozen=True, slots=True)
class LinearFit:
    """Fitted coefficients of the linear-layer model for one GPU (docs/cost_model.md)."""

    hbm_fraction: float  # achieved fraction of datasheet HBM bandwidth (weight streaming, elementwise)
    flops_fraction: float  # achieved fraction of dense BF16 peak in compute-bound GEMMs
    smooth_p: float  # exponent of the smooth maximum at the memory/compute ridge
    fixed_s: float  # per layer: launch/latency floor of the layer's kernels
    source: str  # the files (or the rule) the numbers come from
    mape_pct: float | None = None  # fit error on those files; None when derived, not fitted

    def as_dict(self) -> dict[str, Any]:
        return {
            "hbm_fraction": self.hbm_fraction,
            "flops_fraction": self.flops_fraction,
            "smooth_p": self.smooth_p,
            "fixed_s": self.fixed_s,
            "source": self.source,
            "mape_pct": self.mape_pct,
        }


def smooth_max(a: Any, b: Any, p: float) -> Any:
    """(a^p + b^p)^(1/p), computed stably; tends to max(a, b) as p grows. Elementwise on arrays."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    big = np.maximum(a, b)
    safe = np.where(big > 0, big, 1.0)
    value = big * ((a / safe) ** p + (b / safe) ** p) ** (1.0 / p)
    return np.where(big > 0, value, 0.0)


@dataclass(frozen=True, slots=True)
class LayerCoefficients:
    """Per-GPU bytes and FLOPs of one layer at TP size `tp`, as intercepts and per-token slopes."""

    weight_bytes: float  # read once per call
    gemm_bytes_per_token: float  # GEMM inputs read and outputs written, per token
    elementwise_bytes_per_token: float  # norms, RoPE, activation, residual add: read + written
    flops_per_token: float  # 2 x weights

    @classmethod
    def of(cls, shape: LayerShape, tp: int, compute_params: float | None = None) -> LayerCoefficients:
        """Per-GPU coefficients: GEMM weights and widths split over `tp`; norms and adds are replicated.

        `compute_params` (default: the layer's weights) is what FLOPs count, for MoE later.
        """
        h, d, b = shape.hidden_size, shape.head_dim, shape.dtype_bytes
        q = shape.num_attention_heads * d / tp
        kv = max(1, shape.num_kv_heads // tp) * d  # KV heads are replicated when tp exceeds them
        up = shape.mlp_size * (2 if shape.gated_mlp else 1) / tp
        f = shape.mlp_size / tp
        weights = shape.params() / tp
        # GEMMs: QKV reads h, writes q + 2 kv; output projection reads q, writes h;
        # up(+gate) reads h, writes up; down reads f, writes h.
        gemm = (h + q + 2 * kv) + (q + h) + (h + up) + (f + h)
        # Two norms (read + write h each), RoPE on q and k (read + write), the activation (reads up,
        # writes f), the residual add (reads 2h, writes h).
        elementwise = 2 * (2 * h) + 2 * (q + kv) + (up + f) + 3 * h
        flops = 2.0 * (weights if compute_params is None else compute_params / tp)
        return cls(weights * b, gemm * b, elementwise * b, flops)


def gemm_input_elements(shape: LayerShape, tp: int) -> float:
    """Per-GPU input elements of one layer's four GEMMs for one token: QKV and gate/up read the
    hidden state, the output projection this rank's heads, the down projection its MLP slice.

    Why: an FP8 W8A8 layer quantizes exactly these inputs before each GEMM (sim/scenario/quantization.py
    `activation_quant_kernels_per_layer`), reading them at the model dtype and writing 1 byte each.
    """
    h = shape.hidden_size
    return h + shape.num_attention_heads * shape.head_dim / tp + h + shape.mlp_size / tp


def layer_time_s(
    coefficients: LayerCoefficients, tokens: Any, fit: LinearFit, hbm_bytes_per_s: float, peak_flops: float
) -> Any:
    """Time of one layer's linear ops for `tokens` batch tokens (scalar or array), per GPU."""
    tokens = np.asarray(tokens, dtype=np.float64)
    bandwidth = fit.hbm_fraction * hbm_bytes_per_s
    memory = (coefficients.weight_bytes + tokens * coefficients.gemm_bytes_per_token) / bandwidth
    compute = tokens * coefficients.flops_per_token / (fit.flops_fraction * peak_flops)
    elementwise = tokens * coefficients.elementwise_bytes_per_token / bandwidth
    return fit.fixed_s + smooth_max(memory, compute, fit.smooth_p) + elementwise


def roofline_layer_time_s(
    coefficients: LayerCoefficients,
    tokens: Any,
    hbm_efficiency: float,
    flops_efficiency: float,
    hbm_bytes_per_s: float,
    peak_flops: float,
) -> Any:
    """The constants' model before the fit (hard max of weights read and GEMM FLOPs): the baseline."""
    tokens = np.asarray(tokens, dtype=np.float64)
    memory = coefficients.weight_bytes / (hbm_efficiency * hbm_bytes_per_s)
    compute = tokens * coefficients.flops_per_token / (flops_efficiency * peak_flops)
    return np.maximum(memory, compute)
