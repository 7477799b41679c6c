"""Fit t = a + bytes / BW_eff + c * blocks_touched per (kernel, layout, block size); paged/contiguous ratios.

Why this model: a decode-step kernel is memory-bound, so its time is a fixed cost (launch, tail) plus
bytes over an effective bandwidth; paging adds a per-block cost (a dependent block-table load, a
partly used DRAM burst) that a bytes-only model cannot see. Times span four orders of magnitude, so
the fit minimises RELATIVE error (rows weighted by 1/t) and reports MAPE. Coefficients are physical
only when non-negative, so negative ones are dropped and the rest refitted (an exact small NNLS: all
subsets of {a, c} with the bytes term always kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpu.errors import GpuError

KERNELS: tuple[str, ...] = ("attention", "gather")
CONTIGUOUS_BLOCK_SIZE = 0  # contiguous rows and fits carry block_size 0: the layout has no blocks


@dataclass(frozen=True)
class Fit:
    """One fitted cost line; `bytes_per_s` is BW_eff, `c_s_per_block` the per-block cost."""

    kernel: str
    layout: str
    block_size: int
    a_s: float
    bytes_per_s: float
    c_s_per_block: float
    mape_pct: float
    num_points: int

    def predict_s(self, bytes_: Any, blocks_touched: Any) -> Any:
        return (
            self.a_s + np.asarray(bytes_) / self.bytes_per_s + self.c_s_per_block * np.asarray(blocks_touched)
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit_cost_line(bytes_: Any, blocks_touched: Any, time_s: Any) -> tuple[float, float, float, float]:
    """Least-squares (a_s, bytes_per_s, c_s_per_block, mape_pct) for t = a + bytes/BW + c*blocks.

    Relative residuals are minimised; a and c are constrained to be >= 0 (the subset with the smallest
    residual among non-negative solutions wins); the bytes term is always kept and must come out > 0.
    """
    b = np.asarray(bytes_, dtype=np.float64)
    n = np.asarray(blocks_touched, dtype=np.float64)
    t = np.asarray(time_s, dtype=np.float64)
    if not (b.shape == n.shape == t.shape) or t.size == 0:
        raise GpuError("fit: bytes, blocks_touched and time_s must be non-empty and of equal length")
    if (t <= 0).any() or not np.isfinite(t).all():
        raise GpuError("fit: every time_s must be a positive finite number")
    columns = {"a": np.ones_like(t), "bytes": b, "c": n}
    weights = 1.0 / t
    best: tuple[float, dict[str, float]] | None = None
    for extra in (("a", "c"), ("a",), ("c",), ()):
        names = ["bytes", *extra]
        design = np.stack([columns[k] for k in names], axis=1) * weights[:, None]
        if np.linalg.matrix_rank(design) < len(names):
            continue
        coef, *_ = np.linalg.lstsq(design, t * weights, rcond=None)
        values = dict(zip(names, coef, strict=True))
        if values["bytes"] <= 0 or any(values[k] < 0 for k in extra):
            continue
        residual = float(np.sum((design @ coef - t * weights) ** 2))
        if best is None or residual < best[0] * (1 - 1e-12):
            best = (residual, values)
    if best is None:
        raise GpuError(
            "fit: no non-negative solution with a positive bandwidth (are times increasing with bytes?)"
        )
    values = best[1]
    a_s, inv_bw, c_s = values.get("a", 0.0), values["bytes"], values.get("c", 0.0)
    predicted = a_s + b * inv_bw + c_s * n
    mape = float(np.mean(np.abs(predicted - t) / t) * 100.0)
    return float(a_s), float(1.0 / inv_bw), float(c_s), mape


def fit_rows(rows: Iterable[Mapping[str, Any]]) -> list[Fit]:
    """One Fit per (kernel, layout, block_size) group of measured rows, in a stable order."""
    groups: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((str(row["kernel"]), str(row["layout"]), int(row["block_size"])), []).append(row)
    fits: list[Fit] = []
    for (kernel, layout, block_size), members in sorted(groups.items()):
        a_s, bw, c_s, mape = fit_cost_line(
            [r["bytes"] for r in members],
            [r["blocks_touched"] for r in members],
            [r["median_s"] for r in members],
        )
        fits.append(Fit(kernel, layout, block_size, a_s, bw, c_s, mape, len(members)))
    return fits


def paged_ratios(
    rows: Iterable[Mapping[str, Any]], paged_layout: str = "paged_shuffled"
) -> dict[str, dict[str, float]]:
    """Median over matched shapes of t(paged layout, block size) / t(contiguous), per kernel and block size.

    Shapes match on (batch, context_tokens, num_q_heads, num_kv_heads, head_dim, dtype).
    """
    shape_keys = ("batch", "context_tokens", "num_q_heads", "num_kv_heads", "head_dim", "dtype")
    contiguous: dict[tuple[Any, ...], float] = {}
    paged: dict[tuple[str, int], list[tuple[tuple[Any, ...], float]]] = {}
    for row in rows:
        shape = (row["kernel"], *(row[k] for k in shape_keys))
        if row["layout"] == "contiguous":
            contiguous[shape] = float(row["median_s"])
        elif row["layout"] == paged_layout:
            paged.setdefault((str(row["kernel"]), int(row["block_size"])), []).append(
                (shape, float(row["median_s"]))
            )
    ratios: dict[str, dict[str, float]] = {k: {} for k in KERNELS}
    for (kernel, block_size), members in sorted(paged.items()):
        values = [t / contiguous[shape] for shape, t in members if shape in contiguous]
        if values:
            ratios.setdefault(kernel, {})[str(block_size)] = float(np.median(values))
    return ratios
