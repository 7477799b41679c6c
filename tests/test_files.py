"""sim.files: the one atomic writer, the one JSON rule, and "kvsim only replaces what it wrote" (issue 11).

The property test at the end puts random user files and folders where kvsim's commands write, runs
every writing command in a random order into random targets, and checks that no user file was lost
or changed; every command must end with exit 0 or one line and exit 2.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from _cli_helpers import run_cli
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim import files
from sim.api import simulate
from sim.errors import ResultsError
from sim.files import MARKER_FILE, OutputPathError
from sim.results import load_run, write_run
from sim.scenario.scenario import default_scenario


@pytest.fixture(scope="module")
def tiny_run():
    return simulate(default_scenario().with_overrides(num_prompts=4))


# ------------------------------------------------------------------------------------------ JSON rule


def test_one_json_rule_nan_is_null_inf_is_a_string_that_reads_back() -> None:
    value = {"a": math.nan, "b": math.inf, "c": -math.inf, "d": np.float64(1.5), "e": (np.int64(2), 3)}
    text = files.dumps_json(value)
    assert json.loads(text) == {"a": None, "b": "inf", "c": "-inf", "d": 1.5, "e": [2, 3]}
    assert float(json.loads(text)["b"]) == math.inf
    assert "NaN" not in text and "Infinity" not in text


def test_scenario_and_summary_use_the_same_rule(tiny_run, tmp_path: Path) -> None:
    """An unbounded rate is "inf" in the scenario and reads back; NaN metrics are null."""
    scenario = default_scenario().with_overrides(**{"workload.request_rate": math.inf})
    assert scenario.to_dict()["workload"]["request_rate"] == "inf"
    folder = write_run(tiny_run, tmp_path / "r")
    summary = files.read_summary(folder)
    assert summary == json.loads((folder / "summary.json").read_text())
    assert all(not (isinstance(v, float) and not math.isfinite(v)) for v in summary["metrics"].values())


def test_the_one_summary_reader_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="missing summary.json"):
        files.read_summary(tmp_path)
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(ResultsError, match=r"summary.json: expected a JSON object"):
        files.read_summary(tmp_path)
    (tmp_path / "summary.json").write_text("{nope")
    with pytest.raises(ResultsError, match=r"summary.json: cannot read JSON"):
        files.read_summary(tmp_path)


# ------------------------------------------------------------------------------------- atomic writer


def test_atomic_writes_are_mode_0644_and_leave_no_temp_files(tmp_path: Path, tiny_run) -> None:
    old_mask = os.umask(0o077)  # even under a strict umask, outputs are world-readable as documented
    try:
        files.write_file_atomic(tmp_path / "a.txt", "x")
        folder = write_run(tiny_run, tmp_path / "run")
        files.publish_files(tmp_path / "pub", "report", [("report.md", "# r"), ("figures/f.png", b"png")])
    finally:
        os.umask(old_mask)
    written = [tmp_path / "a.txt", *folder.iterdir(), tmp_path / "pub" / "report.md"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in written)
    leftovers = [p for p in tmp_path.rglob("*") if p.name.startswith(files.STAGING_PREFIX)]
    assert leftovers == []


# ---------------------------------------------------------------------------------------- ownership


def test_marker_names_the_kind_and_every_file(tiny_run, tmp_path: Path) -> None:
    folder = write_run(tiny_run, tmp_path / "run")
    marker = json.loads((folder / MARKER_FILE).read_text())
    assert marker["kind"] == "run"
    assert set(marker["files"]) == {"requests.parquet", "steps.parquet", "summary.json"}
    assert files.foreign_entries(folder) == []


def test_a_kvsim_file_the_user_edited_is_theirs(tiny_run, tmp_path: Path) -> None:
    folder = write_run(tiny_run, tmp_path / "run")
    (folder / "summary.json").write_text((folder / "summary.json").read_text() + " ")
    with pytest.raises(OutputPathError, match=r"holds files kvsim did not write \(summary.json\)"):
        write_run(tiny_run, folder)
    assert (folder / "summary.json").read_text().endswith(" ")


def test_report_next_to_runs_never_overwrites_a_users_report(tiny_run, tmp_path: Path, capsys) -> None:
    """`kvsim report A/r1 A/r2` writes into A by default: never over a user's A/report.html."""
    write_run(tiny_run, tmp_path / "A" / "r1")
    write_run(tiny_run, tmp_path / "A" / "r2")
    (tmp_path / "A" / "report.html").write_text("mine")
    assert run_cli(["report", str(tmp_path / "A" / "r1"), str(tmp_path / "A" / "r2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "report.html exist(s) and kvsim did not write them" in err
    assert (tmp_path / "A" / "report.html").read_text() == "mine"
    (tmp_path / "A" / "report.html").unlink()
    assert run_cli(["report", str(tmp_path / "A" / "r1"), str(tmp_path / "A" / "r2")]) == 0
    assert run_cli(["report", str(tmp_path / "A" / "r1"), str(tmp_path / "A" / "r2")]) == 0  # its own: again


def test_stale_figures_are_removed_only_when_kvsim_wrote_them(tmp_path: Path) -> None:
    folder = tmp_path / "rep"
    files.publish_files(folder, "report", [("figures/a.png", b"1"), ("figures/b.png", b"2")])
    (folder / "figures" / "b.png").write_bytes(b"edited by the user")
    files.publish_files(folder, "report", [("report.md", "x")], remove=["figures/a.png", "figures/b.png"])
    assert not (folder / "figures" / "a.png").exists()
    assert (folder / "figures" / "b.png").read_bytes() == b"edited by the user"


@pytest.mark.parametrize("name", ["../x", "a/b", ".", "..", "", " x"])
def test_name_must_be_plain(name: str, capsys) -> None:
    assert run_cli(["run", "--num-prompts", "4", "--name", name, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must be a plain name" in err


def test_root_home_git_root_and_cwd_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(OutputPathError, match="is the filesystem root"):
        files.check_output_folder("/", "compare")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(OutputPathError, match="is the home folder"):
        files.check_output_folder("~", "run")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    with pytest.raises(OutputPathError, match="root of a git work tree"):
        files.check_output_folder(repo, "sweep")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputPathError, match="is the current folder"):
        files.check_output_folder(".", "report")
    assert not any(home.iterdir())


def test_cwd_that_is_a_kvsim_folder_may_be_rewritten(tiny_run, tmp_path: Path, monkeypatch) -> None:
    folder = write_run(tiny_run, tmp_path / "run")
    monkeypatch.chdir(folder)
    assert files.check_output_folder(".", "run") == folder


def test_a_symlinked_output_folder_is_written_where_it_points(tiny_run, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert write_run(tiny_run, link) == real
    assert write_run(tiny_run, link) == real  # the rerun replaces the folder, not the link
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert load_run(link).summary["metrics"]["num_requests"] == 4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_dangling_symlink_target_is_created(tiny_run, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    assert write_run(tiny_run, link) == tmp_path / "missing"
    assert link.resolve() == tmp_path / "missing" and (link / "summary.json").is_file()


def test_sweep_refuses_a_users_table_and_another_kind(tiny_run, tmp_path: Path, capsys) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "s"\n[base]\nnum_prompts = 4\n[grid]\nseed = [0]\n')
    run_dir = write_run(tiny_run, tmp_path / "run")
    assert run_cli(["sweep", str(spec), "--output", str(run_dir), "--jobs", "1", "--no-progress"]) == 2
    assert "is a kvsim run folder, not a sweep folder" in capsys.readouterr().err
    out = tmp_path / "sweep"
    assert run_cli(["sweep", str(spec), "--output", str(out), "--jobs", "1", "--no-progress"]) == 0
    assert files.folder_kind(out) == "sweep" and files.foreign_entries(out) == []
    assert run_cli(["sweep", str(spec), "--output", str(out), "--jobs", "1", "--no-progress"]) == 0  # resume


# ------------------------------------------------------------------------------- the property test

USER_DIRS = ("out", "out/sub", "res", "res/paged", "A", "A/figures")
USER_NAMES = (
    "notes.txt",
    "summary.json",
    "report.html",
    "report.md",
    "sweep.parquet",
    "plan.json",
    "w.png",
    "profile.json",
    "replay.csv",
    MARKER_FILE,
    "requests.parquet",
    "fig1_taxonomy.png",
)
TARGETS = ("out", "out/sub", "res", "res/paged", "A", "new", "new/deeper", ".")
COMMANDS = ("run", "compare", "report", "sweep", "capacity", "describe", "calibrate", "replay")


@pytest.fixture(scope="module")
def tiny_plan():
    from sim.planning.capacity import capacity
    from sim.planning.slo import Slo

    base = default_scenario().with_overrides(num_prompts=20)
    return capacity(
        base, slo=Slo(ttft_p99_s=10.0), allocators=["paged"], rate_bracket=(1.0, 2.0), rel_tol=0.5, jobs=1
    )


def _command(name: str, target: str, root: Path) -> list[str]:
    quiet = ["--num-prompts", "4", "--quiet"]
    if name == "run":
        return ["run", *quiet, "--output", target]
    if name == "compare":
        return ["compare", *quiet, "--allocators", "paged", "--output", target]
    if name == "report":
        runs = sorted(
            str(p.parent) for p in root.rglob("steps.parquet") if (p.parent / MARKER_FILE).is_file()
        )
        return ["report", *(runs[:2] or [target]), "--output", target]
    if name == "sweep":
        return ["sweep", str(root.parent / "spec.toml"), "--output", target, "--jobs", "1", "--no-progress"]
    if name == "capacity":
        return ["capacity", "--slo-ttft-p99", "10s", "--output", f"{target}/plan.json"]
    if name == "describe":
        return ["workload", "describe", "alpaca", "--num-prompts", "20", "--plot", f"{target}/w.png"]
    if name == "calibrate":
        return ["calibrate", "--output", f"{target}/profile.json"]
    return ["replay", target, "--output", f"{target}/replay.csv"]


def _snapshot(root: Path, user_files: list[str], user_dirs: list[str]) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {rel: (root / rel).read_bytes() for rel in user_files}
    out.update({rel: None for rel in user_dirs})
    return out


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    user_files=st.lists(
        st.tuples(st.sampled_from(("", *USER_DIRS)), st.sampled_from(USER_NAMES), st.binary(max_size=16)),
        max_size=6,
    ),
    empty_dirs=st.lists(st.sampled_from(USER_DIRS), max_size=2),
    commands=st.lists(st.tuples(st.sampled_from(COMMANDS), st.sampled_from(TARGETS)), min_size=1, max_size=4),
)
def test_no_user_file_is_ever_lost_or_changed(
    user_files, empty_dirs, commands, tiny_plan, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr("sim.planning.capacity.capacity", lambda *args, **kwargs: tiny_plan)
    sandbox = Path(tempfile.mkdtemp(prefix="kvsim-owner-"))
    root = sandbox / "root"
    root.mkdir()
    (sandbox / "spec.toml").write_text('name = "s"\n[base]\nnum_prompts = 4\n[grid]\nseed = [0]\n')
    written: list[str] = []
    dirs = sorted(set(empty_dirs))
    for folder, name, content in user_files:
        rel = f"{folder}/{name}" if folder else name
        if (root / rel).exists() or any(rel == d or rel.startswith(f"{d}/") for d in written):
            continue
        if any(d == rel or d.startswith(f"{rel}/") for d in dirs):
            continue  # a file where a folder of the tree goes
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
        written.append(rel)
    for rel in dirs:
        if not (root / rel).exists() and not any(rel.startswith(f"{f}/") for f in written):
            (root / rel).mkdir(parents=True)
    user_dirs = [d for d in dirs if (root / d).is_dir()]
    before = _snapshot(root, written, user_dirs)
    cwd = Path.cwd()
    os.chdir(root)
    try:
        for name, target in commands:
            code = run_cli(_command(name, target, root))
            err = capsys.readouterr().err
            event(f"{name}: exit {code}")  # --hypothesis-show-statistics: both outcomes occur
            assert code in (0, 2), (name, target, err)
            assert code == 0 or err.count("\n") == 1, err
            assert _snapshot(root, written, user_dirs) == before, (name, target)
    finally:
        os.chdir(cwd)
        shutil.rmtree(sandbox, ignore_errors=True)


def test_a_user_file_named_like_the_marker_is_foreign(tmp_path: Path) -> None:
    """Found by the property test: an empty `kvsim-output.json` of the user's must not be taken for
    kvsim's marker (and overwritten); it is a foreign file like any other."""
    from sim.files import MARKER_FILE, foreign_entries

    (tmp_path / MARKER_FILE).write_text("")
    assert foreign_entries(tmp_path) == [tmp_path / MARKER_FILE]


def test_a_file_output_beside_a_user_file_named_like_the_marker_is_refused(tmp_path: Path) -> None:
    from sim.files import MARKER_FILE, OutputPathError, check_output_file

    (tmp_path / MARKER_FILE).write_text("")
    with pytest.raises(OutputPathError, match="is not kvsim's marker"):
        check_output_file(tmp_path / "plan.json", "capacity")
    assert (tmp_path / MARKER_FILE).read_text() == ""


def test_a_failed_swap_into_place_keeps_the_previous_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """replace_folder moves the old folder aside before renaming the new one in: if that second
    rename fails (or a signal lands between the two), the old folder must come back, not be
    removed with the staging folder."""
    from sim import files
    from sim.errors import KvsimError

    target = tmp_path / "out"
    files.replace_folder(target, "run", lambda folder: (folder / "a.txt").write_text("first"))
    real_replace = os.replace

    def failing(src: os.PathLike[str] | str, dst: os.PathLike[str] | str) -> None:
        if Path(src).name == "new":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", failing)
    with pytest.raises(KvsimError):
        files.replace_folder(target, "run", lambda folder: (folder / "a.txt").write_text("second"))
    assert (target / "a.txt").read_text() == "first"
