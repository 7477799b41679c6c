"""A NumPy stand-in for the parts of CuPy that gpu/ uses, with the CUDA kernels emulated from kernels.cu.

Why: developers have no GPU, yet the launch code (argument order, plans, workspaces, replicas, graph
capture, timing bookkeeping) is plain Python that can break. Each emulated kernel reads its raw
arguments exactly as the CUDA signature in gpu/kernels.cu declares them, so a launcher that passes
arguments in the wrong order or the wrong plan fails here the way it would fail on a device. It says
nothing about the CUDA code itself (that is what the NVRTC check and the `gpu` tests are for).

Streams are modelled for ordering, not for time: every write (an upload, a fill, a kernel's arguments,
a memset or copy) is recorded against the stream it was issued on, and stays "in flight" until that
stream, an event recorded after it, or the whole device is synchronised. A kernel, copy or `asnumpy`
that touches an array whose last write is still in flight on a stream it is not ordered after raises
`StreamRaceError`, as CUDA's stream semantics allow the read to see old bytes. The legacy default
stream (`Stream.null`) is ordered with blocking streams and NOT with `non_blocking=True` ones.
The memory pool is modelled too: freed arrays stay cached (`held_bytes`) until `free_all_blocks()`.
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


class StreamRaceError(RuntimeError):
    """A device read of bytes whose write, on another unordered stream, may still be in flight."""


class DevArray(np.ndarray):
    """An ndarray with CuPy's `.data.ptr` and `.get()`; writes through it are recorded per stream."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def get(self) -> np.ndarray:
        return asnumpy(self)

    def fill(self, value: Any) -> None:
        streams.write(self, streams.current(), "fill")
        super().fill(value)

    def __setitem__(self, key: Any, value: Any) -> None:
        streams.write(self, streams.current(), "setitem")
        super().__setitem__(key, value)


class _Memory:
    """Device bytes held by arrays the stand-in allocated, and by CuPy's pool after they are freed.

    Why: the per-point memory cap is a promise about device memory; counting every allocation (and
    its release, when the array is collected) lets a test check it without a device. As in CuPy, a
    freed block stays in the pool (`cached_bytes`, reused by later allocations) until
    `get_default_memory_pool().free_all_blocks()`.
    """

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0
        self.cached_bytes = 0

    @property
    def held_bytes(self) -> int:
        """Device memory taken from the driver: live arrays plus the pool's cached blocks."""
        return self.live_bytes + self.cached_bytes

    def allocate(self, nbytes: int) -> None:
        self.cached_bytes -= min(self.cached_bytes, nbytes)
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def release(self, nbytes: int) -> None:
        self.live_bytes -= nbytes
        self.cached_bytes += nbytes

    def free_all_blocks(self) -> None:
        self.cached_bytes = 0

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes


memory = _Memory()


def get_default_memory_pool() -> Any:
    return SimpleNamespace(
        free_all_blocks=memory.free_all_blocks,
        used_bytes=lambda: memory.live_bytes,
        total_bytes=lambda: memory.held_bytes,
    )


