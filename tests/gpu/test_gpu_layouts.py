"""Layouts and block tables: the three idealised cases, real simulation snapshots, replay's CPU part."""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_helpers import contiguous_snapshot, naive_attention, paged_snapshot, write_results_dir

from gpu.errors import GpuError
from gpu.grid import MAX_POINT_BYTES, GridPoint, grid_points, point_budget
from gpu.layouts import (
    DTYPE_BYTES,
    contiguous_layout,
    float32_to_bits,
    layout_from_snapshot,
    make_layout,
    make_pool,
    paged_sequential_layout,
    paged_shuffled_layout,
)
from gpu.reference import bytes_and_flops, decode_attention_reference, gather_reference
from gpu.replay import ReplayModel, load_snapshots, reference_replay, snapshot_kv_layout
from gpu.replicas import replica_elems


def all_slots(layout) -> np.ndarray:
    return np.concatenate([layout.token_slots(i) for i in range(layout.batch)])


def test_idealised_layouts_own_each_slot_once_and_stay_in_the_pool() -> None:
    lengths = [0, 1, 16, 17, 100]
    rng = np.random.default_rng(0)
    for layout in (
        contiguous_layout(lengths, kv_heads=8, head_dim=128, block_size=16, reserved_tokens=[128] * 5),
        paged_sequential_layout(lengths, kv_heads=8, head_dim=128, block_size=16),
        paged_shuffled_layout(lengths, kv_heads=8, head_dim=128, block_size=16, rng=rng),
    ):
        slots = all_slots(layout)
        assert slots.size == sum(lengths) == np.unique(slots).size
        assert slots.min() >= 0 and slots.max() < layout.num_slots
        assert layout.block_table.dtype == np.int32 and layout.block_table.shape[0] == 5
        np.testing.assert_array_equal(layout.blocks_per_seq(), [0, 1, 1, 2, 7])
        # the block table and the slab starts describe the same slots
        for i, n in enumerate(lengths):
            if n:
                t = np.arange(n)
                from_table = layout.block_table[i, t // 16].astype(np.int64) * 16 + t % 16
                np.testing.assert_array_equal(from_table, layout.token_slots(i))


def test_contiguous_reserves_tails_and_sequential_is_dense() -> None:
    contiguous = contiguous_layout([10, 20], kv_heads=1, head_dim=64, block_size=8, reserved_tokens=[64, 32])
    np.testing.assert_array_equal(contiguous.start_slots, [0, 64])
    assert contiguous.num_blocks == 8 + 4
    sequential = paged_sequential_layout([10, 20], kv_heads=1, head_dim=64, block_size=8)
    np.testing.assert_array_equal(sequential.block_table, [[0, 1, -1], [2, 3, 4]])


def test_shuffled_pool_is_larger_than_the_working_set_and_capped() -> None:
    rng = np.random.default_rng(1)
    layout = paged_shuffled_layout([256] * 4, kv_heads=2, head_dim=64, block_size=16, rng=rng)
    assert layout.num_blocks == 4 * 64
    ids = layout.block_table.reshape(-1)
    assert np.unique(ids).size == ids.size == 64
    assert (np.diff(layout.block_table, axis=1) != 1).sum() > 32  # scattered, not sequential
    block_bytes = 2 * 16 * 2 * 64 * 2
    capped = paged_shuffled_layout(
        [256] * 4, kv_heads=2, head_dim=64, block_size=16, rng=rng, max_pool_bytes=100 * block_bytes
    )
    assert capped.num_blocks == 100
    at_least_ws = paged_shuffled_layout(
        [256] * 4, kv_heads=2, head_dim=64, block_size=16, rng=rng, max_pool_bytes=block_bytes
    )
    assert at_least_ws.num_blocks == 64


def test_same_seed_same_layout_and_pool() -> None:
    a = paged_shuffled_layout([50, 60], kv_heads=2, head_dim=64, block_size=8, rng=np.random.default_rng(9))
    b = paged_shuffled_layout([50, 60], kv_heads=2, head_dim=64, block_size=8, rng=np.random.default_rng(9))
    np.testing.assert_array_equal(a.block_table, b.block_table)
    pa = make_pool(a, np.random.default_rng(2))
    pb = make_pool(b, np.random.default_rng(2))
    np.testing.assert_array_equal(pa[0], pb[0])
    assert pa[0].shape == (a.num_blocks, 8, 2, 64) and pa[0].dtype == np.uint16


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(lengths_tokens=[-1], kv_heads=1, head_dim=64, block_size=4), "lengths_tokens"),
        (dict(lengths_tokens=[4], kv_heads=0, head_dim=64, block_size=4), "kv_heads"),
        (dict(lengths_tokens=[4], kv_heads=1, head_dim=96, block_size=4), "head_dim"),
        (dict(lengths_tokens=[4], kv_heads=1, head_dim=64, block_size=0), "block_size"),
        (dict(lengths_tokens=[4], kv_heads=1, head_dim=64, block_size=4, dtype="fp8"), "dtype"),
    ],
)
def test_bad_layout_arguments_raise_one_line(kwargs: dict, match: str) -> None:
    with pytest.raises(GpuError, match=match) as info:
        paged_sequential_layout(**kwargs)
    assert "\n" not in str(info.value)


