"""Sweep specs: a base scenario plus a grid, expanded into cells and validated before anything runs.

Why a module of its own: a sweep can cost hours, so every mistake the spec can hold (an unknown key, a
value the Scenario refuses, zip lists of different lengths) must be found here, in milliseconds, and
reported as one line naming the file, the table and the key, with the list of valid keys.

A spec is a TOML file (or the same data as a dict):

    name = "alloc-vs-rate"                 # optional; defaults to the spec file's stem
    base = "scenarios/base.toml"           # a scenario TOML (relative to the spec), or an inline table
    [grid]                                 # every list is an axis; cells are the Cartesian product
    allocator = ["paged", "contiguous"]
    workload.request_rate = [1.0, 2.0]     # dotted keys reach nested scenario fields
    [zip]                                  # lists varied together (equal lengths): one more axis
    model = ["llama-2-7b", "llama-2-13b"]
    gpu = ["a100-40gb", "a100-80gb"]

Several zip groups are written `[[zip]]`. A cell's id is a stable hash of its overrides, so that a
restarted sweep finds the cells it already finished.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import KvsimError, ScenarioError
from sim.files import read_text_bounded

SPEC_KEYS: tuple[str, ...] = ("name", "description", "base", "grid", "zip")
CELL_ID_HEX_CHARS = 12


class SweepSpecError(ScenarioError):
    """A sweep spec the sweep cannot run: one line naming the file, the table and the key."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One simulation of a sweep: the overrides applied to the base scenario, and the result."""

    index: int  # position in grid order (rows of sweep.parquet follow it)
    cell_id: str  # stable hash of `overrides`
    overrides: dict[str, Any]  # dotted scenario key -> value, in grid order
    scenario: Any  # sim.scenario.scenario.Scenario, already validated


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """A validated sweep: its name, base scenario and every cell, in grid order."""

    name: str
    base: Any  # sim.scenario.scenario.Scenario
    axes: tuple[tuple[str, ...], ...]  # one tuple of keys per axis (a zip group is one axis)
    cells: tuple[Cell, ...]
    source: str  # the spec file, or "<spec>" for an in-memory dict


def cell_id(overrides: Mapping[str, Any]) -> str:
    """Stable id of a cell: the first hex digits of the SHA-256 of its overrides as canonical JSON.

    Key order does not matter; the value's type does (1 and 1.0 are different cells), which is what
    a TOML author wrote and therefore stable from one run of the same spec to the next.
    """
    canonical = json.dumps(dict(overrides), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:CELL_ID_HEX_CHARS]


