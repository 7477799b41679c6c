"""Helpers for the sweep tests: worker functions importable from spawned processes."""

from __future__ import annotations

import os
import time
from pathlib import Path


def square_or_die(arg: tuple[int, str]) -> int:
    """Square `value`; the first time a marker folder lacks this value's file, kill the worker instead."""
    value, marker_dir = arg
    marker = Path(marker_dir) / f"seen-{value}"
    if value == 3 and not marker.exists():
        marker.touch()
        os._exit(17)  # a worker that dies, as the OOM killer would do it
    return value * value


def always_die(arg: int) -> int:
    os._exit(9)


def raise_value_error(arg: int) -> int:
    raise ValueError(f"bad value {arg}\nsecond line")


def crash_or_wait(arg: tuple[str, str], deaths: int = 3) -> str:
    """("crash", dir): leave a died-N marker (N = attempt) and kill the worker.
    ("wait", dir): a healthy task that runs until the crasher has died `deaths` times (at most 60 s), so
    that it is in flight at each of those deaths; returns "ok"."""
    action, marker_dir = arg
    folder = Path(marker_dir)
    if action == "crash":
        attempt = len(list(folder.glob("died-*"))) + 1
        (folder / f"died-{attempt}").touch()
        os._exit(9)
    deadline = time.monotonic() + 60.0
    while len(list(folder.glob("died-*"))) < deaths and time.monotonic() < deadline:
        time.sleep(0.02)
    return "ok"


def sleep_then_echo(arg: tuple[str, float]) -> str:
    value, seconds = arg
    time.sleep(seconds)
    return value


def crash_or_call(arg: tuple) -> object:
    """(crash, fn, fn_arg, dir): crash leaves a died-N marker and kills the worker; otherwise wait for 2
    crashes, then return fn(fn_arg): a call of seconds, so the 3rd crash happens while it runs."""
    crash, fn, fn_arg, marker_dir = arg
    if not crash:  # one started-* marker per start: a healthy call charged for a crash starts again
        (Path(marker_dir) / f"started-{os.getpid()}-{time.monotonic_ns()}").touch()
    crash_or_wait(("crash" if crash else "wait", marker_dir), deaths=2)
    return fn(fn_arg)
