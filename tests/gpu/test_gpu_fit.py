"""Fit recovery on synthetic data with known coefficients, and the paged/contiguous ratios."""

from __future__ import annotations

import numpy as np
import pytest

from gpu.errors import GpuError
from gpu.fit import fit_cost_line, fit_rows, paged_ratios
from gpu.grid import grid_points


def synthetic_rows(a_s: float, bw: float, c_s: float, noise: float, rng: np.random.Generator) -> list[dict]:
    rows = []
    for point in grid_points(kernels=("attention",), block_sizes=(16,)):
        row = point.as_row()
        t = a_s + row["bytes"] / bw + c_s * row["blocks_touched"]
        t *= 1.0 + noise * rng.standard_normal()
        row.update(median_s=t, p10_s=t, p90_s=t)
        rows.append(row)
    return rows


def test_noiseless_fit_recovers_the_coefficients_exactly() -> None:
    rows = synthetic_rows(6e-6, 3.9e12, 2.5e-9, 0.0, np.random.default_rng(0))
    fits = {(f.layout, f.block_size): f for f in fit_rows(rows)}
    paged = fits[("paged_shuffled", 16)]
    assert paged.a_s == pytest.approx(6e-6, rel=1e-6)
    assert paged.bytes_per_s == pytest.approx(3.9e12, rel=1e-6)
    assert paged.c_s_per_block == pytest.approx(2.5e-9, rel=1e-5)
    assert paged.mape_pct < 1e-6 and paged.num_points == 23  # 28 before the constant 4x spread
    assert fits[("contiguous", 0)].bytes_per_s == pytest.approx(3.9e12, rel=1e-6)


def test_noisy_fit_recovers_the_coefficients_within_a_few_percent() -> None:
    rng = np.random.default_rng(42)
    a_true, bw_true, c_true = 1.0e-5, 4.2e12, 4e-9
    rows = synthetic_rows(a_true, bw_true, c_true, 0.01, rng)
    fit = next(f for f in fit_rows(rows) if f.layout == "paged_sequential")
    assert fit.bytes_per_s == pytest.approx(bw_true, rel=0.02)
    assert fit.a_s == pytest.approx(a_true, rel=0.1)
    assert fit.c_s_per_block == pytest.approx(c_true, rel=0.25)
    assert 0.3 < fit.mape_pct < 2.0  # 1 % noise -> ~0.8 % mean absolute error


def test_negative_terms_are_dropped_not_reported() -> None:
    # A pure bandwidth line with a slight negative offset in the data: a must come out 0, not < 0.
    b = np.array([1e6, 1e7, 1e8, 1e9])
    blocks = np.array([1, 7, 50, 400])
    t = b / 2e12 - 1e-9 * (b > 5e6)
    a_s, bw, c_s, mape = fit_cost_line(b, blocks, np.maximum(t, 1e-7))
    assert a_s >= 0 and c_s >= 0 and bw > 0 and mape >= 0


def test_fit_rejects_bad_data_with_one_line() -> None:
    with pytest.raises(GpuError, match="positive"):
        fit_cost_line([1, 2], [1, 1], [0.0, 1.0])
    with pytest.raises(GpuError, match="equal length"):
        fit_cost_line([1, 2], [1], [1.0, 1.0])
    with pytest.raises(GpuError, match="no non-negative solution"):
        fit_cost_line([0, 0, 0], [1, 2, 3], [3.0, 2.0, 1.0])  # no bytes at all


def test_ratios_are_medians_over_matched_shapes() -> None:
    rows = []
    for batch, slow in ((1, 1.10), (8, 1.20), (32, 1.30)):
        shape = dict(
            batch=batch, context_tokens=512, num_q_heads=32, num_kv_heads=8, head_dim=128, dtype="bf16"
        )
        rows.append(dict(kernel="attention", layout="contiguous", block_size=0, median_s=1.0, **shape))
        rows.append(dict(kernel="attention", layout="paged_shuffled", block_size=16, median_s=slow, **shape))
        rows.append(
            dict(kernel="attention", layout="paged_sequential", block_size=16, median_s=1.01, **shape)
        )
    # an unmatched paged row (no contiguous twin) is ignored
    rows.append(
        dict(kernel="attention", layout="paged_shuffled", block_size=16, median_s=9.0, batch=99,
             context_tokens=1, num_q_heads=32, num_kv_heads=8, head_dim=128, dtype="bf16")
    )  # fmt: skip
    assert paged_ratios(rows) == {"attention": {"16": pytest.approx(1.20)}, "gather": {}}
    assert paged_ratios(rows, "paged_sequential")["attention"]["16"] == pytest.approx(1.01)
