"""The five elementwise ops of a transformer layer (norms, rotary, activation, residual add), on the device.

Why: kvsim's reader of Vidur-format profiles (`kvsim cost validate`, `--calibration`) sums all nine
per-layer ops of a row -- the four GEMMs of gpu/linear.py and these five -- so a measured file must
carry all nine. Each op reads and writes what vLLM's kernel does (see gpu/layer_ops.cu for the
vLLM sources); the kernels are compiled with NVRTC from gpu/layer_ops.cu (header-free, bf16 as
uint16 bits), launched on the current stream, and checked against a float64 host reference before
any timing. Device path: NumPy, CuPy and the standard library only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpu.errors import GpuError
from gpu.layouts import fill_random_bits

ELEMENTWISE_OPS: tuple[str, ...] = (
    "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add",
)  # fmt: skip
KERNEL_NAMES: tuple[str, ...] = ("rms_norm", "residual_add", "silu_and_mul", "rotary_neox")
THREADS = 256  # NORM_THREADS in layer_ops.cu
RMS_EPS = 1e-5  # Llama-2 / Llama-3 config.json rms_norm_eps
ROPE_THETA = 10000.0  # Llama-2's rope_theta (Llama-3: 500000); timing does not depend on it
MAX_POSITION = 4096
ELEMENTWISE_REL_TOL = 2e-2  # bf16 output rounding is 2**-9 relative; fp32 math adds ~1e-6


def layer_ops_source() -> str:
    """The text of gpu/layer_ops.cu (shipped as package data)."""
    return Path(__file__).with_name("layer_ops.cu").read_text()


def compile_layer_ops(cupy: Any) -> Any:
    """The compiled module (cupy.RawModule); its kernels are extern "C", looked up by plain name."""
    return cupy.RawModule(code=layer_ops_source(), options=("-std=c++17",), backend="nvrtc")


def _f64(bits: Any) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


class LayerOps:
    """Buffers and launchers of one (model, TP) layer's elementwise ops, for up to `max_tokens` tokens."""

    def __init__(
        self, cupy: Any, module: Any, shapes: dict[str, int], rng: np.random.Generator, max_tokens: int
    ) -> None:
        """`shapes`: hidden, q_heads, kv_heads, head_dim, inter (all per GPU of the TP group)."""
        self.cupy = cupy
        self.max_tokens = max_tokens
        self.hidden, self.inter = shapes["hidden"], shapes["inter"]
        self.q_heads, self.kv_heads, self.head_dim = shapes["q_heads"], shapes["kv_heads"], shapes["head_dim"]
        self.kernels = {name: module.get_function(name) for name in KERNEL_NAMES}
        n_hidden = max_tokens * self.hidden

        def random(n: int) -> Any:
            return fill_random_bits(cupy.empty(n, dtype=cupy.uint16), rng, "bf16", cupy)

        self.a, self.b, self.out = random(n_hidden), random(n_hidden), cupy.empty(n_hidden, dtype=cupy.uint16)
        self.norm_weight = random(self.hidden)
        self.gate_up = random(max_tokens * 2 * self.inter)
        self.act_out = cupy.empty(max_tokens * self.inter, dtype=cupy.uint16)
        self.q = random(max_tokens * self.q_heads * self.head_dim)
        self.k = random(max_tokens * self.kv_heads * self.head_dim)
        half = self.head_dim // 2
        inv_freq = ROPE_THETA ** (-np.arange(half, dtype=np.float64) * 2 / self.head_dim)
        angles = np.arange(MAX_POSITION, dtype=np.float64)[:, None] * inv_freq[None, :]
        self.cos_sin_host = np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
        self.cos_sin = cupy.asarray(self.cos_sin_host)
        self.positions_host = rng.integers(0, MAX_POSITION, size=max_tokens, dtype=np.int64)
        self.positions = cupy.asarray(self.positions_host)

    def launch(self, op: str, tokens: int) -> None:
        """One op over `tokens` token rows, on the current stream."""
        if not 1 <= tokens <= self.max_tokens:
            raise GpuError(f"tokens must be in [1, {self.max_tokens}], got {tokens}")
        if op in ("input_layernorm", "post_attention_layernorm"):
            self.kernels["rms_norm"](
                (tokens,), (THREADS,),
                (self.a, self.norm_weight, self.out, np.int32(self.hidden), np.float32(RMS_EPS)),
            )  # fmt: skip
        elif op == "add":
            n = tokens * self.hidden
            self.kernels["residual_add"](_grid(n), (THREADS,), (self.a, self.b, self.out, np.int64(n)))
        elif op == "mlp_act":
            n = tokens * self.inter
            self.kernels["silu_and_mul"](
                _grid(n), (THREADS,), (self.gate_up, self.act_out, np.int32(self.inter), np.int64(n))
            )
        elif op == "attn_rope":
            self.kernels["rotary_neox"](
                (tokens,), (THREADS,),
                (self.q, self.k, self.cos_sin, self.positions, np.int32(self.q_heads),
                 np.int32(self.kv_heads), np.int32(self.head_dim)),
            )  # fmt: skip
        else:
            raise GpuError(f"op must be one of {', '.join(ELEMENTWISE_OPS)}, got {op!r}")

    def check(self, op: str, tokens: int) -> float:
        """Worst relative error (per token row, against max |ref| of the row) of one op vs float64 NumPy."""
        cp = self.cupy
        if op == "attn_rope":
            q0 = _f64(cp.asnumpy(self.q[: tokens * self.q_heads * self.head_dim]))
            k0 = _f64(cp.asnumpy(self.k[: tokens * self.kv_heads * self.head_dim]))
            self.launch(op, tokens)
            got = np.concatenate(
                [
                    _f64(cp.asnumpy(self.q[: q0.size])).reshape(tokens, -1),
                    _f64(cp.asnumpy(self.k[: k0.size])).reshape(tokens, -1),
                ],
                axis=1,
            )
            ref = np.concatenate(
                [self._rope_ref(q0, tokens, self.q_heads), self._rope_ref(k0, tokens, self.kv_heads)], axis=1
            )
        elif op == "mlp_act":
            self.act_out[: tokens * self.inter] = 0xFFFF
            self.launch(op, tokens)
            x = _f64(cp.asnumpy(self.gate_up[: tokens * 2 * self.inter])).reshape(tokens, 2, self.inter)
            ref = x[:, 0] / (1 + np.exp(-x[:, 0])) * x[:, 1]
            got = _f64(cp.asnumpy(self.act_out[: tokens * self.inter])).reshape(tokens, self.inter)
        else:
            self.out[: tokens * self.hidden] = 0xFFFF
            self.launch(op, tokens)
            a = _f64(cp.asnumpy(self.a[: tokens * self.hidden])).reshape(tokens, self.hidden)
            if op == "add":
                ref = a + _f64(cp.asnumpy(self.b[: tokens * self.hidden])).reshape(tokens, self.hidden)
            else:
                w = _f64(cp.asnumpy(self.norm_weight))
                ref = a / np.sqrt((a * a).mean(axis=1, keepdims=True) + RMS_EPS) * w[None, :]
            got = _f64(cp.asnumpy(self.out[: tokens * self.hidden])).reshape(tokens, self.hidden)
        if not np.isfinite(got).all():
            return float("inf")
        denom = np.maximum(np.abs(ref).max(axis=1, keepdims=True), 1e-30)
        return float((np.abs(got - ref) / denom).max())

    def _rope_ref(self, x: np.ndarray, tokens: int, heads: int) -> np.ndarray:
        half = self.head_dim // 2
        rows = x.reshape(tokens, heads, self.head_dim)
        cs = self.cos_sin_host[self.positions_host[:tokens]].astype(np.float64)
        cos, sin = cs[:, None, :half], cs[:, None, half:]
        x1, x2 = rows[..., :half], rows[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=2).reshape(tokens, -1)

    def free(self) -> None:
        for name in ("a", "b", "out", "norm_weight", "gate_up", "act_out", "q", "k", "cos_sin", "positions"):
            setattr(self, name, None)


def _grid(n: int) -> tuple[int]:
    """Grid-stride launch: enough CTAs for n elements, at most 65535 (the loops stride over the rest)."""
    return (max(1, min(-(-n // THREADS), 65535)),)