def one_line(exc: BaseException) -> str:
    """The first meaningful line of an error message; pydantic's through the scenario's one formatter."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        from sim.scenario.overrides import one_line as validation_line

        return validation_line(exc)
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def flatten_keys(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """TOML `a.b = [..]` arrives as nested tables; turn them back into dotted keys.

    Only tables recurse: a list (an axis) or a scalar is a leaf, so list items may be inline tables.
    """
    flat: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_keys(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _check_keys(keys: list[str], where: str) -> None:
    """Every key must be a scenario field (dotted for nested ones), else one line with the valid keys."""
    from sim.scenario.overrides import check_field, scenario_fields

    for key in keys:
        try:
            check_field(key)
        except ValueError:
            raise SweepSpecError(
                f"{where}: unknown key {key!r}; valid keys: {', '.join(scenario_fields())}"
            ) from None


def _axis_values(key: str, value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise SweepSpecError(f"{where}: key {key!r} must be a list of values, got {value!r}")
    if not value:
        raise SweepSpecError(f"{where}: key {key!r} has an empty list; give at least one value")
    return value


def _zip_groups(raw: Any, where: str) -> list[tuple[int, dict[str, Any]]]:
    if raw is None:
        return []
    groups = raw if isinstance(raw, list) else [raw]
    out: list[tuple[int, dict[str, Any]]] = []
    for number, group in enumerate(groups):
        if not isinstance(group, Mapping):
            raise SweepSpecError(f"{where} [zip]: expected a table of lists, got {group!r}")
        out.append((number, flatten_keys(group)))
    return out


def _load_base(raw: Any, spec_dir: Path, where: str) -> Any:
    from sim.scenario.scenario import Scenario, default_scenario

    try:
        if raw is None:
            return default_scenario()
        if isinstance(raw, str | Path):
            path = Path(raw)
            if not path.is_absolute():
                path = spec_dir / path
            if not path.is_file():
                raise SweepSpecError(f"{where}: base scenario file {str(path)!r} does not exist")
            return Scenario.from_toml(path)
        if isinstance(raw, Mapping):  # same meaning as a scenario TOML file with these contents
            return Scenario.from_dict(dict(raw))
    except SweepSpecError:
        raise
    except ValueError as exc:
        raise SweepSpecError(f"{where} [base]: {one_line(exc)}") from exc
    raise SweepSpecError(f"{where}: 'base' must be a scenario TOML path or an inline table, got {raw!r}")


def _format_overrides(overrides: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in overrides.items())


Axis = tuple[tuple[str, ...], list[tuple[Any, ...]]]  # the keys varied together, and their value tuples


def parse_spec(
    spec: str | Path | Mapping[str, Any], *, name: str | None = None, base: Any = None
) -> SweepSpec:
    """Read and validate a sweep spec; every cell's scenario is built (and so checked) here.

    `base` (a Scenario) replaces the spec's own base scenario: `kvsim sweep SPEC --config FILE` and
    the scenario flags build it on top of the spec's base. Raises SweepSpecError (one line) for an
    unreadable file, an unknown key or a refused value. The steps, in the order their errors are
    reported: read the spec, check its top-level keys and name, build the axes ([grid], then each
    [zip] group), load the base scenario, expand the cells.
    """
    data, source, spec_dir, default_name = _read_spec(spec)
    _check_top_level_keys(data, source)
    sweep_name = _sweep_name(name or data.get("name") or default_name, source)
    grid_axes = _grid_axes(data.get("grid", {}), source)
    axes = grid_axes + _zip_axes(data.get("zip"), source, varied={keys[0] for keys, _ in grid_axes})
    if base is None:
        base = _load_base(data.get("base"), spec_dir, source)
    return SweepSpec(
        name=sweep_name,
        base=base,
        axes=tuple(keys for keys, _ in axes),
        cells=tuple(_expand_cells(base, axes, source)),
        source=source,
    )


def _read_spec(spec: str | Path | Mapping[str, Any]) -> tuple[Mapping[str, Any], str, Path, str]:
    """(data, source for messages, folder a relative `base` is read from, default sweep name).

    An in-memory dict is its own data ("<spec>", the working folder, "sweep"); a file is read as TOML.
    """
    if isinstance(spec, Mapping):
        return spec, "<spec>", Path.cwd(), "sweep"
    path = Path(spec)
    return _read_spec_file(path), str(path), path.parent, path.stem


def _read_spec_file(path: Path) -> Mapping[str, Any]:
    """The spec file's TOML data; a missing, unreadable, oversized or malformed file is one line."""
    if not path.exists():
        raise SweepSpecError(f"{path}: sweep spec file does not exist")
    try:
        return tomllib.loads(read_text_bounded(path, what="sweep spec file"))  # no /dev/zero, no FIFO
    except KvsimError as exc:
        raise SweepSpecError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise SweepSpecError(f"{path}: not valid TOML: {one_line(exc)}") from exc
    except RecursionError:
        raise SweepSpecError(f"{path}: not valid TOML (nested too deeply)") from None


def _check_top_level_keys(data: Mapping[str, Any], source: str) -> None:
    """Refuse the first top-level key that is not one of `SPEC_KEYS` (a typo would be ignored)."""
    unknown = [key for key in data if key not in SPEC_KEYS]
    if unknown:
        raise SweepSpecError(
            f"{source}: unknown top-level key {unknown[0]!r}; valid keys: {', '.join(SPEC_KEYS)}"
        )


