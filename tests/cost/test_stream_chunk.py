"""`stream_chunk_s` (sim/cost/server.py): the front end's per-chunk CPU, paid once per decoding
sequence per step when the front end shares the engine's event loop, nothing otherwise."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sim.cost.model import CostModel
from sim.cost.server import ServerTerms, load_profile_terms, profile_document
from sim.scenario.scenario import default_scenario

V0_STACK = ServerTerms(overhead_scale=0.3, frontend_in_engine_process=True)


def _cost(terms: ServerTerms) -> CostModel:
    return CostModel.from_scenario(default_scenario().with_overrides(engine="vllm-v0"), server=terms)


def test_each_decoding_sequence_pays_one_chunk_per_step() -> None:
    base, chunked = _cost(V0_STACK), _cost(replace(V0_STACK, stream_chunk_s=150e-6))
    for n in (1, 64, 256):
        assert chunked.step_time_s(0, n, 1000 * n) - base.step_time_s(0, n, 1000 * n) == pytest.approx(
            n * 150e-6
        )


def test_a_front_end_in_its_own_process_does_not_hold_steps_back() -> None:
    own_process = replace(V0_STACK, frontend_in_engine_process=False)
    assert _cost(replace(own_process, stream_chunk_s=150e-6)) == _cost(own_process)


def test_neutral_terms_are_unchanged_and_old_profiles_load(tmp_path: Path) -> None:
    assert ServerTerms.neutral().stream_chunk_s == 0.0
    document = profile_document(V0_STACK, [], {})
    del document["terms"]["stream_chunk_s"]  # a profile written before the term existed
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    assert load_profile_terms(path).stream_chunk_s == 0.0
    document["terms"]["stream_chunk_s"] = 0.01  # outside [0, 1 ms]
    path.write_text(json.dumps(document))
    with pytest.raises(Exception, match="stream_chunk_s"):
        load_profile_terms(path)
