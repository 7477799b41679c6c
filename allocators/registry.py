"""The allocator registry: one table of `AllocatorEntry`s, names -> checked constructors.

Why one registry: the engine, the CLI, sweeps and reports name allocators by string ("paged",
"request_limit:oracle", ...). Each family declares itself once (`allocators.builtin`, or any module
that calls `register_allocator`), so construction, argument checking and the string grammar live in
one place and every bad argument raises `AllocatorConfigError` saying what is wrong and what is allowed.
"""

from __future__ import annotations

from typing import Any

from allocators.base import Allocator, AllocatorConfigError
from allocators.builtin import BUILTIN_ENTRIES
from allocators.entry import MISSING, AllocatorEntry, int_param, required

_REGISTRY: dict[str, AllocatorEntry] = {}


def register_allocator(entry: AllocatorEntry, *, replace: bool = False) -> AllocatorEntry:
    """Add an allocator family (a second entry of the same name needs `replace=True`)."""
    if entry.name in _REGISTRY and not replace:
        raise AllocatorConfigError(f"allocator {entry.name!r} is already registered")
    for kind, names in (
        ("scenario_params", entry.scenario_params),
        ("scenario_defaults", entry.scenario_defaults),
    ):
        if not names <= entry.params:
            raise AllocatorConfigError(
                f"{entry.name}: {kind} {sorted(names - entry.params)} are not among its params"
            )
    _REGISTRY[entry.name] = entry
    return entry


def unregister_allocator(name: str) -> None:
    """Remove a family registered at run time (tests register toys and clean up)."""
    _REGISTRY.pop(name, None)


def allocator_entry(name: str) -> AllocatorEntry:
    """The entry of `name`, or AllocatorConfigError listing the known names."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise AllocatorConfigError(f"unknown allocator {name!r}; allowed: {', '.join(available())}")
    return entry


def available() -> list[str]:
    """Allocator names `make_allocator` accepts, in registration order."""
    return list(_REGISTRY)


def accepted_params(name: str) -> frozenset[str]:
    """Parameter names `name` accepts (besides capacity_tokens), so callers can filter a config."""
    return allocator_entry(name).params


def make_allocator(name: str, capacity_tokens: Any = MISSING, **params: Any) -> Allocator:
    """Build the allocator `name` over `capacity_tokens` token slots; see docs/allocators.md."""
    entry = allocator_entry(name)
    capacity = int_param(
        name, "capacity_tokens", required(name, "capacity_tokens", capacity_tokens, "token slots")
    )
    unknown = sorted(set(params) - entry.params)
    if unknown:
        raise AllocatorConfigError(
            f"{name}: unknown parameter {unknown[0]!r}; allowed: {', '.join(sorted(entry.params))}"
        )
    return entry.factory(capacity, **params)


for _entry in BUILTIN_ENTRIES:
    register_allocator(_entry)
