"""Request tables for kvsim: synthetic generators, published-statistics presets, real-trace readers.

Data flows one way: workloads -> request table -> sim. This package never imports sim.
Public API: `load`, `validate`, `generate`, `presets`, `describe`, `plot`, `read_trace`,
`detect_format`, and the registries of every pluggable family. See docs/workloads.md.
"""

from __future__ import annotations

from workloads.arrivals import ARRIVALS, rescale_to_rate
from workloads.describe import describe, prefix_hit_ratio
from workloads.errors import WorkloadError
from workloads.generate import generate
from workloads.lengths import LENGTHS
from workloads.load import load
from workloads.max_tokens import MAX_TOKENS_POLICIES
from workloads.plot import plot
from workloads.presets import PRESETS, Preset, presets
from workloads.readers import FORMATS, detect_format, read_trace
from workloads.schema import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, validate

__all__ = [
    "ARRIVALS",
    "FORMATS",
    "LENGTHS",
    "MAX_TOKENS_POLICIES",
    "OPTIONAL_COLUMNS",
    "PRESETS",
    "REQUIRED_COLUMNS",
    "Preset",
    "WorkloadError",
    "describe",
    "detect_format",
    "generate",
    "load",
    "plot",
    "prefix_hit_ratio",
    "presets",
    "read_trace",
    "rescale_to_rate",
    "validate",
]
