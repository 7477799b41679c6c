"""Fit the linear-layer coefficients (`LinearFit`) and the all-reduce tables to measured files.

Why here: the constants stored in sim/cost/gpu_fits.py (GPU_LINEAR_FITS) and sim/cost/network.py
(ALL_REDUCE_TABLES) must be what this code produces from ../shared/profiles, so anyone can rerun it
(`python benchmarks/cost_fit.py`) and tests/test_cost_fit.py checks it. Pure NumPy: a deterministic
Nelder-Mead in log-parameter space minimising the mean absolute percentage error (MAPE), the figure
`kvsim cost validate` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost.linear import LayerCoefficients, LinearFit, layer_time_s, roofline_layer_time_s
from sim.cost.profiles import read_all_reduce, read_linear_profile, row_shape

# Where the fit starts (the constants before the fit, a 3-norm and ~30 us per layer).
_START = (0.8, 0.5, 3.0, 30e-6)


@dataclass(frozen=True)
class ProfileArrays:
    """A profile's rows as arrays of per-GPU, per-layer coefficients (what the fit evaluates)."""

    tokens: np.ndarray
    tp: np.ndarray
    weight_bytes: np.ndarray
    gemm_bytes_per_token: np.ndarray
    elementwise_bytes_per_token: np.ndarray
    flops_per_token: np.ndarray
    measured_s: np.ndarray

    @classmethod
    def of(cls, frame: pd.DataFrame) -> ProfileArrays:
        cache: dict[tuple, LayerCoefficients] = {}
        rows = []
        for row in frame.itertuples(index=False):
            key = (row.n_head, row.n_kv_head, row.n_embd, row.n_expanded_embd, row.use_gated_mlp, row.tp)
            if key not in cache:
                cache[key] = LayerCoefficients.of(row_shape(row._asdict()), int(row.tp))
            c = cache[key]
            rows.append(
                (c.weight_bytes, c.gemm_bytes_per_token, c.elementwise_bytes_per_token, c.flops_per_token)
            )
        table = np.asarray(rows, dtype=np.float64).reshape(-1, 4)
        return cls(
            tokens=frame["num_tokens"].to_numpy(np.float64),
            tp=frame["tp"].to_numpy(np.int64),
            weight_bytes=table[:, 0],
            gemm_bytes_per_token=table[:, 1],
            elementwise_bytes_per_token=table[:, 2],
            flops_per_token=table[:, 3],
            measured_s=frame["measured_s"].to_numpy(np.float64),
        )

    def predict_s(self, fit: LinearFit, hbm_bytes_per_s: float, peak_flops: float) -> np.ndarray:
        coefficients = LayerCoefficients(
            self.weight_bytes,
            self.gemm_bytes_per_token,
            self.elementwise_bytes_per_token,
            self.flops_per_token,
        )
        return np.asarray(layer_time_s(coefficients, self.tokens, fit, hbm_bytes_per_s, peak_flops))

    def roofline_s(
        self, hbm_efficiency: float, flops_efficiency: float, hbm_bytes_per_s: float, peak_flops: float
    ) -> np.ndarray:
        coefficients = LayerCoefficients(
            self.weight_bytes,
            self.gemm_bytes_per_token,
            self.elementwise_bytes_per_token,
            self.flops_per_token,
        )
        return np.asarray(
            roofline_layer_time_s(
                coefficients, self.tokens, hbm_efficiency, flops_efficiency, hbm_bytes_per_s, peak_flops
            )
        )


