"""The float64 reference against naive loops, bit conversions, and bytes_and_flops by hand."""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_helpers import naive_attention, naive_bits_to_float, naive_slot

from gpu.errors import GpuError
from gpu.grid import grid_points
from gpu.layouts import (
    contiguous_layout,
    float32_to_bits,
    make_layout,
    make_pool,
    paged_sequential_layout,
    paged_shuffled_layout,
)
from gpu.reference import bits_to_float64, bytes_and_flops, decode_attention_reference, gather_reference


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_bit_conversions_match_struct_and_round_to_nearest_even(dtype: str) -> None:
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.standard_normal(200, dtype=np.float32), [0.0, 1.0, -2.5, 65504.0]]).astype(
        np.float32
    )
    bits = float32_to_bits(values, dtype)
    decoded = bits_to_float64(bits, dtype)
    assert [naive_bits_to_float(b, dtype) for b in bits] == decoded.tolist()
    rel = np.abs(decoded - values) / np.maximum(np.abs(values), 1e-30)
    assert rel.max() <= (2.0**-8 if dtype == "bf16" else 2.0**-11)
    if dtype == "bf16":
        assert float32_to_bits(np.float32([1.0]), "bf16")[0] == 0x3F80
        # 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0)
        assert float32_to_bits(np.float32([1.0 + 2.0**-8]), "bf16")[0] == 0x3F80
        assert float32_to_bits(np.float32([1.0 + 3 * 2.0**-8]), "bf16")[0] == 0x3F82


@pytest.mark.parametrize(
    ("name", "dtype", "group"),
    [("paged_shuffled", "bf16", 2), ("contiguous", "fp16", 1), ("paged_sequential", "bf16", 4)],
)
def test_attention_reference_matches_naive_loops(name: str, dtype: str, group: int) -> None:
    rng = np.random.default_rng(7)
    lengths = [0, 1, 9, 23]
    layout = make_layout(name, lengths, kv_heads=2, head_dim=64, block_size=8, rng=rng, dtype=dtype)
    k_pool, v_pool = make_pool(layout, rng)
    q = float32_to_bits(rng.standard_normal((4, 2 * group, 64), dtype=np.float32), dtype)
    ref = decode_attention_reference(layout, q, k_pool, v_pool)
    naive = np.array(naive_attention(layout, q, k_pool, v_pool))
    np.testing.assert_allclose(ref, naive, rtol=1e-10, atol=1e-12)
    assert not ref[0].any()  # the empty sequence gets zeros


def test_attention_reference_is_layout_independent() -> None:
    """The same tokens give the same output whether stored contiguous, sequential or shuffled."""
    rng = np.random.default_rng(3)
    lengths = [5, 17, 33]
    contiguous = contiguous_layout(
        lengths, kv_heads=2, head_dim=64, block_size=4, reserved_tokens=[40, 40, 40]
    )
    shuffled = paged_shuffled_layout(lengths, kv_heads=2, head_dim=64, block_size=4, rng=rng)
    k_c, v_c = make_pool(contiguous, rng)
    k_s = np.zeros((shuffled.num_blocks, 4, 2, 64), np.uint16)
    v_s = np.zeros_like(k_s)
    for b in range(3):  # copy each token to its shuffled slot
        for t in range(lengths[b]):
            src, dst = naive_slot(contiguous, b, t), naive_slot(shuffled, b, t)
            k_s.reshape(-1, 2, 64)[dst] = k_c.reshape(-1, 2, 64)[src]
            v_s.reshape(-1, 2, 64)[dst] = v_c.reshape(-1, 2, 64)[src]
    q = float32_to_bits(rng.standard_normal((3, 4, 64), dtype=np.float32), "bf16")
    np.testing.assert_array_equal(
        decode_attention_reference(contiguous, q, k_c, v_c), decode_attention_reference(shuffled, q, k_s, v_s)
    )
    for a, b in zip(
        gather_reference(contiguous, k_c, v_c), gather_reference(shuffled, k_s, v_s), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_gather_reference_matches_naive_slots() -> None:
    rng = np.random.default_rng(5)
    layout = paged_shuffled_layout([3, 0, 10], kv_heads=1, head_dim=64, block_size=4, rng=rng)
    k_pool, v_pool = make_pool(layout, rng)
    k_rows, v_rows = gather_reference(layout, k_pool, v_pool)
    expected = [naive_slot(layout, b, t) for b in range(3) for t in range(int(layout.lengths_tokens[b]))]
    assert k_rows.shape == (13, 1, 64) and k_rows.dtype == np.uint16
    np.testing.assert_array_equal(k_rows, k_pool.reshape(-1, 1, 64)[expected])
    np.testing.assert_array_equal(v_rows, v_pool.reshape(-1, 1, 64)[expected])


def test_bytes_and_flops_by_hand_paged() -> None:
    # lengths 3 and 5, block 4: blocks 1 + 2 = 3; kv_heads 2, head_dim 64 -> row 256 B per K (or V)
    layout = paged_sequential_layout([3, 5], kv_heads=2, head_dim=64, block_size=4)
    kv = 2 * 8 * 256  # K and V of 8 live tokens = 4096
    meta = 3 * 4 + 2 * 4  # three int32 table entries + two int32 lengths = 20
    gather = bytes_and_flops("gather", layout)
    assert (gather.bytes, gather.flops, gather.blocks_touched) == (2 * kv + meta, 0, 3)
    attn = bytes_and_flops("attention", layout, q_heads=4)
    q_bytes = 2 * 4 * 64 * 2  # batch 2, 4 query heads, bf16 = 1024
    out_bytes = 2 * 4 * 64 * 4  # float32 = 2048
    assert attn.bytes == kv + q_bytes + out_bytes + meta == 7188
    assert attn.flops == 4 * 8 * 4 * 64 == 8192
    assert attn.kv_bytes == kv and attn.metadata_bytes == meta


def test_bytes_and_flops_by_hand_contiguous() -> None:
    layout = contiguous_layout([3, 5], kv_heads=2, head_dim=64, block_size=4, reserved_tokens=[64, 64])
    cost = bytes_and_flops("gather", layout)
    assert cost.blocks_touched == 2  # one slab per live sequence
    assert cost.bytes == 2 * (2 * 8 * 256) + 2 * 8 + 2 * 4  # reserved tails are never read
    with pytest.raises(GpuError, match="q_heads"):
        bytes_and_flops("attention", layout, q_heads=3)
    with pytest.raises(GpuError, match="kernel"):
        bytes_and_flops("matmul", layout)


def test_grid_closed_form_equals_bytes_and_flops_on_built_layouts() -> None:
    rng = np.random.default_rng(0)
    points = grid_points(batches=(1, 3), contexts_tokens=(512, 700), block_sizes=(1, 16))
    assert {p.layout for p in points} == {"contiguous", "paged_sequential", "paged_shuffled"}
    for point in points:
        layout = make_layout(
            point.layout,
            [point.context_tokens] * point.batch,
            kv_heads=point.num_kv_heads,
            head_dim=point.head_dim,
            block_size=point.block_size or 16,
            rng=rng,
        )
        cost = bytes_and_flops(point.kernel, layout, point.num_q_heads)
        assert point.cost() == {
            "bytes": cost.bytes,
            "flops": cost.flops,
            "blocks_touched": cost.blocks_touched,
        }
