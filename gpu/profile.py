"""The calibration profile: a versioned JSON that `sim.cost.model` reads (schema in docs/calibration.md).

Why hand-written validation: the profile crosses from the GPU machine (which may lack pydantic) to
every simulation, so a bad or stale file must fail at load time with ONE line naming the file and the
key -- never deep inside a simulation. `default_profile()` gives CPU-only users an analytic profile
fitted exactly like a measured one, marked "measured": false.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpu.errors import GpuError
from gpu.fit import CONTIGUOUS_BLOCK_SIZE, KERNELS, fit_rows, paged_ratios
from gpu.layouts import LAYOUT_NAMES

SCHEMA_VERSION = 1

_ROW_INT_KEYS = ("block_size", "batch", "context_tokens", "num_q_heads", "num_kv_heads", "head_dim")
_ROW_COUNT_KEYS = ("bytes", "flops", "blocks_touched")
_ROW_TIME_KEYS = ("median_s", "p10_s", "p90_s")


def _fail(source: str, key: str, problem: str) -> GpuError:
    return GpuError(f"{source}: key '{key}' {problem}")


def _get(obj: Mapping[str, Any], key: str, path: str, source: str) -> Any:
    """obj[key], or GpuError "missing key 'path.key'" (so an absent key never reads as "got None")."""
    if key not in obj:
        raise GpuError(f"{source}: missing key '{path}{key}'")
    return obj[key]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _number(obj: Mapping[str, Any], key: str, path: str, source: str, *, positive: bool = False) -> float:
    value = _get(obj, key, path, source)
    if not _is_number(value):
        raise _fail(source, f"{path}{key}", f"must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise _fail(source, f"{path}{key}", f"must be > 0, got {value!r}")
    if value < 0:
        raise _fail(source, f"{path}{key}", f"must be >= 0, got {value!r}")
    return float(value)


def _integer(obj: Mapping[str, Any], key: str, path: str, source: str, *, minimum: int = 0) -> int:
    value = _get(obj, key, path, source)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _fail(source, f"{path}{key}", f"must be an integer >= {minimum}, got {value!r}")
    return value


def _choice(obj: Mapping[str, Any], key: str, path: str, source: str, allowed: tuple[str, ...]) -> str:
    value = _get(obj, key, path, source)
    if value not in allowed:
        raise _fail(source, f"{path}{key}", f"must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def _mapping(obj: Any, key: str, source: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise _fail(source, key, f"must be an object, got {type(obj).__name__}")
    return obj


def validate_profile(profile: Any, source: str = "profile") -> dict[str, Any]:
    """Check a profile against schema v1; return it unchanged, or raise GpuError naming the key."""
    top = _mapping(profile, "(top level)", source)
    version = _get(top, "schema_version", "", source)
    if version != SCHEMA_VERSION:
        raise _fail(source, "schema_version", f"must be {SCHEMA_VERSION}, got {version!r}")
    measured = _get(top, "measured", "", source)
    if not isinstance(measured, bool):
        raise _fail(source, "measured", f"must be true or false, got {measured!r}")
    device = _mapping(_get(top, "device", "", source), "device", source)
    name = _get(device, "name", "device.", source)
    if not isinstance(name, str) or not name:
        raise _fail(source, "device.name", f"must be a non-empty string, got {name!r}")
    ceilings = _mapping(_get(top, "ceilings", "", source), "ceilings", source)
    for key in ("copy_bytes_per_s", "read_bytes_per_s"):
        _number(ceilings, key, "ceilings.", source, positive=True)

    rows = _get(top, "rows", "", source)
    if not isinstance(rows, list):
        raise _fail(source, "rows", f"must be a list, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        path = f"rows[{i}]."
        _mapping(row, path[:-1], source)
        _choice(row, "kernel", path, source, KERNELS)
        _choice(row, "layout", path, source, LAYOUT_NAMES)
        for key in _ROW_INT_KEYS:
            _integer(row, key, path, source, minimum=0 if key == "block_size" else 1)
        for key in _ROW_COUNT_KEYS:
            _integer(row, key, path, source)
        for key in _ROW_TIME_KEYS:
            _number(row, key, path, source, positive=True)
        dtype = _get(row, "dtype", path, source)
        if not isinstance(dtype, str):
            raise _fail(source, f"{path}dtype", f"must be a string, got {dtype!r}")

    fits = _get(top, "fits", "", source)
    if not isinstance(fits, list):
        raise _fail(source, "fits", f"must be a list, got {type(fits).__name__}")
    for i, fit in enumerate(fits):
        path = f"fits[{i}]."
        _mapping(fit, path[:-1], source)
        _choice(fit, "kernel", path, source, KERNELS)
        layout = _choice(fit, "layout", path, source, LAYOUT_NAMES)
        block_size = _integer(fit, "block_size", path, source)
        if layout != "contiguous" and block_size < 1:
            raise _fail(source, f"{path}block_size", f"must be >= 1 for a paged layout, got {block_size}")
        _number(fit, "a_s", path, source)
        _number(fit, "bytes_per_s", path, source, positive=True)
        _number(fit, "c_s_per_block", path, source)
        _number(fit, "mape_pct", path, source)
        _integer(fit, "num_points", path, source, minimum=1)

    ratios = _mapping(_get(top, "ratios", "", source), "ratios", source)
    for kernel in KERNELS:
        per_block = _mapping(_get(ratios, kernel, "ratios.", source), f"ratios.{kernel}", source)
        for block_key, value in per_block.items():
            if not str(block_key).isdigit() or int(block_key) < 1:
                raise _fail(source, f"ratios.{kernel}.{block_key}", "must be keyed by a block size >= 1")
            _number(per_block, block_key, f"ratios.{kernel}.", source, positive=True)
            del value
    return dict(top)


def load_profile(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a profile file; GpuError (one line naming the file and key) when it is bad."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise GpuError(f"{source}: cannot read calibration profile ({exc.strerror or exc})") from None
    try:
        profile = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GpuError(
            f"{source}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from None
    return validate_profile(profile, source)


def save_profile(profile: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Validate, then write atomically (temp file in the same folder, then os.replace)."""
    validate_profile(profile, str(path))
    write_text_atomic(path, json.dumps(profile, indent=1, sort_keys=False) + "\n")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` so that readers see the old file or the whole new one, never half of it.

    The file gets the mode a plain `open()` would give it (0644 under the usual umask 022), not
    mkstemp's 0600.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process umask (reading it means setting it; it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def find_fit(profile: Mapping[str, Any], kernel: str, layout: str, block_size: int) -> dict[str, Any] | None:
    """The fit for (kernel, layout, block size); contiguous fits are stored once, with block_size 0."""
    wanted = CONTIGUOUS_BLOCK_SIZE if layout == "contiguous" else int(block_size)
    for fit in profile.get("fits", []):
        if fit["kernel"] == kernel and fit["layout"] == layout and int(fit["block_size"]) == wanted:
            return dict(fit)
    return None


def predict_s(fit: Mapping[str, Any], bytes_: float, blocks_touched: float) -> float:
    """t = a + bytes / BW_eff + c * blocks_touched for one fit."""
    return (
        float(fit["a_s"]) + bytes_ / float(fit["bytes_per_s"]) + float(fit["c_s_per_block"]) * blocks_touched
    )


# ---------------------------------------------------------------------------------------------
# The analytic default

# Assumptions, documented in docs/calibration.md: fractions of the HBM datasheet bandwidth that a good
# kernel reaches, fixed per-launch costs, and per-block costs expressed as DRAM bytes wasted per block.
ANALYTIC = {
    "copy_fraction": 0.90,
    "read_fraction": 0.92,
    "kernel_fraction": 0.85,
    "launch_s": {"gather": 4e-6, "attention": 8e-6},
    "block_overhead_bytes": {"contiguous": 0.0, "paged_sequential": 128.0, "paged_shuffled": 1024.0},
}


def _analytic_rows(hbm_bytes_per_s: float) -> list[dict[str, Any]]:
    from gpu.grid import grid_points  # local: grid imports fit/layouts/reference, not profile

    bw = ANALYTIC["kernel_fraction"] * hbm_bytes_per_s
    rows = []
    for point in grid_points():
        row = point.as_row()
        per_block_s = ANALYTIC["block_overhead_bytes"][point.layout] / bw
        t = ANALYTIC["launch_s"][point.kernel] + row["bytes"] / bw + per_block_s * row["blocks_touched"]
        row.update(median_s=t, p10_s=t, p90_s=t)
        rows.append(row)
    return rows


@lru_cache(maxsize=8)
def _default_profile_cached(hbm_bytes_per_s: float, device_name: str) -> str:
    rows = _analytic_rows(hbm_bytes_per_s)
    profile = {
        "schema_version": SCHEMA_VERSION,
        "measured": False,
        "device": {"name": device_name, "hbm_bytes_per_s": hbm_bytes_per_s, "source": "analytic"},
        "ceilings": {
            "copy_bytes_per_s": ANALYTIC["copy_fraction"] * hbm_bytes_per_s,
            "read_bytes_per_s": ANALYTIC["read_fraction"] * hbm_bytes_per_s,
        },
        "rows": [],  # the analytic rows are not data; only their fits and ratios are kept
        "fits": [f.as_dict() for f in fit_rows(rows)],
        "ratios": paged_ratios(rows, "paged_shuffled"),
        "ratios_sequential": paged_ratios(rows, "paged_sequential"),
        "assumptions": ANALYTIC,
    }
    return json.dumps(profile)


def default_profile(
    hbm_bytes_per_s: float = 4.8e12, device_name: str = "analytic (H200-class HBM3e)"
) -> dict:
    """An analytic profile for a GPU with `hbm_bytes_per_s` of HBM bandwidth ("measured": false)."""
    if not (_is_number(hbm_bytes_per_s) and hbm_bytes_per_s > 0):
        raise GpuError(f"hbm_bytes_per_s must be > 0, got {hbm_bytes_per_s!r}")
    return copy.deepcopy(json.loads(_default_profile_cached(float(hbm_bytes_per_s), device_name)))
