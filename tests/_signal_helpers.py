"""Start a `kvsim` command in a subprocess, signal it once it is under way, and collect what it said.

Why one helper: the Ctrl-C and SIGTERM tests (a run, a sweep and its workers) all need the same
careful dance — a session of its own so the signal reaches the whole process group as a terminal's
Ctrl-C or `timeout` sends it, a wait for a sign of progress on disk (never a sleep of a guessed
length), and a SIGKILL if anything goes wrong so no process outlives the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
GUARD_S = 120  # a guard against a hang, not a timing assertion

SLOW_SWEEP_SPEC = (
    'name = "slow"\n[base]\nkv_cache_memory = "2GiB"\nmax_model_len = 2048\n'
    "[grid]\nnum_prompts = [20, 20000, 20001, 20002]\n"
)


def slow_sweep_spec(folder: Path) -> Path:
    """A sweep whose first cell finishes in a second and whose others take long: time to signal it."""
    spec = folder / "slow.toml"
    spec.write_text(SLOW_SWEEP_SPEC, encoding="utf-8")
    return spec


def _default_sigint() -> None:
    # A shell's background job (how CI or `make test &` may run us) starts with SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler; a terminal's Ctrl-C is what we model.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_when(args: list[str], ready: Callable[[], bool], signum: int, what: str) -> tuple[int, str]:
    """Run `kvsim ARGS`, send `signum` to its process group once `ready()`; (exit code, stderr)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sim.cli", *args],
        cwd=REPO_ROOT,
        start_new_session=True,
        preexec_fn=_default_sigint,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + GUARD_S
    try:
        while not ready():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, f"{what} within {GUARD_S} s"
            time.sleep(0.02)
        os.killpg(process.pid, signum)
        _, err = process.communicate(timeout=GUARD_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, err
