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
