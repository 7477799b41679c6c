"""Replay the KV layouts a simulation exported through the real kernels, next to the cost model's prediction.

Why: the calibration grid times idealised layouts; a simulated server's block tables after hours of
churn (prefix sharing, preemptions, fragmented pools) are what the cost model must really price.
The engine writes `layouts/step_{step:08d}.npz` (allocators.base.Layout) and `layouts/index.csv`
(step, time_s, allocator, predicted_kv_read_s, predicted_step_s); this module reads them (CPU),
maps each snapshot to a bounded pool (gpu.layouts.layout_from_snapshot) and times one layer's gather
and decode attention on it (GPU), reporting measured x num_layers against the predicted KV read time.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu.errors import GpuError, check_choice
from gpu.kernels import GROUPS, HEAD_DIMS
from gpu.layouts import (
    DTYPE_BYTES,
    DTYPES,
    KvLayout,
    SnapshotMapping,
    fill_random_bits,
    float32_to_bits,
    layout_from_snapshot,
    make_pool,
    random_values_f32,
)
from gpu.reference import bytes_and_flops, decode_attention_reference, gather_reference
from gpu.replicas import replica_elems, replica_launches
from gpu.timing import MAX_REPLICAS

INDEX_COLUMNS: tuple[str, ...] = ("step", "time_s", "allocator", "predicted_kv_read_s", "predicted_step_s")
REPLAY_COLUMNS: tuple[str, ...] = (
    "run", "allocator", "step", "time_s", "layout", "mapping", "batch", "live_tokens", "blocks_touched",
    "kv_bytes_per_layer", "gather_s", "attention_s", "num_layers", "measured_kv_read_s",
    "predicted_kv_read_s", "predicted_step_s", "measured_over_predicted",
)  # fmt: skip
DEFAULT_BUDGET_BYTES = 8 * 10**9


@dataclass(frozen=True)
class ReplayModel:
    """The attention shape to replay with (one layer is timed; times scale by num_layers)."""

    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    num_layers: int = 32
    dtype: str = "bf16"

    @classmethod
    def resolve(cls, found: dict[str, Any], **given: Any) -> ReplayModel:
        """The defaults, overridden by the shape `found` in a run's summary.json, then by flags `given`.

        Why here: the CLI's flags and the summary's model are two partial views of one shape; a flag
        left unset (None) must not hide what the summary says.
        """
        return cls(**{**found, **{k: v for k, v in given.items() if v is not None}})

    def __post_init__(self) -> None:
        for name in ("num_q_heads", "num_kv_heads", "head_dim", "num_layers"):
            if int(getattr(self, name)) < 1:
                raise GpuError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_q_heads % self.num_kv_heads:
            raise GpuError(
                f"num_q_heads ({self.num_q_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        group = self.num_q_heads // self.num_kv_heads
        if group not in GROUPS:
            raise GpuError(
                f"num_q_heads / num_kv_heads must be one of {GROUPS} (compiled kernels), got {group}"
            )
        if self.head_dim not in HEAD_DIMS:
            raise GpuError(f"head_dim must be one of {HEAD_DIMS} (compiled kernels), got {self.head_dim}")
        check_choice("dtype", self.dtype, DTYPES)


@dataclass(frozen=True)
class Snapshot:
    """One exported step: where its layout file is and what the cost model predicted for it."""

    run: str
    npz_path: Path
    step: int
    time_s: float
    allocator: str
    predicted_kv_read_s: float
    predicted_step_s: float


def find_index_files(results_dir: Path) -> list[Path]:
    """layouts/index.csv in RESULTS_DIR itself or up to two folders below (compare/sweep outputs)."""
    root = Path(results_dir)
    found: list[Path] = []
    for pattern in ("layouts/index.csv", "*/layouts/index.csv", "*/*/layouts/index.csv"):
        found.extend(sorted(root.glob(pattern)))
    return found


def _parse(value: str, kind: type, index_csv: Path, row_number: int, field: str) -> Any:
    try:
        parsed = kind(value)
    except (TypeError, ValueError):
        raise GpuError(
            f"{index_csv}: row {row_number}: field '{field}' must be "
            f"{'an integer' if kind is int else 'a number'}, got {value!r}"
        ) from None
    if kind is float and not math.isfinite(parsed) and field != "predicted_kv_read_s":
        raise GpuError(f"{index_csv}: row {row_number}: field '{field}' must be finite, got {value!r}")
    return parsed


def load_index(index_csv: Path, run: str) -> list[Snapshot]:
    """Parse one layouts/index.csv; every row must name a step whose .npz file exists."""
    try:
        text = index_csv.read_text()
    except OSError as exc:
        raise GpuError(f"{index_csv}: cannot read ({exc.strerror or exc})") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in INDEX_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise GpuError(f"{index_csv}: missing column '{missing[0]}' (need {', '.join(INDEX_COLUMNS)})")
    snapshots: list[Snapshot] = []
    for row_number, row in enumerate(reader, start=2):  # row 1 is the header
        step = _parse(row["step"], int, index_csv, row_number, "step")
        if step < 0:
            raise GpuError(f"{index_csv}: row {row_number}: field 'step' must be >= 0, got {step}")
        npz_path = index_csv.parent / f"step_{step:08d}.npz"
        if not npz_path.is_file():
            raise GpuError(
                f"{index_csv}: row {row_number}: field 'step': layout file {npz_path.name} is missing"
            )
        snapshots.append(
            Snapshot(
                run=run,
                npz_path=npz_path,
                step=step,
                time_s=_parse(row["time_s"], float, index_csv, row_number, "time_s"),
                allocator=str(row["allocator"]),
                predicted_kv_read_s=_parse(
                    row["predicted_kv_read_s"], float, index_csv, row_number, "predicted_kv_read_s"
                ),
                predicted_step_s=_parse(
                    row["predicted_step_s"], float, index_csv, row_number, "predicted_step_s"
                ),
            )
        )
    return snapshots


def load_snapshots(results_dir: str | Path) -> list[Snapshot]:
    """Every exported step under RESULTS_DIR, or GpuError saying what is missing."""
    root = Path(results_dir)
    if not root.is_dir():
        raise GpuError(f"{root}: results folder not found")
    indexes = find_index_files(root)
    if not indexes:
        raise GpuError(f"{root}: no layouts/index.csv found (simulate with --export-layouts N first)")
    snapshots: list[Snapshot] = []
    for index_csv in indexes:
        run_dir = index_csv.parent.parent
        run = "." if run_dir == root else str(run_dir.relative_to(root))
        snapshots.extend(load_index(index_csv, run))
    if not snapshots:
        raise GpuError(f"{root}: layouts/index.csv lists no steps")
    return snapshots


def read_layout(snapshot: Snapshot) -> Any:
    """The allocators.base.Layout stored for a step (GpuError naming the file when unreadable)."""
    from allocators.base import Layout  # local: only replay needs the allocator package

    try:
        return Layout.from_npz(str(snapshot.npz_path))
    except (OSError, KeyError, ValueError) as exc:
        raise GpuError(
            f"{snapshot.npz_path}: cannot read layout snapshot ({type(exc).__name__}: {exc})"
        ) from None


def snapshot_kv_layout(
    snapshot: Snapshot, model: ReplayModel, budget_bytes: int
) -> tuple[KvLayout, SnapshotMapping]:
    """Load a snapshot and map it onto a replay pool of at most `budget_bytes` (K+V, one layer)."""
    return layout_from_snapshot(
        read_layout(snapshot),
        kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        dtype=model.dtype,
        budget_bytes=budget_bytes,
        source=str(snapshot.npz_path),
    )


def reference_replay(
    layout: KvLayout, model: ReplayModel, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The NumPy reference on a snapshot's layout (CPU): gathered K, V and the attention output."""
    k_pool, v_pool = make_pool(layout, rng, np)
    q = float32_to_bits(
        rng.standard_normal((layout.batch, model.num_q_heads, model.head_dim), dtype=np.float32), model.dtype
    )
    k_rows, v_rows = gather_reference(layout, k_pool, v_pool)
    return k_rows, v_rows, decode_attention_reference(layout, q, k_pool, v_pool)


