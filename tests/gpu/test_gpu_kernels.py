"""NVRTC compile check (CPU, runs in CI), the launch plan, the split-K math, the CLI without a device,
and -- marked `gpu`, skipped without a device -- every kernel against the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_helpers import paged_snapshot, write_results_dir

from gpu.compile import NvrtcNotFound, load_nvrtc
from gpu.kernels import (
    GROUPS,
    HEAD_DIMS,
    all_name_expressions,
    attention_plan,
    choose_chunk_tokens,
    compile_check,
    gather_plan,
    plan_chunks,
)
from gpu.layouts import contiguous_layout, float32_to_bits, make_pool, paged_shuffled_layout
from gpu.reference import bits_to_float64, decode_attention_reference
from gpu.timing import replicas_needed, summarize


def _nvrtc_or_skip() -> None:
    try:
        load_nvrtc()
    except NvrtcNotFound as exc:
        pytest.skip(f"NVRTC not installed (pip install nvidia-cuda-nvrtc): {exc}")


def test_every_instantiation_compiles_for_sm90_without_spills() -> None:
    _nvrtc_or_skip()
    report = compile_check("sm_90")
    assert set(report) == set(all_name_expressions())
    assert len(report) == 2 + 2 * 2 * len(HEAD_DIMS) * len(GROUPS) + 2
    for name, resources in report.items():
        assert resources.spill_bytes == 0, f"{name} spills {resources.spill_bytes} bytes"
        assert 0 < resources.registers <= 255
        assert resources.shared_bytes <= 48 * 1024  # static shared memory, no opt-in needed


# ---------------------------------------------------------------------------------------------
# Work split: by live length only


def test_plan_covers_every_live_token_once_in_sequence_order() -> None:
    lengths = np.array([0, 5, 64, 65, 1000])
    plan = plan_chunks(lengths, 64)
    covered = {
        (int(s), int(st) + i)
        for s, st in zip(plan.chunk_seq, plan.chunk_start, strict=True)
        for i in range(64)
    }
    live = {(s, t) for s, n in enumerate(lengths) for t in range(n)}
    assert live <= covered
    assert plan.num_chunks == 0 + 1 + 1 + 2 + 16
    np.testing.assert_array_equal(plan.chunk_begin, [0, 0, 1, 2, 4, 20])
    np.testing.assert_array_equal(plan.out_offsets, [0, 0, 5, 69, 134])
    assert np.all(np.diff(plan.chunk_seq) >= 0)


def test_paged_and_contiguous_get_the_same_plan_whatever_the_capacity() -> None:
    """The known trap: a split sized by cache capacity. Reserved tails and pool size must not matter."""
    lengths = [300, 17, 4096, 1]
    rng = np.random.default_rng(0)
    tight = contiguous_layout(lengths, kv_heads=8, head_dim=128)
    roomy = contiguous_layout(lengths, kv_heads=8, head_dim=128, reserved_tokens=[32768] * 4)
    paged = paged_shuffled_layout(lengths, kv_heads=8, head_dim=128, block_size=16, rng=rng, pool_factor=50)
    for make in (attention_plan, gather_plan):
        plans = [make(layout, num_sms=132) for layout in (tight, roomy, paged)]
        for other in plans[1:]:
            assert other.chunk_tokens == plans[0].chunk_tokens
            np.testing.assert_array_equal(other.chunk_seq, plans[0].chunk_seq)
            np.testing.assert_array_equal(other.chunk_start, plans[0].chunk_start)


def test_chunk_size_targets_waves_over_live_tokens() -> None:
    assert choose_chunk_tokens([512], ctas_per_chunk=8, num_sms=132, min_chunk=64, max_chunk=1024) == 64
    big = choose_chunk_tokens([32768] * 128, ctas_per_chunk=8, num_sms=132, min_chunk=64, max_chunk=1024)
    assert big == 1024
    mid = choose_chunk_tokens([8192] * 8, ctas_per_chunk=8, num_sms=132, min_chunk=64, max_chunk=1024)
    assert mid & (mid - 1) == 0 and 64 <= mid <= 1024


def split_k_emulation(layout, plan, q_bits, k_pool, v_pool) -> np.ndarray:
    """The kernels' algorithm in NumPy: per (chunk, KV head) partial max/sum/acc in base 2, then combine."""
    q = bits_to_float64(q_bits, layout.dtype)
    batch, q_heads, head_dim = q.shape
    group = q_heads // layout.kv_heads
    k_rows = bits_to_float64(k_pool, layout.dtype).reshape(-1, layout.kv_heads, head_dim)
    v_rows = bits_to_float64(v_pool, layout.dtype).reshape(-1, layout.kv_heads, head_dim)
    scale_log2 = np.log2(np.e) / np.sqrt(head_dim)
    parts = np.zeros((plan.num_chunks, q_heads, 2 + head_dim))
    for c in range(plan.num_chunks):
        seq, t0 = int(plan.chunk_seq[c]), int(plan.chunk_start[c])
        slots = layout.token_slots(seq)[t0 : t0 + plan.chunk_tokens]
        for h in range(q_heads):
            s = k_rows[slots, h // group] @ q[seq, h] * scale_log2
            m = s.max()
            p = np.exp2(s - m)
            parts[c, h, 0], parts[c, h, 1], parts[c, h, 2:] = m, p.sum(), p @ v_rows[slots, h // group]
    out = np.zeros((batch, q_heads, head_dim))
    for b in range(batch):
        mine = parts[plan.chunk_begin[b] : plan.chunk_begin[b + 1]]
        if mine.shape[0]:
            w = np.exp2(mine[:, :, 0] - mine[:, :, 0].max(axis=0))
            out[b] = (w[:, :, None] * mine[:, :, 2:]).sum(0) / (w * mine[:, :, 1]).sum(0)[:, None]
    return out


def test_split_k_combine_reproduces_the_reference() -> None:
    rng = np.random.default_rng(4)
    layout = paged_shuffled_layout([0, 1, 70, 200], kv_heads=2, head_dim=64, block_size=8, rng=rng)
    k_pool, v_pool = make_pool(layout, rng)
    q = float32_to_bits(rng.standard_normal((4, 8, 64), dtype=np.float32), "bf16")
    plan = plan_chunks(layout.lengths_tokens, 64)
    np.testing.assert_allclose(
        split_k_emulation(layout, plan, q, k_pool, v_pool),
        decode_attention_reference(layout, q, k_pool, v_pool),
        rtol=1e-9,
        atol=1e-12,
    )


def test_timing_summary_and_replicas() -> None:
    timing = summarize([4.0, 1.0, 2.0, 3.0, 5.0] * 4, launches_per_sample=2)
    assert timing.median_s == 1.5 and timing.p10_s == 0.5 and timing.p90_s == 2.5 and timing.repeats == 20
    with pytest.raises(ValueError):
        summarize([])
    assert replicas_needed(10 * 2**20, 60 * 2**20) == 24
    assert replicas_needed(10 * 2**30, 60 * 2**20) == 2
    assert replicas_needed(2**10, 60 * 2**20) == 32


# ---------------------------------------------------------------------------------------------
# CLI without a device


def _main(argv: list[str], capsys) -> tuple[int, str]:
    from sim.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    return int(info.value.code or 0), capsys.readouterr().err


def test_calibrate_without_a_gpu_exits_2_with_one_line(tmp_path, capsys) -> None:
    from gpu.backend import has_gpu

    if has_gpu():
        pytest.skip("a GPU is present")
    code, err = _main(["calibrate", "--output", str(tmp_path / "p.json")], capsys)
    assert code == 2 and err.startswith("error: no CUDA device: ") and err.count("\n") == 1
    assert not (tmp_path / "p.json").exists()


def test_replay_validates_the_folder_then_needs_a_gpu(tmp_path, capsys) -> None:
    from gpu.backend import has_gpu

    code, err = _main(["replay", str(tmp_path)], capsys)
    assert code == 2 and "no layouts/index.csv found" in err and err.count("\n") == 1
    if has_gpu():
        return
    write_results_dir(tmp_path, {0: paged_snapshot()})
    code, err = _main(["replay", str(tmp_path), "--num-kv-heads", "2", "--num-q-heads", "8"], capsys)
    assert code == 2 and err.startswith("error: no CUDA device: ") and err.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# On a device


@pytest.fixture(scope="module")
def device_kernels():
    from gpu.backend import device_properties, require_cupy
    from gpu.kernels import Kernels

    return Kernels(require_cupy()), device_properties()["multiprocessor_count"]


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("group", GROUPS)
def test_kernels_match_the_reference_on_device(device_kernels, paged, dtype, head_dim, group) -> None:
    from gpu.check import check_case

    kernels, num_sms = device_kernels
    for block_size in (1, 16):
        results = check_case(
            kernels, np.random.default_rng(group * 7 + head_dim), paged=paged, dtype=dtype, head_dim=head_dim,
            group=group, block_size=block_size, num_sms=num_sms,
        )  # fmt: skip
        for result in results:
            assert result.ok, result


@pytest.mark.gpu
def test_event_timer_times_a_graph_of_replicas(device_kernels) -> None:
    from gpu.backend import require_cupy
    from gpu.timing import EventTimer

    cp = require_cupy()
    kernels, num_sms = device_kernels
    timer = EventTimer(cp, kernels=kernels, num_sms=num_sms)
    srcs = [cp.ones(1 << 20, dtype=cp.uint8) for _ in range(4)]
    sink = cp.zeros(1, dtype=cp.uint32)
    timing = timer.time([lambda s=s: kernels.stream_read(s, sink, num_sms) for s in srcs], repeats=20)
    assert timing.launches_per_sample == 4 and timing.repeats == 20 and timing.p10_s <= timing.median_s


def test_out_of_range_flags_exit_2_with_one_line(tmp_path, capsys) -> None:
    code, err = _main(["calibrate", "--output", str(tmp_path / "p.json"), "--repeats", "5"], capsys)
    assert code == 2 and err == "error: --repeats must be in [20, 1000], got 5\n"
    code, err = _main(["replay", str(tmp_path), "--budget-gb", "0"], capsys)
    assert code == 2 and err.startswith("error: --budget-gb must be in") and err.count("\n") == 1
