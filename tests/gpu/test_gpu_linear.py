"""gpu/linear.py: GEMM shapes of real models, the cuBLAS launch (on the stand-in), and Vidur's CSV format."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
from _gpu_helpers import fake_device  # noqa: F401 - fixture

from gpu.linear import (
    CSV_COLUMNS,
    GEMM_OPS,
    MODEL_SHAPES,
    OPS,
    LinearLayer,
    ModelShape,
    check_linear,
    rows_to_csv,
    run_linear,
)
from gpu.timing import EventTimer

VIDUR_MLP = Path(__file__).resolve().parents[3] / "shared" / "profiles" / "vidur_mlp"
TINY = ModelShape("tiny", n_head=4, n_kv_head=2, n_embd=64, n_expanded_embd=96, vocab_size=1000)


def test_op_shapes_are_vllms_fused_projections_per_tp_rank() -> None:
    llama2_7b, llama3_8b, llama2_70b = MODEL_SHAPES
    assert llama2_7b.op_shapes(1) == {
        "attn_pre_proj": (4096, 3 * 4096),
        "attn_post_proj": (4096, 4096),
        "mlp_up_proj": (4096, 2 * 11008),
        "mlp_down_proj": (11008, 4096),
    }
    assert llama3_8b.op_shapes(2)["attn_pre_proj"] == (4096, (16 + 2 * 4) * 128)
    assert llama2_70b.op_shapes(8) == {
        "attn_pre_proj": (8192, (8 + 2 * 1) * 128),
        "attn_post_proj": (1024, 8192),
        "mlp_up_proj": (8192, 2 * 3584),
        "mlp_down_proj": (3584, 8192),
    }
    assert llama3_8b.op_shapes(16)["attn_pre_proj"] == (4096, (2 + 2 * 1) * 128)  # KV heads replicated


@pytest.mark.skipif(not VIDUR_MLP.is_dir(), reason="../shared/profiles is absent")
def test_model_rows_and_columns_match_vidurs_files() -> None:
    shapes = set()
    for path in sorted(VIDUR_MLP.glob("*.mlp.csv")):
        with path.open() as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            row = next(reader)
        # our columns are a subset of Vidur's, in Vidur's order
        assert [c for c in header if c in CSV_COLUMNS] == list(CSV_COLUMNS)
        shapes.add(tuple(row[k] for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size")))
    ours = {
        tuple(str(getattr(m, k)) for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size"))
        for m in MODEL_SHAPES
    }
    assert ours == shapes


@pytest.mark.parametrize("tp", [1, 2])
def test_every_op_matches_the_host_reference_on_the_stand_in(fake_device, tp) -> None:  # noqa: F811
    layer = LinearLayer(fake_device, TINY, tp, np.random.default_rng(0), max_tokens=8)
    fake_device.gemm_calls.clear()
    for op in OPS:
        assert layer.check(op, tokens=5) < 1e-2, op
    in_out = TINY.op_shapes(tp)
    assert [(c["m"], c["n"], c["k"], c["transa"], c["transb"]) for c in fake_device.gemm_calls] == [
        (in_out[op][1], 5, in_out[op][0], 1, 0) for op in GEMM_OPS
    ]


def test_vidurs_nine_per_layer_ops_are_all_timed() -> None:
    assert set(GEMM_OPS) < set(OPS) and len(OPS) == 9
    assert [c.split(".")[1] for c in CSV_COLUMNS if c.endswith(".median")] == list(OPS)


@pytest.mark.parametrize("op", ["input_layernorm", "attn_rope", "mlp_act", "add"])
def test_a_wrong_elementwise_kernel_fails_its_check(fake_device, monkeypatch, op) -> None:  # noqa: F811
    layer = LinearLayer(fake_device, TINY, 1, np.random.default_rng(0), max_tokens=8)
    names = {
        "input_layernorm": "rms_norm",
        "attn_rope": "rotary_neox",
        "mlp_act": "silu_and_mul",
        "add": "residual_add",
    }
    original = fake_device._LAYER_OPS[names[op]]

    def off_by_one(grid, args):  # the kernel sees one token fewer (rows) or one element fewer (flat ops)
        args = list(args)
        if op in ("add", "mlp_act"):
            args[-1] = np.int64(int(args[-1]) - 1)
            return original(grid, tuple(args))
        return original((grid[0] - 1,), tuple(args))

    monkeypatch.setitem(fake_device._LAYER_OPS, names[op], off_by_one)
    assert layer.check(op, tokens=5) > 1e-2


def test_a_gemm_reading_the_wrong_rows_fails_the_check(fake_device, monkeypatch) -> None:  # noqa: F811
    import gpu.linear as linear

    def off_by_one_row(self, op: str, tokens: int) -> None:  # reads x from its second token row on
        in_f, out_f = self.shapes[op]
        self.cupy.cuda.cublas.gemmEx(
            self._handle, linear.CUBLAS_OP_T, linear.CUBLAS_OP_N, out_f, tokens, in_f,
            self._alpha.ctypes.data, self.weights[op].data.ptr, linear.CUDA_R_16BF, in_f,
            self.x[in_f:].data.ptr, linear.CUDA_R_16BF, in_f,
            self._beta.ctypes.data, self.y.data.ptr, linear.CUDA_R_16BF, out_f,
            linear.CUBLAS_COMPUTE_32F, linear.CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip

    results = check_linear(fake_device, np.random.default_rng(1), models=(TINY,), tp=2)
    assert [r["op"] for r in results] == list(OPS) and all(r["ok"] for r in results)
    monkeypatch.setattr(LinearLayer, "launch", off_by_one_row)
    results = check_linear(fake_device, np.random.default_rng(1), models=(TINY,), tp=2)
    assert {r["op"] for r in results if not r["ok"]} == set(GEMM_OPS)


def test_run_linear_writes_one_vidur_row_per_model_tp_and_batch(fake_device) -> None:  # noqa: F811
    from gpu.kernels import Kernels

    timer = EventTimer(fake_device, 1 << 16, kernels=Kernels(fake_device), num_sms=4)
    seen, errors = [], []
    rows, skipped = run_linear(
        fake_device, timer, np.random.default_rng(0), models=(TINY,), tp_sizes=(1, 2), num_tokens=(1, 4),
        on_row=seen.append, on_error=errors.append,
    )  # fmt: skip
    assert skipped == 0 and not errors and rows == seen and len(rows) == 4
    assert [(r["num_tensor_parallel_workers"], r["num_tokens"]) for r in rows] == [
        (1, 1),
        (1, 4),
        (2, 1),
        (2, 4),
    ]
    for row in rows:
        for op in OPS:  # all nine, as kvsim's reader sums them
            low, mid, high = (row[f"time_stats.{op}.{s}"] for s in ("min", "median", "max"))
            assert 0 < low <= mid <= high and row[f"time_stats.{op}.std"] >= 0
    parsed = list(csv.DictReader(io.StringIO(rows_to_csv(rows))))
    assert list(parsed[0]) == list(CSV_COLUMNS) and parsed[0]["use_gated_mlp"] == "True"
    assert float(parsed[1]["time_stats.mlp_up_proj.median"]) == rows[1]["time_stats.mlp_up_proj.median"]


def test_a_row_that_raises_is_recorded_and_the_rest_are_timed(fake_device, monkeypatch) -> None:  # noqa: F811
    from gpu.kernels import Kernels

    timer = EventTimer(fake_device, 1 << 16, kernels=Kernels(fake_device), num_sms=4)
    original = LinearLayer.launch

    def fails_at_two(self, op, tokens):
        if tokens == 2:
            raise RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")
        return original(self, op, tokens)

    monkeypatch.setattr(LinearLayer, "launch", fails_at_two)
    errors: list[dict] = []
    rows, _ = run_linear(
        fake_device, timer, np.random.default_rng(0), models=(TINY,), tp_sizes=(1,), num_tokens=(1, 2, 3),
        on_error=errors.append,
    )  # fmt: skip
    assert [r["num_tokens"] for r in rows] == [1, 3]
    assert len(errors) == 1 and "num_tokens=2" in errors[0]["what"] and "CUBLAS" in errors[0]["error"]


def test_the_elementwise_kernels_compile_for_sm90_without_spills() -> None:
    import re

    from gpu.compile import NvrtcNotFound, compile_source, load_nvrtc
    from gpu.layer_ops import KERNEL_NAMES, layer_ops_source

    try:
        load_nvrtc()
    except NvrtcNotFound as exc:
        pytest.skip(str(exc))
    result = compile_source(
        layer_ops_source(), list(KERNEL_NAMES), arch="sm_90", options=("-std=c++17", "--ptxas-options=-v")
    )
    assert set(result.lowered_names) == set(KERNEL_NAMES)
    spills = [
        int(a) + int(b)
        for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", result.log)
    ]
    assert len(spills) == len(KERNEL_NAMES) and not any(spills)


def test_kvsims_profile_reader_accepts_the_csv(fake_device, tmp_path) -> None:  # noqa: F811
    """Cross-check with the sim side (sim.cost.profiles, issue 13); skipped on branches without it."""
    profiles = pytest.importorskip("sim.cost.profiles")
    from gpu.kernels import Kernels

    timer = EventTimer(fake_device, 1 << 16, kernels=Kernels(fake_device), num_sms=4)
    rows, _ = run_linear(
        fake_device, timer, np.random.default_rng(0), models=(TINY,), tp_sizes=(1, 2), num_tokens=(1, 4)
    )
    path = tmp_path / "h200_tiny.mlp.csv"
    path.write_text(rows_to_csv(rows))
    frame = profiles.read_linear_profile(path)
    assert len(frame) == 4 and (frame["measured_s"] > 0).all()