def test_grid_respects_the_8gb_cap_and_covers_the_issue_grid() -> None:
    points = grid_points()
    assert len(points) == 536  # 561 before issue 15 dropped the 25 shuffled points whose 4x spread was capped
    shuffled = [p for p in points if p.layout == "paged_shuffled"]
    assert all(p.pool_bytes(MAX_POINT_BYTES) == 4 * p.blocks_needed * p.block_bytes for p in shuffled)
    assert all(p.memory_bytes(MAX_POINT_BYTES) <= MAX_POINT_BYTES for p in points)
    assert {p.block_size for p in points if p.layout != "contiguous"} == {1, 8, 16, 32, 128}
    assert {p.batch for p in points} == {1, 8, 32, 128}
    assert {p.context_tokens for p in points} == {512, 2048, 8192, 32768}
    assert {p.heads for p in points} == {"mha", "gqa8"}
    # MHA at batch 128 x 32k tokens is 2 x 128 x 32768 x 32 x 128 x 2 B = 68.7 GB: skipped
    assert not [p for p in points if p.heads == "mha" and p.batch == 128 and p.context_tokens == 32768]
    assert [p for p in points if p.heads == "gqa8" and p.batch == 32 and p.context_tokens == 8192]
    # GQA-8 at 32 x 32k is a 4.3 GB working set: attention fits, the gather (plus 4.3 GB of output) does not
    big = {p.kernel for p in points if p.heads == "gqa8" and p.batch == 32 and p.context_tokens == 32768}
    assert big == {"attention"}


@pytest.mark.parametrize("cap_bytes", [MAX_POINT_BYTES, 2 * 10**9, 40 * 2**20])
def test_point_memory_counts_pool_outputs_and_tables_against_the_given_cap(cap_bytes: int) -> None:
    arena_bytes, reserve_bytes = point_budget(cap_bytes)
    assert arena_bytes + reserve_bytes <= cap_bytes
    points = grid_points(
        batches=(1, 8, 32, 128), contexts_tokens=(64, 512, 8192, 32768), max_point_bytes=cap_bytes
    )
    assert points
    rng = np.random.default_rng(0)
    for point in points:
        assert point.memory_bytes(cap_bytes) <= cap_bytes
        assert point.pool_bytes(cap_bytes) + point.output_bytes <= arena_bytes
        if point.batch * point.context_tokens > 8192:
            continue  # building the layout is the slow part; the small points check the closed form
        layout = make_layout(
            point.layout, np.full(point.batch, point.context_tokens), kv_heads=point.num_kv_heads,
            head_dim=point.head_dim, block_size=point.pool_block_size, rng=rng,
            max_pool_bytes=point.pool_bytes(cap_bytes),
        )  # fmt: skip
        pool, out = replica_elems(point.kernel, layout)
        assert layout.pool_bytes == point.pool_bytes(cap_bytes) == 2 * pool * DTYPE_BYTES
        assert 2 * out * DTYPE_BYTES == point.output_bytes
        assert point.metadata_bytes >= layout.block_table.size * 4 + layout.batch * 12
    # the shuffled pool follows the cap it is given, not the module's 8 GB constant
    shuffled = GridPoint("attention", "paged_shuffled", 16, 8, 8192, "gqa8", 32, 8, 128)
    assert shuffled.pool_bytes(MAX_POINT_BYTES) == 4 * shuffled.working_set_bytes
    assert shuffled.pool_bytes(300 * 2**20) == point_budget(300 * 2**20)[0] < 4 * shuffled.working_set_bytes
    # a gather needs its working set twice (pool and output): skipped once that passes the arena
    gather = GridPoint("gather", "contiguous", 0, 8, 8192, "gqa8", 32, 8, 128)
    assert gather.fits(2 * 2 * gather.working_set_bytes) and not gather.fits(
        gather.working_set_bytes * 3 // 2
    )


