"""Check every kernel instantiation against the float64 reference on fresh random data.

Why before any timing: a fast wrong kernel calibrates nothing. Outputs are poisoned first (0xFFFF
bits for the gather, NaN for attention) so a CTA that never writes is caught, not masked by a
zero-filled buffer. Lengths include 0, 1 and non-multiples of the block size; contiguous slabs have
reserved tails that must never be read. The gather must be bit-exact; attention's relative error
(max |out - ref| / max |ref|) must be under 1e-2 for bf16 and fp16 (fp32 accumulation gives ~1e-6).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpu.errors import KernelCheckError
from gpu.grid import BLOCK_SIZES
from gpu.kernels import GROUPS, HEAD_DIMS, DeviceLayout, DevicePlan, Kernels, attention_plan, gather_plan
from gpu.layouts import DTYPES, KvLayout, contiguous_layout, float32_to_bits, make_pool, paged_shuffled_layout
from gpu.reference import decode_attention_reference, gather_reference

REL_TOL = 1e-2


@dataclass(frozen=True)
class CheckResult:
    kernel: str
    paged: bool
    dtype: str
    head_dim: int
    group: int
    block_size: int
    rel_err: float
    ok: bool

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
    got = cp.asnumpy(out).astype(np.float64)
    denom = max(float(np.abs(ref).max()), 1e-30)
    rel_err = float(np.abs(got - ref).max() / denom) if np.isfinite(got).all() else float("inf")
    attn_result = CheckResult("attention", group=group, rel_err=rel_err, ok=rel_err < REL_TOL, **common)
    return [gather_result, attn_result]


def check_all(
    kernels: Kernels, rng: np.random.Generator, num_sms: int, *, raise_on_failure: bool = True
) -> list[CheckResult]:
    """Every instantiation (both variants, both dtypes, every head dim and group), block sizes cycled."""
    results: list[CheckResult] = []
    i = 0
    for paged in (False, True):
        for dtype in DTYPES:
            for head_dim in HEAD_DIMS:
                for group in GROUPS:
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
    failures = [r for r in results if not r.ok]
    if failures and raise_on_failure:
        first = failures[0]
        raise KernelCheckError(
            f"{len(failures)} kernel check(s) failed; first: {first.kernel} paged={first.paged} "
            f"dtype={first.dtype} head_dim={first.head_dim} group={first.group} "
            f"block_size={first.block_size} rel_err={first.rel_err:.3g}"
        )
    return results
