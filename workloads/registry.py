"""A tiny named registry, one per pluggable family (arrivals, lengths, max_tokens policies, presets,
trace formats).

Why one helper: every family needs the same three things -- register by name, look up with an error
that lists the known names, and list names for `--help` and docs -- and the same error wording.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from workloads.errors import param_error

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a name to an entry (a function or a spec); `family` names the field in error messages."""

    def __init__(self, family: str):
        self.family = family
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@ARRIVALS.register("poisson")`."""

        def add(entry: T) -> T:
            self.add(name, entry)
            return entry

        return add

    def add(self, name: str, entry: T) -> None:
        if name in self._entries:
            raise ValueError(f"{self.family} {name!r} registered twice")
        self._entries[name] = entry

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries))
            raise param_error(self.family, f"unknown {self.family} {name!r} (known: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)
