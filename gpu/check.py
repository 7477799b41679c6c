"""Check every kernel instantiation, and every shape family the grid times, against the float64 reference.

Why before any timing: a fast wrong kernel calibrates nothing. Outputs are poisoned first (0xFFFF
bits for the gather, NaN for attention) so a CTA that never writes is caught, not masked by a
zero-filled buffer. Lengths include 0, 1 and non-multiples of the block size; contiguous slabs have
reserved tails that must never be read. The gather must be bit-exact.

Attention's error is normalised PER SEQUENCE: max |out_b - ref_b| / max |ref_b| for each sequence b
(an empty sequence must give exactly 0). A batch-wide denominator would come from the length-1
sequence and dilute a long sequence's error ~20x, so a kernel that drops the last token of each long
sequence passed a 1e-2 batch-wide check about a third of the time (issue 15). The tolerance,
ATTN_REL_TOL = 1e-4, is set from the float32-accumulation error: the kernels accumulate in float32
over bf16/fp16 inputs; the worst per-sequence error seen in the float32 emulation
(tests/_gpu_fake_cupy.py) is 5e-7 over every instantiation and 7e-7 over every grid family, and
float32 sums of n <= 2048 terms stay within ~sqrt(n) x 6e-8 < 3e-6. 1e-4 leaves > 30x headroom for
exp2f's ulps on the device, while dropping the last token of a sequence (65 to 1100 tokens) moves
that sequence's output by 2.5e-2 or more (tests/test_gpu_checks.py plants exactly that bug).

Two sets of cases: `check_all` covers every compiled instantiation (dtype, head dim, GQA group) on
small 2-KV-head layouts; `check_grid_families` covers every shape family the grid times (MHA and GQA-8
row widths, which select the gather's unrolled and multi-pass paths; every layout and block size;
the device's chunk sizes and the largest ones), each on a replica carved at the TOP of the shared
arena (the same carving as gpu.replicas), so 64-bit offsets past 4 GB are exercised on the device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpu.errors import KernelCheckError
from gpu.grid import BLOCK_SIZES, CONTIGUOUS_POOL_BLOCK, HEAD_CONFIGS
from gpu.kernels import GROUPS, HEAD_DIMS, DeviceLayout, DevicePlan, Kernels, attention_plan, gather_plan
from gpu.layouts import (
    DTYPE_BYTES,
    DTYPES,
    LAYOUT_NAMES,
    KvLayout,
    contiguous_layout,
    float32_to_bits,
    make_layout,
    make_pool,
    paged_shuffled_layout,
)
from gpu.reference import decode_attention_reference, gather_reference
from gpu.replicas import replica_elems, replica_views

ATTN_REL_TOL = 1e-4  # per-sequence; see the module docstring for where it comes from
LONG_TOKENS = (
    1100  # > the largest attention chunk (1024), so a long sequence spans a full and a partial chunk
)


@dataclass(frozen=True)
class CheckResult:
    kernel: str
    paged: bool
    dtype: str
    head_dim: int
    group: int
    block_size: int
    rel_err: float  # gather: mismatched elements; attention: worst per-sequence relative error
    ok: bool
    family: str = "instantiation"  # or the grid shape family, chunk size and arena offset checked
    tolerance: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_layout(
    rng: np.random.Generator, *, paged: bool, dtype: str, head_dim: int, block_size: int
) -> KvLayout:
    """A small batch with awkward lengths (0, 1, block size +- 1, a few hundred), paged or contiguous."""
    lengths = np.array(
        [0, 1, block_size + 1, max(block_size - 1, 1), *rng.integers(2, 700, size=3)], dtype=np.int64
    )
    if paged:
        return paged_shuffled_layout(
            lengths, kv_heads=2, head_dim=head_dim, block_size=block_size, rng=rng, dtype=dtype
        )
    return contiguous_layout(
        lengths,
        kv_heads=2,
        head_dim=head_dim,
        dtype=dtype,
        block_size=block_size,
        reserved_tokens=lengths + 257,
    )


def check_case(
    kernels: Kernels,
    rng: np.random.Generator,
    *,
    paged: bool,
    dtype: str,
    head_dim: int,
    group: int,
    block_size: int,
    num_sms: int,
) -> list[CheckResult]:
    """Run gather and attention on one random case; return both results (never raises)."""
    cp = kernels.cupy
    layout = check_layout(rng, paged=paged, dtype=dtype, head_dim=head_dim, block_size=block_size)
    k_host, v_host = make_pool(layout, rng, np)
    k_pool, v_pool = cp.asarray(k_host), cp.asarray(v_host)
    dev = DeviceLayout.upload(cp, layout)
    common = dict(paged=paged, dtype=dtype, head_dim=head_dim, block_size=block_size)

    g_plan = DevicePlan.upload(cp, gather_plan(layout, num_sms))
    total = layout.live_tokens
    k_out = cp.full((total, layout.kv_heads, head_dim), 0xFFFF, dtype=cp.uint16)
    v_out = cp.full((total, layout.kv_heads, head_dim), 0xFFFF, dtype=cp.uint16)
    kernels.gather(dev, g_plan, k_pool, v_pool, k_out, v_out)
    k_ref, v_ref = gather_reference(layout, k_host, v_host)
    mismatched = int((cp.asnumpy(k_out) != k_ref).sum() + (cp.asnumpy(v_out) != v_ref).sum())
    gather_result = CheckResult("gather", group=1, rel_err=float(mismatched), ok=mismatched == 0, **common)

    q_heads = layout.kv_heads * group
    q_host = float32_to_bits(rng.standard_normal((layout.batch, q_heads, head_dim), dtype=np.float32), dtype)
    a_plan_host = attention_plan(layout, num_sms)
    a_plan = DevicePlan.upload(cp, a_plan_host)
    out = cp.full((layout.batch, q_heads, head_dim), np.nan, dtype=cp.float32)
    workspace = kernels.attention_workspace(layout, a_plan_host, q_heads)
    kernels.attention(dev, a_plan, cp.asarray(q_host), k_pool, v_pool, out, workspace)
    ref = decode_attention_reference(layout, q_host, k_host, v_host)
    rel_err = per_sequence_rel_err(cp.asnumpy(out), ref)
    attn_result = CheckResult(
        "attention", group=group, rel_err=rel_err, ok=rel_err < ATTN_REL_TOL, tolerance=ATTN_REL_TOL, **common
    )
    return [gather_result, attn_result]


def per_sequence_rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Worst over sequences of max |got_b - ref_b| / max |ref_b| (inf on NaN or a non-zero empty sequence).

    `got` and `ref` are [batch, q_heads, head_dim]. An empty sequence's reference is all zeros; its
    output must be exactly zero too (its error is then max |got_b|, unnormalised).
    """
    got = np.asarray(got, dtype=np.float64)
    if not np.isfinite(got).all():
        return float("inf")
    worst = 0.0
    for b in range(ref.shape[0]):
        denom = float(np.abs(ref[b]).max())
        err = float(np.abs(got[b] - ref[b]).max())
        worst = max(worst, err / denom if denom > 0 else (0.0 if err == 0 else float("inf")))
    return worst


