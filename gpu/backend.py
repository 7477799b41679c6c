"""One switch between NumPy and CuPy, so the same gpu/ code runs with and without a device.

Why: developers' machines have no GPU, but the data generation, launch plans and checks should be
the same code on both. `array_module()` returns `cupy` when a device is usable and `numpy` otherwise;
`to_host()` brings any array back to NumPy. CuPy is imported lazily: `import gpu` never needs it.
"""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType
from typing import Any

from gpu.errors import NoDeviceError


@lru_cache(maxsize=1)
def _cupy_or_reason() -> tuple[ModuleType | None, str]:
    """Import CuPy once; return (module, "") or (None, why it is unusable)."""
    try:
        import cupy  # optional dependency
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return (
            None,
            f"CuPy is not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
        )
    try:
        if not cupy.is_available():
            return None, "cupy.is_available() is False (no driver or no visible GPU)"
    except Exception as exc:  # pragma: no cover - driver errors
        return None, f"cupy.is_available() failed ({type(exc).__name__})"
    return cupy, ""


def has_gpu() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    return _cupy_or_reason()[0] is not None


def require_cupy() -> ModuleType:
    """CuPy, or a one-line NoDeviceError saying why it cannot be used."""
    cupy, reason = _cupy_or_reason()
    if cupy is None:
        raise NoDeviceError(f"no CUDA device: {reason}")
    return cupy


def device_properties() -> dict[str, Any]:
    """Name, SM count, L2 size and memory of device 0, read at run time (needs a device)."""
    cupy = require_cupy()
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    free_bytes, total_bytes = cupy.cuda.runtime.memGetInfo()
    return {
        "name": name,
        "compute_capability": f"{props['major']}.{props['minor']}",
        "multiprocessor_count": int(props["multiProcessorCount"]),
        "l2_cache_bytes": int(props["l2CacheSize"]),
        "total_memory_bytes": int(total_bytes),
        "free_memory_bytes": int(free_bytes),
        "driver_version": int(cupy.cuda.runtime.driverGetVersion()),
        "runtime_version": int(cupy.cuda.runtime.runtimeGetVersion()),
        "cupy_version": str(cupy.__version__),
    }