def _sweep_name(sweep_name: Any, source: str) -> str:
    """The sweep's name, which becomes its results folder: non-empty, no '/', not hidden."""
    if not isinstance(sweep_name, str) or not sweep_name or "/" in sweep_name or sweep_name.startswith("."):
        raise SweepSpecError(f"{source}: 'name' must be a non-empty folder name, got {sweep_name!r}")
    return sweep_name


def _grid_axes(grid_raw: Any, source: str) -> list[Axis]:
    """One axis per [grid] key (dotted), in the spec's order; keys and lists checked."""
    if not isinstance(grid_raw, Mapping):
        raise SweepSpecError(f"{source}: [grid] must be a table of lists, got {grid_raw!r}")
    grid = flatten_keys(grid_raw)
    where = f"{source} [grid]"
    _check_keys(list(grid), where)
    return [((key,), [(v,) for v in _axis_values(key, value, where)]) for key, value in grid.items()]


def _zip_axes(zip_raw: Any, source: str, *, varied: set[str]) -> list[Axis]:
    """One axis per [zip] group: its lists, of equal lengths, varied together.

    `varied` holds the keys the grid already varies; a key varied twice (grid and zip, or two zips)
    is refused.
    """
    seen = set(varied)
    axes: list[Axis] = []
    for number, group in _zip_groups(zip_raw, source):
        where = f"{source} [zip] group {number}"
        _check_zip_group(group, where)
        for key in group:
            if key in seen:
                raise SweepSpecError(f"{where}: key {key!r} is varied twice (grid and zip, or two zips)")
            seen.add(key)
        keys = tuple(group)
        axes.append((keys, list(zip(*(group[k] for k in keys), strict=True))))
    return axes


def _check_zip_group(group: Mapping[str, Any], where: str) -> None:
    """A zip group: not empty, scenario keys only, lists of one length."""
    if not group:
        raise SweepSpecError(f"{where}: empty; give two or more lists of equal length")
    _check_keys(list(group), where)
    lengths = {key: len(_axis_values(key, value, where)) for key, value in group.items()}
    if len(set(lengths.values())) != 1:
        sizes = ", ".join(f"{k}: {n}" for k, n in lengths.items())
        raise SweepSpecError(f"{where}: lists must have equal lengths, got {sizes}")


def _expand_cells(base: Any, axes: list[Axis], source: str) -> list[Cell]:
    """Every cell of the axes' Cartesian product, in grid order, each scenario built and checked.

    Two cells with the same overrides (a value listed twice) would share a folder: refused.
    """
    cells: list[Cell] = []
    ids: set[str] = set()
    for index, combo in enumerate(itertools.product(*(values for _, values in axes))):
        overrides = _cell_overrides(axes, combo)
        scenario = _cell_scenario(base, overrides, source)
        cid = cell_id(overrides)
        if cid in ids:
            raise SweepSpecError(f"{source}: cell {_format_overrides(overrides)} appears twice in the grid")
        ids.add(cid)
        cells.append(Cell(index=index, cell_id=cid, overrides=overrides, scenario=scenario))
    return cells


def _cell_overrides(axes: list[Axis], combo: tuple[tuple[Any, ...], ...]) -> dict[str, Any]:
    """One cell's dotted key -> value, from one value tuple per axis, in axis order."""
    overrides: dict[str, Any] = {}
    for (keys, _), values in zip(axes, combo, strict=True):
        overrides.update(zip(keys, values, strict=True))
    return overrides


def _cell_scenario(base: Any, overrides: dict[str, Any], source: str) -> Any:
    """The base scenario with a cell's overrides; a refused value is one line naming the cell."""
    if not overrides:
        return base
    try:
        # Shallow keys first: `allocator = "contiguous"` must not wipe `allocator.params.placement`.
        ordered = dict(sorted(overrides.items(), key=lambda item: item[0].count(".")))
        return base.with_overrides(**ordered)
    except ValueError as exc:
        raise SweepSpecError(f"{source}: cell {_format_overrides(overrides)}: {one_line(exc)}") from exc
