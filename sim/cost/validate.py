"""Validate the linear-layer model against a measured profile: per-bucket table and overall MAPE.

Why its own module: `kvsim cost validate` prints it, tests and docs/cost_model.md quote it, and the
plot script (benchmarks/cost_plot.py) reuses the predictions. Each row is predicted from its own
model shape (the row's heads, KV heads, hidden and MLP sizes) on the GPU's fitted coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost.fit import ProfileArrays, mape_pct
from sim.cost.gpu_fits import gpu_linear_fit
from sim.cost.linear import LinearFit
from sim.cost.profiles import gpu_from_file_name, read_linear_profile
from sim.errors import KvsimError
from sim.scenario.presets import GpuSpec, canonical_gpu_name, gpu_preset

# Batch-token buckets of the table: decode-sized, small, medium and prefill-sized batches.
BUCKETS: tuple[tuple[int, int | None], ...] = ((1, 16), (17, 128), (129, 1024), (1025, None))


def bucket_label(low: int, high: int | None) -> str:
    return f"{low}+" if high is None else f"{low}-{high}"


@dataclass(frozen=True)
class Validation:
    """Measured and predicted per-layer seconds of every row of one profile on one GPU."""

    path: Path
    gpu: GpuSpec
    fit: LinearFit
    rows: pd.DataFrame  # num_tokens, tp, measured_s, predicted_s

    @property
    def mape_pct(self) -> float:
        return mape_pct(self.rows["predicted_s"].to_numpy(), self.rows["measured_s"].to_numpy())

    def bucket_table(self) -> pd.DataFrame:
        """One row per (TP size, batch-token bucket) with rows, mean measured/predicted ms and MAPE."""
        out = []
        for tp, by_tp in self.rows.groupby("tp", sort=True):
            for low, high in BUCKETS:
                tokens = by_tp["num_tokens"]
                mask = (tokens >= low) & (tokens <= (high if high is not None else np.inf))
                part = by_tp[mask]
                if part.empty:
                    continue
                out.append(
                    {
                        "tp": int(tp),
                        "batch_tokens": bucket_label(low, high),
                        "rows": len(part),
                        "measured_ms": 1e3 * float(part["measured_s"].mean()),
                        "predicted_ms": 1e3 * float(part["predicted_s"].mean()),
                        "mape_pct": mape_pct(part["predicted_s"].to_numpy(), part["measured_s"].to_numpy()),
                    }
                )
        return pd.DataFrame(out)

    def text(self) -> str:
        """The table as printed by `kvsim cost validate`; the last line is exactly `MAPE <x> %`."""
        lines = [
            f"{self.path.name} on {self.gpu.name}: linear ops per layer per GPU, measured vs predicted",
            f"fit: HBM {self.fit.hbm_fraction:.3f}, FLOPs {self.fit.flops_fraction:.3f}, "
            f"p {self.fit.smooth_p:.3f}, fixed {self.fit.fixed_s * 1e6:.1f} us/layer ({self.fit.source})",
            f"{'TP':>3}  {'batch tokens':>12}  {'rows':>5}  "
            f"{'measured ms':>11}  {'predicted ms':>12}  {'MAPE %':>7}",
        ]
        for row in self.bucket_table().itertuples(index=False):
            lines.append(
                f"{row.tp:>3}  {row.batch_tokens:>12}  {row.rows:>5}  {row.measured_ms:>11.4f}  "
                f"{row.predicted_ms:>12.4f}  {row.mape_pct:>7.2f}"
            )
        lines.append(f"MAPE {self.mape_pct:.2f} %")
        return "\n".join(lines)


def resolve_gpu(path: str | Path, gpu: str | None) -> GpuSpec:
    """The GPU named by --gpu, else the one the file name says (Vidur's `a100_`/`h100_` prefix)."""
    name = gpu if gpu is not None else gpu_from_file_name(path)
    if name is None:
        raise KvsimError(
            f"{path}: cannot tell the GPU from the file name; pass --gpu NAME (e.g. --gpu A100-80GB)"
        )
    try:
        return gpu_preset(canonical_gpu_name(name))
    except ValueError as exc:
        raise KvsimError(f"argument 'gpu': {exc}") from None


def validate_profile(path: str | Path, gpu: str | None = None, fit: LinearFit | None = None) -> Validation:
    """Predict every row of the profile at `path` on `gpu` (default: from the file name)."""
    path = Path(path)
    frame = read_linear_profile(path)
    spec = resolve_gpu(path, gpu)
    fit = gpu_linear_fit(spec.name) if fit is None else fit
    arrays = ProfileArrays.of(frame)
    predicted = arrays.predict_s(fit, spec.hbm_bandwidth_bytes_per_s, spec.peak_flops)
    rows = pd.DataFrame(
        {
            "num_tokens": frame["num_tokens"],
            "tp": frame["tp"],
            "measured_s": frame["measured_s"],
            "predicted_s": predicted,
        }
    )
    return Validation(path, spec, fit, rows)
