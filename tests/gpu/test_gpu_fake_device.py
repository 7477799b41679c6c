"""The GPU-side Python (checks, calibration driver, timer, replay, CLI) run against a NumPy stand-in for CuPy.

The stand-in emulates each kernel from its CUDA signature (tests/_gpu_fake_cupy.py), so argument
order, plans, workspaces, replicas and graph capture are exercised without a device.
"""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_helpers import contiguous_snapshot, paged_snapshot, write_results_dir

import gpu.backend as backend
from gpu.profile import load_profile, validate_profile
from gpu.timing import EventTimer


@pytest.fixture()
def fake_device(monkeypatch):
    import _gpu_fake_cupy

    monkeypatch.setattr(backend, "_cupy_or_reason", lambda: (_gpu_fake_cupy, ""))
    monkeypatch.setattr(EventTimer, "graph_below_s", 10.0)  # CPU "kernels" are slow: still exercise graphs
    return _gpu_fake_cupy


def test_every_instantiation_passes_the_reference_check(fake_device) -> None:
    from gpu.check import check_all
    from gpu.kernels import Kernels

    results = check_all(Kernels(fake_device), np.random.default_rng(0), num_sms=4)
    assert len(results) == 80 and all(r.ok for r in results)
    assert max(r.rel_err for r in results if r.kernel == "attention") < 1e-5


def test_quick_calibration_builds_a_valid_profile(fake_device, tmp_path) -> None:
    from gpu.calibrate import run_calibration, summary_table, write_outputs
    from gpu.grid import grid_points

    points = grid_points(batches=(2,), contexts_tokens=(64, 160), block_sizes=(16,), heads=("gqa8",))
    profile, rows = run_calibration(
        max_point_bytes=40 * 2**20, check=False, points=points, log=lambda _: None
    )
    validate_profile(profile)
    assert profile["measured"] is True and profile["device"]["name"] == "FakeGPU"
    kinds = {(r["kernel"], r["layout"], r["block_size"]) for r in rows}
    assert ("attention", "contiguous", 0) in kinds and ("gather", "paged_shuffled", 16) in kinds
    assert any(r["launches_per_sample"] > 1 for r in rows)  # short kernels timed as graphs of replicas
    assert len(rows) == len(points) == 12
    assert set(profile["ratios"]["attention"]) == {"16"}
    write_outputs(profile, rows, tmp_path / "profile.json", tmp_path / "raw.csv")
    assert load_profile(tmp_path / "profile.json")["rows"] == rows
    assert len((tmp_path / "raw.csv").read_text().splitlines()) == len(rows) + 1
    assert "paged_shuffled/contiguous attention" in summary_table(profile)


def test_replay_cli_on_an_exported_compare_folder(fake_device, tmp_path, capsys) -> None:
    from sim.cli import main

    write_results_dir(tmp_path / "paged", {0: paged_snapshot(0), 10: paged_snapshot(1)})
    write_results_dir(tmp_path / "contiguous", {0: contiguous_snapshot()}, allocator="contiguous")
    main(["replay", str(tmp_path), "--num-q-heads", "8", "--num-kv-heads", "2", "--head-dim", "64",
          "--num-layers", "4", "--budget-gb", "0.05"])  # fmt: skip
    out = capsys.readouterr().out
    assert "wrote" in out and (tmp_path / "replay.csv").is_file()
    lines = (tmp_path / "replay.csv").read_text().splitlines()
    assert len(lines) == 4 and lines[0].startswith("run,allocator,step")
    assert lines[1].startswith("contiguous,contiguous,0,") and ",snapshot_contiguous,exact," in lines[1]


