"""Scenario TOML: reading a file (with paths relative to it) and writing one back.

Why its own module: `tomllib` only reads, so writing is ours; and a scenario file names traces and
calibration profiles relative to itself, which only the reader knows.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from sim.errors import KvsimError, ScenarioError
from sim.files import read_text_bounded


def read_toml(path: Path) -> dict[str, Any]:
    """The file's table, with relative paths resolved against its folder; ScenarioError (one line) if bad."""
    try:
        # bounded, regular files only: `--config /dev/zero` read until memory ran out (issue 23)
        text = read_text_bounded(path, what="config file")
    except KvsimError as exc:
        raise ScenarioError(str(exc)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ScenarioError(f"{path}: invalid TOML (nested too deeply)") from None
    _resolve_relative_paths(data, path.parent)
    return data


def _resolve_relative_paths(data: dict[str, Any], base: Path) -> None:
    """Paths in a TOML file are relative to the file when they exist there (not to the caller's cwd)."""

    def resolve(value: Any) -> Any:
        if isinstance(value, str) and value and not Path(value).is_absolute() and (base / value).exists():
            return str((base / value).resolve())
        return value

    if "calibration" in data:
        data["calibration"] = resolve(data["calibration"])
    workload = data.get("workload")
    if isinstance(workload, dict) and "source" in workload:
        workload["source"] = resolve(workload["source"])
    elif isinstance(workload, str):
        data["workload"] = resolve(workload)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_value(key)


def to_toml(data: dict[str, Any]) -> str:
    """Scenario data as TOML text: scalars first, then one table per nested model; None is left out."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for key, value in data.items():
        if value is None:
            continue  # TOML has no null: absent means default
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, table in tables:
        lines.append("")
        lines.append(f"[{_toml_key(key)}]")
        for sub_key, sub_value in table.items():
            if sub_value is not None:
                lines.append(f"{_toml_key(sub_key)} = {_toml_value(sub_value)}")
    return "\n".join(lines) + "\n"
