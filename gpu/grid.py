"""The calibration grid: which (kernel, layout, block size, batch, context, heads) points are timed.

Why a module of its own: the device run times this grid, `default_profile()` evaluates the analytic
model on the same grid (so measured and default profiles are fitted the same way), and tests check
its memory cap -- all without CuPy. Each point's byte count has a closed form (uniform lengths),
which tests check against `reference.bytes_and_flops` on the built layout.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from gpu.fit import CONTIGUOUS_BLOCK_SIZE
from gpu.layouts import DTYPE_BYTES, LAYOUT_NAMES
from gpu.reference import INDEX_BYTES, LENGTH_BYTES, OUTPUT_BYTES, START_SLOT_BYTES

BLOCK_SIZES: tuple[int, ...] = (1, 8, 16, 32, 128)
BATCHES: tuple[int, ...] = (1, 8, 32, 128)
CONTEXTS_TOKENS: tuple[int, ...] = (512, 2048, 8192, 32768)
# name -> head shape (GridPoint and ReplayModel field names): Llama-2-7B-like MHA, Llama-3-8B-like GQA-8.
HEAD_CONFIGS: dict[str, dict[str, int]] = {
    "mha": {"num_q_heads": 32, "num_kv_heads": 32, "head_dim": 128},
    "gqa8": {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128},
}
KERNELS: tuple[str, ...] = ("gather", "attention")
MAX_POINT_BYTES = 8 * 10**9
SHUFFLED_POOL_FACTOR = 4.0
CONTIGUOUS_POOL_BLOCK = 16  # contiguous slabs are laid out in 16-token blocks of the shared pool
METADATA_RESERVE_FRACTION = 1 / 32  # of the per-point cap: block tables, plans, workspaces, q and out
INDEX_ENTRY_BYTES = 4  # one int32 block-table entry on the device
START_AND_LENGTH_BYTES = 8 + 4  # int64 slab/first-block slot and int32 length per sequence


def point_budget(max_point_bytes: int) -> tuple[int, int]:
    """Split a per-point memory cap into (KV arena bytes, metadata reserve bytes).

    Why a split: every point's K/V pools and gather outputs are carved from one pre-filled arena,
    while its block tables, plans and workspaces are allocated per point. Capping the arena at the cap
    minus a reserve, and a point's metadata at the reserve, keeps everything a point allocates within
    `max_point_bytes` without refilling the arena for every point.
    """
    reserve = int(max_point_bytes * METADATA_RESERVE_FRACTION)
    return (max_point_bytes - reserve) // 16 * 16, reserve


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
    def pool_block_size(self) -> int:
        """Block size of the layout built over the pool (contiguous slabs use 16-token blocks)."""
        return CONTIGUOUS_POOL_BLOCK if self.layout == "contiguous" else self.block_size

    @property
    def output_bytes(self) -> int:
        """Bytes the kernel writes into the arena: the gather's packed K and V rows (attention: none)."""
        return self.working_set_bytes if self.kernel == "gather" else 0

    @property
    def metadata_bytes(self) -> int:
        """Block table, slot starts and lengths, plus attention's q and float32 output (one replica)."""
        table = self.batch * -(-self.context_tokens // self.pool_block_size) * INDEX_ENTRY_BYTES
        q_out = self.batch * self.num_q_heads * self.head_dim * (DTYPE_BYTES + OUTPUT_BYTES)
        return table + self.batch * START_AND_LENGTH_BYTES + (q_out if self.kernel == "attention" else 0)

    @property
    def block_bytes(self) -> int:
        """K and V bytes of one pool block."""
        return 2 * self.pool_block_size * self.num_kv_heads * self.head_dim * DTYPE_BYTES

    @property
    def blocks_needed(self) -> int:
        """Pool blocks holding the live tokens (a partly used last block per sequence counts whole)."""
        return self.batch * -(-self.context_tokens // self.pool_block_size)

    def pool_bytes(self, max_point_bytes: int = MAX_POINT_BYTES) -> int:
        """K and V pool the point occupies: its blocks, or the shuffled pool (4x, capped), as built.

        The shuffled pool gets what the arena has left after the gather's outputs, never less than
        the blocks it needs (the same rule as layouts.paged_shuffled_layout).
        """
        needed = self.blocks_needed
        if self.layout != "paged_shuffled":
            return needed * self.block_bytes
        available = point_budget(max_point_bytes)[0] - self.output_bytes
        pool_blocks = min(
            int(math.ceil(needed * SHUFFLED_POOL_FACTOR)), max(available // self.block_bytes, needed)
        )
        return pool_blocks * self.block_bytes

    def memory_bytes(self, max_point_bytes: int = MAX_POINT_BYTES) -> int:
        """Everything the point allocates for one replica: pool, outputs, block tables, q and out."""
        return self.pool_bytes(max_point_bytes) + self.output_bytes + self.metadata_bytes

    def fits(self, max_point_bytes: int = MAX_POINT_BYTES) -> bool:
        """Whether the point's pool and outputs fit the arena and its metadata fits the reserve.

        A paged_shuffled point must fit with its FULL 4x pool spread: a point whose spread the arena
        would cap is left out, so every shuffled row (and every ratio) has the same spread (issue 15:
        mixing 1.8-4x spreads in one fit group mixed two layouts).
        """
        arena, reserve = point_budget(max_point_bytes)
        return (
            self.spread_pool_blocks * self.block_bytes + self.output_bytes <= arena
            and self.metadata_bytes <= reserve
        )

    @property
    def spread_pool_blocks(self) -> int:
        """Pool blocks the layout asks for before any cap: 4x the needed blocks when shuffled."""
        if self.layout == "paged_shuffled":
            return int(math.ceil(self.blocks_needed * SHUFFLED_POOL_FACTOR))
        return self.blocks_needed

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
    """The grid, skipping points that do not fit `max_point_bytes` (GridPoint.fits: pool, outputs, tables).

    Contiguous points are timed once per shape (block size does not apply); paged points once per
    block size. Shuffled pools are 4x the working set, capped by what the arena has left. Shapes are the outer
    loop, so a run cut short by its time budget still has every (kernel, layout, block size) group.
    """
    points: list[GridPoint] = []
    for batch in batches:
        for context in contexts_tokens:
            for head_name in heads:
                for kernel in kernels:
                    base = dict(kernel=kernel, batch=batch, context_tokens=context, heads=head_name)
                    shape = HEAD_CONFIGS[head_name]
                    probe = GridPoint(layout="contiguous", block_size=CONTIGUOUS_BLOCK_SIZE, **base, **shape)
                    if not probe.fits(max_point_bytes):
                        continue
                    points.append(probe)
                    for layout in LAYOUT_NAMES[1:]:
                        for block_size in block_sizes:
                            point = GridPoint(layout=layout, block_size=block_size, **base, **shape)
                            if point.fits(max_point_bytes):
                                points.append(point)
    return points
