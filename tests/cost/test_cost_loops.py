"""The cost model's jump loops give the floats of the NumPy expressions they replaced, bit for bit.

Why: compiled, `sim/cost/model.py` `_line_durations` and `_steps_starting_before` are C loops (issue 24,
docs/compiled_core.md "Typed loops"); the jump's step durations and where the next arrival cuts it must
stay what `intercept + slope * arange(k)` and `searchsorted(cumsum(...))` gave, compiled or as Python.
Compared with ==, never approx.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.cost import model as cost_model
from sim.cost.model import CostModel
from sim.scenario.scenario import default_scenario


def _numpy_durations(k: int, split: int, ia: float, sa: float, ib: float, sb: float) -> np.ndarray:
    """The vectorised durations `decode_step_durations_s` computed before its loop."""
    steps = np.arange(k, dtype=np.float64)
    if split >= k:
        return ia + sa * steps
    if split <= 0:
        return ib + sb * steps
    durations = np.zeros(k, dtype=np.float64)
    durations[:split] = ia + sa * steps[:split]
    durations[split:] = ib + sb * steps[split:]
    return durations


def _cases() -> list[tuple[int, int, float, float, float, float]]:
    rng = np.random.default_rng(24)  # a generator of its own: no global random state
    cases = []
    for k in (1, 2, 3, 17, 48, 49, 200):
        for split in (0, 1, k // 2, k - 1, k, k + 5):
            ia, sa, ib, sb = (float(x) for x in rng.uniform(1e-5, 3e-2, 4) * rng.uniform(0.1, 1.0, 4))
            cases.append((k, split, ia, sa * 1e-3, ib, sb * 1e-3))
    return cases


@pytest.mark.parametrize("case", _cases())
def test_line_durations_equal_numpy(case: tuple[int, int, float, float, float, float]) -> None:
    assert cost_model._line_durations(*case).tolist() == _numpy_durations(*case).tolist()


@pytest.mark.parametrize("case", _cases())
def test_steps_starting_before_equal_searchsorted(case: tuple[int, int, float, float, float, float]) -> None:
    durations = _numpy_durations(*case)
    starts = durations[:-1].cumsum()
    gaps = [0.0, float(durations[0]), float("inf")]
    gaps += [float(x) for x in starts] + [float(np.nextafter(x, 0.0)) for x in starts]
    for gap_s in gaps:
        expected = 1 + int(starts.searchsorted(gap_s, side="left"))
        assert cost_model._steps_starting_before(*case, gap_s) == expected, (case, gap_s)


def test_model_jump_search_equals_its_durations() -> None:
    """Through the model, beyond the Python path's scalar limit (k > 48) too."""
    cost = CostModel.from_scenario(default_scenario())
    for n, context in ((1, 0), (7, 999), (40, 123_457), (128, 2_000_000)):
        for k in (2, 10, 48, 49, 300):
            durations = cost.decode_step_durations_s(n, context, k)
            starts = durations[:-1].cumsum()
            for gap_s in (float(starts[0]), float(starts[len(starts) // 2]), float(starts[-1]) * 2):
                expected = 1 + int(starts.searchsorted(gap_s, side="left"))
                assert cost.decode_steps_starting_before(n, context, k, gap_s) == expected
