"""End-to-end sweeps with the real engine: values, resume after a SIGKILL, Dask == local, bad specs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from sim.api import simulate
from sim.cli import main
from sim.scenario.scenario import Scenario
from sim.sweeps.runner import run_sweep, sweep

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "model": "OPT-13B",
    "gpu": "A100-40GB",
    "kv_cache_memory": "2GiB",
    "max_model_len": 2048,
    "num_prompts": 60,
    "workload": {"source": "sharegpt"},
}
SPEC_2X2 = {
    "name": "two-by-two",
    "base": BASE,
    "grid": {"allocator": ["paged", "contiguous"], "workload.request_rate": [1.0, 4.0]},
}
WALL_COLUMNS = ["cell_wall_s", "wall_s"]


def spec_toml(path: Path, *, num_prompts: int, grid: str) -> Path:
    path.write_text(
        f"""name = "{path.stem}"
[base]
model = "OPT-13B"
gpu = "A100-40GB"
kv_cache_memory = "2GiB"
max_model_len = 2048
num_prompts = {num_prompts}
[grid]
{grid}
"""
    )
    return path


@pytest.fixture(scope="module")
def local_2x2(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, Path]:
    out = tmp_path_factory.mktemp("sweep") / "two-by-two"
    return sweep(SPEC_2X2, jobs=2, output_dir=out, progress=False), out


def test_two_allocators_by_two_rates_gives_four_rows_with_the_right_values(local_2x2) -> None:
    table, out = local_2x2
    assert len(table) == 4 and (table["status"] == "ok").all()
    assert list(zip(table["allocator"], table["workload.request_rate"], strict=True)) == [
        ("paged", 1.0),
        ("paged", 4.0),
        ("contiguous", 1.0),
        ("contiguous", 4.0),
    ]
    assert table.equals(pd.read_parquet(out / "sweep.parquet"))
    for row in table.itertuples():
        cell_dir = out / "cells" / row.cell_id
        assert {p.name for p in cell_dir.iterdir()} >= {"requests.parquet", "steps.parquet", "summary.json"}
        summary = json.loads((cell_dir / "summary.json").read_text())
        assert (
            summary["scenario"]["workload"]["request_rate"] == table.loc[row.Index, "workload.request_rate"]
        )
        assert summary["metrics"]["request_throughput"] == row.request_throughput
        assert summary["metrics"]["p99_ttft_ms"] == row.p99_ttft_ms
    assert not (out / "cells" / ".partial").exists() or not any((out / "cells" / ".partial").iterdir())
    # the values are the engine's: one cell re-simulated directly gives the same metrics
    scenario = Scenario.from_dict(dict(BASE), allocator="contiguous", **{"workload.request_rate": 4.0})
    direct = simulate(scenario).summary["metrics"]
    row = table.iloc[3]
    for key in ("completed", "request_throughput", "p99_ttft_ms", "mean_tpot_ms", "max_concurrency"):
        assert row[key] == pytest.approx(direct[key]), key
    assert row["num_requests"] == 60 and row["completed"] == 60
    # more load means a longer queue: the grid's values really differ
    assert table.iloc[1]["mean_ttft_ms"] > table.iloc[0]["mean_ttft_ms"]


def test_rerun_skips_finished_cells_and_gives_the_same_table(local_2x2) -> None:
    table, out = local_2x2
    before = {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*/summary.json")}
    again, report = run_sweep(SPEC_2X2, jobs=2, output_dir=out, progress=False)
    assert report.skipped == 4 and report.ran == 0 and not report.failed
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*/summary.json")} == before
    pd.testing.assert_frame_equal(again, table)


def test_dask_local_cluster_gives_the_same_table_as_local_processes(local_2x2, tmp_path: Path) -> None:
    table, _ = local_2x2
    dask_table = sweep(SPEC_2X2, dask_local=2, output_dir=tmp_path / "dask", progress=False)
    pd.testing.assert_frame_equal(dask_table.drop(columns=WALL_COLUMNS), table.drop(columns=WALL_COLUMNS))


def test_scheduler_address_path_writes_the_runs_in_the_client(local_2x2, tmp_path: Path) -> None:
    import logging

    import distributed

    table, _ = local_2x2
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None, silence_logs=logging.ERROR
    ) as cluster:
        remote = sweep(
            SPEC_2X2, scheduler=cluster.scheduler_address, output_dir=tmp_path / "remote", progress=False
        )
    pd.testing.assert_frame_equal(remote.drop(columns=WALL_COLUMNS), table.drop(columns=WALL_COLUMNS))
    assert len(list((tmp_path / "remote" / "cells").glob("*/requests.parquet"))) == 4


def test_sweep_killed_midway_resumes_without_losing_or_duplicating(tmp_path: Path) -> None:
    spec = spec_toml(
        tmp_path / "killme.toml",
        num_prompts=800,
        grid='allocator = ["paged", "virtual"]\nworkload.request_rate = [2.0, 8.0, 32.0]',
    )
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "sim.cli",
        "sweep",
        str(spec),
        "--jobs",
        "1",
        "--output",
        str(out),
        "--no-progress",
    ]
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    try:
        while not list((out / "cells").glob("*/summary.json")):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no cell finished within 60 s"
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the sweep and its worker processes, as a job kill would
        process.wait()
    done_before = {p.parent.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*/summary.json")}
    assert 1 <= len(done_before) < 6
    assert not (out / "sweep.parquet").exists()
    rerun = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert f"6 cells: {6 - len(done_before)} ran, {len(done_before)} already done, 0 failed" in rerun.stdout
    table = pd.read_parquet(out / "sweep.parquet")
    assert len(table) == 6 and (table["status"] == "ok").all() and table["cell_id"].is_unique
    done_after = {p.parent.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*/summary.json")}
    assert set(done_after) == set(table["cell_id"])
    assert {k: done_after[k] for k in done_before} == done_before  # finished cells were not redone
    assert sorted(p.name for p in (out / "cells").iterdir() if not p.name.startswith(".")) == sorted(
        done_after
    )


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    captured = capsys.readouterr()
    return int(info.value.code), captured.out, captured.err


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ('alocator = ["paged"]', "unknown key 'alocator'; valid keys: name, model,"),
        (
            'allocator = ["paged", "pagd"]',
            "cell allocator='pagd': field 'allocator': unknown allocator 'pagd'",
        ),
        ("block_size = [16, -1]", "cell block_size=-1: field 'block_size': must be >= 1 (got -1)"),
        ('allocator = "paged"', "key 'allocator' must be a list of values"),
    ],
)
def test_bad_spec_gives_one_line_and_exit_2_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grid: str, message: str
) -> None:
    spec = spec_toml(tmp_path / "bad.toml", num_prompts=10, grid=grid)
    code, out, err = run_cli(["sweep", str(spec), "--output", str(tmp_path / "out"), "--no-progress"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_bad_flags_give_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_toml(tmp_path / "ok.toml", num_prompts=10, grid='allocator = ["paged"]')
    code, _, err = run_cli(["sweep", str(spec), "--jobs", "0"], capsys)
    assert code == 2 and err == "error: --jobs: must be an integer >= 1 (got 0)\n"
    code, _, err = run_cli(["sweep", str(spec), "--dask-local", "2", "--scheduler", "tcp://h:1"], capsys)
    assert code == 2 and "exclusive" in err
    code, _, err = run_cli(["sweep", str(tmp_path / "missing.toml")], capsys)
    assert code == 2 and "sweep spec file does not exist" in err


def test_a_failing_cell_does_not_stop_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-trace.jsonl"
    spec = spec_toml(
        tmp_path / "partial.toml", num_prompts=20, grid=f'workload.source = ["sharegpt", "{missing}"]'
    )
    code, out, err = run_cli(["sweep", str(spec), "--jobs", "2", "--output", str(tmp_path / "out")], capsys)
    assert code == 1
    assert "2 cells: 1 ran, 0 already done, 1 failed" in out
    assert "1 failed cell(s):" in err and "no-such-trace.jsonl" in err
    table = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    assert list(table["status"]) == ["ok", "failed"]
    assert table.loc[1, "error"] and "\n" not in table.loc[1, "error"]
    assert table.loc[0, "completed"] == 20 and pd.isna(table.loc[1, "completed"])


def test_report_on_a_sweep_folder_reports_its_cells_with_figure_5(
    local_2x2, capsys: pytest.CaptureFixture[str]
) -> None:
    from _report_helpers import parse_html

    from sim.reports.render import FIGURE_FILES

    table, out = local_2x2
    junk = out / "cells" / ".partial" / "deadbeef0000-1234"  # a killed worker's half-written cell
    junk.mkdir(parents=True, exist_ok=True)
    (junk / "steps.parquet").write_bytes(b"")
    try:
        main(["report", str(out)])
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr().err
    assert f"report written to {out / 'report.html'}" in capsys.readouterr().out
    parsed = parse_html(out / "report.html")
    assert sorted(label for label, _ in parsed.rows) == [
        "contiguous (request_rate=1.0)",
        "contiguous (request_rate=4.0)",
        "paged (request_rate=1.0)",
        "paged (request_rate=4.0)",
    ]
    figure_5 = out / "figures" / FIGURE_FILES["rate_sweep"]
    assert figure_5.read_bytes().startswith(b"\x89PNG")
    assert not (out / "cells" / "report.html").exists() and not (out / "cells" / "figures").exists()
    # the table's numbers are the cells' own
    cells = {metric: raw for metric, raw, _ in dict(parsed.rows)["paged (request_rate=4.0)"]}
    expected = table[(table["allocator"] == "paged") & (table["workload.request_rate"] == 4.0)]
    assert json.loads(cells["request_throughput"]) == expected["request_throughput"].iloc[0]


def test_a_finished_sweep_rerun_starts_no_workers(local_2x2, monkeypatch: pytest.MonkeyPatch) -> None:
    table, out = local_2x2

    def no_executor(**kwargs: object) -> None:
        raise AssertionError("an executor was made for a sweep with nothing to run")

    monkeypatch.setattr("sim.sweeps.runner.make_executor", no_executor)
    again, report = run_sweep(SPEC_2X2, output_dir=out, progress=False)
    assert report.ran == 0 and report.skipped == 4
    pd.testing.assert_frame_equal(again, table)


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_unwritable_sweep_folder_is_one_line_exit_2_before_any_cell(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_toml(tmp_path / "ok.toml", num_prompts=10, grid='allocator = ["paged"]')
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    output = blocker if where == "file" else blocker / "sweep"
    code, out, err = run_cli(["sweep", str(spec), "-o", str(output), "--no-progress"], capsys)
    assert code == 2 and out == ""
    in_the_way = "" if where == "file" else f"{blocker} "
    assert err == f"error: sweep folder {output}: {in_the_way}is a file, not a folder\n"
    assert blocker.read_text() == "x"


def test_unreachable_scheduler_leaves_no_sweep_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from sim.sweeps.executors import DaskExecutor

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def quick_dask(*, jobs: object, scheduler: str, dask_local: object) -> DaskExecutor:
        return DaskExecutor(scheduler=scheduler, connect_timeout_s=1.0)

    monkeypatch.setattr("sim.sweeps.runner.make_executor", quick_dask)
    spec = spec_toml(tmp_path / "ok.toml", num_prompts=10, grid='allocator = ["paged"]')
    output = tmp_path / "sweep"
    code, _, err = run_cli(
        ["sweep", str(spec), "-o", str(output), "--scheduler", f"tcp://127.0.0.1:{port}", "--no-progress"],
        capsys,
    )
    assert code == 2 and err.startswith(f"error: --scheduler (tcp://127.0.0.1:{port}): cannot connect")
    assert err.count("\n") == 1
    assert not output.exists()  # no .lock, no cells/


def test_scenario_flags_change_the_base_of_every_cell(tmp_path: Path) -> None:
    """`kvsim sweep SPEC --num-prompts N --set seed=S`: the same scenario flags as run and capacity."""
    spec = spec_toml(tmp_path / "s.toml", num_prompts=10, grid='allocator = ["paged", "contiguous"]')
    output = tmp_path / "out"
    main(["sweep", str(spec), "-o", str(output), "--no-progress", "--num-prompts", "6", "--set", "seed=3"])
    table = pd.read_parquet(output / "sweep.parquet")
    assert table["num_prompts"].tolist() == [6, 6] and table["seed"].tolist() == [3, 3]
