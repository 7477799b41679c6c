"""Who holds a copy of which KV content: the source of the `duplicated` part of the taxonomy.

Why a ledger: duplication is "slots holding a second copy of KV that already exists elsewhere".
Content is named by *keys* (a shared system prompt, a prefix-block hash chain node, the tokens a fork
copied). Each key covers a fixed number of tokens; each physical copy of it (a contiguous slab or a
paged block) is a holder. Then duplicated = sum over keys of tokens x (holders - 1), kept up to date
in O(1) per change, so `breakdown()` never scans memory.

Keys are nested by construction: a holder's keys always cover a prefix of what it stores, so the
count never exceeds what is stored.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable


class DuplicateLedger:
    """Holder counts per content key and the running total of duplicated token slots."""

    def __init__(self) -> None:
        self._holders: dict[Hashable, int] = {}
        self._tokens: dict[Hashable, int] = {}
        self._serial = itertools.count()
        self.duplicated_tokens = 0

    def new_key(self, kind: str) -> tuple[str, int]:
        """A fresh key for content that exists for the first time (e.g. the tokens a fork copies)."""
        return (kind, next(self._serial))

    def add(self, key: Hashable, tokens: int) -> None:
        """One more physical copy of `key`'s `tokens` tokens."""
        held = self._holders.get(key, 0)
        if held == 0:
            self._tokens[key] = tokens
        elif held > 0:
            self.duplicated_tokens += self._tokens[key]
        self._holders[key] = held + 1

    def remove(self, key: Hashable) -> None:
        """One physical copy of `key` is gone."""
        held = self._holders[key] - 1
        if held == 0:
            del self._holders[key]
            del self._tokens[key]
        else:
            self._holders[key] = held
            self.duplicated_tokens -= self._tokens[key]

    def tokens_of(self, key: Hashable) -> int:
        return self._tokens[key]

    def holders(self, key: Hashable) -> int:
        return self._holders.get(key, 0)

    def is_empty(self) -> bool:
        return not self._holders
