"""The device run on the NumPy stand-in: stream order, L2 flush, ceilings, and a run that never loses work.

The stand-in (tests/_gpu_fake_cupy.py) models the legacy default stream and the timer's non-blocking
stream: a launch that reads an upload still in flight on the other stream raises StreamRaceError, as
it could read stale bytes on a device (issue 15).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _gpu_helpers import fake_device  # noqa: F401 - fixture

from gpu.timing import EventTimer

REPO = Path(__file__).resolve().parents[2]


def _layout_and_launch(fake):
    from gpu.kernels import DeviceLayout, DevicePlan, Kernels, gather_plan
    from gpu.layouts import make_pool, paged_shuffled_layout

    kernels = Kernels(fake)
    rng = np.random.default_rng(0)
    layout = paged_shuffled_layout([40, 9, 100], kv_heads=2, head_dim=64, block_size=8, rng=rng)
    k_host, v_host = make_pool(layout, rng)
    k_pool, v_pool = fake.asarray(k_host), fake.asarray(v_host)  # uploads on the default stream
    dev = DeviceLayout.upload(fake, layout)
    plan = DevicePlan.upload(fake, gather_plan(layout, 4))
    k_out = fake.empty((layout.live_tokens, 2, 64), dtype=np.uint16)
    v_out = fake.empty((layout.live_tokens, 2, 64), dtype=np.uint16)
    return kernels, lambda: kernels.gather(dev, plan, k_pool, v_pool, k_out, v_out)


def test_the_stand_in_orders_the_default_stream_with_blocking_streams_only(fake_device) -> None:  # noqa: F811
    kernels, launch = _layout_and_launch(fake_device)
    with fake_device.cuda.Stream(non_blocking=True):
        with pytest.raises(fake_device.StreamRaceError, match="upload on null"):
            launch()
    with fake_device.cuda.Stream(non_blocking=False):
        launch()  # a blocking stream waits for the legacy default stream
    kernels, launch = _layout_and_launch(fake_device)
    fake_device.cuda.runtime.deviceSynchronize()
    with fake_device.cuda.Stream(non_blocking=True):
        launch()


def test_the_timer_synchronises_uploads_before_its_first_launch(fake_device, monkeypatch) -> None:  # noqa: F811
    kernels, launch = _layout_and_launch(fake_device)
    timer = EventTimer(fake_device, 1 << 16, kernels=kernels, num_sms=4)
    monkeypatch.setattr(EventTimer, "synchronize_device", lambda self: None)  # the race of issue 15
    with pytest.raises(fake_device.StreamRaceError):
        timer.time([launch], repeats=20)
    monkeypatch.undo()
    monkeypatch.setattr(EventTimer, "graph_below_s", 10.0)
    kernels, launch = _layout_and_launch(fake_device)
    assert timer.time([launch], repeats=20).repeats == 20


def test_without_the_sync_every_grid_point_races_and_the_grid_stops(fake_device, monkeypatch) -> None:  # noqa: F811
    import gpu.calibrate as calibrate
    from gpu.calibrate import CalibrationState, GridAborted, run_calibration
    from gpu.grid import grid_points

    points = grid_points(batches=(2,), contexts_tokens=(64,), block_sizes=(16,), heads=("gqa8",))
    real_sync, real_point = EventTimer.synchronize_device, calibrate.time_point
    in_grid: list[bool] = []

    def sync_before_the_grid_only(self) -> None:
        if not in_grid:
            real_sync(self)

    def grid_point(point, **kwargs):
        in_grid.append(True)
        return real_point(point, **kwargs)

    monkeypatch.setattr(EventTimer, "synchronize_device", sync_before_the_grid_only)
    monkeypatch.setattr(calibrate, "time_point", grid_point)
    state = CalibrationState()
    with pytest.raises(GridAborted):
        run_calibration(
            max_point_bytes=40 * 2**20,
            check=False,
            points=points,
            log=lambda _: None,
            warm_up_s=0.0,
            state=state,
        )
    assert not state.rows and len(state.errors) == 3
    assert all("StreamRaceError" in e["error"] for e in state.errors)


def test_l2_is_flushed_by_reading_a_buffer_zeroed_once(fake_device, monkeypatch) -> None:  # noqa: F811
    kernels, launch = _layout_and_launch(fake_device)
    timer = EventTimer(fake_device, 1 << 16, kernels=kernels, num_sms=4)
    assert not np.asarray(timer.flush_buffer).any() and timer.flush_bytes == 4 << 16
    memsets: list[int] = []
    reads: list[int] = []
    monkeypatch.setattr(fake_device.cuda.runtime, "memsetAsync", lambda *a: memsets.append(1))
    original = kernels.stream_read
    monkeypatch.setattr(
        kernels, "stream_read", lambda src, *a: (reads.append(int(src.nbytes)), original(src, *a))
    )
    timing = timer.time([launch], repeats=20)
    assert not memsets
    assert reads.count(timer.flush_bytes) == timing.repeats + 3  # one flush per probe and per repeat


def test_clocks_are_warmed_before_the_ceilings_and_their_buffers_freed(fake_device, monkeypatch) -> None:  # noqa: F811
    import gpu.calibrate as calibrate
    from gpu.grid import grid_points

    order: list[str] = []

    def recorded(name: str):
        original = getattr(EventTimer, name)

        def method(self, *args, **kwargs):
            order.append(name)
            return original(self, *args, **kwargs)

        return method

    for name in ("warm_up", "copy_ceiling", "read_ceiling"):
        monkeypatch.setattr(EventTimer, name, recorded(name))
    held: list[int] = []
    original_point = calibrate.time_point

    def first_point(point, **kwargs):
        if not held:
            held.append(fake_device.memory.held_bytes)
        return original_point(point, **kwargs)

    monkeypatch.setattr(calibrate, "time_point", first_point)
    cap = 40 * 2**20
    points = grid_points(
        batches=(2,), contexts_tokens=(64,), block_sizes=(16,), heads=("gqa8",), max_point_bytes=cap
    )
    calibrate.run_calibration(
        max_point_bytes=cap, check=False, points=points, log=lambda _: None, warm_up_s=0.01
    )
    assert order == ["warm_up", "copy_ceiling", "read_ceiling"]
    arena, reserve = calibrate.point_budget(cap)
    copy_bytes = cap // 4  # two buffers of this size, then a read buffer of twice it
    assert held[0] < arena + reserve + 4 * (1 << 20) + 2**20 + copy_bytes  # ceiling buffers not held


# ---------------------------------------------------------------------------------------------
# gpu/device_run.py end to end


@pytest.fixture()
def small_run(fake_device, monkeypatch):  # noqa: F811
    """device_run on the stand-in with a tiny grid, families and linear model (seconds on a CPU)."""
    import gpu.calibrate as calibrate
    import gpu.linear as linear
    from gpu.grid import grid_points

    monkeypatch.setattr(
        calibrate,
        "quick_grid",
        lambda cap: grid_points(
            batches=(2,), contexts_tokens=(64, 96), block_sizes=(16,), heads=("gqa8",), max_point_bytes=cap
        ),
    )
    monkeypatch.setattr(
        calibrate,
        "check_all",
        functools.partial(calibrate.check_all, dtypes=("bf16",), head_dims=(64,), groups=(1, 4)),
    )
    monkeypatch.setattr(
        calibrate,
        "check_grid_families",
        functools.partial(calibrate.check_grid_families, heads=("gqa8",), block_sizes=(16,), long_tokens=200),
    )
    monkeypatch.setattr(linear, "MODEL_SHAPES", (linear.ModelShape("tiny", 4, 2, 64, 96, 1000),))
    monkeypatch.setattr(linear, "TP_SIZES", (1, 2))
    monkeypatch.setattr(linear, "NUM_TOKENS", (1, 3, 8))
    monkeypatch.setattr(EventTimer, "graph_below_s", 0.0)  # single launches: graphs are tested elsewhere
    return fake_device


def _device_run(out: Path) -> int:
    from gpu.device_run import main

    old = os.umask(0o022)
    try:
        return main(["--out", str(out), "--quick", "--max-point-gb", "0.04", "--warm-up-s", "0.01"])
    finally:
        os.umask(old)


def _csv_rows(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1


def test_a_complete_run_writes_a_handful_of_0644_files(small_run, tmp_path) -> None:
    from gpu.linear import CSV_COLUMNS
    from gpu.profile import load_profile

    assert _device_run(tmp_path) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["checks.csv", "linear.mlp.csv", "profile.json", "raw.csv", "table.txt"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {0o644}
    profile = load_profile(tmp_path / "profile.json")
    assert profile["complete"] is True and profile["errors"] == [] and len(profile["rows"]) == 12
    assert _csv_rows(tmp_path / "raw.csv") == 12
    assert {r["pool_spread"] for r in profile["rows"] if r["layout"] == "paged_shuffled"} == {4.0}
    assert _csv_rows(tmp_path / "linear.mlp.csv") == 6  # 1 model x 2 TP sizes x 3 batch sizes
    assert (tmp_path / "linear.mlp.csv").read_text().splitlines()[0].split(",") == list(CSV_COLUMNS)
    checks = (tmp_path / "checks.csv").read_text().splitlines()
    assert len(checks) == 1 + 2 * 2 * 2 + 3 * 2 * 2 + 9  # instantiations, families, the 9 layer ops
    assert all(line.endswith("True") for line in checks[1:])
    assert profile["linear"]["rows"] == 6 and "linear layers (6 rows" in (tmp_path / "table.txt").read_text()


def test_a_kernel_mismatch_stops_before_timing_and_leaves_the_checks(
    small_run, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(small_run, "PLANTED_DROP_LAST_TOKEN_ABOVE", 64)
    assert _device_run(tmp_path) == 1
    checks = (tmp_path / "checks.csv").read_text().splitlines()
    assert any(line.endswith("False") for line in checks)
    assert _csv_rows(tmp_path / "raw.csv") == 0 and not (tmp_path / "profile.json").exists()


def test_a_failing_point_is_recorded_and_the_run_goes_on(small_run, tmp_path, monkeypatch) -> None:
    import gpu.calibrate as calibrate

    original = calibrate.time_point

    def fails_once(point, **kwargs):
        if point.layout == "paged_sequential" and point.kernel == "gather" and point.context_tokens == 64:
            raise RuntimeError("cudaErrorLaunchFailure: planted")
        return original(point, **kwargs)

    monkeypatch.setattr(calibrate, "time_point", fails_once)
    assert _device_run(tmp_path) == 3
    assert _csv_rows(tmp_path / "errors.csv") == 1 and _csv_rows(tmp_path / "raw.csv") == 11
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["complete"] is True and "planted" in profile["errors"][0]["error"]


@pytest.mark.parametrize(
    ("how", "code"),
    [("crash", 4), ("sigterm", 5)],
)
def test_a_run_stopped_midway_keeps_its_rows_and_a_partial_profile(
    small_run, tmp_path, monkeypatch, how, code
) -> None:
    import gpu.calibrate as calibrate
    from gpu.profile import validate_profile

    original = calibrate.time_point
    seen: list[int] = []

    def stop_at_the_fifth(point, **kwargs):
        seen.append(1)
        if len(seen) == 5:
            if how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)  # as the call's time limit would
            else:
                raise MemoryError("planted")  # an error the per-point capture does not cover... once
        return original(point, **kwargs)

    if how == "crash":
        monkeypatch.setattr(calibrate, "MAX_CONSECUTIVE_ERRORS", 1)
    monkeypatch.setattr(calibrate, "time_point", stop_at_the_fifth)
    assert _device_run(tmp_path) == code
    profile = json.loads((tmp_path / "profile.json").read_text())
    validate_profile(profile)
    assert profile["complete"] is False and profile["stage"] == "grid"
    assert len(profile["rows"]) == 4 == _csv_rows(tmp_path / "raw.csv")
    assert _csv_rows(tmp_path / "linear.mlp.csv") == 6 and (tmp_path / "table.txt").is_file()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or how == "crash"


def test_run_device_sh_prints_its_run_line_and_logs_without_a_device(tmp_path) -> None:
    import sys

    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PYTHONPATH": ""}
    proc = subprocess.run(
        ["bash", str(REPO / "gpu" / "run_device.sh"), "--quick"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr  # no CuPy here: exit 2, one line
    assert 'run(command="bash gpu/run_device.sh", timeout_s=480)' in proc.stdout
    log = (out / "log.txt").read_text()
    assert "error: no CUDA device" in log and "exit 2" in log
    assert len(list(out.iterdir())) <= 8
