"""Diagnosis rules at their thresholds: a statement appears just above its bar and not just below it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest

from allocators.base import BREAKDOWN_PARTS
from sim.reports import diagnosis

CAPACITY_TOKENS = 10_000


def steps_table(queue_length: list[int], **parts: list[int]) -> pd.DataFrame:
    """Steps of 1 s each; unspecified taxonomy parts are 0 and `free` takes the remainder."""
    rows = len(queue_length)
    table = {name: np.asarray(parts.get(name, [0] * rows), dtype=np.int64) for name in BREAKDOWN_PARTS}
    used = sum(table[name] for name in BREAKDOWN_PARTS if name != "free")
    table["free"] = CAPACITY_TOKENS - used
    return pd.DataFrame(
        {
            "time_s": np.arange(rows, dtype=float),
            "duration_s": np.ones(rows),
            "num_running": np.asarray(parts.get("num_running", [4] * rows), dtype=np.int64),
            "queue_length": np.asarray(queue_length, dtype=np.int64),
            "capacity": np.full(rows, CAPACITY_TOKENS, dtype=np.int64),
            **table,
        }
    )


@dataclass
class FakeRun:
    steps: pd.DataFrame
    summary: dict[str, Any]
    requests: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(
            {
                "arrival_s": [0.0, 1.0],
                "finish_s": [1.0, 2.0],
                "prompt_tokens": [100, 100],
                "generated_tokens": [100, 100],
                "rejected": [False, False],
            }
        )
    )


def metrics(**overrides: float) -> dict[str, Any]:
    base = {
        "max_queue_length": 0,
        "kv_duplicated_pct": 0.0,
        "waste_pct": 0.0,
        "preemptions": 0,
        "num_requests": 100,
        "rejected": 0,
        "kv_capacity_tokens": CAPACITY_TOKENS,
        "max_concurrency": 4,
        "mean_concurrency": 4.0,
    }
    return base | overrides


def kinds(run: FakeRun) -> set[str]:
    return {statement.kind for statement in diagnosis.diagnose({"run": run})}


@pytest.mark.parametrize(("external_tokens", "expected"), [(900, False), (1100, True)])
def test_shape_not_capacity_threshold(external_tokens: int, expected: bool) -> None:
    steps = steps_table([0, 20, 20, 0], external=[0, external_tokens, external_tokens, 0])
    run = FakeRun(steps, {"scenario": {}, "metrics": metrics(max_queue_length=20)})
    assert ("shape_not_capacity" in kinds(run)) is expected


def test_shape_not_capacity_needs_a_queue() -> None:
    steps = steps_table([0, 5, 5, 0], external=[0, 5000, 5000, 0])
    run = FakeRun(steps, {"scenario": {}, "metrics": metrics(max_queue_length=5)})
    assert "shape_not_capacity" not in kinds(run)


@pytest.mark.parametrize(("internal_tokens", "expected"), [(2400, False), (2600, True)])
def test_reserved_but_unused_threshold(internal_tokens: int, expected: bool) -> None:
    steps = steps_table([12, 12], internal=[internal_tokens] * 2)
    run = FakeRun(steps, {"scenario": {}, "metrics": metrics(max_queue_length=12)})
    assert ("reserved_but_unused" in kinds(run)) is expected


@pytest.mark.parametrize(("num_running", "expected"), [(5, True), (3, False)])
def test_concurrency_tracked_max_model_len(num_running: int, expected: bool) -> None:
    """capacity 10,000 / max_model_len 2,000 = 5 slabs; requests are 200 tokens (room for 50)."""
    steps = steps_table([15, 15], num_running=[num_running] * 2)
    summary = {"scenario": {"max_model_len": 2000}, "metrics": metrics(max_queue_length=15)}
    assert ("concurrency_tracked_max_model_len" in kinds(FakeRun(steps, summary))) is expected


@pytest.mark.parametrize(
    ("overrides", "kind", "expected"),
    [
        ({"kv_duplicated_pct": 4.9}, "duplication", False),
        ({"kv_duplicated_pct": 5.1}, "duplication", True),
        ({"waste_pct": 49.0}, "high_waste", False),
        ({"waste_pct": 51.0}, "high_waste", True),
        ({"preemptions": 4}, "preemptions", False),
        ({"preemptions": 6}, "preemptions", True),
        ({"rejected": 0}, "rejections", False),
        ({"rejected": 1}, "rejections", True),
    ],
)
def test_summary_thresholds(overrides: dict[str, float], kind: str, expected: bool) -> None:
    run = FakeRun(steps_table([0, 0]), {"scenario": {}, "metrics": metrics(**overrides)})
    assert (kind in kinds(run)) is expected


def test_backlog_growth_counts_requests_in_system_over_second_half_of_arrivals() -> None:
    arrival_s = np.arange(0.0, 100.0, 0.5)  # 2 req/s for 100 s
    finish_s = arrival_s * 2.0 + 1.0  # served at 1 req/s: the backlog grows by ~1 req/s
    requests = pd.DataFrame({"arrival_s": arrival_s, "finish_s": finish_s, "rejected": False})
    assert diagnosis.backlog_growth_req_per_s(requests) == pytest.approx(1.0, abs=0.05)
    requests["finish_s"] = arrival_s + 0.2  # keeps up
    assert abs(diagnosis.backlog_growth_req_per_s(requests)) < 0.05


def test_concurrency_comparison_only_between_runs_of_the_same_workload() -> None:
    scenario = {"model": "m", "gpu": "g", "workload": {"source": "s", "request_rate": 2.0}, "seed": 0}
    slow = FakeRun(steps_table([0]), {"scenario": scenario, "metrics": metrics(mean_concurrency=4.0)})
    fast = FakeRun(steps_table([0]), {"scenario": scenario, "metrics": metrics(mean_concurrency=8.0)})
    statements = diagnosis.diagnose({"contiguous": slow, "paged": fast})
    assert [s.label for s in statements] == ["paged vs contiguous"]
    other = {**scenario, "workload": {"source": "s", "request_rate": 4.0}}
    fast_elsewhere = FakeRun(steps_table([0]), {"scenario": other, "metrics": metrics(mean_concurrency=8.0)})
    assert diagnosis.diagnose({"contiguous": slow, "paged": fast_elsewhere}) == []
