"""The float64 NumPy reference for the two timed operations, and their exact byte and FLOP counts.

Why: every CUDA kernel is checked against this on fresh random data before any timing is trusted,
and the fit needs the bytes each operation must move. Both operations are defined on a `KvLayout`, so
the reference never cares whether a layout is paged or contiguous: it follows `token_slots()`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu.errors import GpuError
from gpu.layouts import DTYPE_BYTES, KvLayout

INDEX_BYTES = 4  # one int32 block-table entry
START_SLOT_BYTES = 8  # one int64 slab start
LENGTH_BYTES = 4  # one int32 live length
OUTPUT_BYTES = 4  # attention output is float32


def bits_to_float64(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Decode uint16 bf16/fp16 bit patterns to float64 exactly."""
    bits = np.asarray(bits, dtype=np.uint16)
    if dtype == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "fp16":
        return bits.view(np.float16).astype(np.float64)
    raise GpuError(f"dtype must be bf16 or fp16, got {dtype!r}")


def _slots_matrix(layout: KvLayout) -> tuple[np.ndarray, np.ndarray]:
    """All live slots, concatenated in (sequence, token) order, and each sequence's start in that list."""
    slots = [layout.token_slots(i) for i in range(layout.batch)]
    offsets = np.concatenate([[0], np.cumsum([s.size for s in slots])]).astype(np.int64)
    flat = np.concatenate(slots) if slots else np.zeros(0, np.int64)
    return flat, offsets


def gather_reference(
    layout: KvLayout, k_pool: np.ndarray, v_pool: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Packed K and V rows of every live token: uint16 [total_tokens, kv_heads, head_dim] each.

    A gather is a copy, so the reference is bit-exact (no float conversion).
    """
    flat, _ = _slots_matrix(layout)
    k_rows = np.asarray(k_pool).reshape(-1, layout.kv_heads, layout.head_dim)
    v_rows = np.asarray(v_pool).reshape(-1, layout.kv_heads, layout.head_dim)
    return k_rows[flat], v_rows[flat]


def decode_attention_reference(
    layout: KvLayout, q_bits: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, scale: float | None = None
) -> np.ndarray:
    """GQA decode attention in float64: out[b, h] = softmax(q[b, h] . K_b^T * scale) V_b.

    q_bits: uint16 [batch, q_heads, head_dim]; query head h reads KV head h // (q_heads // kv_heads).
    A sequence with no live token gets zeros. Returns float64 [batch, q_heads, head_dim].
    """
    q = bits_to_float64(q_bits, layout.dtype)
    batch, q_heads, head_dim = q.shape
    if q_heads % layout.kv_heads or head_dim != layout.head_dim or batch != layout.batch:
        raise GpuError(
            f"q shape {q.shape} does not match the layout ({layout.kv_heads} KV heads, {head_dim=})"
        )
    group = q_heads // layout.kv_heads
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    k_all, v_all = gather_reference(layout, k_pool, v_pool)
    k_all = bits_to_float64(k_all, layout.dtype)
    v_all = bits_to_float64(v_all, layout.dtype)
    _, offsets = _slots_matrix(layout)
    out = np.zeros((batch, q_heads, head_dim), dtype=np.float64)
    for b in range(batch):
        k = k_all[offsets[b] : offsets[b + 1]]  # [T, kv_heads, D]
        v = v_all[offsets[b] : offsets[b + 1]]
        if k.shape[0] == 0:
            continue
        qg = q[b].reshape(layout.kv_heads, group, head_dim)
        scores = np.einsum("hgd,thd->hgt", qg, k) * scale
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out[b] = np.einsum("hgt,thd->hgd", p, v).reshape(q_heads, head_dim)
    return out


@dataclass(frozen=True)
class OpCost:
    """What one operation must move and compute (not what a particular kernel wastes on top)."""

    bytes: int
    flops: int
    blocks_touched: int
    kv_bytes: int
    metadata_bytes: int


def bytes_and_flops(kernel: str, layout: KvLayout, q_heads: int | None = None) -> OpCost:
    """Exact bytes moved and FLOPs of `kernel` ("gather" or "attention") on `layout`.

    Bytes: K and V rows of every live token read; lengths (4 B per sequence); the index that locates
    the tokens -- paged: every live block-table entry once (4 B); contiguous: each slab start (8 B);
    gather: the packed K and V written back; attention: q read (2 B per element) and the float32 output
    written. FLOPs: attention does 2*D for q.k and 2*D for p.v per token per query head (softmax's
    exponentials not counted); a gather does none. blocks_touched: paged, live blocks summed over
    sequences (a shared block counts once per sequence that reads it); contiguous, one per live slab.
    The kernels' own scratch (launch plan, split-K partials) is implementation overhead, not counted.
    """
    lengths = layout.lengths_tokens.astype(np.int64)
    live_tokens = int(lengths.sum())
    live_seqs = int((lengths > 0).sum())
    kv_bytes = 2 * live_tokens * layout.row_bytes
    if layout.paged:
        blocks_touched = int(layout.blocks_per_seq().sum())
        index_bytes = blocks_touched * INDEX_BYTES
    else:
        blocks_touched = live_seqs
        index_bytes = layout.batch * START_SLOT_BYTES
    metadata_bytes = index_bytes + layout.batch * LENGTH_BYTES
    if kernel == "gather":
        return OpCost(2 * kv_bytes + metadata_bytes, 0, blocks_touched, kv_bytes, metadata_bytes)
    if kernel == "attention":
        if q_heads is None or q_heads < layout.kv_heads or q_heads % layout.kv_heads:
            raise GpuError(
                f"q_heads must be a positive multiple of kv_heads={layout.kv_heads}, got {q_heads}"
            )
        q_bytes = layout.batch * q_heads * layout.head_dim * DTYPE_BYTES
        out_bytes = layout.batch * q_heads * layout.head_dim * OUTPUT_BYTES
        flops = 4 * live_tokens * q_heads * layout.head_dim
        return OpCost(
            kv_bytes + q_bytes + out_bytes + metadata_bytes, flops, blocks_touched, kv_bytes, metadata_bytes
        )
    raise GpuError(f"kernel must be 'gather' or 'attention', got {kernel!r}")
