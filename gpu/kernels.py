"""Load and launch the CUDA kernels of kernels.cu; plan their work split; check they compile.

Why the plan lives here, in Python: paged and contiguous launches must split work identically, and
by LIVE length. (The known trap: a split sized from cache capacity gives the contiguous kernel many
empty CTAs over its reserved tails and makes paging look faster than it is.) `plan_chunks` sees only
the live lengths, never a capacity or a block table, so the two variants cannot diverge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from gpu.compile import compile_source, kernel_source
from gpu.errors import GpuError
from gpu.layouts import KvLayout

DTYPE_CODES: dict[str, int] = {"bf16": 0, "fp16": 1}
HEAD_DIMS: tuple[int, ...] = (64, 128)
# Query heads per KV head: MHA 1; Llama-3-8B, Mistral-7B 4; Qwen2.5-7B 7; Llama-3-70B, Qwen2.5-72B 8.
GROUPS: tuple[int, ...] = (1, 2, 4, 7, 8)
GATHER_THREADS = 256
ATTN_THREADS = 128  # must match ATTN_THREADS in kernels.cu
REDUCE_THREADS = 128
READ_THREADS = 512


def gather_name(paged: bool) -> str:
    return f"gather_kv<{'true' if paged else 'false'}>"


def attention_name(paged: bool, dtype: str, head_dim: int, group: int) -> str:
    return (
        f"decode_attention_partial<{'true' if paged else 'false'}, {DTYPE_CODES[dtype]}, {head_dim}, {group}>"
    )


def all_name_expressions() -> list[str]:
    """Every instantiation the package launches: both variants of each kernel, all dtypes and shapes."""
    names = [gather_name(False), gather_name(True)]
    for paged in (False, True):
        for dtype in DTYPE_CODES:
            for head_dim in HEAD_DIMS:
                for group in GROUPS:
                    names.append(attention_name(paged, dtype, head_dim, group))
    names += ["decode_attention_reduce", "stream_read"]
    return names


@dataclass(frozen=True)
class KernelResources:
    """ptxas's report for one instantiation."""

    registers: int
    spill_bytes: int
    shared_bytes: int


def compile_check(arch: str = "sm_90") -> dict[str, KernelResources]:
    """Compile every instantiation for `arch` with NVRTC (no GPU needed); return ptxas's resource report.

    Raises gpu.compile.NvrtcCompileError with the compiler log on any error, NvrtcNotFound without NVRTC.
    """
    result = compile_source(
        kernel_source(), all_name_expressions(), arch=arch, options=("-std=c++17", "--ptxas-options=-v")
    )
    by_mangled = {mangled: expr for expr, mangled in result.lowered_names.items()}
    report: dict[str, KernelResources] = {}
    current: str | None = None
    regs = spill = smem = 0
    for line in result.log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = by_mangled.get(m.group(1), m.group(1))
            regs = spill = smem = 0
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            spill = int(m.group(1)) + int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            regs = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            smem = int(s.group(1)) if s else 0
            report[current] = KernelResources(regs, spill, smem)
    return report


# ---------------------------------------------------------------------------------------------
# Work split


@dataclass(frozen=True)
class LaunchPlan:
    """Which CTA handles which tokens: chunks of `chunk_tokens` live tokens of one sequence each.

    Chunks are ordered by sequence; `chunk_begin[b]:chunk_begin[b+1]` are sequence b's chunks.
    `out_offsets[b]` is where sequence b's tokens start in a packed gather output.
    """

    chunk_tokens: int
    chunk_seq: np.ndarray  # int32 [num_chunks]
    chunk_start: np.ndarray  # int32 [num_chunks]
    chunk_begin: np.ndarray  # int32 [batch + 1]
    out_offsets: np.ndarray  # int64 [batch]

    @property
    def num_chunks(self) -> int:
        return int(self.chunk_seq.size)


