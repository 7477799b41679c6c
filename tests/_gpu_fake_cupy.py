"""A NumPy stand-in for the parts of CuPy that gpu/ uses, with the CUDA kernels emulated from kernels.cu.

Why: developers have no GPU, yet the launch code (argument order, plans, workspaces, replicas, graph
capture, timing bookkeeping) is plain Python that can break. Each emulated kernel reads its raw
arguments exactly as the CUDA signature in gpu/kernels.cu declares them, so a launcher that passes
arguments in the wrong order or the wrong plan fails here the way it would fail on a device. It says
nothing about the CUDA code itself (that is what the NVRTC check and the `gpu` tests are for).
"""

from __future__ import annotations

import ctypes
import re
import time
import weakref
from types import SimpleNamespace
from typing import Any

import numpy as np

uint8, uint16, uint32, float16, float32, int32, int64 = (
    np.uint8, np.uint16, np.uint32, np.float16, np.float32, np.int32, np.int64,
)  # fmt: skip
__version__ = "fake-numpy"
_capturing: list[list] = []  # stack of graphs being captured


class DevArray(np.ndarray):
    """An ndarray with CuPy's `.data.ptr` and `.get()`."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def get(self) -> np.ndarray:
        return np.array(self)


class _Memory:
    """Device bytes held by arrays the stand-in allocated: now, and the most at any one time.

    Why: the per-point memory cap is a promise about device memory; counting every allocation (and
    its release, when the array is collected) lets a test check it without a device.
    """

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0

    def allocate(self, nbytes: int) -> None:
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def release(self, nbytes: int) -> None:
        self.live_bytes -= nbytes

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes


memory = _Memory()


def _alloc(shape: Any, dtype: Any) -> DevArray:
    """A DevArray that owns its memory (so views keep it, and its bytes, alive)."""
    array = DevArray(shape, dtype=dtype)
    memory.allocate(int(array.nbytes))
    weakref.finalize(array, memory.release, int(array.nbytes))
    return array


def _dev(x: Any) -> DevArray:
    host = np.asarray(x)
    array = _alloc(host.shape, host.dtype)
    array[...] = host
    return array


def asarray(x: Any, dtype: Any = None) -> DevArray:
    return _dev(np.asarray(x, dtype=dtype))


def asnumpy(x: Any) -> np.ndarray:
    return np.array(x)


def empty(shape: Any, dtype: Any = np.float32) -> DevArray:
    return _alloc(shape, dtype)


def empty_like(x: Any) -> DevArray:
    return _alloc(x.shape, x.dtype)


def full(shape: Any, value: Any, dtype: Any) -> DevArray:
    array = _alloc(shape, dtype)
    array[...] = value
    return array


def zeros(shape: Any, dtype: Any = np.float32) -> DevArray:
    return full(shape, 0, dtype)


def ones(shape: Any, dtype: Any = np.float32) -> DevArray:
    return full(shape, 1, dtype)


def is_available() -> bool:
    return True


class _RandomState:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def standard_normal(self, size: Any, dtype: Any = np.float64) -> DevArray:
        return _dev(self.rng.standard_normal(size, dtype=dtype))


random = SimpleNamespace(RandomState=_RandomState)


# ---------------------------------------------------------------------------------------------
# cupy.cuda


class _Stream:
    def __init__(self, non_blocking: bool = False) -> None:
        self.ptr = id(self)

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def begin_capture(self) -> None:
        _capturing.append([])

    def end_capture(self) -> Any:
        launches = _capturing.pop()
        return SimpleNamespace(launch=lambda stream=None: [f() for f in launches])


class _Event:
    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        return None


def _props(device: int) -> dict[str, Any]:
    return {"name": b"FakeGPU", "major": 9, "minor": 0, "multiProcessorCount": 4, "l2CacheSize": 1 << 20}


def _memset(ptr: int, value: int, nbytes: int, stream: int = 0) -> None:
    ctypes.memset(ptr, value, nbytes)


def _memcpy(dst: int, src: int, nbytes: int, kind: int, stream: int = 0) -> None:
    ctypes.memmove(dst, src, nbytes)


runtime = SimpleNamespace(
    getDeviceProperties=_props,
    memGetInfo=lambda: (8 << 30, 16 << 30),
    driverGetVersion=lambda: 13000,
    runtimeGetVersion=lambda: 13000,
    memsetAsync=_memset,
    memcpyAsync=_memcpy,
    memcpyDeviceToDevice=3,
)
cuda = SimpleNamespace(
    Stream=_Stream, Event=_Event, runtime=runtime, get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3 + 1e-3
)


# ---------------------------------------------------------------------------------------------
# Kernels, emulated from the signatures in gpu/kernels.cu


def _bits_to_f32(bits: np.ndarray, dtype_code: int) -> np.ndarray:
    if dtype_code == 0:
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


def _slot(
    paged: bool, block_table: np.ndarray, max_blocks: int, start_slots: np.ndarray, seq: int, t: np.ndarray,
    block_size: int,
) -> np.ndarray:  # fmt: skip
    if paged:
        blocks = block_table.reshape(-1)[seq * max_blocks + t // block_size].astype(np.int64)
        assert (blocks >= 0).all(), "kernel read a -1 block-table entry"
        return blocks * block_size + t % block_size
    return int(start_slots[seq]) + t


def _as_vec16(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8).reshape(-1, 16)


def _gather(paged: bool, args: tuple) -> None:
    (k_pool, v_pool, k_out, v_out, table, max_blocks, starts, lengths, out_offsets, chunk_seq, chunk_start,
     chunk_tokens, block_size, row_vecs) = args  # fmt: skip
    kp, vp, ko, vo = (_as_vec16(x) for x in (k_pool, v_pool, k_out, v_out))
    for seq, t0 in zip(chunk_seq.tolist(), chunk_start.tolist(), strict=True):
        t = np.arange(t0, min(t0 + int(chunk_tokens), int(lengths[seq])))
        src = _slot(paged, table, int(max_blocks), starts, seq, t, int(block_size)) * int(row_vecs)
        dst = (int(out_offsets[seq]) + t) * int(row_vecs)
        cols = np.arange(int(row_vecs))
        ko[(dst[:, None] + cols).reshape(-1)] = kp[(src[:, None] + cols).reshape(-1)]
        vo[(dst[:, None] + cols).reshape(-1)] = vp[(src[:, None] + cols).reshape(-1)]


def _attention_partial(paged: bool, dtype: int, head_dim: int, group: int, grid: tuple, args: tuple) -> None:
    (q, k_pool, v_pool, table, max_blocks, starts, lengths, chunk_seq, chunk_start, chunk_tokens, block_size,
     kv_heads, scale_log2, part_m, part_l, part_acc) = args  # fmt: skip
    kv_heads = int(kv_heads)
    assert grid == (chunk_seq.size, kv_heads), f"attention grid {grid} does not match the plan"
    qf = _bits_to_f32(np.asarray(q).reshape(-1), dtype).reshape(-1, kv_heads * group, head_dim)
    k_bits = np.asarray(k_pool).reshape(-1).view(np.uint16).reshape(-1, kv_heads, head_dim)
    v_bits = np.asarray(v_pool).reshape(-1).view(np.uint16).reshape(-1, kv_heads, head_dim)
    pm, pl, pa = part_m.reshape(-1), part_l.reshape(-1), part_acc.reshape(-1, head_dim)
    for c, (seq, t0) in enumerate(zip(chunk_seq.tolist(), chunk_start.tolist(), strict=True)):
        t = np.arange(t0, min(t0 + int(chunk_tokens), int(lengths[seq])))
        slots = _slot(paged, table, int(max_blocks), starts, seq, t, int(block_size))
        kf = _bits_to_f32(k_bits[slots], dtype)  # [tokens, kv_heads, head_dim]
        vf = _bits_to_f32(v_bits[slots], dtype)
        for head in range(kv_heads):
            for g in range(group):
                s = kf[:, head] @ (qf[seq, head * group + g] * np.float32(scale_log2))
                m = s.max()
                p = np.exp2(s - m)
                idx = (c * kv_heads + head) * group + g
                pm[idx], pl[idx], pa[idx] = m, p.sum(), p @ vf[:, head]


def _attention_reduce(grid: tuple, args: tuple) -> None:
    part_m, part_l, part_acc, chunk_begin, out, kv_heads, group, head_dim = args
    batch, q_heads = grid
    head_dim, group, kv_heads = int(head_dim), int(group), int(kv_heads)
    acc = part_acc.reshape(-1, head_dim)
    o = out.reshape(batch, q_heads, head_dim)
    for b in range(batch):
        c0, c1 = int(chunk_begin[b]), int(chunk_begin[b + 1])
        for qh in range(q_heads):
            idx = (np.arange(c0, c1) * kv_heads + qh // group) * group + qh % group
            if idx.size == 0:
                o[b, qh] = 0.0
                continue
            m = part_m.reshape(-1)[idx]
            w = np.exp2(m - m.max())
            o[b, qh] = (w[:, None] * acc[idx]).sum(0) / (w * part_l.reshape(-1)[idx]).sum()


class _Kernel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, grid: tuple, block: tuple, args: tuple, **kwargs: Any) -> None:
        if _capturing:
            _capturing[-1].append(lambda: self._run(grid, args))
        else:
            self._run(grid, args)

    def _run(self, grid: tuple, args: tuple) -> None:
        m = re.fullmatch(r"(\w+)(?:<(.*)>)?", self.name)
        assert m, self.name
        base, targs = m.group(1), [a.strip() for a in (m.group(2) or "").split(",") if a.strip()]
        if base == "gather_kv":
            assert grid == (args[9].size,), f"gather grid {grid} does not match the plan"
            _gather(targs[0] == "true", args)
        elif base == "decode_attention_partial":
            _attention_partial(targs[0] == "true", int(targs[1]), int(targs[2]), int(targs[3]), grid, args)
        elif base == "decode_attention_reduce":
            _attention_reduce(grid, args)
        elif base == "stream_read":
            src, n_vecs, sink = args
            assert src.nbytes // 16 == int(n_vecs)
        else:  # pragma: no cover
            raise AssertionError(f"unknown kernel {self.name}")


class RawModule:
    def __init__(
        self, code: str, options: tuple = (), name_expressions: list | None = None, backend: str = ""
    ) -> None:
        assert "decode_attention_partial" in code
        self.names = set(name_expressions or [])

    def get_function(self, name: str) -> _Kernel:
        assert name in self.names, f"{name} was not instantiated"
        return _Kernel(name)