def replay(
    results_dir: str | Path,
    model: ReplayModel,
    *,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    repeats: int = 20,
    max_steps: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Time gather and attention on every exported step (GPU); snapshots are validated first (CPU)."""
    snapshots = load_snapshots(results_dir)
    if max_steps is not None:
        snapshots = snapshots[:max_steps]
    mapped = [(s, *snapshot_kv_layout(s, model, budget_bytes)) for s in snapshots]

    from gpu.backend import device_properties, require_cupy  # GPU part
    from gpu.kernels import Kernels
    from gpu.timing import EventTimer

    cp = require_cupy()
    props = device_properties()
    num_sms = props["multiprocessor_count"]
    kernels = Kernels(cp)
    timer = EventTimer(cp, props["l2_cache_bytes"], kernels=kernels, num_sms=num_sms)
    rng = np.random.default_rng(seed)
    arena = fill_random_bits(
        cp.empty(replay_arena_elems([layout for _, layout, _ in mapped], budget_bytes), dtype=cp.uint16),
        rng,
        model.dtype,
        cp,
    )
    rows: list[dict[str, Any]] = []
    for snap, layout, mapping in mapped:
        gather_s, attention_s = _time_layout(kernels, timer, layout, model, arena, rng, num_sms, repeats)
        rows.append(replay_row(snap, layout, mapping, model, gather_s, attention_s))
    return rows


def replay_arena_elems(layouts: list[KvLayout], budget_bytes: int) -> int:
    """uint16 elements of the shared replay arena: room for MAX_REPLICAS replicas, within the budget.

    Never smaller than one replica of the largest snapshot (pools plus gather outputs), so every
    snapshot can be timed; never larger than the budget otherwise, and no larger than the replicas
    could use. Short kernels then get as many disjoint replicas as fit (gpu.replicas).
    """
    one = max(2 * sum(replica_elems("gather", layout)) for layout in layouts)
    return max(one, min(budget_bytes // DTYPE_BYTES // 8 * 8, MAX_REPLICAS * one))


def _time_layout(
    kernels: Any,
    timer: Any,
    layout: KvLayout,
    model: ReplayModel,
    arena: Any,
    rng: np.random.Generator,
    num_sms: int,
    repeats: int,
) -> tuple[float, float]:
    """Median seconds per launch of one layer's gather and decode attention on `layout`.

    Timed exactly as a calibration point is: short kernels as a CUDA graph of disjoint replicas.
    """
    cp = kernels.cupy
    n_q = layout.batch * model.num_q_heads * model.head_dim
    q = float32_to_bits(random_values_f32(cp, rng, n_q), model.dtype, cp)
    q = q.reshape(layout.batch, model.num_q_heads, model.head_dim)
    out = cp.empty(q.shape, dtype=cp.float32)
    medians = []
    for kernel in ("gather", "attention"):
        replicas = replica_launches(
            kernels, kernel, layout, arena, q=q, out=out, num_sms=num_sms, l2_bytes=timer.l2_bytes,
            graph_below_s=timer.graph_below_s,
        )  # fmt: skip
        medians.append(timer.time(replicas.launches, repeats=repeats).median_s)
    return medians[0], medians[1]


def replay_row(
    snap: Snapshot,
    layout: KvLayout,
    mapping: SnapshotMapping,
    model: ReplayModel,
    gather_s: float,
    attention_s: float,
) -> dict[str, Any]:
    """One output row: per-layer kernel times, scaled to all layers, next to the prediction."""
    cost = bytes_and_flops("attention", layout, model.num_q_heads)
    measured = attention_s * model.num_layers
    predicted = snap.predicted_kv_read_s
    ratio = measured / predicted if predicted > 0 and math.isfinite(predicted) else float("nan")
    return {
        "run": snap.run,
        "allocator": snap.allocator,
        "step": snap.step,
        "time_s": snap.time_s,
        "layout": layout.name,
        "mapping": "exact" if mapping.exact else f"compacted(dropped {mapping.dropped_seqs})",
        "batch": layout.batch,
        "live_tokens": layout.live_tokens,
        "blocks_touched": cost.blocks_touched,
        "kv_bytes_per_layer": cost.kv_bytes,
        "gather_s": gather_s,
        "attention_s": attention_s,
        "num_layers": model.num_layers,
        "measured_kv_read_s": measured,
        "predicted_kv_read_s": predicted,
        "predicted_step_s": snap.predicted_step_s,
        "measured_over_predicted": ratio,
    }


def rows_to_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(
        buffer, fieldnames=list(REPLAY_COLUMNS), lineterminator="\n", extrasaction="ignore"
    )
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def replay_table(rows: list[dict[str, Any]]) -> str:
    """A short text table of the replay rows."""
    header = f"{'run':<14} {'allocator':<16} {'step':>8} {'batch':>5} {'tokens':>8} "
    header += f"{'gather us':>9} {'attn us':>8} {'meas ms':>8} {'pred ms':>8} {'ratio':>6}"
    lines = [header]
    for r in rows:
        lines.append(
            f"{r['run'][:14]:<14} {r['allocator'][:16]:<16} {r['step']:>8} {r['batch']:>5} "
            f"{r['live_tokens']:>8} {r['gather_s'] * 1e6:>9.1f} {r['attention_s'] * 1e6:>8.1f} "
            f"{r['measured_kv_read_s'] * 1e3:>8.3f} {r['predicted_kv_read_s'] * 1e3:>8.3f} "
            f"{r['measured_over_predicted']:>6.2f}"
        )
    return "\n".join(lines)