def test_calibration_keeps_every_point_within_its_memory_cap(fake_device, monkeypatch) -> None:
    import gpu.calibrate as calibrate
    from gpu.grid import grid_points

    cap_bytes = 24 * 2**20
    points = grid_points(
        batches=(2,), contexts_tokens=(64, 256), block_sizes=(16,), heads=("mha",), max_point_bytes=cap_bytes
    )
    assert any(p.kernel == "gather" and p.working_set_bytes > cap_bytes // 4 for p in points)
    timed, flush_bytes = [], []
    original = calibrate.time_point

    def measured(point, **kwargs):
        if not timed:
            fake_device.memory.reset_peak()  # the grid starts: ceiling buffers are gone
            flush_bytes.append(kwargs["timer"].flush_bytes)
        timed.append(point)
        return original(point, **kwargs)

    monkeypatch.setattr(calibrate, "time_point", measured)
    _, rows = calibrate.run_calibration(
        max_point_bytes=cap_bytes, check=False, points=points, log=lambda _: None
    )
    assert len(rows) == len(points)
    assert any(r["launches_per_sample"] > 1 for r in rows)
    point_bytes = fake_device.memory.peak_bytes - flush_bytes[0]  # the L2-flush buffer is the timer's
    assert cap_bytes // 2 < point_bytes <= cap_bytes


def test_replica_launches_read_and_write_disjoint_copies(fake_device) -> None:
    from gpu.kernels import Kernels
    from gpu.layouts import fill_random_bits, paged_shuffled_layout
    from gpu.reference import gather_reference
    from gpu.replicas import replica_elems, replica_launches

    rng = np.random.default_rng(3)
    layout = paged_shuffled_layout([40, 9, 100], kv_heads=2, head_dim=64, block_size=8, rng=rng)
    pool, out = replica_elems("gather", layout)
    arena = fill_random_bits(fake_device.empty(2 * (pool + out) * 5 + 7, dtype=np.uint16), rng, "bf16")
    q = fake_device.zeros((3, 4, 64), dtype=np.uint16)
    result = replica_launches(
        Kernels(fake_device), "gather", layout, arena, q=q, out=None, num_sms=4, l2_bytes=1 << 20,
        graph_below_s=10.0,
    )  # fmt: skip
    assert result.replicas == 5  # as many as the arena holds (L2 would want more)
    for launch in result.launches:
        launch()
    rows_elems = layout.live_tokens * layout.kv_heads * layout.head_dim
    k_pools = np.asarray(arena[: 5 * pool]).reshape(5, layout.num_slots, layout.kv_heads, layout.head_dim)
    v_pools = np.asarray(arena[5 * pool : 10 * pool]).reshape(k_pools.shape)
    for r in range(5):
        k_ref, v_ref = gather_reference(layout, k_pools[r], v_pools[r])
        k_out = arena[10 * pool + r * out : 10 * pool + (r + 1) * out]
        v_out = arena[10 * pool + (5 + r) * out : 10 * pool + (6 + r) * out]
        np.testing.assert_array_equal(np.asarray(k_out), k_ref.reshape(rows_elems))
        np.testing.assert_array_equal(np.asarray(v_out), v_ref.reshape(rows_elems))
    assert len({id(x.block_table) for x in result.keep_alive if hasattr(x, "block_table")}) == 5


def test_replay_times_short_kernels_as_graphs_of_replicas(fake_device, tmp_path, monkeypatch) -> None:
    from gpu.replay import ReplayModel, replay

    launches_seen: list[int] = []
    original = EventTimer.time

    def spy(self, launches, **kwargs):
        launches_seen.append(len(launches))
        return original(self, launches, **kwargs)

    monkeypatch.setattr(EventTimer, "time", spy)
    write_results_dir(tmp_path, {0: paged_snapshot(0)})
    model = ReplayModel(num_q_heads=8, num_kv_heads=2, head_dim=64, num_layers=4)
    rows = replay(tmp_path, model, budget_bytes=50 * 10**6)
    assert len(rows) == 1 and rows[0]["gather_s"] > 0 and rows[0]["attention_s"] > 0
    assert len(launches_seen) == 2 and min(launches_seen) > 1  # gather and attention, both as graphs


def test_replay_model_resolve_prefers_flags_then_summary_then_defaults() -> None:
    from gpu.replay import ReplayModel

    model = ReplayModel.resolve({"num_kv_heads": 4, "num_layers": 28}, num_kv_heads=None, head_dim=64)
    assert (model.num_q_heads, model.num_kv_heads, model.head_dim, model.num_layers) == (32, 4, 64, 28)
