"""Refuse a run whose request count cannot fit in this machine's memory, before allocating anything.

Why: `--num-prompts 1000000000` asked NumPy for 7.45 GiB at once (a MemoryError, or the OOM killer
minutes later), and `--num-prompts 99999999999999999999` raised "Maximum allowed dimension
exceeded" (issue 23). A run holds, per request, its row in the request table, the engine's
per-request state and its row in the results, plus the per-step rows its requests cause; that is
about `BYTES_PER_REQUEST` (measured below). The estimate is compared with the memory this process
may still use, and a run that would not fit is refused with one line naming the flag and both
figures.

Measured (docs/metrics.md, "Memory per request"): peak RSS of `sim.simulate(default_scenario()
.with_overrides(num_prompts=N, **{"workload.request_rate": 50.0}))` was 126 MiB at N = 1,000 and
152 MiB at N = 30,000 (98,731 steps): 26 MiB / 29,000 requests = ~940 bytes per request; rounded up
to 1 KiB.
"""

from __future__ import annotations

import math
import os
import resource

from sim.errors import ScenarioError

BYTES_PER_REQUEST = 1024
MAX_REQUESTS = 2**31 - 1  # whatever the memory: request ids and NumPy dimensions stay well inside int64


def _meminfo_bytes(key: str, path: str = "/proc/meminfo") -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                name, _, rest = line.partition(":")
                if name == key:
                    return int(rest.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory_bytes() -> int | None:
    """Memory this process may still allocate: the smaller of the system's available memory and
    what its address-space limit (`ulimit -v`) leaves; None when neither is known."""
    figures: list[int] = []
    available = _meminfo_bytes("MemAvailable")
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            available = None
    if available is not None:
        figures.append(available)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = _meminfo_bytes("VmSize", "/proc/self/status") or 0
        figures.append(max(0, soft - used))
    return min(figures) if figures else None


def _gib(value: float) -> str:
    return f"{value / 2**30:,.1f} GiB"


def check_request_memory(num_requests: float, field: str) -> None:
    """ScenarioError naming `field` if `num_requests` requests cannot be held in memory."""
    shown = f"{num_requests:,}" if isinstance(num_requests, int) else f"{num_requests:,.0f}"
    if not math.isfinite(num_requests) or num_requests > MAX_REQUESTS:
        raise ScenarioError(
            f"field '{field}': {shown} requests is more than kvsim runs (at most {MAX_REQUESTS:,})"
        )
    needed = num_requests * BYTES_PER_REQUEST
    available = available_memory_bytes()
    if available is not None and needed > available:
        raise ScenarioError(
            f"field '{field}': {shown} requests need about {_gib(needed)} of memory "
            f"({BYTES_PER_REQUEST} bytes each), more than the {_gib(available)} available; ask for fewer"
        )
