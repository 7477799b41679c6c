"""Disjoint replicas of one kernel's data, launched together as a CUDA graph (calibrate and replay).

Why: a kernel under ~20 us is dominated by launch gaps when timed alone, and timing it again on the
same data would read from L2, not DRAM. So a short kernel is timed as a graph of launches, each on its
own copy of the layout: the same block table shifted up a pre-filled arena, with its own gather output
rows, plan and workspace. Together the replicas overflow L2 4x, so every launch still reads from DRAM.
`kvsim calibrate` and `kvsim replay` both build their launches here, so a grid point and a replayed
snapshot are timed the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu.errors import GpuError
from gpu.kernels import DeviceLayout, DevicePlan, Kernels, LaunchPlan, attention_plan, gather_plan
from gpu.layouts import DTYPE_BYTES, KvLayout
from gpu.reference import bytes_and_flops
from gpu.timing import replicas_needed

ESTIMATE_BYTES_PER_S = 3e12  # only to decide whether replicas are worth building (graph timing)
INDEX_BYTES = {"block_table": 4, "start_slots": 8, "lengths": 4}
WORKSPACE_BYTES = 4  # float32 split-K partials


def replica_elems(kernel: str, layout: KvLayout) -> tuple[int, int]:
    """uint16 elements one replica takes in the arena: (K or V pool, K or V gather output)."""
    row_elems = layout.kv_heads * layout.head_dim
    out = layout.live_tokens * row_elems if kernel == "gather" else 0
    return layout.num_slots * row_elems, out


def replica_metadata_bytes(kernel: str, layout: KvLayout, plan: LaunchPlan, q_heads: int) -> int:
    """Device bytes of one replica outside the arena: index arrays, launch plan, split-K workspace."""
    index = layout.block_table.size * INDEX_BYTES["block_table"] + layout.batch * (
        INDEX_BYTES["start_slots"] + INDEX_BYTES["lengths"]
    )
    plan_bytes = sum(a.nbytes for a in (plan.chunk_seq, plan.chunk_start, plan.chunk_begin, plan.out_offsets))
    workspace = 0
    if kernel == "attention":
        workspace = max(plan.num_chunks, 1) * q_heads * (layout.head_dim + 2) * WORKSPACE_BYTES
    return index + plan_bytes + workspace


def replica_count(
    kernel: str,
    layout: KvLayout,
    plan: LaunchPlan,
    *,
    q_heads: int,
    l2_bytes: int,
    graph_below_s: float,
    arena_elems: int,
    metadata_budget_bytes: int | None = None,
) -> int:
    """How many disjoint replicas to time: enough to overflow L2 4x, as many as the memory allows.

    Long kernels (estimated at 3 TB/s, well above the graph threshold) get one: they are timed alone.
    GpuError when not even one replica fits the arena or the metadata budget.
    """
    pool, out = replica_elems(kernel, layout)
    per_replica = 2 * (pool + out)
    meta = replica_metadata_bytes(kernel, layout, plan, q_heads)
    if per_replica > arena_elems or (metadata_budget_bytes is not None and meta > metadata_budget_bytes):
        raise GpuError(
            f"{kernel} on {layout.name} needs {per_replica * DTYPE_BYTES} arena bytes and {meta} metadata "
            f"bytes; {arena_elems * DTYPE_BYTES} and {metadata_budget_bytes} are available"
        )
    cost = bytes_and_flops(kernel, layout, q_heads)
    if cost.bytes / ESTIMATE_BYTES_PER_S > 4 * graph_below_s:
        return 1
    fit = arena_elems // per_replica
    if metadata_budget_bytes is not None:
        fit = min(fit, metadata_budget_bytes // max(meta, 1))
    return max(1, min(replicas_needed(cost.kv_bytes, l2_bytes), fit))


@dataclass
class ReplicaView:
    """Replica `index` of `replicas`: the shifted layout and the arena views its launch reads and writes.

    `k_pool`/`v_pool` are the whole K and V pool regions (the shifted layout indexes into them);
    `k_out`/`v_out` are this replica's gather outputs (None for attention).
    """

    layout: KvLayout
    k_pool: Any
    v_pool: Any
    k_out: Any
    v_out: Any


def replica_views(arena: Any, kernel: str, layout: KvLayout, *, replicas: int, index: int) -> ReplicaView:
    """Carve replica `index` of `replicas` from the flat uint16 arena: [K pools | V pools | K outs | V outs].

    Why one function: the timed launches (replica_launches) and the correctness check of the shapes
    the grid times (gpu.check.check_grid_families) must address the arena the same way.
    """
    pool, out_elems = replica_elems(kernel, layout)
    n, r = replicas, index
    if not 0 <= r < n or 2 * n * (pool + out_elems) > int(arena.size):
        raise GpuError(f"replica {r} of {n} does not fit an arena of {int(arena.size)} elements")
    k_out = v_out = None
    if kernel == "gather":
        outputs = 2 * n * pool
        k_out = arena[outputs + r * out_elems : outputs + (r + 1) * out_elems]
        v_start = outputs + (n + r) * out_elems
        v_out = arena[v_start : v_start + out_elems]
    return ReplicaView(
        layout.shifted(r * layout.num_blocks), arena[: n * pool], arena[n * pool : 2 * n * pool], k_out, v_out
    )


@dataclass
class ReplicaLaunches:
    """The launches to hand to EventTimer.time, and the device arrays they use (kept alive with them)."""

    launches: list[Callable[[], None]]
    keep_alive: list[Any]

    @property
    def replicas(self) -> int:
        return len(self.launches)


def replica_launches(
    kernels: Kernels,
    kernel: str,
    layout: KvLayout,
    arena: Any,
    *,
    q: Any,
    out: Any,
    num_sms: int,
    l2_bytes: int,
    graph_below_s: float,
    metadata_budget_bytes: int | None = None,
) -> ReplicaLaunches:
    """One launch of `kernel` per disjoint replica of `layout`, carved from the flat uint16 `arena`.

    The arena is laid out as [K pools | V pools | K outputs | V outputs], each region holding the
    replicas back to back; replica r reads blocks shifted up by r x num_blocks. `q` [batch, q_heads,
    head_dim] (uint16) and `out` (float32, same shape) are shared by the attention replicas.
    """
    cp = kernels.cupy
    q_heads = int(q.shape[1])
    host_plan = gather_plan(layout, num_sms) if kernel == "gather" else attention_plan(layout, num_sms)
    n = replica_count(
        kernel, layout, host_plan, q_heads=q_heads, l2_bytes=l2_bytes, graph_below_s=graph_below_s,
        arena_elems=int(arena.size), metadata_budget_bytes=metadata_budget_bytes,
    )  # fmt: skip
    result = ReplicaLaunches([], [])
    for r in range(n):
        view = replica_views(arena, kernel, layout, replicas=n, index=r)
        dev = DeviceLayout.upload(cp, view.layout)
        plan = DevicePlan.upload(cp, host_plan)
        if kernel == "gather":
            result.launches.append(
                lambda dev=dev, plan=plan, view=view: kernels.gather(
                    dev, plan, view.k_pool, view.v_pool, view.k_out, view.v_out
                )
            )
            result.keep_alive += [dev, plan]
        else:
            workspace = kernels.attention_workspace(view.layout, host_plan, q_heads)
            result.launches.append(
                lambda dev=dev, plan=plan, ws=workspace, view=view: kernels.attention(
                    dev, plan, q, view.k_pool, view.v_pool, out, ws
                )
            )
            result.keep_alive += [dev, plan, workspace]
    return result
