"""The bisection and the stability rule of `sim.capacity`, as pure functions (no engine needed)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.errors import CapacityError
from sim.planning.capacity import gpus_for_target
from sim.planning.search import find_max_rate
from sim.planning.slo import Slo, queue_slope_req_s


def threshold_evaluator(threshold: float):
    calls: list[float] = []

    def evaluate(rate: float) -> tuple[bool, dict]:
        calls.append(rate)
        return rate <= threshold, {"rate": rate}

    return evaluate, calls


def test_bisection_converges_below_the_threshold_within_tolerance() -> None:
    evaluate, calls = threshold_evaluator(37.3)
    search = find_max_rate(evaluate, low=1.0, high=64.0, rel_tol=0.01)
    assert search.status == "converged"
    assert 37.3 / 1.01 <= search.max_rate_req_s <= 37.3
    lo, hi = search.final_bracket
    assert lo == search.max_rate_req_s and hi > 37.3 and hi / lo - 1 <= 0.01
    assert [p.rate_req_s for p in search.probes] == calls
    assert calls[:2] == [1.0, 64.0]
    assert all(p.ok == (p.rate_req_s <= 37.3) for p in search.probes)
    # geometric bisection: log2(log(64)/log(1.01)) ~ 8.7 probes after the two ends
    assert len(calls) <= 2 + 9


def test_bracket_is_widened_when_an_end_is_on_the_wrong_side() -> None:
    evaluate, calls = threshold_evaluator(300.0)
    search = find_max_rate(evaluate, low=1.0, high=10.0, rel_tol=0.05)
    assert search.status == "converged" and 300 / 1.05 <= search.max_rate_req_s <= 300
    assert calls[:6] == [1.0, 10.0, 20.0, 40.0, 80.0, 160.0]
    evaluate, calls = threshold_evaluator(0.3)
    search = find_max_rate(evaluate, low=1.0, high=10.0, rel_tol=0.05)
    assert search.status == "converged" and 0.3 / 1.05 <= search.max_rate_req_s <= 0.3
    assert calls[:3] == [1.0, 0.5, 0.25]


def test_nothing_passes_or_everything_passes() -> None:
    evaluate, calls = threshold_evaluator(0.0)
    search = find_max_rate(evaluate, low=1.0, high=2.0, max_expansions=3)
    assert search.status == "below_bracket" and search.max_rate_req_s == 0.0 and len(calls) == 4
    evaluate, calls = threshold_evaluator(math.inf)
    search = find_max_rate(evaluate, low=1.0, high=2.0, max_expansions=3)
    assert search.status == "above_bracket" and search.max_rate_req_s == 16.0


@given(
    threshold=st.floats(0.01, 1e4),
    low=st.floats(0.05, 50.0),
    ratio=st.floats(1.5, 100.0),
    rel_tol=st.floats(0.001, 0.3),
)
def test_bisection_property(threshold: float, low: float, ratio: float, rel_tol: float) -> None:
    evaluate, _ = threshold_evaluator(threshold)
    search = find_max_rate(evaluate, low=low, high=low * ratio, rel_tol=rel_tol, max_expansions=20)
    assert search.status == "converged"
    assert threshold / (1 + rel_tol) <= search.max_rate_req_s <= threshold


@pytest.mark.parametrize(("low", "high", "tol"), [(0.0, 1.0, 0.05), (2.0, 1.0, 0.05), (1.0, 2.0, 0.0)])
def test_bad_bracket_is_refused(low: float, high: float, tol: float) -> None:
    with pytest.raises(CapacityError):
        find_max_rate(lambda r: (True, None), low=low, high=high, rel_tol=tol)


def steps_frame(time_s: np.ndarray, queue_length: np.ndarray) -> pd.DataFrame:
    duration_s = np.diff(time_s, append=time_s[-1] + (time_s[-1] - time_s[-2]))
    return pd.DataFrame({"time_s": time_s, "duration_s": duration_s, "queue_length": queue_length})


def test_queue_slope_is_zero_when_level_and_the_gap_when_the_queue_grows() -> None:
    time_s = np.linspace(0.0, 100.0, 401)
    level = steps_frame(time_s, np.where(np.arange(401) % 7 == 0, 1, 0))  # a short queue now and then
    assert queue_slope_req_s(level, 50.0, 100.0) == pytest.approx(0.0, abs=0.01)
    growing = steps_frame(time_s, np.floor(2.5 * time_s))  # arrivals outpace admissions by 2.5 req/s
    assert queue_slope_req_s(growing, 50.0, 100.0) == pytest.approx(2.5, rel=0.01)
    # only the window counts: a queue that built up early and then stayed level is stable
    early = steps_frame(time_s, np.minimum(np.floor(3 * time_s), 90))
    assert queue_slope_req_s(early, 50.0, 100.0) == pytest.approx(0.0, abs=1e-9)
    assert queue_slope_req_s(early.iloc[:0], 0.0, 1.0) == 0.0


def test_slo_needs_a_bound_and_positive_values() -> None:
    with pytest.raises(CapacityError, match="give an SLO"):
        Slo()
    with pytest.raises(CapacityError, match="ttft_p99_s"):
        Slo(ttft_p99_s=-1.0)
    assert "p99 TTFT <= 2000 ms" in Slo(ttft_p99_s=2.0).describe()


def test_gpus_for_target() -> None:
    assert gpus_for_target(10.0, 4.0, 1) == (3, 3)
    assert gpus_for_target(8.0, 4.0, 2) == (2, 4)
    assert gpus_for_target(8.0, 0.0, 1) == (-1, -1)
