"""The burst's prefill span (sim/bench/lambda_set.py `burst_prefill_span_ms`, Table 3 of
benchmarks/bench_fidelity.py) runs from the 10th to the 90th percentile first token: a straggler's
late first token does not move it, and on the Lambda BF16/FP8 pairs its ratio agrees with the ratio
of the prefill steps' median gap, which the last first token did not (1xH100: 1.65 against 1.37).
The measured-data check is skipped without ../shared/bench.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.bench.lambda_set import burst_prefill_span_ms, fp8_pairs, load_set
from sim.bench.replay import streamed_mask

SHARED_BENCH = Path(__file__).resolve().parents[2].parent / "shared" / "bench" / "vllm_bench"
STEP_GAP_MIN_MS = 10.0  # first tokens closer than this came out of the same prefill step


def _steps(count: int, step_ms: float, per_step: int = 8) -> np.ndarray:
    """First tokens of a burst prefilled `per_step` requests a step, one step every `step_ms`."""
    return 800.0 + step_ms * (np.arange(count) // per_step).astype(np.float64)


def test_span_is_the_p10_to_p90_first_token() -> None:
    """320 first tokens, 8 per 40 ms step from 800 ms: the 33rd is step 4's (960 ms), the 33rd from
    the end step 35's (2,200 ms); 32 cut at each end."""
    ttft = _steps(320, 40.0)
    assert burst_prefill_span_ms(ttft) == 2200.0 - 960.0
    assert burst_prefill_span_ms(ttft[::-1]) == 1240.0  # order does not matter


def test_two_stragglers_do_not_move_the_span() -> None:
    ttft = _steps(320, 40.0)
    late = ttft.copy()
    late[:2] = ttft.max() + 300.0  # two first tokens 0.3 s after the last prefill step
    # the two move the cut points by two first tokens: at most one 40 ms step, where a span to the
    # last first token would have grown by their 300 ms
    assert abs(burst_prefill_span_ms(late) - burst_prefill_span_ms(ttft)) <= 40.0


def test_span_scales_with_the_step_time() -> None:
    assert burst_prefill_span_ms(_steps(320, 50.0)) / burst_prefill_span_ms(_steps(320, 25.0)) == (
        pytest.approx(2.0, rel=1e-6)
    )


def _median_step_gap_ms(ttft_ms: np.ndarray) -> float:
    gaps = np.diff(np.sort(ttft_ms))
    return float(np.median(gaps[gaps > STEP_GAP_MIN_MS]))


@pytest.mark.skipif(not SHARED_BENCH.is_dir(), reason="shared bench files not found")
def test_measured_span_ratio_follows_the_prefill_steps() -> None:
    pairs = fp8_pairs(load_set(SHARED_BENCH))
    assert len(pairs) == 4
    for bf16, fp8 in pairs:
        ttfts = [bench.ttfts_s[streamed_mask(bench)] * 1e3 for bench in (bf16, fp8)]
        span_ratio = burst_prefill_span_ms(ttfts[0]) / burst_prefill_span_ms(ttfts[1])
        step_ratio = _median_step_gap_ms(ttfts[0]) / _median_step_gap_ms(ttfts[1])
        assert span_ratio == pytest.approx(step_ratio, rel=0.08), bf16.name
