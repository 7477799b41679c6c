"""An allocator registered from a test file alone runs through sim.simulate and `kvsim run --allocator`.

Why: adding an allocator must be one declaration (an `AllocatorEntry` passed to
`allocators.register_allocator`); nothing in `sim/` may list allocator families. The toy below is a
fixed-slab allocator of `slab_tokens` per sequence, with a string word (`toy_slab:wide`) and a
scenario-supplied parameter (`max_model_len`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import allocators
import sim
from allocators import AllocatorEntry, MemoryBreakdown, SeqSpec, SpecWord
from allocators.base import AllocatorBase
from sim.cli import main
from sim.scenario import default_scenario

TOY = "toy_slab"


class ToySlab(AllocatorBase):
    """Every sequence gets one slab of `slab_tokens` slots; nothing is shared or placed."""

    def __init__(self, capacity_tokens: int, slab_tokens: int) -> None:
        self.name = TOY
        self.capacity_tokens = capacity_tokens
        self.slab_tokens = slab_tokens
        self.length: dict[int, int] = {}
        self.final: dict[int, int] = {}

    def demand_tokens(self, seq: SeqSpec) -> int:
        return self.slab_tokens

    def _free_slabs(self) -> int:
        return self.capacity_tokens // self.slab_tokens - len(self.length)

    def admit(self, seq: SeqSpec) -> bool:
        if self._free_slabs() < 1 or seq.prompt_tokens > self.slab_tokens:
            return False
        self.length[seq.seq_id] = seq.prompt_tokens
        self.final[seq.seq_id] = min(seq.final_tokens, self.slab_tokens)
        return True

    def grow(self, seq_ids: np.ndarray, num_tokens: int = 1) -> np.ndarray:
        failed = [int(s) for s in seq_ids if self.length[int(s)] + num_tokens > self.slab_tokens]
        for s in seq_ids:
            if int(s) not in failed:
                self.length[int(s)] += num_tokens
        return np.asarray(failed, dtype=np.int64)

    def max_uniform_growth(self, seq_ids: np.ndarray, limit: int) -> int:
        room = [self.slab_tokens - self.length[int(s)] for s in seq_ids]
        return max(0, min([limit, *room]))

    def release(self, seq_id: int) -> None:
        del self.length[seq_id]
        del self.final[seq_id]

    def fork(self, parent_id: int, child: SeqSpec) -> bool:
        if self._free_slabs() < 1:
            return False
        self.length[child.seq_id] = self.length[parent_id]
        self.final[child.seq_id] = min(child.final_tokens, self.slab_tokens)
        return True

    def prefix_hit_tokens(self, seq_id: int) -> int:
        return 0

    def breakdown(self, next_demand_tokens: int = 0) -> MemoryBreakdown:
        tokens = sum(self.length.values())
        will_fill = sum(max(self.final[s], v) for s, v in self.length.items())
        reserved = len(self.length) * self.slab_tokens
        return MemoryBreakdown(
            capacity=self.capacity_tokens,
            token_states=tokens,
            reservation=will_fill - tokens,
            internal=reserved - will_fill,
            external=0,
            duplicated=0,
            free=self.capacity_tokens - reserved,
        )


def _make_toy(capacity_tokens: int, max_model_len: int = 2048, width: str = "narrow") -> ToySlab:
    return ToySlab(capacity_tokens, max_model_len if width == "wide" else max_model_len // 2)


def _one_slab(params: Mapping[str, Any]) -> tuple[int, str]:
    return int(params["max_model_len"]), "one slab"


@pytest.fixture
def toy_registered() -> Iterator[AllocatorEntry]:
    entry = allocators.register_allocator(
        AllocatorEntry(
            name=TOY,
            factory=_make_toy,
            params=frozenset({"max_model_len", "width"}),
            scenario_params=frozenset({"max_model_len"}),
            spec_words=(SpecWord("width", "a width", ("narrow", "wide")),),
            min_capacity=_one_slab,
        )
    )
    yield entry
    allocators.unregister_allocator(TOY)


def test_a_registered_toy_runs_through_simulate(toy_registered: AllocatorEntry) -> None:
    scenario = default_scenario().with_overrides(allocator=f"{TOY}:wide", num_prompts=30)
    assert scenario.allocator.label == f"{TOY}:wide"
    assert scenario.allocator_params()["max_model_len"] == scenario.max_model_len  # supplied by the scenario
    run = sim.simulate(scenario)
    assert run.summary["allocator"] == f"{TOY}:wide"
    assert run.metrics["completed"] + run.metrics["rejected"] == 30
    assert run.metrics["completed"] > 0
    # a slab per sequence: nothing external, nothing duplicated, parts still sum to capacity
    steps = run.steps
    parts = ["token_states", "reservation", "internal", "external", "duplicated", "free"]
    assert (steps[parts].sum(axis=1) == steps["capacity"]).all()
    assert (steps["external"] == 0).all()


def test_a_registered_toy_runs_through_kvsim_run(toy_registered: AllocatorEntry, tmp_path: Path) -> None:
    out = tmp_path / "toy"
    try:
        main(["run", "--num-prompts", "20", "--allocator", f"{TOY}:narrow", "--output", str(out)])
    except SystemExit as exc:
        assert exc.code in (0, None)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["allocator"] == f"{TOY}:narrow"
    assert summary["metrics"]["num_requests"] == 20


def test_the_toy_grammar_and_scenario_params_come_from_its_entry(toy_registered: AllocatorEntry) -> None:
    from sim.errors import ScenarioError

    with pytest.raises(ScenarioError, match="after 'toy_slab' the allowed parts are a width"):
        default_scenario().with_overrides(allocator=f"{TOY}:huge")
    with pytest.raises(ScenarioError, match="comes from the scenario"):
        default_scenario().with_overrides(allocator={"name": TOY, "params": {"max_model_len": 5}})


def test_unregistered_names_are_refused_with_the_known_ones() -> None:
    from sim.errors import ScenarioError

    with pytest.raises(ScenarioError, match="unknown allocator 'toy_slab'"):
        default_scenario().with_overrides(allocator=TOY)
