"""Parse and bind `name(arg, key=value)` specs, the one way every pluggable family is configured.

Why a spec language: the CLI, TOML scenarios and Python callers must say the same thing the same
way -- `"lognormal(161.31, cv=1.2)"`, `"gamma(cv=3)"`, `"fixed(2048)"`. Python callers may also pass
`("gamma", {"cv": 3})` or `{"name": "gamma", "cv": 3}`. Arguments are bound to the registered
function's signature, so a misspelt parameter is an error naming the field, not a silent default.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from workloads.errors import param_error

SpecLike = str | tuple | Mapping[str, Any]


def parse_spec(value: SpecLike, field: str) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """Split a spec into (name, positional args, keyword args); raise WorkloadError naming `field`."""
    if isinstance(value, Mapping):
        params = dict(value)
        name = params.pop("name", None)
        if not isinstance(name, str):
            raise param_error(field, f"a spec dict needs a 'name' (got {value!r})")
        return name, (), params
    if isinstance(value, tuple):
        if len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], Mapping):
            return value[0], (), dict(value[1])
        raise param_error(field, f"a spec tuple is (name, {{params}}) (got {value!r})")
    if not isinstance(value, str) or not value.strip():
        raise param_error(field, f"expected a spec like 'name' or 'name(arg, key=value)' (got {value!r})")
    try:
        tree = ast.parse(value.strip(), mode="eval").body
    except SyntaxError:
        raise param_error(field, f"cannot parse spec {value!r}; write it as name(arg, key=value)") from None
    if isinstance(tree, ast.Name):
        return tree.id, (), {}
    if isinstance(tree, ast.Constant) and isinstance(tree.value, str):  # names with dashes, quoted
        return tree.value, (), {}
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name):
        try:
            args = tuple(ast.literal_eval(a) for a in tree.args)
            kwargs = {k.arg: ast.literal_eval(k.value) for k in tree.keywords if k.arg is not None}
        except ValueError:
            raise param_error(field, f"spec {value!r}: arguments must be numbers or quoted strings") from None
        return tree.func.id, args, kwargs
    raise param_error(field, f"cannot parse spec {value!r}; write it as name(arg, key=value)")


def bind(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], field: str, skip: int
) -> dict:
    """Bind user arguments to `fn`'s parameters after the first `skip` (which the caller supplies)."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    user_sig = inspect.Signature(params)
    try:
        bound = user_sig.bind(*args, **kwargs)
    except TypeError as exc:
        names = ", ".join(p.name for p in params) or "none"
        raise param_error(field, f"{exc} (parameters: {names})") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def format_spec(name: str, params: Mapping[str, Any]) -> str:
    """The canonical text form of a spec, for describe() output and summaries."""
    inner = ", ".join(
        f"{k}={(f'array{v.shape}' if hasattr(v, 'shape') else repr(v))}" for k, v in params.items()
    )
    return f"{name}({inner})"


def positive(field: str, value: Any, *, allow_zero: bool = False) -> float:
    """A number > 0 (or >= 0), else a WorkloadError naming the field and the range."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise param_error(field, f"must be a number (got {value!r})") from None
    if number != number or (number < 0 if allow_zero else number <= 0):
        raise param_error(field, f"must be {'>= 0' if allow_zero else '> 0'} (got {value!r})")
    return number


def positive_int(field: str, value: Any, *, minimum: int = 1) -> int:
    """An integer >= minimum, else a WorkloadError naming the field and the range."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or int(value) != value:
        raise param_error(field, f"must be an integer >= {minimum} (got {value!r})")
    if int(value) < minimum:
        raise param_error(field, f"must be an integer >= {minimum} (got {value!r})")
    return int(value)
