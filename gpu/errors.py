"""Errors raised by gpu/ for bad user input (files, flags) and for a missing device.

Why a ValueError subclass: the CLI (`sim.cli.main`) maps every user-input error to one line and exit
code 2, and it recognises gpu's errors by this type. gpu/ must not import sim/, so the class lives
here. Messages are ONE line naming the file and key (or the flag and the allowed range).
"""

from __future__ import annotations


class GpuError(ValueError):
    """Bad calibration input: a profile file, a results folder, a flag out of range."""


class NoDeviceError(GpuError):
    """A command that needs a CUDA device was run without one (message starts 'no CUDA device')."""


class KernelCheckError(RuntimeError):
    """A kernel disagreed with the float64 reference: a bug in the kernel, never the user's fault."""


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """GpuError "NAME must be one of a, b, got 'x'" unless `value` is allowed: one wording everywhere."""
    if value not in allowed:
        raise GpuError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
