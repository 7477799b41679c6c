"""Issue 23: a full disk, a killed run, links, odd names, two writers — one line each, nothing left behind.

Each test failed on bbd53f5 (a traceback, a leftover folder, a write outside the named output, or a
silent success). The full disk is a fake writer raising ENOSPC (a tmpfs cannot be mounted here);
the lock is held by a second process; links are made in a temporary folder.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import pytest
from _signal_helpers import signal_when, slow_sweep_spec

import sim.api
from sim.cli import main
from sim.files import STAGING_MARKER, STAGING_PREFIX, clear_stale_staging, staging_folder
from sim.output_lock import LOCK_PREFIX
from sim.scenario import memory_guard

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--num-prompts", "4", "--quiet"]


def cli(args: list[str]) -> tuple[int, str, str]:
    """`kvsim ARGS` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stderr(err), redirect_stdout(out):
        try:
            main(args)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def one_line(args: list[str], code: int = 2) -> str:
    """Run, check exit `code` and a single stderr line without a traceback; return that line."""
    got, _, err = cli(args)
    assert got == code and err.count("\n") == 1 and "Traceback" not in err, (got, err)
    return err.strip()


def leftovers(folder: Path) -> list[str]:
    """kvsim's hidden names (staging folders, locks) anywhere under `folder`."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(f"{STAGING_PREFIX}*"))


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small, real results folder to copy (a run takes a second or two)."""
    folder = tmp_path_factory.mktemp("runs") / "run"
    code, _, err = cli(["run", *SMALL, "--output", str(folder)])
    assert code == 0, err
    return folder


# ------------------------------------------------------------------------------- 1: a full disk


