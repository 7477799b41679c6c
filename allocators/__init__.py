"""KV-cache allocators behind one Protocol (allocators/base.py), made by name.

Why a registry: the engine, the CLI and sweeps name allocators by string ("paged",
"request_limit" with reservation="oracle", ...), so construction and argument checking live in one
place and every bad argument raises `AllocatorConfigError` saying what is wrong and what is allowed.

    from allocators import make_allocator
    alloc = make_allocator("paged", capacity_tokens=100_000, block_size=16)
"""

from __future__ import annotations

# First: installs the finder that picks each hot-loop module's compiled or pure path (before any is found).
from allocators import compiled
from allocators.base import (
    BREAKDOWN_PARTS,
    Allocator,
    AllocatorConfigError,
    Layout,
    MemoryBreakdown,
    SeqSpec,
)
from allocators.entry import AllocatorEntry, SpecWord
from allocators.registry import (
    accepted_params,
    allocator_entry,
    available,
    make_allocator,
    register_allocator,
    unregister_allocator,
)

core_path = compiled.core_path

__all__ = [
    "BREAKDOWN_PARTS",
    "Allocator",
    "AllocatorEntry",
    "AllocatorConfigError",
    "Layout",
    "MemoryBreakdown",
    "SeqSpec",
    "SpecWord",
    "accepted_params",
    "allocator_entry",
    "available",
    "core_path",
    "make_allocator",
    "register_allocator",
    "unregister_allocator",
]
