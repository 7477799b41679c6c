"""The cost model's per-batch-size memos return exactly what the unmemoised terms compute.

Why: issue 16 memoises the decode batch's fixed time and the KV-read lines per batch size, and
inlines attention_time_s into step_time_s; results must stay bit-identical, so this compares the
memoised answers (first call and cache hit) with the public term functions, with ==, not approx.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest

from sim.cost.model import CostModel, load_calibration
from sim.scenario.scenario import default_scenario

PROFILE = Path(__file__).resolve().parents[1] / "data" / "calibration_small.json"
BATCHES = (0, 1, 2, 7, 40, 128)
CONTEXTS = (0, 1, 999, 123_457)


def _models() -> list[CostModel]:
    scenario = default_scenario()
    models = [
        CostModel.from_scenario(scenario),
        CostModel.from_scenario(scenario.with_overrides(tensor_parallel_size=2)),
        CostModel.from_scenario(scenario, engine="vllm-v1"),
    ]
    if PROFILE.exists():
        models.append(CostModel.from_scenario(scenario, profile=load_calibration(str(PROFILE))))
    return models


def _step_by_terms(cost: CostModel, prefill: int, n: int, context: int, prefill_context: int) -> float:
    """step_time_s as the sum of its public terms (unmemoised: batch_time_s and attention_time_s)."""
    if prefill <= 0 and n <= 0:
        return 0.0
    pairs = cost.step_attention_pairs(context, prefill_context, prefilling=prefill > 0)
    return cost.batch_time_s(prefill + n, n) + cost.attention_time_s(n, context, pairs)


@pytest.mark.parametrize("index", range(4))
def test_memoised_step_time_equals_its_terms(index: int) -> None:
    models = _models()
    if index >= len(models):
        pytest.skip("no calibration profile")
    cost = models[index]
    for _ in range(2):  # the first call fills the memo, the second reads it
        for n in BATCHES:
            for context in CONTEXTS:
                assert cost.step_time_s(0, n, context) == _step_by_terms(cost, 0, n, context, 0)
                assert cost.step_time_s(300, n, context, 45_150) == _step_by_terms(
                    cost, 300, n, context, 45_150
                )
    assert set(cost._decode_batch_memo) <= set(BATCHES)  # bounded by the batch sizes asked


def test_memoised_decode_durations_equal_a_fresh_model() -> None:
    for cost in _models():
        for n in BATCHES[1:]:
            fresh = dataclasses.replace(cost)  # a copy with empty memos
            assert not fresh._decode_batch_memo and not fresh._kv_lines_memo
            durations = cost.decode_step_durations_s(n, 10_000, 64)
            again = cost.decode_step_durations_s(n, 10_000, 64)
            assert (
                durations.tolist() == again.tolist() == fresh.decode_step_durations_s(n, 10_000, 64).tolist()
            )


def test_memos_are_not_part_of_the_value() -> None:
    cost = _models()[0]
    before = copy.deepcopy(cost)
    cost.step_time_s(0, 40, 4_000)
    assert cost == before and hash(cost) == hash(before)
    restored = pickle.loads(pickle.dumps(cost))
    assert restored == cost and restored.step_time_s(0, 40, 4_000) == cost.step_time_s(0, 40, 4_000)
    assert "_memo" not in repr(cost)
