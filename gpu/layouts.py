"""KV pools and block tables: the three idealised layouts and layouts taken from a simulated step.

Why this module: a calibration is only as honest as the memory layouts it times. The grid times three
idealised cases (contiguous slabs, paged blocks handed out in order, paged blocks scattered over a
pool much larger than the working set); `kvsim replay` times the exact block tables a simulated step
produced. Both end up as one `KvLayout`, which the kernels, the reference and the byte counts share.

NumPy only for the index structures; `make_pool` fills the pool through the array-module switch so
the same code fills it on the GPU. Pool shape: [num_blocks, block_size, kv_heads, head_dim], uint16
(bf16 or fp16 bits). A token's slot is `block * block_size + offset`; slots are what the kernels index.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import numpy as np

from gpu.errors import GpuError, check_choice

DTYPES: tuple[str, ...] = ("bf16", "fp16")
DTYPE_BYTES = 2
LAYOUT_NAMES: tuple[str, ...] = ("contiguous", "paged_sequential", "paged_shuffled")


@dataclass(frozen=True)
class KvLayout:
    """Where every live token of a decode batch sits in a KV pool (one layer's worth).

    paged=True: token t of sequence i is in block `block_table[i, t // block_size]`.
    paged=False: it is in slot `start_slots[i] + t`; `block_table` then lists the same slots as
    consecutive blocks (so the reference and the byte counts treat both kinds alike).
    """

    name: str
    paged: bool
    block_size: int
    num_blocks: int
    kv_heads: int
    head_dim: int
    dtype: str
    lengths_tokens: np.ndarray  # int32 [batch]
    block_table: np.ndarray  # int32 [batch, max_blocks], -1 padded
    start_slots: np.ndarray  # int64 [batch]; contiguous: slab start; paged: first block's slot
    seq_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    notes: str = ""

    @property
    def batch(self) -> int:
        return int(self.lengths_tokens.shape[0])

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's K (or V) for all KV heads of one layer."""
        return self.kv_heads * self.head_dim * DTYPE_BYTES

    @property
    def pool_bytes(self) -> int:
        """Bytes of the K and V pools together."""
        return 2 * self.num_slots * self.row_bytes

    @property
    def live_tokens(self) -> int:
        return int(self.lengths_tokens.sum())

    def blocks_per_seq(self) -> np.ndarray:
        """Blocks holding each sequence's live tokens: ceil(length / block_size)."""
        return -(-self.lengths_tokens.astype(np.int64) // self.block_size)

    def token_slots(self, seq: int) -> np.ndarray:
        """Pool slots of sequence `seq`'s live tokens, in token order (int64)."""
        length = int(self.lengths_tokens[seq])
        t = np.arange(length, dtype=np.int64)
        if not self.paged:
            return self.start_slots[seq] + t
        blocks = self.block_table[seq, t // self.block_size].astype(np.int64)
        return blocks * self.block_size + t % self.block_size

    def shifted(self, offset_blocks: int) -> KvLayout:
        """The same layout moved `offset_blocks` blocks up a larger pool (disjoint replicas for timing)."""
        table = np.where(self.block_table >= 0, self.block_table + offset_blocks, -1).astype(np.int32)
        return replace(
            self,
            block_table=table,
            start_slots=self.start_slots + offset_blocks * self.block_size,
            num_blocks=self.num_blocks + offset_blocks,
        )


def _check_common(
    lengths_tokens: Any, block_size: int, kv_heads: int, head_dim: int, dtype: str
) -> np.ndarray:
    lengths = np.asarray(lengths_tokens, dtype=np.int64).reshape(-1)
    if lengths.size == 0:
        raise GpuError("lengths_tokens: need at least one sequence")
    if (lengths < 0).any() or lengths.max() >= 2**31:
        raise GpuError("lengths_tokens: every length must be in [0, 2**31)")
    if block_size < 1:
        raise GpuError(f"block_size must be >= 1, got {block_size}")
    if kv_heads < 1:
        raise GpuError(f"kv_heads must be >= 1, got {kv_heads}")
    if head_dim not in (64, 128, 256):
        raise GpuError(f"head_dim must be 64, 128 or 256, got {head_dim}")
    check_choice("dtype", dtype, DTYPES)
    return lengths


def _table_from_ids(block_ids: np.ndarray, blocks_per_seq: np.ndarray) -> np.ndarray:
    """Pack a flat list of block ids (sequence after sequence) into a -1 padded [batch, max] table."""
    batch = blocks_per_seq.shape[0]
    width = max(int(blocks_per_seq.max()), 1)
    table = np.full((batch, width), -1, dtype=np.int32)
    col = np.arange(width)
    mask = col[None, :] < blocks_per_seq[:, None]
    table[mask] = block_ids
    return table


def contiguous_layout(
    lengths_tokens: Any,
    *,
    kv_heads: int,
    head_dim: int,
    dtype: str = "bf16",
    block_size: int = 16,
    reserved_tokens: Any = None,
) -> KvLayout:
    """One slab per sequence, back to back; each slab holds `reserved_tokens` (default: its length).

    Slabs are rounded up to whole blocks so the same slots can be listed as a consecutive block table.
    The kernel only reads the live part: a slab's reserved tail costs memory, never bandwidth.
    """
    lengths = _check_common(lengths_tokens, block_size, kv_heads, head_dim, dtype)
    reserved = (
        lengths if reserved_tokens is None else np.maximum(np.asarray(reserved_tokens, np.int64), lengths)
    )
    slab_blocks = np.maximum(-(-reserved // block_size), 1)
    first_block = np.concatenate([[0], np.cumsum(slab_blocks)[:-1]]).astype(np.int64)
    live_blocks = -(-lengths // block_size)
    ids = np.concatenate([first_block[i] + np.arange(live_blocks[i]) for i in range(lengths.size)])
    return KvLayout(
        name="contiguous",
        paged=False,
        block_size=block_size,
        num_blocks=int(slab_blocks.sum()),
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        lengths_tokens=lengths.astype(np.int32),
        block_table=_table_from_ids(ids.astype(np.int32), live_blocks),
        start_slots=first_block * block_size,
        seq_ids=np.arange(lengths.size, dtype=np.int64),
    )


def _paged_layout(
    name: str,
    lengths: np.ndarray,
    per_seq: np.ndarray,
    block_ids: np.ndarray,
    *,
    num_blocks: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: str,
    seq_ids: np.ndarray | None = None,
    notes: str = "",
) -> KvLayout:
    """The KvLayout of a paged batch whose blocks are `block_ids`, sequence after sequence.

    Why one builder: the idealised and the snapshot paged layouts differ only in which ids they hold
    and how large the pool is; everything derived from the ids (table, first slots) must not diverge.
    """
    table = _table_from_ids(block_ids.astype(np.int32), per_seq)
    return KvLayout(
        name=name,
        paged=True,
        block_size=block_size,
        num_blocks=num_blocks,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        lengths_tokens=lengths.astype(np.int32),
        block_table=table,
        start_slots=np.maximum(table[:, 0], 0).astype(np.int64) * block_size,
        seq_ids=np.arange(lengths.size, dtype=np.int64) if seq_ids is None else seq_ids,
        notes=notes,
    )


def paged_sequential_layout(
    lengths_tokens: Any, *, kv_heads: int, head_dim: int, block_size: int, dtype: str = "bf16"
) -> KvLayout:
    """Paged, with block ids handed out in order: the best case for a paged kernel (a fresh pool)."""
    lengths = _check_common(lengths_tokens, block_size, kv_heads, head_dim, dtype)
    per_seq = -(-lengths // block_size)
    needed = int(per_seq.sum())
    return _paged_layout(
        "paged_sequential", lengths, per_seq, np.arange(needed), num_blocks=max(needed, 1),
        kv_heads=kv_heads, head_dim=head_dim, block_size=block_size, dtype=dtype,
    )  # fmt: skip


def paged_shuffled_layout(
    lengths_tokens: Any,
    *,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    rng: np.random.Generator,
    dtype: str = "bf16",
    pool_factor: float = 4.0,
    max_pool_bytes: int | None = None,
) -> KvLayout:
    """Paged, with blocks drawn at random from a pool `pool_factor` times the working set.

    This is a long-running server's pool after churn: no two consecutive logical blocks are adjacent.
    `max_pool_bytes` caps the pool (never below the working set itself).
    """
    lengths = _check_common(lengths_tokens, block_size, kv_heads, head_dim, dtype)
    if pool_factor < 1.0:
        raise GpuError(f"pool_factor must be >= 1, got {pool_factor}")
    per_seq = -(-lengths // block_size)
    needed = max(int(per_seq.sum()), 1)
    pool_blocks = int(np.ceil(needed * pool_factor))
    if max_pool_bytes is not None:
        block_bytes = 2 * block_size * kv_heads * head_dim * DTYPE_BYTES
        pool_blocks = min(pool_blocks, max(int(max_pool_bytes // block_bytes), needed))
    if pool_blocks >= 2**31:
        raise GpuError(f"pool of {pool_blocks} blocks exceeds int32 block ids")
    ids = rng.permutation(pool_blocks)[: int(per_seq.sum())]
    return _paged_layout(
        "paged_shuffled", lengths, per_seq, ids, num_blocks=pool_blocks,
        kv_heads=kv_heads, head_dim=head_dim, block_size=block_size, dtype=dtype,
    )  # fmt: skip


def make_layout(
    name: str,
    lengths_tokens: Any,
    *,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    rng: np.random.Generator,
    dtype: str = "bf16",
    max_pool_bytes: int | None = None,
) -> KvLayout:
    """One of LAYOUT_NAMES by name (the calibration grid's switch)."""
    check_choice("layout", name, LAYOUT_NAMES)
    common = dict(kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, block_size=block_size)
    if name == "contiguous":
        return contiguous_layout(lengths_tokens, **common)
    if name == "paged_sequential":
        return paged_sequential_layout(lengths_tokens, **common)
    return paged_shuffled_layout(lengths_tokens, rng=rng, max_pool_bytes=max_pool_bytes, **common)


# ---------------------------------------------------------------------------------------------
# From a simulation snapshot (allocators.base.Layout, read duck-typed so gpu/ needs no allocator code)


@dataclass(frozen=True)
class SnapshotMapping:
    """How a snapshot was mapped onto the replay pool: exact, compacted, or truncated to the budget."""

    exact: bool
    kept_seqs: int
    dropped_seqs: int
    shared_blocks: int  # physical blocks referenced by more than one sequence (prefix sharing)


def layout_from_snapshot(
    snapshot: Any,
    *,
    kv_heads: int,
    head_dim: int,
    dtype: str = "bf16",
    budget_bytes: int = 8 * 10**9,
    source: str = "snapshot",
) -> tuple[KvLayout, SnapshotMapping]:
    """Map the live working set of a simulated step onto a bounded pool.

    When the allocator's whole capacity fits `budget_bytes` (K and V of one layer), the physical
    placement is kept exactly. Otherwise live blocks (paged) or slabs (contiguous) are compacted in
    address order: adjacency between live blocks and shared blocks are preserved, free gaps dropped.
    If even the live set exceeds the budget, sequences are kept in order until it is full.
    kind "virtual" (vAttention) is virtually contiguous and replays as contiguous.
    """
    kind = str(snapshot.kind)
    lengths = np.asarray(snapshot.lengths_tokens, dtype=np.int64).reshape(-1)
    seq_ids = np.asarray(snapshot.seq_ids, dtype=np.int64).reshape(-1)
    if lengths.shape != seq_ids.shape:
        raise GpuError(
            f"{source}: field 'lengths_tokens' has {lengths.size} entries, 'seq_ids' {seq_ids.size}"
        )
    if kind == "paged":
        block_size = int(snapshot.block_size)
        table = np.asarray(snapshot.block_table, dtype=np.int64)
        if table.ndim != 2 or table.shape[0] != lengths.size:
            raise GpuError(f"{source}: field 'block_table' must be [num_seqs, max_blocks], got {table.shape}")
    elif kind in ("contiguous", "virtual"):
        block_size = 1
        table = None
    else:
        raise GpuError(f"{source}: field 'kind' must be paged, contiguous or virtual, got {kind!r}")
    _check_common(np.zeros(1), max(block_size, 1), kv_heads, head_dim, dtype)  # heads, dtype, block size
    row_bytes = kv_heads * head_dim * DTYPE_BYTES
    token_bytes = 2 * row_bytes  # K and V
    live = lengths > 0
    lengths = lengths[live]
    seq_ids = seq_ids[live]
    if lengths.size == 0:
        raise GpuError(f"{source}: no live sequence to replay")

    if kind == "paged":
        assert table is not None
        table = table[live]
        per_seq = -(-lengths // block_size)
        if (per_seq > table.shape[1]).any():
            raise GpuError(f"{source}: field 'block_table' has fewer blocks than 'lengths_tokens' needs")
        used = table[np.arange(table.shape[1])[None, :] < per_seq[:, None]]
        if (used < 0).any():
            raise GpuError(f"{source}: field 'block_table' has -1 inside a live sequence's blocks")
        block_bytes = block_size * token_bytes
        capacity_blocks = max(int(snapshot.capacity_tokens) // block_size, int(used.max()) + 1)
        unique_ids, counts = np.unique(used, return_counts=True)
        shared = int((counts > 1).sum())
        exact = capacity_blocks * block_bytes <= budget_bytes
        kept = lengths.size
        if not exact:
            # Keep sequences in order while their (not yet counted) blocks fit the budget.
            max_blocks = max(int(budget_bytes // block_bytes), 1)
            seen: set[int] = set()
            kept = 0
            for i in range(lengths.size):
                new = set(table[i, : per_seq[i]].tolist()) - seen
                if len(seen) + len(new) > max_blocks:
                    break
                seen |= new
                kept += 1
            if kept == 0:
                raise GpuError(
                    f"{source}: one sequence alone exceeds the replay budget of {budget_bytes} bytes"
                )
            lengths, seq_ids, per_seq, table = lengths[:kept], seq_ids[:kept], per_seq[:kept], table[:kept]
            used = table[np.arange(table.shape[1])[None, :] < per_seq[:, None]]
            unique_ids = np.unique(used)
            rank = np.searchsorted(unique_ids, table.clip(min=0))
            table = np.where(table >= 0, rank, -1)
            num_blocks = int(unique_ids.size)
        else:
            num_blocks = capacity_blocks
        live_ids = table[np.arange(table.shape[1])[None, :] < per_seq[:, None]]
        layout = _paged_layout(
            "snapshot_paged", lengths, per_seq, live_ids, num_blocks=num_blocks, kv_heads=kv_heads,
            head_dim=head_dim, block_size=block_size, dtype=dtype, seq_ids=seq_ids,
            notes="exact" if exact else "compacted",
        )  # fmt: skip
        return layout, SnapshotMapping(exact, kept, int(live.sum()) - kept, shared)

    # contiguous / virtual: slabs at token offsets; pool of 1-token blocks.
    offsets = np.asarray(snapshot.offsets_tokens, dtype=np.int64).reshape(-1)
    if offsets.size != live.size:
        raise GpuError(f"{source}: field 'offsets_tokens' has {offsets.size} entries, expected {live.size}")
    offsets = offsets[live]
    if (offsets < 0).any():
        raise GpuError(f"{source}: field 'offsets_tokens' has a negative offset")
    capacity_tokens = max(int(snapshot.capacity_tokens), int((offsets + lengths).max()))
    exact = capacity_tokens * token_bytes <= budget_bytes
    kept = lengths.size
    if exact:
        starts = offsets
        num_slots = capacity_tokens
    else:
        order = np.argsort(offsets, kind="stable")
        fits = np.cumsum(lengths[order]) * token_bytes <= budget_bytes
        keep_sorted = order[fits]
        if keep_sorted.size == 0:
            raise GpuError(f"{source}: one sequence alone exceeds the replay budget of {budget_bytes} bytes")
        keep = np.sort(keep_sorted)  # back to the snapshot's sequence order
        kept = int(keep.size)
        # compact in address order: each slab starts where the previous live part ended
        sorted_keep = keep[np.argsort(offsets[keep], kind="stable")]
        new_starts = np.concatenate([[0], np.cumsum(lengths[sorted_keep])[:-1]])
        starts_by_seq = np.empty(lengths.size, dtype=np.int64)
        starts_by_seq[sorted_keep] = new_starts
        lengths, seq_ids, starts = lengths[keep], seq_ids[keep], starts_by_seq[keep]
        num_slots = int(lengths.sum())
    width = max(int(lengths.max()), 1)
    t = np.arange(width, dtype=np.int64)
    table = np.where(t[None, :] < lengths[:, None], starts[:, None] + t[None, :], -1)
    if num_slots >= 2**31:
        raise GpuError(f"{source}: contiguous pool of {num_slots} slots exceeds int32 ids; lower the budget")
    layout = KvLayout(
        name=f"snapshot_{kind}",
        paged=False,
        block_size=1,
        num_blocks=num_slots,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        lengths_tokens=lengths.astype(np.int32),
        block_table=table.astype(np.int32),
        start_slots=starts.astype(np.int64),
        seq_ids=seq_ids,
        notes="exact" if exact else "compacted",
    )
    return layout, SnapshotMapping(exact, kept, int(live.sum()) - kept, 0)


# ---------------------------------------------------------------------------------------------
# Data


def random_values_f32(xp: ModuleType, rng: np.random.Generator, size: int) -> Any:
    """Standard-normal float32 values: on the host from `rng`, on the device from a seed drawn from it."""
    if xp is np:
        return rng.standard_normal(size, dtype=np.float32)
    seed = int(rng.integers(0, 2**63 - 1))
    return xp.random.RandomState(seed).standard_normal(size, dtype=xp.float32)


def float32_to_bits(values: Any, dtype: str, xp: ModuleType = np) -> Any:
    """bf16 (round to nearest even) or fp16 bit patterns, as uint16, of float32 values."""
    check_choice("dtype", dtype, DTYPES)
    if dtype == "fp16":
        return values.astype(xp.float16).view(xp.uint16)
    u = values.astype(xp.float32).view(xp.uint32)
    rounding = ((u >> 16) & 1) + xp.uint32(0x7FFF)
    return ((u + rounding) >> 16).astype(xp.uint16)


def fill_random_bits(
    flat: Any, rng: np.random.Generator, dtype: str, xp: ModuleType = np, chunk_elems: int = 1 << 26
) -> Any:
    """Fill a flat uint16 array with standard-normal bf16/fp16 values, in place; return it.

    In chunks, so an 8 GB device pool never needs a float32 temporary of the same size.
    """
    total = int(flat.size)
    for start in range(0, total, chunk_elems):
        n = min(chunk_elems, total - start)
        flat[start : start + n] = float32_to_bits(random_values_f32(xp, rng, n), dtype, xp)
    return flat


def make_pool(
    layout: KvLayout, rng: np.random.Generator, xp: ModuleType = np, chunk_elems: int = 1 << 26
) -> tuple:
    """Random K and V pools [num_blocks, block_size, kv_heads, head_dim] of uint16 for `layout`."""
    shape = (layout.num_blocks, layout.block_size, layout.kv_heads, layout.head_dim)
    total = int(np.prod(shape))
    pools = [
        fill_random_bits(xp.empty(total, dtype=xp.uint16), rng, layout.dtype, xp, chunk_elems).reshape(shape)
        for _ in range(2)
    ]
    return pools[0], pools[1]