def mape_pct(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    return float(100.0 * np.mean(np.abs(np.asarray(predicted) / np.asarray(measured) - 1.0)))


def nelder_mead(
    objective: Callable[[np.ndarray], float], start: Sequence[float], step: float = 0.3, max_iter: int = 4000
) -> np.ndarray:
    """Minimise `objective` from `start` (deterministic simplex; stops when the simplex stops improving)."""
    n = len(start)
    points = [np.asarray(start, dtype=np.float64)]
    points += [points[0] + step * np.eye(n)[i] for i in range(n)]
    values = [objective(p) for p in points]
    for _ in range(max_iter):
        order = np.argsort(values, kind="stable")
        points, values = [points[i] for i in order], [values[i] for i in order]
        if abs(values[-1] - values[0]) <= 1e-10 * max(1.0, abs(values[0])):
            break
        centroid = np.mean(points[:-1], axis=0)
        reflected = centroid + (centroid - points[-1])
        f_reflected = objective(reflected)
        if f_reflected < values[0]:
            expanded = centroid + 2.0 * (centroid - points[-1])
            f_expanded = objective(expanded)
            points[-1], values[-1] = (
                (expanded, f_expanded) if f_expanded < f_reflected else (reflected, f_reflected)
            )
        elif f_reflected < values[-2]:
            points[-1], values[-1] = reflected, f_reflected
        else:
            contracted = centroid + 0.5 * (points[-1] - centroid)
            f_contracted = objective(contracted)
            if f_contracted < values[-1]:
                points[-1], values[-1] = contracted, f_contracted
            else:
                best = points[0]
                points = [best] + [best + 0.5 * (p - best) for p in points[1:]]
                values = [values[0]] + [objective(p) for p in points[1:]]
    return points[int(np.argmin(values))]


def _fit_from_params(params: np.ndarray, source: str, mape: float | None = None) -> LinearFit:
    hbm, flops, p_minus_1, fixed = np.exp(params)
    return LinearFit(
        hbm_fraction=float(hbm),
        flops_fraction=float(flops),
        smooth_p=float(1.0 + p_minus_1),
        fixed_s=float(fixed),
        source=source,
        mape_pct=mape,
    )


def _rounded(fit: LinearFit) -> LinearFit:
    """Four significant digits: what is stored in sim/cost/gpu_fits.py."""

    def r(x: float) -> float:
        return float(f"{x:.4g}")

    return LinearFit(
        r(fit.hbm_fraction),
        r(fit.flops_fraction),
        r(fit.smooth_p),
        r(fit.fixed_s),
        fit.source,
        None if fit.mape_pct is None else round(fit.mape_pct, 2),
    )


def fit_linear(
    profiles: Sequence[ProfileArrays], hbm_bytes_per_s: float, peak_flops: float, source: str
) -> LinearFit:
    """Coefficients minimising the MAPE over all rows of `profiles` (one GPU), rounded as stored."""
    if not profiles:
        raise ValueError("fit_linear needs at least one profile")

    def objective(params: np.ndarray) -> float:
        fit = _fit_from_params(params, source)
        errors = [
            np.abs(a.predict_s(fit, hbm_bytes_per_s, peak_flops) / a.measured_s - 1.0) for a in profiles
        ]
        return float(np.mean(np.concatenate(errors)))

    start = np.log([_START[0], _START[1], _START[2] - 1.0, _START[3]])
    best = nelder_mead(objective, start)
    fit = _fit_from_params(best, source)
    rounded = _rounded(fit)
    measured = np.concatenate([a.measured_s for a in profiles])
    predicted = np.concatenate([a.predict_s(rounded, hbm_bytes_per_s, peak_flops) for a in profiles])
    return _rounded(_fit_from_params(best, source, mape_pct(predicted, measured)))


def load_profiles(paths: Sequence[str | Path]) -> dict[str, ProfileArrays]:
    """Each file's rows as arrays, keyed by file name."""
    return {Path(p).name: ProfileArrays.of(read_linear_profile(p)) for p in paths}


# ------------------------------------------------------------------------------------------------------------
# All-reduce tables


def fit_all_reduce(
    path: str | Path, bins: int = 16
) -> dict[int, tuple[tuple[float, ...], tuple[float, ...]]]:
    """Per group size: binned medians of (size, time), log-spaced bins, made non-decreasing in size.

    Why binned medians: the files hold ~1,000 noisy sizes per group; the median of each log-spaced bin
    keeps the latency floor and the bandwidth slope without the noise, and a suffix minimum removes the
    few small-message outliers that would make a larger message look faster.
    """
    frame = read_all_reduce(path)
    tables: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {}
    for group, rows in frame.groupby("group"):
        sizes, times = rows["size_elements"].to_numpy(), rows["time_s"].to_numpy()
        edges = np.geomspace(sizes.min(), sizes.max() * (1 + 1e-9), bins + 1)
        index = np.digitize(sizes, edges) - 1
        bin_sizes, bin_times = [], []
        for b in range(bins):
            mask = index == b
            if mask.any():
                bin_sizes.append(float(np.median(sizes[mask])))
                bin_times.append(float(np.median(times[mask])))
        monotone = np.minimum.accumulate(np.asarray(bin_times)[::-1])[::-1]
        tables[int(group)] = (
            tuple(float(f"{s:.6g}") for s in bin_sizes),
            tuple(float(f"{t:.4g}") for t in monotone),
        )
    return tables
