"""Human-friendly sizes and durations: "12GiB", "500MB", "2s", "100ms".

Why one module: the scenario (`kv_cache_memory`), sweeps and the capacity planner (`--slo-ttft-p99 2s`)
all accept the same spellings, and a user who writes "12GB" must get the same answer everywhere.
Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units (KB, MB, GB, TB) powers of 1000,
as in the IEC/SI convention that vLLM and nvidia-smi documentation follow. Units are case-insensitive.
"""

from __future__ import annotations

import math
import re

from sim.errors import KvsimError


class UnitError(KvsimError):
    """A size or duration string that cannot be read; the message names the field and the allowed forms."""


BYTE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

DURATION_UNITS_S: dict[str, float] = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "ns": 1e-9,
    "min": 60.0,
    "m": 60.0,
    "h": 3600.0,
}

_NUMBER_AND_UNIT = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([a-zA-Zµ]*)\s*$")


def _split(text: str) -> tuple[float, str] | None:
    match = _NUMBER_AND_UNIT.match(text)
    if match is None:
        return None
    return float(match.group(1)), match.group(2).lower()


def parse_bytes(value: int | float | str, *, field: str = "size") -> int:
    """Bytes from an int (taken as bytes) or a string such as "12GiB", "500 MB", "1.5e9".

    Fractional results are allowed only when they land on a whole byte ("0.5KiB" = 512), so a typo
    never silently rounds. Negative sizes are refused.
    """
    allowed = "a byte count or a number with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
    if isinstance(value, bool):
        raise UnitError(f"field '{field}': expected {allowed} (got {value!r})")
    if isinstance(value, int):
        if value < 0:
            raise UnitError(f"field '{field}': must be >= 0 bytes (got {value})")
        return value
    if isinstance(value, float):
        number, unit = value, ""
    elif isinstance(value, str):
        parts = _split(value)
        if parts is None or parts[1] not in BYTE_UNITS:
            raise UnitError(f"field '{field}': expected {allowed} (got {value!r})")
        number, unit = parts
    else:
        raise UnitError(f"field '{field}': expected {allowed} (got {value!r})")
    if not math.isfinite(number) or number < 0:
        raise UnitError(f"field '{field}': must be a finite size >= 0 bytes (got {value!r})")
    total = number * BYTE_UNITS[unit]
    whole = round(total)
    if abs(total - whole) > 1e-6 * max(1.0, abs(total)):
        raise UnitError(f"field '{field}': {value!r} is not a whole number of bytes")
    return int(whole)


def parse_duration_s(value: int | float | str, *, field: str = "duration") -> float:
    """Seconds from a number (taken as seconds) or a string such as "2s", "100ms", "1.5min", "1h"."""
    allowed = "seconds or a number with a unit (ns, us, ms, s, min, h)"
    if isinstance(value, bool):
        raise UnitError(f"field '{field}': expected {allowed} (got {value!r})")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    elif isinstance(value, str):
        parts = _split(value)
        if parts is None or parts[1] not in DURATION_UNITS_S:
            raise UnitError(f"field '{field}': expected {allowed} (got {value!r})")
        number, unit = parts
    else:
        raise UnitError(f"field '{field}': expected {allowed} (got {value!r})")
    if not math.isfinite(number) or number < 0:
        raise UnitError(f"field '{field}': must be a finite duration >= 0 s (got {value!r})")
    return number * DURATION_UNITS_S[unit]


_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
_COUNT_SCALE = {"": 1, "k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}


def parse_count(value: int | str, *, field: str = "count") -> int:
    """A whole number >= 1 from an int or "4096", "4K" (4096) or "4k" (4000): vLLM's convention for
    `--max-model-len` (vllm/engine/arg_utils.py `human_readable_int`: k = 1000, K = 1024)."""
    if isinstance(value, bool):
        raise UnitError(f"field '{field}': expected a whole number such as 4096, 4K or 4k (got {value!r})")
    if isinstance(value, int):
        number: float = value
    else:
        match = _COUNT.match(str(value))
        if match is None:
            text = str(value).strip()
            raise UnitError(
                f"field '{field}': {text!r} is not an integer such as 4096, 4K (4096) or 4k (4000)"
            )
        number = float(match.group(1)) * _COUNT_SCALE[match.group(2)]
    if number != int(number) or number < 1:
        raise UnitError(f"field '{field}': {str(value).strip()!r} must be a whole number >= 1")
    return int(number)


def format_bytes(num_bytes: float) -> str:
    """Short binary-unit display, e.g. 12884901888 -> "12.00 GiB"."""
    magnitude = abs(num_bytes)
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if magnitude >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes:.0f} B"


def format_duration_s(seconds: float) -> str:
    """Short display with the natural unit, e.g. 0.0123 -> "12.3 ms"."""
    magnitude = abs(seconds)
    if magnitude >= 3600:
        return f"{seconds / 3600:.2f} h"
    if magnitude >= 60:
        return f"{seconds / 60:.2f} min"
    if magnitude >= 1 or magnitude == 0:
        return f"{seconds:.3g} s"
    if magnitude >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"
