"""Time the per-layer ops of real models (bf16 cuBLAS GEMMs and the elementwise ops), Vidur-style.

Why: every step time kvsim prints rests on the cost model's linear-layer term (issue 13). Vidur
measured those ops on A100 and H100 (../shared/profiles/vidur_mlp/*.mlp.csv); this module measures
them on the device at hand and writes them in the SAME CSV format, so `kvsim cost validate` and
`--calibration` read a measured H200 file exactly like Vidur's.

What is timed, per (model, TP size, batch tokens), on one GPU of the TP group, as vLLM runs it:

* the four GEMMs (`F.linear`, i.e. cuBLAS TN GEMMs, bf16 in and out, fp32 accumulation):
  attn_pre_proj -- fused QKV [tokens, hidden] x [hidden, (q_heads + 2 kv_heads) head_dim / tp];
  attn_post_proj -- [tokens, q_heads head_dim / tp] x [q_heads head_dim / tp, hidden];
  mlp_up_proj -- gate+up [tokens, hidden] x [hidden, 2 mlp / tp] (gated MLP; mlp / tp if not);
  mlp_down_proj -- [tokens, mlp / tp] x [mlp / tp, hidden];
* the five elementwise ops (gpu/layer_ops.py): input_layernorm and post_attention_layernorm (RMSNorm
  over [tokens, hidden]), attn_rope (NeoX rotary on q and k), mlp_act (SiLU-and-mul), add (residual).

These are vLLM's QKVParallelLinear / RowParallelLinear / MergedColumnParallelLinear shapes
(vllm/model_executor/layers/linear.py) and Vidur's op names (vidur/profiling/mlp/mlp_impl.py); the
embedding (`emb`, once per model, not per layer) is not timed and its columns are left out. Weights are
random bf16 (random data, not zeros: zeros run ~13 % faster, /work/.library/device/KINDS.md), and L2 is
flushed before every repeat, as a layer's weights are read from DRAM once per step in serving.

Device path: NumPy, CuPy (`cupy.cuda.cublas.gemmEx`: CuPy has no bf16 dtype, so the bits travel as
uint16, as in gpu/kernels.py) and the standard library only.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu.errors import GpuError
from gpu.layer_ops import ELEMENTWISE_OPS, LayerOps, compile_layer_ops
from gpu.layouts import DTYPE_BYTES, fill_random_bits

# cuBLAS / CUDA enum values (cublas_api.h: cublasOperation_t, cublasComputeType_t, cublasGemmAlgo_t;
# library_types.h: cudaDataType_t). Stable across CUDA 11-13.
CUBLAS_OP_N = 0
CUBLAS_OP_T = 1
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1

GEMM_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# Every per-layer op of Vidur's files, in their column order: what kvsim's reader sums per row.
OPS: tuple[str, ...] = (
    "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
    "mlp_up_proj", "mlp_act", "mlp_down_proj", "add",
)  # fmt: skip
STATS: tuple[str, ...] = ("min", "max", "mean", "median", "std")
SHAPE_COLUMNS: tuple[str, ...] = (
    "n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
    "num_tensor_parallel_workers",
)  # fmt: skip
# Vidur's column order: the time_stats block (ms) first, then the model's shape and the batch.
CSV_COLUMNS: tuple[str, ...] = (
    *(f"time_stats.{op}.{stat}" for op in OPS for stat in STATS),
    *SHAPE_COLUMNS,
)
# Batch tokens: dense where the memory-bound-to-compute-bound transition is (16-512), up to 4096 as Vidur.
NUM_TOKENS: tuple[int, ...] = (
    1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
)  # fmt: skip
TP_SIZES: tuple[int, ...] = (1, 2, 4, 8)
LINEAR_REL_TOL = 2e-2  # bf16 output rounding is 2**-9 = 2e-3 relative; fp32 accumulation adds ~1e-6


@dataclass(frozen=True)
class ModelShape:
    """A model's layer shape, with the values Vidur's files carry (so measured rows match theirs)."""

    name: str
    n_head: int
    n_kv_head: int
    n_embd: int
    n_expanded_embd: int
    vocab_size: int
    use_gated_mlp: bool = True

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def op_shapes(self, tp: int) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each GEMM on one GPU of a TP group of size `tp`."""
        if self.n_head % tp or self.n_expanded_embd % tp or (self.n_kv_head % tp and tp % self.n_kv_head):
            raise GpuError(f"{self.name}: tensor_parallel_size {tp} does not divide its heads and MLP")
        kv_per_gpu = max(self.n_kv_head // tp, 1)  # vLLM replicates KV heads when tp > n_kv_head
        q_per_gpu = self.n_head // tp
        up = (2 if self.use_gated_mlp else 1) * self.n_expanded_embd // tp
        return {
            "attn_pre_proj": (self.n_embd, (q_per_gpu + 2 * kv_per_gpu) * self.head_dim),
            "attn_post_proj": (q_per_gpu * self.head_dim, self.n_embd),
            "mlp_up_proj": (self.n_embd, up),
            "mlp_down_proj": (self.n_expanded_embd // tp, self.n_embd),
        }

    def elementwise_shapes(self, tp: int) -> dict[str, int]:
        """What the norms, rotary, activation and add see on one GPU of the TP group."""
        return {
            "hidden": self.n_embd,
            "q_heads": self.n_head // tp,
            "kv_heads": max(self.n_kv_head // tp, 1),
            "head_dim": self.head_dim,
            "inter": self.n_expanded_embd // tp,
        }

    def shape_row(self, tp: int, num_tokens: int) -> dict[str, Any]:
        return {
            "n_head": self.n_head,
            "n_kv_head": self.n_kv_head,
            "n_embd": self.n_embd,
            "n_expanded_embd": self.n_expanded_embd,
            "vocab_size": self.vocab_size,
            "use_gated_mlp": self.use_gated_mlp,
            "num_tokens": num_tokens,
            "num_tensor_parallel_workers": tp,
        }


# The models of ../shared/profiles/vidur_mlp (shapes from each model's Hugging Face config.json;
# vocab_size as Vidur's files record it: Llama-2's 32000 padded to 32768 by Vidur's model config).
MODEL_SHAPES: tuple[ModelShape, ...] = (
    ModelShape("meta-llama/Llama-2-7b-hf", 32, 32, 4096, 11008, 32768),
    ModelShape("meta-llama/Meta-Llama-3-8B", 32, 8, 4096, 14336, 128256),
    ModelShape("meta-llama/Llama-2-70b-hf", 64, 8, 8192, 28672, 32768),
)


def gemm_flops(tokens: int, in_features: int, out_features: int) -> int:
    return 2 * tokens * in_features * out_features


def gemm_bytes(tokens: int, in_features: int, out_features: int) -> int:
    """Weights, input and output once each (bf16)."""
    return DTYPE_BYTES * (in_features * out_features + tokens * (in_features + out_features))


class LinearLayer:
    """One (model, TP) layer's four weight matrices and its elementwise ops' buffers; launchers of all nine.

    Weights are stored as PyTorch stores them, [out_features, in_features] row-major, and launched as
    vLLM's F.linear is: y = x W^T, which in cuBLAS's column-major terms is C[out, tokens] =
    op_T(W)[out, in] x X[in, tokens] (transa = T, transb = N).
    """

    def __init__(
        self,
        cupy: Any,
        model: ModelShape,
        tp: int,
        rng: np.random.Generator,
        max_tokens: int,
        module: Any = None,
    ) -> None:
        """`module`: the compiled gpu/layer_ops.cu (compile_layer_ops), shared by every layer of a run."""
        self.cupy = cupy
        self.model = model
        self.tp = tp
        self.shapes = model.op_shapes(tp)
        self.weights = {
            op: fill_random_bits(cupy.empty(i * o, dtype=cupy.uint16), rng, "bf16", cupy)
            for op, (i, o) in self.shapes.items()
        }
        self.max_tokens = max_tokens
        max_in = max(i for i, _ in self.shapes.values())
        max_out = max(o for _, o in self.shapes.values())
        self.x = fill_random_bits(cupy.empty(max_tokens * max_in, dtype=cupy.uint16), rng, "bf16", cupy)
        self.y = cupy.empty(max_tokens * max_out, dtype=cupy.uint16)
        self._alpha = np.ones(1, dtype=np.float32)
        self._beta = np.zeros(1, dtype=np.float32)
        self._handle = cupy.cuda.device.get_cublas_handle()
        module = compile_layer_ops(cupy) if module is None else module
        self.elementwise = LayerOps(cupy, module, model.elementwise_shapes(tp), rng, max_tokens)

    @property
    def weight_bytes(self) -> int:
        return sum(int(w.nbytes) for w in self.weights.values())

    def launch(self, op: str, tokens: int) -> None:
        """One op over `tokens` rows, on the current stream; a GEMM computes y = x W_op^T."""
        if op in ELEMENTWISE_OPS:
            self.elementwise.launch(op, tokens)
            return
        if not 1 <= tokens <= self.max_tokens:
            raise GpuError(f"tokens must be in [1, {self.max_tokens}], got {tokens}")
        in_f, out_f = self.shapes[op]
        self.cupy.cuda.cublas.gemmEx(
            self._handle, CUBLAS_OP_T, CUBLAS_OP_N, out_f, tokens, in_f,
            self._alpha.ctypes.data, self.weights[op].data.ptr, CUDA_R_16BF, in_f,
            self.x.data.ptr, CUDA_R_16BF, in_f,
            self._beta.ctypes.data, self.y.data.ptr, CUDA_R_16BF, out_f,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip

    def check(self, op: str, tokens: int, max_columns: int = 256) -> float:
        """Worst relative error of one GEMM against a float64 host reference (on <= max_columns outputs).

        Why: a swapped transpose or leading dimension gives plausible timings and wrong shapes; the
        check runs before any timing. Relative to max |ref| per token row (bf16 output rounding ~4e-3).
        Elementwise ops are checked by LayerOps.check.
        """
        if op in ELEMENTWISE_OPS:
            return self.elementwise.check(op, tokens)
        cp = self.cupy
        in_f, out_f = self.shapes[op]
        cols = min(out_f, max_columns)
        self.y[: tokens * out_f] = 0xFFFF  # NaN bits: an unwritten output fails
        self.launch(op, tokens)
        got = _bf16_to_f64(cp.asnumpy(self.y[: tokens * out_f]).reshape(tokens, out_f)[:, :cols])
        w = _bf16_to_f64(cp.asnumpy(self.weights[op][: cols * in_f]).reshape(cols, in_f))
        x = _bf16_to_f64(cp.asnumpy(self.x[: tokens * in_f]).reshape(tokens, in_f))
        ref = x @ w.T
        if not np.isfinite(got).all():
            return float("inf")
        denom = np.maximum(np.abs(ref).max(axis=1, keepdims=True), 1e-30)
        return float((np.abs(got - ref) / denom).max())

    def free(self) -> None:
        self.weights.clear()
        self.x = self.y = None
        self.elementwise.free()


def _bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def check_linear(
    cupy: Any,
    rng: np.random.Generator,
    models: Iterable[ModelShape] | None = None,
    tokens: int = 7,
    tp: int | None = None,
) -> list[dict[str, Any]]:
    """Every op of every model against a host reference (default: at the largest TP, the smallest weights).

    The input has room for twice `tokens` rows, so a launch that reads the wrong rows reads real data
    (and fails the comparison) rather than running off the end.
    """
    results = []
    tp = max(TP_SIZES) if tp is None else tp
    module = compile_layer_ops(cupy)
    for model in MODEL_SHAPES if models is None else models:
        layer = LinearLayer(cupy, model, tp, rng, max_tokens=2 * tokens, module=module)
        for op in OPS:
            err = layer.check(op, tokens)
            results.append(
                {"model": model.name, "tp": tp, "op": op, "rel_err": err, "ok": err < LINEAR_REL_TOL}
            )
        layer.free()
    return results


def time_layer(
    layer: LinearLayer,
    timer: Any,
    num_tokens: int,
    repeats: int,
) -> dict[str, Any]:
    """One Vidur-format row: the nine ops at `num_tokens`, each timed with L2 flushed (ms stats)."""
    row: dict[str, Any] = {}
    for op in OPS:
        timing = timer.time([lambda op=op: layer.launch(op, num_tokens)], repeats=repeats)
        samples_ms = np.asarray(timing.samples_s, dtype=np.float64) * 1e3
        row.update(
            {
                f"time_stats.{op}.min": float(samples_ms.min()),
                f"time_stats.{op}.max": float(samples_ms.max()),
                f"time_stats.{op}.mean": float(samples_ms.mean()),
                f"time_stats.{op}.median": float(np.median(samples_ms)),
                f"time_stats.{op}.std": float(samples_ms.std()),
            }
        )
    row.update(layer.model.shape_row(layer.tp, num_tokens))
    return row


def run_linear(
    cupy: Any,
    timer: Any,
    rng: np.random.Generator,
    *,
    models: Iterable[ModelShape] | None = None,
    tp_sizes: Iterable[int] | None = None,
    num_tokens: Iterable[int] | None = None,
    repeats: int = 20,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
    on_error: Callable[[dict[str, Any]], None] = lambda entry: None,
    deadline: Callable[[], bool] = lambda: False,
) -> tuple[list[dict[str, Any]], int]:
    """Time every (model, TP, batch tokens) row; returns (rows, rows skipped by `deadline`).

    Each row is handed to `on_row` as soon as it is measured (the device script appends it to the
    CSV); an exception in one row goes to `on_error` and the run goes on with the next. Unset
    arguments take the module's MODEL_SHAPES, TP_SIZES and NUM_TOKENS (read at call time).
    """
    tokens = tuple(NUM_TOKENS if num_tokens is None else num_tokens)
    plan = [(m, tp) for m in (MODEL_SHAPES if models is None else models) for tp in (tp_sizes or TP_SIZES)]
    rows: list[dict[str, Any]] = []
    skipped = 0
    module = compile_layer_ops(cupy)
    for i, (model, tp) in enumerate(plan):
        if deadline():
            skipped += (len(plan) - i) * len(tokens)
            break
        try:
            layer = LinearLayer(cupy, model, tp, rng, max_tokens=max(tokens), module=module)
        except Exception as exc:
            on_error({"what": f"linear {model.name} tp={tp} (allocating the layer)", "error": _one_line(exc)})
            continue
        for j, n in enumerate(tokens):
            if deadline():
                skipped += len(tokens) - j
                break
            try:
                row = time_layer(layer, timer, n, repeats)
            except Exception as exc:
                on_error({"what": f"linear {model.name} tp={tp} num_tokens={n}", "error": _one_line(exc)})
                continue
            rows.append(row)
            on_row(row)
        layer.free()
        timer.free_pool()
    return rows, skipped


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def rows_to_csv(rows: Iterable[dict[str, Any]]) -> str:
    """Rows as CSV text in Vidur's column order (CSV_COLUMNS); booleans as True/False like Vidur."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row.get(k, "") for k in CSV_COLUMNS})
    return buffer.getvalue()


def linear_summary(rows: list[dict[str, Any]], read_bytes_per_s: float, peak_flops: float = 989e12) -> dict:
    """Achieved fractions: weight-read bandwidth at 1 token and TFLOP/s at the largest batch, per op.

    `peak_flops` defaults to the H100/H200 SXM dense bf16 datasheet figure (989 TFLOP/s; H200.md).
    """
    out: dict[str, Any] = {"rows": len(rows), "peak_flops": peak_flops}
    key = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")
    shapes = {tuple(getattr(m, k) for k in key): m for m in MODEL_SHAPES}
    read_fractions, flop_fractions = [], []
    max_tokens = max((int(r["num_tokens"]) for r in rows), default=0)
    for row in rows:
        model = shapes.get(tuple(int(row[k]) for k in key))
        if model is None:
            continue
        for op, (i, o) in model.op_shapes(int(row["num_tensor_parallel_workers"])).items():  # GEMMs
            t = float(row[f"time_stats.{op}.median"]) * 1e-3
            n = int(row["num_tokens"])
            if n == 1:
                read_fractions.append(gemm_bytes(n, i, o) / t / read_bytes_per_s)
            if n == max_tokens:
                flop_fractions.append(gemm_flops(n, i, o) / t / peak_flops)
    if read_fractions:
        out["median_read_fraction_at_1_token"] = float(np.median(read_fractions))
    if flop_fractions:
        out["median_flops_fraction_at_max_tokens"] = float(np.median(flop_fractions))
        out["best_flops_fraction_at_max_tokens"] = float(np.max(flop_fractions))
    return out
