"""Results folders: atomic writes, faithful round trip, one-line errors for missing pieces, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sim.api import compare, simulate
from sim.errors import KvsimError, ResultsError
from sim.files import OutputPathError
from sim.results import check_run_dir, load_run, write_run
from sim.scenario.scenario import default_scenario


@pytest.fixture(scope="module")
def small_run():
    return simulate(default_scenario().with_overrides(num_prompts=60))


def test_round_trip_keeps_tables_and_summary(small_run, tmp_path: Path) -> None:
    folder = write_run(small_run, tmp_path / "run")
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["kvsim-output.json", "requests.parquet", "steps.parquet", "summary.json"]
    loaded = load_run(folder)
    pd.testing.assert_frame_equal(loaded.requests, small_run.requests)
    pd.testing.assert_frame_equal(loaded.steps, small_run.steps)
    summary = json.loads((folder / "summary.json").read_text())
    for key in ("kvsim_version", "versions", "scenario", "seed", "allocator", "metrics"):
        assert key in summary
    assert summary["scenario"]["model"] == "OPT-13B"
    assert summary["versions"]["simpy"]
    assert summary["metrics"]["completed"] == 60
    assert not list(tmp_path.glob(".run.*"))  # no temporary leftovers


def test_rewrite_replaces_a_previous_run_but_never_a_foreign_file(small_run, tmp_path: Path) -> None:
    """A kvsim run folder is replaced whole; one holding a file kvsim did not write is refused (issue 11)."""
    folder = write_run(small_run, tmp_path / "run")
    before = (folder / "summary.json").read_bytes()
    assert write_run(small_run, folder) == folder
    assert (folder / "summary.json").read_bytes() == before
    (folder / "notes.txt").write_text("mine, inside a kvsim folder")
    with pytest.raises(OutputPathError, match=r"holds files kvsim did not write \(notes.txt\)"):
        write_run(small_run, folder)
    assert (folder / "notes.txt").read_text() == "mine, inside a kvsim folder"
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(OutputPathError, match=r"exists and is not a kvsim folder \(holds notes.txt\)"):
        write_run(small_run, foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_check_run_dir_applies_write_runs_rule(small_run, tmp_path: Path) -> None:
    """The up-front check (used by the CLI before simulating) accepts exactly what write_run accepts."""
    assert check_run_dir(tmp_path / "new" / "run") == tmp_path / "new" / "run"  # not there yet
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_run_dir(empty) == empty
    previous = write_run(small_run, tmp_path / "previous")
    assert check_run_dir(previous) == previous
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(OutputPathError, match=f"^results folder {foreign}: exists and is not a kvsim folder"):
        check_run_dir(foreign)
    with pytest.raises(KvsimError, match=f"^results folder {a_file}: is a file, not a folder"):
        check_run_dir(a_file)
    assert not (tmp_path / "new").exists()  # checking creates nothing


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: (f / "summary.json").unlink(), "missing summary.json"),
        (lambda f: (f / "steps.parquet").unlink(), "missing steps.parquet"),
        (lambda f: (f / "summary.json").write_text("{not json"), "cannot read JSON"),
        (lambda f: (f / "summary.json").write_text('{"seed": 0}'), "missing key"),
        (
            lambda f: (
                pd.read_parquet(f / "requests.parquet")
                .drop(columns=["ttft_ms"])
                .to_parquet(f / "requests.parquet")
            ),
            "missing column.*ttft_ms",
        ),
    ],
)
def test_load_run_names_what_is_missing(small_run, tmp_path: Path, damage, message: str) -> None:
    folder = write_run(small_run, tmp_path / "run")
    damage(folder)
    with pytest.raises(ResultsError, match=message) as info:
        load_run(folder)
    assert "\n" not in str(info.value)


def test_load_run_of_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="not found"):
        load_run(tmp_path / "nope")


def test_same_scenario_and_seed_give_identical_parquet(tmp_path: Path) -> None:
    scenario = default_scenario().with_overrides(num_prompts=80, kv_cache_memory="2GiB", seed=3)
    first = write_run(simulate(scenario), tmp_path / "a")
    second = write_run(simulate(scenario), tmp_path / "b")
    for name in ("requests.parquet", "steps.parquet"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    other = write_run(simulate(scenario.with_overrides(seed=4)), tmp_path / "c")
    assert (other / "requests.parquet").read_bytes() != (first / "requests.parquet").read_bytes()


def test_compare_uses_one_workload_for_every_allocator() -> None:
    runs = compare(default_scenario().with_overrides(num_prompts=40), ["paged", "request_limit:oracle"])
    assert list(runs) == ["paged", "request_limit:oracle"]
    a, b = (run.requests for run in runs.values())
    assert a["prompt_tokens"].tolist() == b["prompt_tokens"].tolist()
    assert a["arrival_s"].tolist() == b["arrival_s"].tolist()
    assert runs["paged"].summary["allocator"] == "paged"


def test_export_layouts_writes_npz_and_index(tmp_path: Path) -> None:
    from allocators.base import Layout

    run = simulate(default_scenario().with_overrides(num_prompts=30, export_layouts_every=50))
    folder = write_run(run, tmp_path / "run")
    index = pd.read_csv(folder / "layouts" / "index.csv")
    assert list(index.columns) == ["step", "time_s", "allocator", "predicted_kv_read_s", "predicted_step_s"]
    assert len(index) >= 2
    # Jumps stop where a snapshot is due, so snapshots fall on multiples of N while the server is busy.
    assert (index["step"] % 50 == 0).mean() > 0.8
    assert index["step"].is_unique and (index["step"].diff().dropna() >= 1).all()
    first = Layout.from_npz(str(folder / "layouts" / f"step_{int(index['step'].iloc[1]):08d}.npz"))
    assert first.kind == "paged" and first.block_size == 16
