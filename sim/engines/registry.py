"""The engine registry: engine names -> `EnginePolicy` objects, like the allocator registry.

Why one registry: the Scenario's `engine` field, `--engine` on run/compare/capacity, sweep grids and
the engine itself name engines by string. Each engine declares itself once (a class, and one
`register_engine` call here or in any module, a test file included), so nothing in `sim/` lists
engines, and a name nobody registered is refused with the known ones.
"""

from __future__ import annotations

from sim.engines.base import EnginePolicy
from sim.engines.sglang import SglangPolicy
from sim.engines.vllm_v0 import VllmV0Policy
from sim.engines.vllm_v1 import VllmV1Policy

DEFAULT_ENGINE = "vllm-v0"  # the vLLM paper's engine (SOSP 2023): kvsim's default setting

_REGISTRY: dict[str, EnginePolicy] = {}


def register_engine(policy: EnginePolicy, *, replace: bool = False) -> EnginePolicy:
    """Add an engine under `policy.name` (a second one of the same name needs `replace=True`)."""
    if policy.name in _REGISTRY and not replace:
        raise ValueError(f"engine {policy.name!r} is already registered")
    _REGISTRY[policy.name] = policy
    return policy


def unregister_engine(name: str) -> None:
    """Remove an engine registered at run time (tests register toys and clean up)."""
    _REGISTRY.pop(name, None)


def engine_policy(name: str) -> EnginePolicy:
    """The engine registered as `name`; ValueError listing the known names for anything else."""
    policy = _REGISTRY.get(name)
    if policy is None:
        raise ValueError(f"unknown engine {name!r}; known: {', '.join(available_engines())}")
    return policy


def available_engines() -> list[str]:
    """Registered engine names, in registration order."""
    return list(_REGISTRY)


for _policy in (VllmV0Policy(), VllmV1Policy(), SglangPolicy(), SglangPolicy("fcfs")):
    register_engine(_policy)
