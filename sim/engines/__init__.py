"""Engines as classes: one `EnginePolicy` per engine, registered by name (docs/engines.md).

`sim.core` keeps the batch and asks a policy for each step's plan; this package holds the policies of
the modelled engines with their preset defaults and sources, and the registry that names them.
"""

from sim.engines.base import EnginePolicy
from sim.engines.registry import (
    DEFAULT_ENGINE,
    available_engines,
    engine_policy,
    register_engine,
    unregister_engine,
)
from sim.engines.sglang import SglangPolicy
from sim.engines.vllm_v0 import VllmV0Policy
from sim.engines.vllm_v1 import VllmV1Policy

__all__ = [
    "DEFAULT_ENGINE",
    "EnginePolicy",
    "SglangPolicy",
    "VllmV0Policy",
    "VllmV1Policy",
    "available_engines",
    "engine_policy",
    "register_engine",
    "unregister_engine",
]
