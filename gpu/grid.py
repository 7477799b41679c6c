"""The calibration grid: which (kernel, layout, block size, batch, context, heads) points are timed.

Why a module of its own: the device run times this grid, `default_profile()` evaluates the analytic
model on the same grid (so measured and default profiles are fitted the same way), and tests check
its memory cap -- all without CuPy. Each point's byte count has a closed form (uniform lengths),
which tests check against `reference.bytes_and_flops` on the built layout.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpu.fit import CONTIGUOUS_BLOCK_SIZE
from gpu.layouts import DTYPE_BYTES, LAYOUT_NAMES
from gpu.reference import INDEX_BYTES, LENGTH_BYTES, OUTPUT_BYTES, START_SLOT_BYTES

BLOCK_SIZES: tuple[int, ...] = (1, 8, 16, 32, 128)
BATCHES: tuple[int, ...] = (1, 8, 32, 128)
CONTEXTS_TOKENS: tuple[int, ...] = (512, 2048, 8192, 32768)
# name -> (query heads, KV heads, head dim): Llama-2-7B-like MHA and Llama-3-8B-like GQA-8.
HEAD_CONFIGS: dict[str, tuple[int, int, int]] = {"mha": (32, 32, 128), "gqa8": (32, 8, 128)}
KERNELS: tuple[str, ...] = ("gather", "attention")
MAX_POINT_BYTES = 8 * 10**9
SHUFFLED_POOL_FACTOR = 4.0


@dataclass(frozen=True)
class GridPoint:
    """One timed configuration. Contiguous points carry block_size 0 (they have no blocks)."""

    kernel: str
    layout: str
    block_size: int
    batch: int
    context_tokens: int
    heads: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bf16"

    @property
    def working_set_bytes(self) -> int:
        """K and V bytes of the live tokens (one layer)."""
        return 2 * self.batch * self.context_tokens * self.num_kv_heads * self.head_dim * DTYPE_BYTES

    @property
    def pool_bytes(self) -> int:
        """K and V pool the point occupies: the working set, or the shuffled pool (capped)."""
        if self.layout != "paged_shuffled":
            return self.working_set_bytes
        return int(
            min(self.working_set_bytes * SHUFFLED_POOL_FACTOR, max(MAX_POINT_BYTES, self.working_set_bytes))
        )

    def blocks_touched(self) -> int:
        if self.layout == "contiguous":
            return self.batch
        return self.batch * -(-self.context_tokens // self.block_size)

    def cost(self) -> dict[str, int]:
        """bytes, flops and blocks_touched in closed form; equals reference.bytes_and_flops on the layout."""
        kv_bytes = self.working_set_bytes
        blocks = self.blocks_touched()
        index = self.batch * START_SLOT_BYTES if self.layout == "contiguous" else blocks * INDEX_BYTES
        metadata = index + self.batch * LENGTH_BYTES
        if self.kernel == "gather":
            return {"bytes": 2 * kv_bytes + metadata, "flops": 0, "blocks_touched": blocks}
        q_elems = self.batch * self.num_q_heads * self.head_dim
        flops = 4 * self.batch * self.context_tokens * self.num_q_heads * self.head_dim
        total = kv_bytes + q_elems * DTYPE_BYTES + q_elems * OUTPUT_BYTES + metadata
        return {"bytes": total, "flops": flops, "blocks_touched": blocks}

    def as_row(self) -> dict[str, Any]:
        return {**asdict(self), **self.cost()}


def grid_points(
    *,
    kernels: tuple[str, ...] = KERNELS,
    block_sizes: tuple[int, ...] = BLOCK_SIZES,
    batches: tuple[int, ...] = BATCHES,
    contexts_tokens: tuple[int, ...] = CONTEXTS_TOKENS,
    heads: tuple[str, ...] = tuple(HEAD_CONFIGS),
    max_point_bytes: int = MAX_POINT_BYTES,
) -> list[GridPoint]:
    """The grid, skipping points whose KV working set exceeds `max_point_bytes`.

    Contiguous points are timed once per shape (block size does not apply); paged points once per
    block size. Shuffled pools are 4x the working set, capped at max_point_bytes. Shapes are the outer
    loop, so a run cut short by its time budget still has every (kernel, layout, block size) group.
    """
    points: list[GridPoint] = []
    for batch in batches:
        for context in contexts_tokens:
            for head_name in heads:
                q_heads, kv_heads, head_dim = HEAD_CONFIGS[head_name]
                for kernel in kernels:
                    base = dict(
                        kernel=kernel,
                        batch=batch,
                        context_tokens=context,
                        heads=head_name,
                        num_q_heads=q_heads,
                        num_kv_heads=kv_heads,
                        head_dim=head_dim,
                    )
                    probe = GridPoint(layout="contiguous", block_size=CONTIGUOUS_BLOCK_SIZE, **base)
                    if probe.working_set_bytes > max_point_bytes:
                        continue
                    points.append(probe)
                    for layout in LAYOUT_NAMES[1:]:
                        for block_size in block_sizes:
                            points.append(GridPoint(layout=layout, block_size=block_size, **base))
    return points
