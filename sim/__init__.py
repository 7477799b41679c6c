"""kvsim's simulator package, one subpackage per layer: core (engine, scheduler, metrics), scenario
(config, presets, cost model), sweeps, planning, reports and cli; `api` is the facade.

The public API is re-exported lazily so that `import sim` stays cheap (the CLI starts fast) and so
that each function lives in the one module whose job it is.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "Scenario": "sim.scenario.scenario",
    "simulate": "sim.api",
    "compare": "sim.api",
    "Run": "sim.results",
    "load_run": "sim.results",
    "write_run": "sim.results",
    "sweep": "sim.sweeps.runner",
    "capacity": "sim.planning.capacity",
    "report": "sim.reports.publish",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