def check_all(
    kernels: Kernels,
    rng: np.random.Generator,
    num_sms: int,
    *,
    raise_on_failure: bool = True,
    dtypes: tuple[str, ...] = DTYPES,
    head_dims: tuple[int, ...] = HEAD_DIMS,
    groups: tuple[int, ...] = GROUPS,
) -> list[CheckResult]:
    """Every instantiation (both variants, both dtypes, every head dim and group), block sizes cycled.

    The device run uses the defaults (all of them); CPU tests may pass fewer to stay fast.
    """
    results: list[CheckResult] = []
    i = 0
    for paged in (False, True):
        for dtype in dtypes:
            for head_dim in head_dims:
                for group in groups:
                    block_size = BLOCK_SIZES[i % len(BLOCK_SIZES)]
                    i += 1
                    results += check_case(
                        kernels,
                        rng,
                        paged=paged,
                        dtype=dtype,
                        head_dim=head_dim,
                        group=group,
                        block_size=block_size,
                        num_sms=num_sms,
                    )
    if raise_on_failure:
        raise_on_failures(results)
    return results


def raise_on_failures(results: list[CheckResult]) -> None:
    """KernelCheckError naming the first failure, when any check failed."""
    failures = [r for r in results if not r.ok]
    if failures:
        first = failures[0]
        raise KernelCheckError(
            f"{len(failures)} kernel check(s) failed; first: {first.kernel} paged={first.paged} "
            f"dtype={first.dtype} head_dim={first.head_dim} group={first.group} "
            f"block_size={first.block_size} family={first.family!r} rel_err={first.rel_err:.3g} "
            f"(tolerance {first.tolerance:g})"
        )


def family_lengths(block_size: int, long_tokens: int, rng: np.random.Generator) -> np.ndarray:
    """Awkward lengths: empty, one token, block size +- 1, one long sequence, two random ones."""
    return np.array(
        [0, 1, block_size + 1, max(block_size - 1, 1), long_tokens, *rng.integers(2, 400, size=2)],
        dtype=np.int64,
    )