def _disk_full(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as pyarrow raises it: no file name


def test_full_disk_during_run_is_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def half_then_full(self: pd.DataFrame, path: object, *args: object, **kwargs: object) -> None:
        Path(str(path)).write_bytes(b"PAR1 half a file")
        _disk_full()

    monkeypatch.setattr(pd.DataFrame, "to_parquet", half_then_full)
    out = tmp_path / "t" / "run"
    line = one_line(["run", *SMALL, "--output", str(out)])
    assert line == f"error: results folder {out}: cannot write (No space left on device)"
    assert list(tmp_path.iterdir()) == []  # not even the parent folder `t` the run created


def test_full_disk_during_compare_leaves_no_compare_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    original = pd.DataFrame.to_parquet

    def second_run_fails(self: pd.DataFrame, path: object, *args: object, **kwargs: object) -> None:
        calls.append(str(path))
        if len(calls) == 3:  # the first run folder is complete (requests, steps); the second is not
            _disk_full()
        original(self, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", second_run_fails)
    out = tmp_path / "cmp"
    line = one_line(["compare", "--allocators", "paged,contiguous", *SMALL, "--output", str(out)])
    assert line.startswith(f"error: results folder {out}/") and line.endswith(
        ": cannot write (No space left on device)"
    )
    assert list(tmp_path.iterdir()) == []  # was: cmp/ holding only kvsim-output.json


def test_a_disk_error_from_any_other_writer_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim.api, "simulate", lambda *a, **k: _disk_full())
    line = one_line(["run", *SMALL, "--output", str(tmp_path / "run")])
    assert line == "error: cannot write output: No space left on device"
    assert list(tmp_path.iterdir()) == []


def test_full_disk_during_report_leaves_no_report_folder(
    tmp_path: Path, run_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sim.files

    monkeypatch.setattr(sim.files, "_fill", lambda path, content: _disk_full())
    out = tmp_path / "rep"
    line = one_line(["report", str(run_folder), "--output", str(out)])
    assert line == f"error: report folder {out}: cannot write (No space left on device)"
    assert not out.exists() and leftovers(run_folder.parent) == []


def test_full_disk_for_a_small_file_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.files import write_file_atomic

    monkeypatch.setattr(Path, "write_text", lambda self, *a, **k: _disk_full())
    with pytest.raises(ValueError, match=r"x\.json: cannot write \(No space left on device\)"):
        write_file_atomic(tmp_path / "x.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_full_disk_during_describe_plot_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import workloads

    monkeypatch.setattr(workloads, "plot", lambda df, path, **kwargs: _disk_full())
    out = tmp_path / "f.png"
    line = one_line(["workload", "describe", "sharegpt", "--num-prompts", "20", "--plot", str(out)])
    assert line == f"error: --plot {out}: cannot write (No space left on device)"
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------- 4: an absurd size, refused up front


def test_num_prompts_beyond_any_machine_is_one_line() -> None:
    line = one_line(["run", "--num-prompts", "99999999999999999999", "--quiet"])
    assert line == (
        "error: --num-prompts (field 'num_prompts'): 99,999,999,999,999,999,999 requests is more than "
        "kvsim runs (at most 2,147,483,647)"
    )


def test_num_prompts_beyond_this_machine_names_the_flag_and_the_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import workloads

    monkeypatch.setattr(memory_guard, "available_memory_bytes", lambda: 2**30)
    monkeypatch.setattr(workloads, "load", lambda *a, **k: pytest.fail("requests allocated before the check"))
    line = one_line(["run", "--num-prompts", "2000000", "--quiet", "--output", str(tmp_path / "o")])
    assert line == (
        "error: --num-prompts (field 'num_prompts'): 2,000,000 requests need about 1.9 GiB of memory "
        "(1024 bytes each), more than the 1.0 GiB available; ask for fewer"
    )
    assert list(tmp_path.iterdir()) == []


def test_available_memory_is_read_from_this_machine() -> None:
    available = memory_guard.available_memory_bytes()
    assert available is None or available > 0


@pytest.mark.parametrize("name", ["/dev/zero", "fifo.json", "fifo.csv"])
def test_a_calibration_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path, name: str) -> None:
    path = Path(name) if name.startswith("/") else tmp_path / name
    if not name.startswith("/"):
        os.mkfifo(path)  # the CSV reader waited for a writer forever; /dev/zero ran out of memory
    line = one_line(["run", "--calibration", str(path), *SMALL, "--output", str(tmp_path / "o")])
    assert line.endswith(f"{path}: calibration profile must be a regular file (this is not)"), line
    assert not (tmp_path / "o").exists()


def test_a_rate_that_spreads_arrivals_over_centuries_names_the_rate() -> None:
    line = one_line(["run", "--request-rate", "1e-300", *SMALL])
    assert line.startswith("error: --request-rate (field 'workload.request_rate'): 4 requests at 1e-300")
    assert "row 2" not in line


# ------------------------------------------------------------ 5: SIGTERM, stale staging folders


def test_stale_staging_of_a_dead_kvsim_is_cleared_and_nothing_else(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_pid = int(dead.stdout)
    host = __import__("socket").gethostname()

    def staging(name: str, pid: int, kvsim: str = "staging", where: str = host) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "half.parquet").write_bytes(b"x" * 100)
        (folder / STAGING_MARKER).write_text(json.dumps({"kvsim": kvsim, "host": where, "pid": pid}))
        return folder

    stale = staging(f"{STAGING_PREFIX}run-{dead_pid}-0a1b2c3d", dead_pid)
    live = staging(f"{STAGING_PREFIX}run-live-0a1b2c3d", os.getpid())
    other_host = staging(f"{STAGING_PREFIX}run-nfs-0a1b2c3d", dead_pid, where="another-host")
    not_ours = staging(f"{STAGING_PREFIX}user", dead_pid, kvsim="something else")
    unmarked = tmp_path / f"{STAGING_PREFIX}unmarked"
    unmarked.mkdir()
    user_dir = staging("my-folder", dead_pid)  # a marker, but not kvsim's staging name
    link = tmp_path / f"{STAGING_PREFIX}link"
    link.symlink_to(stale)
    assert clear_stale_staging(tmp_path) == [stale]
    assert not stale.exists()
    assert all(p.exists() for p in (live, other_host, not_ours, unmarked, user_dir))
    assert link.is_symlink()


def test_a_rerun_clears_what_a_killed_run_left(tmp_path: Path) -> None:
    script = (
        "import os, sys\nfrom pathlib import Path\nfrom sim.files import staging_folder\n"
        "with staging_folder(Path(sys.argv[1]), 'run'):\n    os.kill(os.getpid(), 9)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO_ROOT)
    assert killed.returncode == -signal.SIGKILL
    assert len(leftovers(tmp_path)) == 1  # what SIGKILL leaves: a staging folder with its marker
    code, _, err = cli(["run", *SMALL, "--output", str(tmp_path / "run")])
    assert code == 0, err
    assert leftovers(tmp_path) == []


def test_staging_folder_is_removed_on_the_way_out(tmp_path: Path) -> None:
    with staging_folder(tmp_path, "x") as folder:
        assert json.loads((folder / STAGING_MARKER).read_text())["pid"] == os.getpid()
    assert list(tmp_path.iterdir()) == []


def test_sigterm_is_handled_like_ctrl_c_with_exit_143(tmp_path: Path) -> None:
    out = tmp_path / "run"
    lock = tmp_path / f"{LOCK_PREFIX}run"
    returncode, err = signal_when(
        ["run", "--num-prompts", "200000", "--quiet", "-o", str(out)],
        ready=lock.exists,  # the lock is taken after the checks, right before simulating
        signum=signal.SIGTERM,  # `kill`, `timeout`, a batch scheduler
        what="the run did not start",
    )
    assert returncode == 143, err
    assert err == "terminated (SIGTERM): nothing was written (no output is left half-written)\n"
    assert list(tmp_path.iterdir()) == []  # no results folder, no staging folder, no lock


def test_sigterm_to_a_sweep_and_its_workers_saves_cells_and_exits_143(tmp_path: Path) -> None:
    out = tmp_path / "out"
    returncode, err = signal_when(
        ["sweep", str(slow_sweep_spec(tmp_path)), "--jobs", "2", "--output", str(out), "--no-progress"],
        ready=lambda: bool(list((out / "cells").glob("*/summary.json"))),
        signum=signal.SIGTERM,  # as `timeout` and batch schedulers send it: to the whole group
        what="no cell finished",
    )
    assert returncode == 143, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"terminated (SIGTERM): {out.resolve()}: ") and "cells saved" in lines[0]


# ------------------------------------------------------------------------------- 6: symbolic links


def test_report_default_folder_comes_from_the_paths_as_typed(tmp_path: Path, run_folder: Path) -> None:
    coll = tmp_path / "coll2"
    coll.mkdir()
    shutil.copytree(run_folder, coll / "runA")
    shutil.copytree(run_folder, tmp_path / "outside" / "realrun")
    (coll / "runB").symlink_to(tmp_path / "outside" / "realrun")
    code, out, err = cli(["report", str(coll / "runA"), str(coll / "runB")])
    assert code == 0, err
    assert (coll / "report.html").is_file() and (coll / "figures").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coll2", "outside"]  # nothing written into S/


def test_report_never_writes_through_a_link_inside_its_folder(tmp_path: Path, run_folder: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "rep_d"
    out.mkdir()
    (out / "figures").symlink_to(victim)
    line = one_line(["report", str(run_folder), "--output", str(out)])
    assert line == (
        f"error: report folder {out}: figures is a symbolic link; kvsim never writes through a link inside "
        "the output folder (remove it or choose another --output)"
    )
    assert list(victim.iterdir()) == [] and sorted(p.name for p in out.iterdir()) == ["figures"]


# ----------------------------------------------------------------------- 7: a non-UTF-8 output name


@pytest.mark.parametrize("command", [["run", *SMALL], ["compare", "--allocators", "paged", *SMALL]])
def test_non_utf8_output_name_is_refused_before_the_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.setattr(sim.api, "simulate", lambda *a, **k: pytest.fail("simulated before the check"))
    monkeypatch.setattr(sim.api, "compare", lambda *a, **k: pytest.fail("simulated before the check"))
    out = os.fsdecode(os.fsencode(tmp_path) + b"/bad\xff\xfe")
    line = one_line([*command, "--output", out])
    assert line.endswith("/bad\\xff\\xfe: the name is not valid UTF-8; choose a UTF-8 name"), line
    assert list(tmp_path.iterdir()) == []


def test_non_utf8_report_and_plot_names_are_refused(tmp_path: Path, run_folder: Path) -> None:
    bad = os.fsdecode(os.fsencode(tmp_path) + b"/bad\xff")
    assert "not valid UTF-8" in one_line(["report", str(run_folder), "--output", bad])
    assert "not valid UTF-8" in one_line(["workload", "describe", "sharegpt", "--plot", bad + ".png"])
    assert list(tmp_path.iterdir()) == []


def test_a_trace_with_a_non_utf8_name_reaches_the_report_escaped(tmp_path: Path) -> None:
    trace = os.fsdecode(os.fsencode(tmp_path) + b"/tr\xff.csv")
    Path(trace).write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,5\n", encoding="utf-8")
    code, _, err = cli(["run", "--workload", trace, "--quiet", "--output", str(tmp_path / "run")])
    assert code == 0, err
    code, _, err = cli(["report", str(tmp_path / "run"), "--output", str(tmp_path / "rep")])
    assert code == 0, err  # was: UnicodeEncodeError after rendering
    page = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert "tr\\udcff.csv" in page


# --------------------------------------------------------------------- 8: two writers, one output


def _hold_lock(target: Path) -> subprocess.Popen[str]:
    script = (
        "import sys\nfrom sim.output_lock import claim_output\n"
        "with claim_output(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.readline()\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(target)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "held\n"
    return process


def test_a_foreign_file_named_like_the_lock_is_never_truncated_or_removed(tmp_path: Path) -> None:
    """A user's own file at the lock's name: refused in one line, left byte for byte."""
    from sim.output_lock import LOCK_PREFIX

    out = tmp_path / "r"
    foreign = tmp_path / f"{LOCK_PREFIX}r"
    foreign.write_text("my notes\n")
    line = one_line(["run", *SMALL, "--output", str(out)])
    assert "is not a kvsim lock file" in line
    assert foreign.read_text() == "my notes\n" and not out.exists()


@pytest.mark.parametrize("command", ["run", "compare", "report"])
def test_a_second_writer_of_one_output_gets_one_line(tmp_path: Path, run_folder: Path, command: str) -> None:
    out = tmp_path / "same"
    args = {
        "run": ["run", *SMALL, "--output", str(out)],
        "compare": ["compare", "--allocators", "paged", *SMALL, "--output", str(out)],
        "report": ["report", str(run_folder), "--output", str(out)],
    }[command]
    holder = _hold_lock(out)
    try:
        line = one_line(args)
    finally:
        holder.communicate("\n", timeout=60)
    what = {"run": "results folder", "compare": "compare folder", "report": "report folder"}[command]
    assert line == (
        f"error: {what} {out}: another kvsim (pid {holder.pid}) is writing it now; wait for it to finish "
        "or choose another --output"
    )
    assert not out.exists() and leftovers(tmp_path) == []
    code, _, err = cli(args)  # once the first writer is done, the same command succeeds
    assert code == 0, err
    assert leftovers(tmp_path) == []


# ------------------------------------------------------------------------------- 9: the smaller ones


def test_a_newline_in_a_name_is_refused(tmp_path: Path) -> None:
    line = one_line(["run", *SMALL, "--name", "a\nb"])
    assert line == (
        "error: --name (field 'name') 'a\\nb': must not contain control characters (newline, tab, ...)"
    )


def test_plot_is_written_0644_like_every_other_output(tmp_path: Path) -> None:
    out = tmp_path / "f.png"
    code, _, err = cli(["workload", "describe", "sharegpt", "--num-prompts", "20", "--plot", str(out)])
    assert code == 0, err
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_gpu_hour_cost_is_bounded() -> None:
    line = one_line(["report", "no-such-folder", "--gpu-hour-cost", "1e308"])
    assert line == (
        "error: --gpu-hour-cost: must be a finite number > 0 and at most 10,000 USD per GPU-hour (got 1e+308)"
    )


@pytest.mark.parametrize("table", ["requests.parquet", "steps.parquet"])
def test_report_refuses_an_empty_table_alike(tmp_path: Path, run_folder: Path, table: str) -> None:
    folder = tmp_path / "run"
    shutil.copytree(run_folder, folder)
    frame = pd.read_parquet(folder / table)
    frame.iloc[:0].to_parquet(folder / table, index=False)
    line = one_line(["report", str(folder), "--output", str(tmp_path / "rep")])
    assert line == f"error: {folder / table}: no rows (partial run?)"


def test_block_size_1_writes_no_rounding_noise(tmp_path: Path) -> None:
    code, _, err = cli(
        ["run", "--block-size", "1", "--num-prompts", "20", "--quiet", "-o", str(tmp_path / "r")]
    )
    assert code == 0, err
    metrics = json.loads((tmp_path / "r" / "summary.json").read_text())["metrics"]
    shares = {k: v for k, v in metrics.items() if k.startswith("kv_") and k.endswith("_pct")}
    assert all(v == 0.0 or abs(v) >= 1e-9 for v in shares.values()), shares
    assert all(v >= 0.0 for v in shares.values()), shares
