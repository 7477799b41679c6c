"""kvsim's simulator package, one subpackage per layer: core (engine, scheduler, metrics), scenario
(config, presets, cost model), sweeps, planning, reports and cli; `api` is the facade.

The public API is re-exported lazily so that each function lives in the one module whose job it is.
`import sim` first installs the compiled core's finder (`allocators.compiled`): the hot-loop modules of
sim.core, sim.engines and sim.cost load compiled or pure as it decides, never past it. `core_path()`
says which path runs.
"""

from __future__ import annotations

import importlib
from typing import Any

from allocators.compiled import core_path

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

__all__ = ["__version__", "core_path", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