def check_family_case(
    kernels: Kernels,
    rng: np.random.Generator,
    arena: Any,
    layout: KvLayout,
    *,
    q_heads: int,
    plan_sms: int,
    family: str,
) -> list[CheckResult]:
    """Gather and attention on `layout` placed as the LAST replica that fits `arena` (its top end).

    The carving is gpu.replicas.replica_views, the one the timed launches use; the reference reads the
    host copies of that replica's K and V pools.
    """
    cp = kernels.cupy
    results: list[CheckResult] = []
    common = dict(
        paged=layout.paged, dtype=layout.dtype, head_dim=layout.head_dim, block_size=layout.block_size
    )
    for kernel in ("gather", "attention"):
        pool, out_elems = replica_elems(kernel, layout)
        n = int(arena.size) // (2 * (pool + out_elems))
        if n < 2:
            raise KernelCheckError(f"check {family}: the arena holds {n} replica(s) of the case; need 2")
        view = replica_views(arena, kernel, layout, replicas=n, index=n - 1)
        k_host = cp.asnumpy(arena[(n - 1) * pool : n * pool])
        v_host = cp.asnumpy(arena[(2 * n - 1) * pool : 2 * n * pool])
        dev = DeviceLayout.upload(cp, view.layout)
        name = f"{family} {kernel} offset={(n - 1) * pool * DTYPE_BYTES}B"
        if kernel == "gather":
            plan = DevicePlan.upload(cp, gather_plan(layout, plan_sms))
            view.k_out[...] = 0xFFFF
            view.v_out[...] = 0xFFFF
            kernels.gather(dev, plan, view.k_pool, view.v_pool, view.k_out, view.v_out)
            k_ref, v_ref = gather_reference(layout, k_host, v_host)
            bad = int(
                (cp.asnumpy(view.k_out) != k_ref.reshape(-1)).sum()
                + (cp.asnumpy(view.v_out) != v_ref.reshape(-1)).sum()
            )
            results.append(
                CheckResult("gather", group=1, rel_err=float(bad), ok=bad == 0, family=name, **common)
            )
            continue
        host_plan = attention_plan(layout, plan_sms)
        q_host = float32_to_bits(
            rng.standard_normal((layout.batch, q_heads, layout.head_dim), dtype=np.float32), layout.dtype
        )
        out = cp.full((layout.batch, q_heads, layout.head_dim), np.nan, dtype=cp.float32)
        workspace = kernels.attention_workspace(layout, host_plan, q_heads)
        kernels.attention(
            dev,
            DevicePlan.upload(cp, host_plan),
            cp.asarray(q_host),
            view.k_pool,
            view.v_pool,
            out,
            workspace,
        )
        ref = decode_attention_reference(layout, q_host, k_host, v_host)
        rel_err = per_sequence_rel_err(cp.asnumpy(out), ref)
        results.append(
            CheckResult(
                "attention",
                group=q_heads // layout.kv_heads,
                rel_err=rel_err,
                ok=rel_err < ATTN_REL_TOL,
                family=f"{name} chunk={host_plan.chunk_tokens}",
                tolerance=ATTN_REL_TOL,
                **common,
            )  # fmt: skip
        )
    return results


def check_grid_families(
    kernels: Kernels,
    rng: np.random.Generator,
    num_sms: int,
    arena: Any,
    *,
    heads: tuple[str, ...] = tuple(HEAD_CONFIGS),
    block_sizes: tuple[int, ...] = BLOCK_SIZES,
    dtype: str = "bf16",
    long_tokens: int = LONG_TOKENS,
) -> list[CheckResult]:
    """Every (head config, layout, block size) the grid times, with the device's plan and the largest chunks.

    Two plans per layout: the one the grid uses (`num_sms`) and one planned for a single SM, which
    gives the largest chunks (gather 256 tokens, attention 1024). `long_tokens` shrinks (halving) when
    two replicas of a case would not fit `arena` (small arenas in CPU tests); never below 2 blocks.
    """
    results: list[CheckResult] = []
    for head_name in heads:
        shape = HEAD_CONFIGS[head_name]
        kv_heads, head_dim, q_heads = shape["num_kv_heads"], shape["head_dim"], shape["num_q_heads"]
        for layout_name in LAYOUT_NAMES:
            sizes = (CONTIGUOUS_POOL_BLOCK,) if layout_name == "contiguous" else block_sizes
            for block_size in sizes:
                tokens = long_tokens
                while True:
                    lengths = family_lengths(block_size, tokens, rng)
                    layout = make_layout(
                        layout_name, lengths, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
                        rng=rng, dtype=dtype,
                    )  # fmt: skip
                    pool, out_elems = replica_elems("gather", layout)
                    if 2 * 2 * (pool + out_elems) <= int(arena.size) or tokens <= 2 * block_size:
                        break
                    tokens //= 2
                for plan_sms in sorted({num_sms, 1}, reverse=True):
                    family = f"{head_name} {layout_name} block={block_size} long={tokens} plan_sms={plan_sms}"
                    results += check_family_case(
                        kernels, rng, arena, layout, q_heads=q_heads, plan_sms=plan_sms, family=family
                    )
    return results