def _owner(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory of `array` (a view's base, followed to the end)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _alloc(shape: Any, dtype: Any) -> DevArray:
    """A DevArray that owns its memory (so views keep it, and its bytes, alive)."""
    array = DevArray(shape, dtype=dtype)
    memory.allocate(int(array.nbytes))
    streams.register(array)
    weakref.finalize(array, memory.release, int(array.nbytes))
    weakref.finalize(array, streams.forget, id(array))
    return array


def _dev(x: Any) -> DevArray:
    host = np.asarray(x)
    array = _alloc(host.shape, host.dtype)
    np.ndarray.__setitem__(array, ..., host)
    streams.write(array, streams.current(), "upload")  # cupy.asarray copies on the current stream
    return array


def asarray(x: Any, dtype: Any = None) -> DevArray:
    return _dev(np.asarray(x, dtype=dtype))


def asnumpy(x: Any) -> np.ndarray:
    """Copy to the host on the current stream and wait for that stream (as cupy.asnumpy does)."""
    if isinstance(x, DevArray):
        stream = streams.current()
        streams.read(x, stream, "asnumpy")
        stream.synchronize()
    return np.array(x)


def empty(shape: Any, dtype: Any = np.float32) -> DevArray:
    return _alloc(shape, dtype)


def empty_like(x: Any) -> DevArray:
    return _alloc(x.shape, x.dtype)


def full(shape: Any, value: Any, dtype: Any) -> DevArray:
    array = _alloc(shape, dtype)
    array[...] = value  # a fill kernel on the current stream
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
    def __init__(self, non_blocking: bool = False, *, null: bool = False) -> None:
        self.non_blocking = non_blocking
        self.ptr = 0 if null else id(self)
        self.name = "null" if null else f"stream@{self.ptr:x}" + (" (non_blocking)" if non_blocking else "")
        streams.by_ptr[self.ptr] = self

    def __enter__(self) -> _Stream:
        streams.stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        streams.stack.pop()

    def synchronize(self) -> None:
        streams.synchronize(self)

    def begin_capture(self) -> None:
        _capturing.append([])

    def end_capture(self) -> Any:
        launches = _capturing.pop()

        def launch(stream: _Stream | None = None) -> None:
            for kernel, grid, args in launches:
                kernel._launch(grid, args, stream or streams.current())

        return SimpleNamespace(launch=launch)


class _Streams:
    """Which stream last wrote each allocation, with a sequence number, until that write is synchronised."""

    def __init__(self) -> None:
        self.stack: list[_Stream] = []
        self.by_ptr: dict[int, _Stream] = {}
        self.pending: dict[int, tuple[_Stream, int, str]] = {}
        self.allocations: dict[int, tuple[int, int, weakref.ref]] = {}  # id -> (ptr, nbytes, array)
        self.seq = 0
        self.null: _Stream | None = None

    def current(self) -> _Stream:
        if self.stack:
            return self.stack[-1]
        assert self.null is not None
        return self.null

    def register(self, array: np.ndarray) -> None:
        self.allocations[id(array)] = (
            array.__array_interface__["data"][0],
            int(array.nbytes),
            weakref.ref(array),
        )

    def forget(self, key: int) -> None:
        self.pending.pop(key, None)
        self.allocations.pop(key, None)

    @staticmethod
    def ordered(first: _Stream, then: _Stream) -> bool:
        """Whether work on `then` is ordered after earlier work on `first` without any synchronisation."""
        if first is then:
            return True
        legacy = first.ptr == 0 or then.ptr == 0  # the legacy default stream syncs with blocking streams
        return legacy and not (first.non_blocking or then.non_blocking)

    def _key(self, array: np.ndarray) -> int | None:
        key = id(_owner(array))
        return key if key in self.allocations else None

    def write(self, array: np.ndarray, stream: _Stream, what: str) -> None:
        key = self._key(array)
        if key is None:
            return
        self.read_key(key, stream, what)
        self.seq += 1
        self.pending[key] = (stream, self.seq, what)

    def read(self, array: np.ndarray, stream: _Stream, what: str) -> None:
        key = self._key(array)
        if key is not None:
            self.read_key(key, stream, what)

    def read_key(self, key: int, stream: _Stream, what: str) -> None:
        entry = self.pending.get(key)
        if entry is not None and not self.ordered(entry[0], stream):
            raise StreamRaceError(
                f"{what} on {stream.name} touches an array whose {entry[2]} on {entry[0].name} may still "
                "be in flight (no synchronisation between the two streams)"
            )

    def owner_at(self, ptr: int) -> tuple[int, np.ndarray] | None:
        """(allocation id, owning array) of the allocation holding device address `ptr`."""
        for key, (start, nbytes, ref) in self.allocations.items():
            if start <= ptr < start + max(nbytes, 1):
                array = ref()
                if array is not None:
                    return key, array
        return None

    def synchronize(self, stream: _Stream, upto_seq: int | None = None) -> None:
        for key, (s, seq, _) in list(self.pending.items()):
            if s is stream and (upto_seq is None or seq <= upto_seq):
                del self.pending[key]

    def synchronize_device(self) -> None:
        self.pending.clear()


streams = _Streams()
Stream = _Stream
Stream.null = _Stream(null=True)  # type: ignore[attr-defined]
streams.null = Stream.null  # type: ignore[attr-defined]


class _Event:
    def record(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else streams.current()
        self.seq = streams.seq
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        streams.synchronize(self.stream, self.seq)


def _props(device: int) -> dict[str, Any]:
    return {"name": b"FakeGPU", "major": 9, "minor": 0, "multiProcessorCount": 4, "l2CacheSize": 1 << 20}


def _stream_of(ptr: int) -> _Stream:
    return streams.by_ptr[int(ptr)]


def _bytes_at(ptr: int, nbytes: int, stream: _Stream, what: str, write: bool) -> np.ndarray:
    """A uint8 view of `nbytes` device bytes at `ptr`, after the stream-order check (and write record)."""
    found = streams.owner_at(ptr)
    assert found is not None, f"{what}: address {ptr:#x} is not in any live allocation"
    key, owner = found
    start = owner.__array_interface__["data"][0]
    assert ptr + nbytes <= start + owner.nbytes, f"{what}: {nbytes} bytes at {ptr:#x} overrun the allocation"
    (streams.write if write else streams.read)(owner, stream, what)
    flat = np.ndarray.reshape(owner, -1).view(np.uint8)
    return flat[ptr - start : ptr - start + nbytes]


def _memset(ptr: int, value: int, nbytes: int, stream: int = 0) -> None:
    np.ndarray.fill(_bytes_at(ptr, nbytes, _stream_of(stream), "memsetAsync", write=True), value)


def _memcpy(dst: int, src: int, nbytes: int, kind: int, stream: int = 0) -> None:
    on = _stream_of(stream)
    source = _bytes_at(src, nbytes, on, "memcpyAsync", write=False).copy()
    np.ndarray.__setitem__(_bytes_at(dst, nbytes, on, "memcpyAsync", write=True), ..., source)


runtime = SimpleNamespace(
    getDeviceProperties=_props,
    memGetInfo=lambda: (8 << 30, 16 << 30),
    driverGetVersion=lambda: 13000,
    runtimeGetVersion=lambda: 13000,
    memsetAsync=_memset,
    memcpyAsync=_memcpy,
    memcpyDeviceToDevice=3,
    deviceSynchronize=streams.synchronize_device,
)


# cuBLAS: gemmEx only (gpu/linear.py), emulated from cublasGemmEx's column-major contract.
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
gemm_calls: list[dict[str, int]] = []  # every gemmEx call's sizes, for tests


def _bf16_matrix(ptr: int, rows: int, cols: int, ld: int, stream: _Stream) -> np.ndarray:
    """A column-major [rows, cols] bf16 matrix with leading dimension ld, as float32."""
    raw = _bytes_at(ptr, 2 * ld * (cols - 1) + 2 * rows, stream, "gemmEx", write=False)
    bits = np.frombuffer(raw.tobytes() + b"\0" * 2 * (ld - rows), dtype=np.uint16).reshape(cols, ld)
    return ((bits[:, :rows].astype(np.uint32) << 16).view(np.float32)).T


def _gemm_ex(
    handle: int, transa: int, transb: int, m: int, n: int, k: int, alpha: int, a: int, a_type: int, lda: int,
    b: int, b_type: int, ldb: int, beta: int, c: int, c_type: int, ldc: int, compute_type: int, algo: int,
) -> None:  # fmt: skip
    """C (m x n) = alpha op(A) op(B) + beta C, column-major, bf16 in and out, fp32 compute (beta = 0)."""
    assert a_type == b_type == c_type == CUDA_R_16BF and compute_type == CUBLAS_COMPUTE_32F
    stream = streams.current()
    a_mat = _bf16_matrix(a, k if transa else m, m if transa else k, lda, stream)
    b_mat = _bf16_matrix(b, n if transb else k, k if transb else n, ldb, stream)
    op_a = a_mat.T if transa else a_mat
    op_b = b_mat.T if transb else b_mat
    assert op_a.shape == (m, k) and op_b.shape == (k, n), (op_a.shape, op_b.shape, m, n, k)
    scale = float(np.frombuffer(ctypes.string_at(alpha, 4), dtype=np.float32)[0])
    assert float(np.frombuffer(ctypes.string_at(beta, 4), dtype=np.float32)[0]) == 0.0
    result = (scale * (op_a.astype(np.float64) @ op_b.astype(np.float64))).astype(np.float32)
    u = result.T.reshape(-1).view(np.uint32)  # column-major order
    bits = ((u + ((u >> 16) & 1) + np.uint32(0x7FFF)) >> 16).astype(np.uint16).reshape(n, m)
    out = _bytes_at(c, 2 * ldc * (n - 1) + 2 * m, stream, "gemmEx", write=True)
    for col in range(n):
        out[2 * ldc * col : 2 * ldc * col + 2 * m] = bits[col].view(np.uint8)
    gemm_calls.append({"m": m, "n": n, "k": k, "transa": transa, "transb": transb})


cublas = SimpleNamespace(gemmEx=_gemm_ex, CUBLAS_OP_N=0, CUBLAS_OP_T=1)
device = SimpleNamespace(get_cublas_handle=lambda: 1)
cuda = SimpleNamespace(
    Stream=_Stream, Event=_Event, runtime=runtime, cublas=cublas, device=device,
    get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3 + 1e-3,
)  # fmt: skip


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


# Tests set this: the attention kernel then skips the last token of every sequence longer than it.
PLANTED_DROP_LAST_TOKEN_ABOVE: int | None = None


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
        end = int(lengths[seq])
        if PLANTED_DROP_LAST_TOKEN_ABOVE is not None and end > PLANTED_DROP_LAST_TOKEN_ABOVE:
            end -= 1
        t = np.arange(t0, min(t0 + int(chunk_tokens), end))
        if t.size == 0:  # as the CUDA kernel leaves an empty chunk: max -inf, sum 0, accumulator 0
            for idx in range((c * kv_heads) * group, (c * kv_heads + kv_heads) * group):
                pm[idx], pl[idx], pa[idx] = -np.inf, 0.0, 0.0
            continue
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


# The elementwise ops of gpu/layer_ops.cu, emulated in float32 from their signatures.


def _bf(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).reshape(-1).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _to_bf(values: np.ndarray) -> np.ndarray:
    u = np.asarray(values, dtype=np.float32).view(np.uint32)
    return ((u + ((u >> 16) & 1) + np.uint32(0x7FFF)) >> 16).astype(np.uint16)


def _rms_norm(grid: tuple, args: tuple) -> None:
    x, w, y, hidden, eps = args
    rows = _bf(x)[: grid[0] * int(hidden)].reshape(grid[0], int(hidden))
    inv = 1.0 / np.sqrt((rows * rows).mean(axis=1, keepdims=True, dtype=np.float32) + np.float32(eps))
    y.reshape(-1)[: rows.size] = _to_bf((rows * inv * _bf(w)[None, : int(hidden)]).reshape(-1))


def _residual_add(grid: tuple, args: tuple) -> None:
    a, b, out, n = args
    out.reshape(-1)[: int(n)] = _to_bf(_bf(a)[: int(n)] + _bf(b)[: int(n)])


def _silu_and_mul(grid: tuple, args: tuple) -> None:
    x, out, inter, n = args
    i = np.arange(int(n))
    t, j = i // int(inter), i % int(inter)
    flat = _bf(x)
    g, u = flat[t * 2 * int(inter) + j], flat[t * 2 * int(inter) + int(inter) + j]
    out.reshape(-1)[: int(n)] = _to_bf(g / (1 + np.exp(-g)) * u)


def _rotary_neox(grid: tuple, args: tuple) -> None:
    q, k, cos_sin, positions, q_heads, kv_heads, head_dim = args
    tokens, half, d = grid[0], int(head_dim) // 2, int(head_dim)
    cs = np.asarray(cos_sin).reshape(-1, d)[np.asarray(positions)[:tokens]]
    for buf, heads in ((q, int(q_heads)), (k, int(kv_heads))):
        rows = _bf(buf)[: tokens * heads * d].reshape(tokens, heads, d)
        x1, x2 = rows[..., :half], rows[..., half:]
        c, s = cs[:, None, :half], cs[:, None, half:]
        buf.reshape(-1)[: rows.size] = _to_bf(
            np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=2).reshape(-1)
        )


_LAYER_OPS = {
    "rms_norm": _rms_norm, "residual_add": _residual_add, "silu_and_mul": _silu_and_mul,
    "rotary_neox": _rotary_neox,
}  # fmt: skip


class _Kernel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, grid: tuple, block: tuple, args: tuple, **kwargs: Any) -> None:
        if _capturing:
            _capturing[-1].append((self, grid, args))
        else:
            self._launch(grid, args, streams.current())

    def _launch(self, grid: tuple, args: tuple, stream: _Stream) -> None:
        """Check stream order for every array argument, run, and record them as written on `stream`."""
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        for a in arrays:
            streams.read(a, stream, f"kernel {self.name}")
        streams.stack.append(stream)
        try:
            self._run(grid, args)
        finally:
            streams.stack.pop()
        for a in arrays:
            streams.write(a, stream, f"kernel {self.name}")

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
        elif base in _LAYER_OPS:
            _LAYER_OPS[base](grid, args)
        elif base == "stream_read":
            src, n_vecs, sink = args
            assert src.nbytes // 16 == int(n_vecs)
        else:  # pragma: no cover
            raise AssertionError(f"unknown kernel {self.name}")


class RawModule:
    def __init__(
        self, code: str, options: tuple = (), name_expressions: list | None = None, backend: str = ""
    ) -> None:
        assert "decode_attention_partial" in code or "rotary_neox" in code
        # templates need name expressions; extern "C" kernels are found by their plain names
        self.names = set(name_expressions or []) | set(
            re.findall(r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\(', code)
        )

    def get_function(self, name: str) -> _Kernel:
        assert name in self.names, f"{name} was not instantiated"
        return _Kernel(name)
