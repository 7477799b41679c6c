"""Helpers for the sweep tests: worker functions importable from spawned processes."""

from __future__ import annotations

import os
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