# ---------------------------------------------------------------------------------------------
# Real snapshots


def test_paged_snapshot_is_replayed_exactly_with_its_shared_blocks() -> None:
    snap = paged_snapshot()
    layout, mapping = layout_from_snapshot(snap, kv_heads=2, head_dim=64, budget_bytes=10**9)
    assert mapping.exact and mapping.dropped_seqs == 0 and mapping.shared_blocks >= 2  # the shared prefix
    live = snap.lengths_tokens > 0
    np.testing.assert_array_equal(layout.lengths_tokens, snap.lengths_tokens[live])
    np.testing.assert_array_equal(layout.seq_ids, snap.seq_ids[live])
    for i in range(layout.batch):
        n = int(layout.blocks_per_seq()[i])
        np.testing.assert_array_equal(layout.block_table[i, :n], snap.block_table[live][i, :n])
    assert layout.num_blocks == snap.capacity_tokens // snap.block_size
    cost = bytes_and_flops("attention", layout, q_heads=4)
    assert cost.blocks_touched == int(np.sum(-(-snap.lengths_tokens // snap.block_size)))


def test_paged_snapshot_compacts_to_the_budget_preserving_order_and_sharing() -> None:
    snap = paged_snapshot(capacity_tokens=1 << 16)
    block_bytes = 2 * 16 * 2 * 64 * 2
    exact, _ = layout_from_snapshot(snap, kv_heads=2, head_dim=64, budget_bytes=10**10)
    small, mapping = layout_from_snapshot(snap, kv_heads=2, head_dim=64, budget_bytes=30 * block_bytes)
    assert not mapping.exact and small.num_blocks <= 30
    kept = mapping.kept_seqs
    assert kept >= 1 and mapping.dropped_seqs == exact.batch - kept
    # rank compaction keeps the relative order of physical ids (and equal ids stay equal)
    old = exact.block_table[:kept].reshape(-1)
    new = small.block_table.reshape(-1)
    mask = old >= 0
    order_old = np.argsort(old[mask], kind="stable")
    assert np.all(np.diff(new[mask][order_old]) >= 0)
    assert (np.unique(old[mask]).size) == np.unique(new[mask]).size


def test_contiguous_snapshot_keeps_offsets_and_reads_only_live_tokens() -> None:
    snap = contiguous_snapshot()
    layout, mapping = layout_from_snapshot(snap, kv_heads=2, head_dim=64, budget_bytes=10**9)
    assert mapping.exact and not layout.paged and layout.block_size == 1
    np.testing.assert_array_equal(layout.start_slots, snap.offsets_tokens)
    assert bytes_and_flops("gather", layout).blocks_touched == snap.seq_ids.size
    compacted, mapping = layout_from_snapshot(snap, kv_heads=2, head_dim=64, budget_bytes=512 * 4000)
    assert not mapping.exact
    starts = np.sort(compacted.start_slots)
    ends = starts + compacted.lengths_tokens[np.argsort(compacted.start_slots)]
    np.testing.assert_array_equal(starts[1:], ends[:-1])  # back to back, no reserved tails


def test_reference_runs_on_a_real_snapshot() -> None:
    snap = paged_snapshot()
    model = ReplayModel(num_q_heads=4, num_kv_heads=2, head_dim=64, num_layers=2)
    layout, _ = layout_from_snapshot(snap, kv_heads=2, head_dim=64)
    k_rows, v_rows, out = reference_replay(layout, model, np.random.default_rng(0))
    assert k_rows.shape == (layout.live_tokens, 2, 64) == v_rows.shape
    assert out.shape == (layout.batch, 4, 64) and np.isfinite(out).all()
    # spot-check one short sequence against the naive loops
    rng = np.random.default_rng(11)
    k_pool, v_pool = make_pool(layout, rng)
    q = float32_to_bits(rng.standard_normal((layout.batch, 4, 64), dtype=np.float32), "bf16")
    ref = decode_attention_reference(layout, q, k_pool, v_pool)
    np.testing.assert_allclose(
        ref, np.array(naive_attention(layout, q, k_pool, v_pool)), rtol=1e-10, atol=1e-12
    )
    np.testing.assert_array_equal(
        gather_reference(layout, k_pool, v_pool)[0][:1], k_pool.reshape(-1, 2, 64)[[layout.token_slots(0)[0]]]
    )


def test_bad_snapshots_name_the_field() -> None:
    snap = paged_snapshot()
    snap.block_table[0, 0] = -1
    with pytest.raises(GpuError, match="block_table"):
        layout_from_snapshot(snap, kv_heads=2, head_dim=64, source="x.npz")
    snap = paged_snapshot()
    snap.kind = "tiled"
    with pytest.raises(GpuError, match="x.npz: field 'kind'"):
        layout_from_snapshot(snap, kv_heads=2, head_dim=64, source="x.npz")


# ---------------------------------------------------------------------------------------------
# Replay's CPU part: the exported folder


def test_load_snapshots_from_an_exported_results_folder(tmp_path) -> None:
    run = write_results_dir(tmp_path / "cmp" / "paged", {0: paged_snapshot(0), 50: paged_snapshot(1)})
    write_results_dir(tmp_path / "cmp" / "contiguous", {0: contiguous_snapshot()}, allocator="contiguous")
    snapshots = load_snapshots(tmp_path / "cmp")
    assert [(s.run, s.step, s.allocator) for s in snapshots] == [
        ("contiguous", 0, "contiguous"),
        ("paged", 0, "paged"),
        ("paged", 50, "paged"),
    ]
    assert snapshots[1].predicted_kv_read_s == pytest.approx(1.5e-4)
    model = ReplayModel(num_q_heads=8, num_kv_heads=2, head_dim=128, num_layers=4)
    for snapshot in snapshots:
        layout, mapping = snapshot_kv_layout(snapshot, model, budget_bytes=10**9)
        assert mapping.exact and layout.kv_heads == 2 and layout.head_dim == 128
    assert run.is_dir()


def test_bad_results_folders_raise_one_line(tmp_path) -> None:
    with pytest.raises(GpuError, match="no layouts/index.csv"):
        load_snapshots(tmp_path)
    write_results_dir(tmp_path, {3: paged_snapshot()})
    index = tmp_path / "layouts" / "index.csv"
    index.write_text("step,time_s,allocator,predicted_kv_read_s,predicted_step_s\nabc,0,paged,1,1\n")
    with pytest.raises(GpuError, match=r"index.csv: row 2: field 'step' must be an integer"):
        load_snapshots(tmp_path)
    index.write_text("step,time_s,allocator,predicted_kv_read_s,predicted_step_s\n7,0,paged,1,1\n")
    with pytest.raises(GpuError, match="row 2: field 'step': layout file step_00000007.npz is missing"):
        load_snapshots(tmp_path)
    index.write_text("step,time_s,allocator\n3,0,paged\n")
    with pytest.raises(GpuError, match="missing column 'predicted_kv_read_s'"):
        load_snapshots(tmp_path)
    with pytest.raises(GpuError, match="must be a multiple"):
        ReplayModel(num_q_heads=6, num_kv_heads=4)
