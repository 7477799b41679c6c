"""Shared helpers for the gpu/ tests: independent naive implementations and real allocator snapshots.

Why naive loops: the reference is checked against code that shares nothing with it (no einsum, no
vectorised gathers, Python floats and math.exp), so a bug cannot hide in both.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest

from allocators.base import Layout, SeqSpec


@pytest.fixture()
def fake_device(monkeypatch):
    """gpu.backend sees the NumPy stand-in for CuPy (tests/_gpu_fake_cupy.py), with a clean stream state."""
    import _gpu_fake_cupy

    import gpu.backend as backend
    from gpu.timing import EventTimer

    monkeypatch.setattr(backend, "_cupy_or_reason", lambda: (_gpu_fake_cupy, ""))
    monkeypatch.setattr(EventTimer, "graph_below_s", 10.0)  # CPU "kernels" are slow: still exercise graphs
    monkeypatch.setattr(_gpu_fake_cupy, "PLANTED_DROP_LAST_TOKEN_ABOVE", None)
    _gpu_fake_cupy.streams.synchronize_device()
    _gpu_fake_cupy.memory.free_all_blocks()
    return _gpu_fake_cupy


def naive_bits_to_float(bits: int, dtype: str) -> float:
    """Decode one bf16/fp16 bit pattern with struct (independent of NumPy views)."""
    if dtype == "bf16":
        return struct.unpack("<f", struct.pack("<I", int(bits) << 16))[0]
    return struct.unpack("<e", struct.pack("<H", int(bits)))[0]


def naive_slot(layout, seq: int, t: int) -> int:
    if layout.paged:
        return (
            int(layout.block_table[seq][t // layout.block_size]) * layout.block_size + t % layout.block_size
        )
    return int(layout.start_slots[seq]) + t


def naive_attention(layout, q_bits, k_pool, v_pool) -> list:
    """out[b][h][d] with Python loops and math.exp; zeros for empty sequences."""
    k_rows = np.asarray(k_pool).reshape(-1, layout.kv_heads, layout.head_dim)
    v_rows = np.asarray(v_pool).reshape(-1, layout.kv_heads, layout.head_dim)
    batch, q_heads, head_dim = q_bits.shape
    group = q_heads // layout.kv_heads
    scale = 1.0 / math.sqrt(head_dim)
    out = []
    for b in range(batch):
        per_head = []
        for h in range(q_heads):
            kvh = h // group
            q = [naive_bits_to_float(x, layout.dtype) for x in q_bits[b, h]]
            scores, values = [], []
            for t in range(int(layout.lengths_tokens[b])):
                slot = naive_slot(layout, b, t)
                k = [naive_bits_to_float(x, layout.dtype) for x in k_rows[slot, kvh]]
                scores.append(sum(qi * ki for qi, ki in zip(q, k, strict=True)) * scale)
                values.append([naive_bits_to_float(x, layout.dtype) for x in v_rows[slot, kvh]])
            if not scores:
                per_head.append([0.0] * head_dim)
                continue
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            per_head.append(
                [sum(w * v[d] for w, v in zip(weights, values, strict=True)) / total for d in range(head_dim)]
            )
        out.append(per_head)
    return out


def paged_snapshot(seed: int = 0, capacity_tokens: int = 4096, block_size: int = 16) -> Layout:
    """A real paged allocator after admissions with a shared prefix, growth and a release."""
    import allocators

    rng = np.random.default_rng(seed)
    alloc = allocators.make_allocator(
        "paged", capacity_tokens=capacity_tokens, block_size=block_size, enable_prefix_caching=True
    )
    admitted = []
    for i in range(8):
        prompt = int(rng.integers(33, 200))
        spec = SeqSpec(
            seq_id=i, prompt_tokens=prompt, max_tokens=64, output_tokens=40, prefix_group=0, prefix_tokens=32
        )
        if alloc.admit(spec):
            admitted.append(i)
    alloc.grow(np.array(admitted), 5)
    alloc.release(admitted[2])
    return alloc.layout()


def contiguous_snapshot(capacity_tokens: int = 8192, max_model_len: int = 1024) -> Layout:
    """A real contiguous allocator with a hole left by a released sequence."""
    import allocators

    alloc = allocators.make_allocator(
        "contiguous", capacity_tokens=capacity_tokens, max_model_len=max_model_len
    )
    for i in range(5):
        alloc.admit(SeqSpec(seq_id=i, prompt_tokens=50 + 30 * i, max_tokens=64, output_tokens=40))
    alloc.grow(np.arange(5), 3)
    alloc.release(1)
    return alloc.layout()


def write_results_dir(root: Path, layouts: dict[int, Layout], allocator: str = "paged") -> Path:
    """A results folder as the engine exports it: layouts/step_XXXXXXXX.npz plus layouts/index.csv."""
    folder = root / "layouts"
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["step,time_s,allocator,predicted_kv_read_s,predicted_step_s"]
    for step, layout in layouts.items():
        layout.to_npz(str(folder / f"step_{step:08d}.npz"))
        lines.append(f"{step},{step * 0.01},{allocator},1.5e-4,2.0e-2")
    (folder / "index.csv").write_text("\n".join(lines) + "\n")
    return root
