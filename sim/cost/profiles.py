"""Read measured linear-layer profiles (Vidur's `*.mlp.csv` format) and all-reduce files.

Why a reader of its own: `kvsim cost validate`, the fit (`sim.cost.fit`) and the GPU side (gpu/
writes the same format) all need the same checks. A bad or foreign file is one `KvsimError` line
naming the file and what is wrong (exit 2 in the CLI), never a pandas traceback.

Format (../shared/profiles/README.md): one row per (`num_tokens`, `num_tensor_parallel_workers`),
the model's shape in `n_head`, `n_kv_head`, `n_embd`, `n_expanded_embd`, `use_gated_mlp`, and per-op
times in milliseconds as `time_stats.<op>.median` (per layer, per GPU of the TP group).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost.linear import LAYER_OPS, LayerShape
from sim.errors import KvsimError

SHAPE_COLUMNS: tuple[str, ...] = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp")
KEY_COLUMNS: tuple[str, ...] = ("num_tokens", "num_tensor_parallel_workers")
ALL_REDUCE_COLUMNS: tuple[str, ...] = ("num_workers", "size", "time_stats.all_reduce.median")

# File-name prefixes of the measured GPUs (Vidur's naming) and the kvsim preset they were taken on.
GPU_BY_PREFIX: dict[str, str] = {"a100": "A100-80GB", "h100": "H100-80GB", "h200": "H200-141GB"}


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise KvsimError(f"{path}: profile file not found")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise KvsimError(f"{path}: not a CSV profile ({reason})") from None
    if frame.empty:
        raise KvsimError(f"{path}: no rows")
    return frame


def _numeric(frame: pd.DataFrame, path: Path, columns: list[str]) -> pd.DataFrame:
    """The columns as floats; one line naming the first bad row and column otherwise."""
    out = pd.DataFrame(index=frame.index)
    for column in columns:
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = values.isna() | ~np.isfinite(values.to_numpy(dtype=np.float64, na_value=np.nan))
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise KvsimError(
                f"{path}: row {row + 2}, column {column!r}: not a finite number ({frame[column].iloc[row]!r})"
            )
        out[column] = values.astype(np.float64)
    return out


def read_linear_profile(path: str | Path) -> pd.DataFrame:
    """One row per measurement: tokens, tp, the layer shape, and `measured_s` (sum of the layer's ops).

    `measured_s` sums `time_stats.<op>.median` over `LAYER_OPS` (converted from ms to s). Rows are
    kept as measured (the shared files repeat some (tokens, tp) pairs; each counts).
    """
    path = Path(path)
    frame = _read_csv(path)
    time_columns = [f"time_stats.{op}.median" for op in LAYER_OPS]
    missing = [c for c in (*KEY_COLUMNS, *SHAPE_COLUMNS, *time_columns) if c not in frame.columns]
    if missing:
        shown = ", ".join(missing[:3]) + (f" (+{len(missing) - 3} more)" if len(missing) > 3 else "")
        raise KvsimError(f"{path}: not a linear-layer profile (Vidur mlp format): missing column(s) {shown}")
    gated = frame["use_gated_mlp"].map(_as_bool)
    if gated.isna().any():
        row = int(np.flatnonzero(gated.isna().to_numpy())[0])
        value = frame["use_gated_mlp"].iloc[row]
        raise KvsimError(f"{path}: row {row + 2}, column 'use_gated_mlp': not true/false ({value!r})")
    numbers = _numeric(frame, path, [*KEY_COLUMNS, *SHAPE_COLUMNS[:4], *time_columns])
    for column in (*KEY_COLUMNS, *SHAPE_COLUMNS[:4]):
        low = numbers[column] < 1
        if low.any():
            row = int(np.flatnonzero(low.to_numpy())[0])
            raise KvsimError(f"{path}: row {row + 2}, column {column!r}: must be >= 1")
    times = numbers[time_columns]
    if (times < 0).to_numpy().any():
        row, col = map(int, np.argwhere((times < 0).to_numpy())[0])
        raise KvsimError(f"{path}: row {row + 2}, column {time_columns[col]!r}: negative time")
    heads = numbers["n_head"].astype(int)
    if ((numbers["n_embd"].astype(int) % heads) != 0).any():
        row = int(np.flatnonzero(((numbers["n_embd"].astype(int) % heads) != 0).to_numpy())[0])
        raise KvsimError(f"{path}: row {row + 2}: n_embd is not a multiple of n_head")
    measured = times.sum(axis=1) * 1e-3
    if (measured <= 0).any():
        row = int(np.flatnonzero((measured <= 0).to_numpy())[0])
        raise KvsimError(f"{path}: row {row + 2}: the layer's op times sum to zero")
    return pd.DataFrame(
        {
            "num_tokens": numbers["num_tokens"].astype(np.int64),
            "tp": numbers["num_tensor_parallel_workers"].astype(np.int64),
            "n_head": heads,
            "n_kv_head": numbers["n_kv_head"].astype(int),
            "n_embd": numbers["n_embd"].astype(int),
            "n_expanded_embd": numbers["n_expanded_embd"].astype(int),
            "use_gated_mlp": gated.astype(bool),
            "measured_s": measured.to_numpy(),
        }
    ).reset_index(drop=True)


def _as_bool(value: object) -> bool | None:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "1", "1.0", "yes"):
        return True
    if text in ("false", "0", "0.0", "no"):
        return False
    return None


def row_shape(row: pd.Series | dict, dtype_bytes: int = 2) -> LayerShape:
    """The layer shape a profile row describes (fp16/bf16 weights: 2 bytes)."""
    return LayerShape(
        hidden_size=int(row["n_embd"]),
        num_attention_heads=int(row["n_head"]),
        num_kv_heads=int(row["n_kv_head"]),
        mlp_size=int(row["n_expanded_embd"]),
        gated_mlp=bool(row["use_gated_mlp"]),
        dtype_bytes=dtype_bytes,
    )


def gpu_from_file_name(path: str | Path) -> str | None:
    """The GPU preset a Vidur file was measured on, from its name prefix (`a100_...`), or None."""
    prefix = Path(path).name.split("_", 1)[0].lower()
    return GPU_BY_PREFIX.get(prefix)


def read_all_reduce(path: str | Path) -> pd.DataFrame:
    """Single-node all-reduce medians: `group` (TP size), `size_elements` (fp16 elements), `time_s`.

    Only rows where the whole group sits in one node (`devices_per_node == num_workers`, when the
    column exists) are kept, plus groups larger than one node when nothing smaller exists for them.
    """
    path = Path(path)
    frame = _read_csv(path)
    missing = [c for c in ALL_REDUCE_COLUMNS if c not in frame.columns]
    if missing:
        raise KvsimError(f"{path}: not an all-reduce profile: missing column(s) {', '.join(missing)}")
    numbers = _numeric(frame, path, list(ALL_REDUCE_COLUMNS))
    keep = np.ones(len(frame), dtype=bool)
    if "devices_per_node" in frame.columns:
        per_node = pd.to_numeric(frame["devices_per_node"], errors="coerce").to_numpy()
        max_per_node = (
            pd.to_numeric(frame["max_devices_per_node"], errors="coerce").to_numpy()
            if "max_devices_per_node" in frame.columns
            else np.full(len(frame), np.nan)
        )
        workers = numbers["num_workers"].to_numpy()
        # In one node; or spread over full nodes (devices_per_node = the node's size) beyond it.
        keep = (per_node == workers) | ((workers > max_per_node) & (per_node == max_per_node))
    return pd.DataFrame(
        {
            "group": numbers["num_workers"].to_numpy()[keep].astype(np.int64),
            "size_elements": numbers["size"].to_numpy()[keep],
            "time_s": numbers["time_stats.all_reduce.median"].to_numpy()[keep] * 1e-3,
        }
    )
