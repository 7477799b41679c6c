"""What an allocator declares about itself: its name, parameters, string grammar and scenario inputs.

Why a declaration: the scenario, the CLI and the reports must build, name and check allocators without
knowing any family by name. An `AllocatorEntry` says everything they need, so adding an allocator is
one entry passed to `allocators.register_allocator` and nothing in `sim/` changes:

- `params`: the keyword arguments its factory accepts (besides `capacity_tokens`);
- `scenario_params`: which of them the scenario supplies from its own fields (`max_model_len`,
  `block_size`, `enable_prefix_caching`, `num_layers`, `bytes_per_token_per_layer`), so a user never
  sets them twice;
- `scenario_defaults`: parameters the user may set but whose default the scenario picks (the engine
  preset's placement for slabs, `share_prefixes` following prefix caching);
- `spec_words`: the optional words of its string form, in label order (`request_limit:oracle:buddy`);
- `min_capacity`: the smallest KV budget it can run in, and how to say it;
- `check`: a problem with a user's parameter that the scenario should report as its field, or None;
- `derived_defaults`: defaults that depend on other parameters (a page size in whole tokens), so the
  complete parameters a run used can be recorded;
- `block_table_layout`: whether attention gathers its KV through a block table (the cost model's
  layout factor applies) or reads one contiguous range per sequence.

The checkers below turn a bad argument into one `AllocatorConfigError` line naming the parameter, the
value and what is allowed; factories call them because the classes assume valid arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from allocators.base import Allocator, AllocatorConfigError

MISSING: Any = object()  # a required parameter that was not given


@dataclass(frozen=True)
class SpecWord:
    """One optional word after the name in an allocator's string form.

    `choices` lists the words it accepts; with no choices any word is accepted and converted by its
    `kind` ("bytes": a size such as 64KiB, parsed by the scenario layer, which owns units).
    """

    param: str
    describe: str
    choices: tuple[str, ...] = ()
    kind: str = "choice"


@dataclass(frozen=True)
class AllocatorEntry:
    """One allocator family as the registry knows it (see the module docstring)."""

    name: str
    factory: Callable[..., Allocator]
    params: frozenset[str]
    scenario_params: frozenset[str] = frozenset()
    scenario_defaults: frozenset[str] = frozenset()
    spec_words: tuple[SpecWord, ...] = ()
    min_capacity: Callable[[Mapping[str, Any]], tuple[int, str]] | None = None
    check: Callable[[Mapping[str, Any]], tuple[str, str] | None] | None = None
    derived_defaults: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    block_table_layout: bool = False

    def capacity_needed(self, params: Mapping[str, Any]) -> tuple[int, str]:
        """(token slots, what they are) that the smallest useful cache of this allocator needs."""
        if self.min_capacity is None:
            return 1, "one token"
        return self.min_capacity(params)

    def complete(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` with the derived defaults filled in where the caller gave none."""
        if self.derived_defaults is None:
            return dict(params)
        return {**self.derived_defaults(params), **params}

    def problem(self, params: Mapping[str, Any]) -> tuple[str, str] | None:
        """(parameter, what is wrong with it) for complete `params`, or None when they are fine."""
        return None if self.check is None else self.check(params)


def int_param(allocator: str, field: str, value: Any, *, minimum: int = 1) -> int:
    """`value` as an int >= minimum, or AllocatorConfigError naming the field and the range."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int and hasattr(value, "__index__") and not isinstance(value, bool):
        try:
            value = value.__index__()
            is_int = True
        except TypeError:
            is_int = False
    if not is_int or value < minimum:
        raise AllocatorConfigError(f"{allocator}: {field} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def bool_param(allocator: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise AllocatorConfigError(f"{allocator}: {field} must be true or false, got {value!r}")
    return value


def choice_param(allocator: str, field: str, value: Any, allowed: list[str]) -> str:
    if value not in allowed:
        raise AllocatorConfigError(f"{allocator}: unknown {field} {value!r}; allowed: {', '.join(allowed)}")
    return str(value)


def required(allocator: str, field: str, value: Any, meaning: str) -> Any:
    if value is MISSING or value is None:
        raise AllocatorConfigError(f"{allocator}: {field} is required ({meaning})")
    return value
