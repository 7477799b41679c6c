"""kvsim's simulator package: engine, scheduler, cost model, metrics, results, sweeps, reports, CLI.

The public API is re-exported lazily so that `import sim` stays cheap (the CLI starts fast) and so
that each function lives in the one module whose job it is.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "Scenario": "sim.config",
    "simulate": "sim.simulation",
    "compare": "sim.simulation",
    "Run": "sim.results",
    "load_run": "sim.results",
    "write_run": "sim.results",
    "sweep": "sim.sweeping",
    "capacity": "sim.capacity_planning",
    "report": "sim.reporting",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
