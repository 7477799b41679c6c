"""User-facing errors: one line, exit code 2, no traceback.

Why one place: every package raises its own ValueError subclass (allocators, workloads, sim, gpu),
and the CLI must map all of them the same way. Anything that is a `ValueError` raised for bad user
input subclasses one of these; the CLI prints `error: <message>` and exits 2.
"""

from __future__ import annotations


class KvsimError(ValueError):
    """Base of errors caused by the user's input (config, file, flags). Message is one line."""


class ScenarioError(KvsimError):
    """An invalid or impossible scenario: names the field and the allowed range."""


class CapacityError(KvsimError):
    """Bad capacity-planner input: names the argument and the allowed range."""


class ResultsError(KvsimError):
    """A results folder that is missing files or comes from an older/partial run."""


def user_error_types() -> tuple[type[BaseException], ...]:
    """All exception types that mean 'bad input' across kvsim's packages.

    Imported here, lazily, because allocators/, workloads/ and gpu/ must not import sim/ (data flows
    one way), so each defines its own ValueError subclass and only the CLI needs to know them all.
    """
    from allocators.base import AllocatorConfigError
    from gpu.errors import GpuError
    from workloads.errors import WorkloadError

    return (KvsimError, AllocatorConfigError, WorkloadError, GpuError)