def choose_chunk_tokens(
    lengths_tokens: np.ndarray, *, ctas_per_chunk: int, num_sms: int, min_chunk: int, max_chunk: int
) -> int:
    """A power-of-two chunk that gives about 4 waves of CTAs over the LIVE tokens, within [min, max]."""
    live = int(np.asarray(lengths_tokens, dtype=np.int64).sum())
    target_ctas = 4 * max(num_sms, 1)
    want = max(1, -(-live * ctas_per_chunk // target_ctas))
    chunk = 1 << (want - 1).bit_length()
    return int(min(max(chunk, min_chunk), max_chunk))


def plan_chunks(lengths_tokens: Any, chunk_tokens: int) -> LaunchPlan:
    """Split each sequence's live tokens into chunks of `chunk_tokens` (sequences of length 0 get none)."""
    lengths = np.asarray(lengths_tokens, dtype=np.int64).reshape(-1)
    if chunk_tokens < 1:
        raise GpuError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    per_seq = -(-lengths // chunk_tokens)
    chunk_begin = np.concatenate([[0], np.cumsum(per_seq)]).astype(np.int32)
    chunk_seq = np.repeat(np.arange(lengths.size, dtype=np.int32), per_seq)
    within = np.arange(int(per_seq.sum()), dtype=np.int64) - np.repeat(
        chunk_begin[:-1].astype(np.int64), per_seq
    )
    out_offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return LaunchPlan(
        chunk_tokens=chunk_tokens,
        chunk_seq=chunk_seq,
        chunk_start=(within * chunk_tokens).astype(np.int32),
        chunk_begin=chunk_begin,
        out_offsets=out_offsets,
    )


def gather_plan(layout: KvLayout, num_sms: int) -> LaunchPlan:
    """The gather's split: a CTA moves whole token rows (all heads), 16..256 tokens each."""
    chunk = choose_chunk_tokens(
        layout.lengths_tokens, ctas_per_chunk=1, num_sms=num_sms, min_chunk=16, max_chunk=256
    )
    return plan_chunks(layout.lengths_tokens, chunk)


def attention_plan(layout: KvLayout, num_sms: int) -> LaunchPlan:
    """The attention's split-K: a CTA covers one KV head of a chunk of 64..1024 live tokens."""
    chunk = choose_chunk_tokens(
        layout.lengths_tokens, ctas_per_chunk=layout.kv_heads, num_sms=num_sms, min_chunk=64, max_chunk=1024
    )
    return plan_chunks(layout.lengths_tokens, chunk)


# ---------------------------------------------------------------------------------------------
# CuPy launchers


@dataclass
class DeviceLayout:
    """A KvLayout's index arrays on the device, ready to launch (pools are passed separately)."""

    layout: KvLayout
    block_table: Any
    start_slots: Any
    lengths: Any

    @classmethod
    def upload(cls, cupy: ModuleType, layout: KvLayout) -> DeviceLayout:
        return cls(
            layout=layout,
            block_table=cupy.asarray(np.ascontiguousarray(layout.block_table, dtype=np.int32)),
            start_slots=cupy.asarray(np.ascontiguousarray(layout.start_slots, dtype=np.int64)),
            lengths=cupy.asarray(np.ascontiguousarray(layout.lengths_tokens, dtype=np.int32)),
        )


@dataclass
class DevicePlan:
    plan: LaunchPlan
    chunk_seq: Any
    chunk_start: Any
    chunk_begin: Any
    out_offsets: Any

    @classmethod
    def upload(cls, cupy: ModuleType, plan: LaunchPlan) -> DevicePlan:
        return cls(
            plan,
            cupy.asarray(plan.chunk_seq),
            cupy.asarray(plan.chunk_start),
            cupy.asarray(plan.chunk_begin),
            cupy.asarray(plan.out_offsets),
        )


class Kernels:
    """The compiled module (every instantiation, via cupy.RawModule name_expressions) and its launchers."""

    def __init__(self, cupy: ModuleType) -> None:
        self.cupy = cupy
        self.module = cupy.RawModule(
            code=kernel_source(),
            options=("-std=c++17",),
            name_expressions=all_name_expressions(),
            backend="nvrtc",
        )
        self._cache: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        if name not in self._cache:
            self._cache[name] = self.module.get_function(name)
        return self._cache[name]

    def gather(
        self, dev: DeviceLayout, plan: DevicePlan, k_pool: Any, v_pool: Any, k_out: Any, v_out: Any
    ) -> None:
        """Packed copy of every live K and V row (launches on the current stream)."""
        lay = dev.layout
        if plan.plan.num_chunks == 0:
            return
        row_vecs = lay.row_bytes // 16
        self.function(gather_name(lay.paged))(
            (plan.plan.num_chunks,),
            (GATHER_THREADS,),
            (
                k_pool,
                v_pool,
                k_out,
                v_out,
                dev.block_table,
                np.int32(dev.block_table.shape[1]),
                dev.start_slots,
                dev.lengths,
                plan.out_offsets,
                plan.chunk_seq,
                plan.chunk_start,
                np.int32(plan.plan.chunk_tokens),
                np.int32(lay.block_size),
                np.int32(row_vecs),
            ),
        )

    def attention_workspace(self, layout: KvLayout, plan: LaunchPlan, q_heads: int) -> tuple[Any, Any, Any]:
        """Split-K partial state: max and sum per (chunk, query head), accumulator per dim."""
        n = max(plan.num_chunks, 1) * q_heads
        cp = self.cupy
        return (
            cp.empty(n, dtype=cp.float32),
            cp.empty(n, dtype=cp.float32),
            cp.empty(n * layout.head_dim, dtype=cp.float32),
        )

    def attention(
        self,
        dev: DeviceLayout,
        plan: DevicePlan,
        q: Any,
        k_pool: Any,
        v_pool: Any,
        out: Any,
        workspace: tuple[Any, Any, Any],
        scale: float | None = None,
    ) -> None:
        """GQA decode attention: partial kernel over (chunk, KV head), then the per-sequence combine."""
        lay = dev.layout
        batch, q_heads, head_dim = q.shape
        group = q_heads // lay.kv_heads
        if group not in GROUPS or head_dim not in HEAD_DIMS or q_heads % lay.kv_heads:
            raise GpuError(
                f"no kernel instantiation for head_dim={head_dim}, q_heads/kv_heads={q_heads}/{lay.kv_heads}"
            )
        scale = 1.0 / float(np.sqrt(head_dim)) if scale is None else scale
        part_m, part_l, part_acc = workspace
        if plan.plan.num_chunks > 0:
            self.function(attention_name(lay.paged, lay.dtype, head_dim, group))(
                (plan.plan.num_chunks, lay.kv_heads),
                (ATTN_THREADS,),
                (
                    q,
                    k_pool,
                    v_pool,
                    dev.block_table,
                    np.int32(dev.block_table.shape[1]),
                    dev.start_slots,
                    dev.lengths,
                    plan.chunk_seq,
                    plan.chunk_start,
                    np.int32(plan.plan.chunk_tokens),
                    np.int32(lay.block_size),
                    np.int32(lay.kv_heads),
                    np.float32(scale * np.log2(np.e)),
                    part_m,
                    part_l,
                    part_acc,
                ),
            )
        self.function("decode_attention_reduce")(
            (batch, q_heads),
            (REDUCE_THREADS,),
            (
                part_m,
                part_l,
                part_acc,
                plan.chunk_begin,
                out,
                np.int32(lay.kv_heads),
                np.int32(group),
                np.int32(head_dim),
            ),
        )

    def stream_read(self, src: Any, sink: Any, num_sms: int) -> None:
        """Read every 16-byte vector of `src` once (the streaming-read ceiling)."""
        n_vecs = src.nbytes // 16
        self.function("stream_read")((num_sms * 4,), (READ_THREADS,), (src, np.int64(n_vecs), sink))
