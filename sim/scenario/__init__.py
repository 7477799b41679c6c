"""The scenario layer: the pydantic `Scenario`, its overrides and TOML form, model/GPU presets, units
and the step-time cost model. It turns what a user asks for into the engine's plain inputs."""

from sim.scenario.scenario import Scenario, default_scenario

__all__ = ["Scenario", "default_scenario"]
