"""Scenario field names, dotted overrides (`--set a.b=c`, sweep axes) and the one-line error text.

Why its own module: every way of changing a scenario (flags, `--set`, sweep grids, `with_overrides`)
goes through the same dotted keys, checked against the same list of fields, and every pydantic
validation error becomes the same one line (`field 'block_size': must be >= 1 (got 0)`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from sim.errors import ScenarioError

_FREE_FORM_PREFIXES: tuple[str, ...] = ("allocator.params.", "workload.params.")


def _submodels() -> dict[str, type[BaseModel]]:
    """The nested models by field name (imported here: sim.scenario.scenario imports this module)."""
    from sim.scenario.presets import GpuSpec, ModelSpec
    from sim.scenario.scenario import AllocatorSpec, WorkloadSpec

    return {"model": ModelSpec, "gpu": GpuSpec, "allocator": AllocatorSpec, "workload": WorkloadSpec}


_FREE_FORM_PREFIXES: tuple[str, ...] = ("allocator.params.", "workload.params.")


def scenario_fields() -> list[str]:
    """Every valid dotted key (sweeps refuse others); free-form dicts are listed as 'allocator.params.*'."""
    from sim.scenario.scenario import Scenario

    submodels = _submodels()
    keys: list[str] = []
    for name in Scenario.model_fields:
        keys.append(name)
        if name in submodels:
            for sub in submodels[name].model_fields:
                keys.append(f"{name}.{sub}")
    keys += [prefix + "*" for prefix in _FREE_FORM_PREFIXES]
    return keys


def check_field(key: str) -> None:
    """Raise ScenarioError naming the valid keys unless `key` is a scenario field (dotted for nested)."""
    if key.startswith(_FREE_FORM_PREFIXES) and len(key.split(".")) == 3 and key.split(".")[2]:
        return
    if key not in scenario_fields():
        raise ScenarioError(f"unknown scenario field {key!r} (valid: {', '.join(scenario_fields())})")


def deep_copy(data: Any) -> Any:
    """A copy of nested dicts and lists (the leaves are shared: they are immutable scalars)."""
    if isinstance(data, dict):
        return {key: deep_copy(value) for key, value in data.items()}
    if isinstance(data, list):
        return [deep_copy(value) for value in data]
    return data


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.c = value` in nested scenario data; a string allocator or workload becomes its table."""
    from sim.scenario.scenario import parse_allocator

    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if isinstance(child, str) and part == "allocator":
            child = parse_allocator(child)
        elif isinstance(child, str) and part == "workload":
            child = {"source": child}
        elif isinstance(child, BaseModel):
            child = child.model_dump(exclude_unset=True)
        elif not isinstance(child, dict):
            child = {}
        node[part] = child
        node = child
    node[parts[-1]] = value


def _valid_keys(loc: tuple[Any, ...]) -> list[str]:
    from sim.scenario.scenario import Scenario

    submodels = _submodels()
    model: type[BaseModel] = Scenario
    for part in loc:
        if isinstance(part, str) and part in submodels and model is Scenario:
            model = submodels[part]
    return list(model.model_fields)


def _describe(error: dict[str, Any]) -> str:
    kind, ctx, got = error["type"], error.get("ctx") or {}, error.get("input")
    shown = f" (got {got!r})" if not isinstance(got, dict | list) else ""
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}{shown}"
    if kind == "greater_than":
        return f"must be > {ctx['gt']}{shown}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}{shown}"
    if kind == "less_than":
        return f"must be < {ctx['lt']}{shown}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"must be an integer{shown}"
    if kind in ("float_parsing", "float_type", "finite_number"):
        return f"must be a number{shown}"
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false{shown}"
    if kind == "string_type":
        return f"must be a string{shown}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}{shown}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be a table of fields{shown}"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return f"unknown field (valid: {', '.join(_valid_keys(tuple(error['loc'][:-1])))})"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    message = str(error["msg"])
    return message[:1].lower() + message[1:] + shown


def _location(loc: tuple[Any, ...]) -> str:
    """Dotted field path without pydantic's union tags ('str', 'ModelSpec', 'function-after[...]')."""
    parts = [
        str(part)
        for part in loc
        if not (
            isinstance(part, str) and (part in ("str", "int", "float") or "[" in part or part[:1].isupper())
        )
    ]
    return ".".join(parts)


def one_line(exc: ValidationError) -> str:
    """The first problem as `field 'block_size': must be >= 1 (got 0)`, plus a count of the others."""
    errors = exc.errors()
    # A union (str | ModelSpec) reports one error per branch; drop the branch the input was not meant for.
    meant = [e for e in errors if not (e["type"] == "string_type" and e["loc"][-1:] == ("str",))]
    errors = meant or errors
    first = errors[0]
    where = _location(tuple(first["loc"]))
    message = _describe(first)
    text = message if message.startswith("field '") or not where else f"field '{where}': {message}"
    others = len({_location(tuple(e["loc"])) for e in errors} - {where})
    if others:
        text += f" (and {others} more problem{'s' if others > 1 else ''})"
    return " ".join(text.split())
