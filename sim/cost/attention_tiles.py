"""Query-tile padding: what a decoding sequence costs inside an attention call that also prefills.

Why it matters: vLLM v1 runs one FlashAttention varlen call per layer over every token the step
schedules, prefill chunks and decodes together (vllm/v1/attention/backends/flash_attn.py
`FlashAttentionImpl.forward`: one `flash_attn_varlen_func` with `cu_seqlens_q`, `max_seqlen_q`,
`seqused_k` and the block table). The kernel tiles the queries in blocks of kBlockM rows, and the
tensor cores compute the whole tile whatever the number of valid rows. A decoding sequence brings one
query row per head, so each of its tiles is almost all padding, yet it runs over the sequence's whole
context. Counted in (query, key) pairs per query head, a decode of context c in a mixed step costs
`rows x c` pairs, not c. The rows, per kernel:

- Ampere (A100, sm80; also sm89 parts): FlashAttention-2 from vllm-project/flash-attention.
  `mha_varlen_fwd` (csrc/flash_attn/flash_api.cpp) sends a paged KV cache to the split-KV kernel
  (`run_mha_fwd(params, stream, /*force_split_kernel=*/paged_KV)`), whose tile is
  `kBlockM = 64; // Fixed for all head dimensions` (csrc/flash_attn/src/flash_fwd_launch_template.h
  `run_mha_fwd_splitkv_dispatch`). It packs the query heads of a KV group into one tile
  (`seqlenq_ngroups_swapped`) and splits the KV only when `max_seqlen_q == 1`, a decode-only step;
  in a mixed step each query head of a decode is a 64-row tile of its own: 64 rows per query head.
- Hopper (H100, H200, sm90): FlashAttention-3 (hopper/). A varlen call always packs the query heads of
  a KV group into the tile (hopper/heuristics.h `should_pack_gqa`: "if (varlen_q) return true"), and
  the tile is 128 rows for head dimensions above 96 (192 up to 96; hopper/tile_size.h
  `tile_size_fwd_sm90`): 128 rows per KV head, 128 / (query heads per KV head) per query head.
- Any other GPU (B200, MI300X): no kernel source was read, so no padding is modelled (1 row: the real
  FLOPs). The kernel is chosen by the GPU preset's name; a custom GPU spec gets 1 row too.
- MLA models (DeepSeek-V2/V3) run through vLLM's MLA backends, which split a step's decodes from its
  prefills and run each part on its own (vllm/v1/attention/backends/mla/common.py
  `MLACommonImpl.forward`: `_forward_decode` and `_forward_prefill`): 1 row.

A decode-only step is left as it was: there both kernels pack a KV group's query heads into one tile
(FA2 `seqlenq_ngroups_swapped`, FA3 PackGQA), so the padded tile does 64 (FA2) or 128 (FA3) FLOPs
per KV byte read, below each GPU's datasheet FLOP-per-byte ridge (A100 153, H100 SXM 295, PCIe 378):
the KV read sets the time. (kvsim's own H100 ridge under the shipped vllm-v1 terms is lower, 108,
because their FLOP scale 0.5 is a whole-step efficiency fitted on prefill-heavy rows, not the
attention kernel's rate; decode-heavy measured rows, Qwen3-8B on an H100 at concurrency 1-8, are
within 5 % on TPOT unpadded: docs/cost_model.md "Decodes beside a prefill".)
Engines that run decodes in calls of their own (vLLM v0's FlashAttention backend:
`flash_attn_with_kvcache` for decodes, `flash_attn_varlen_func` for prefills; SGLang, whose prefill
and decode batches are separate steps) pay no padding either: see each engine's `serving_stack`
key `one_attention_call`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """The attention kernel vLLM's FlashAttention backend runs on one GPU family."""

    name: str
    tile_rows: int  # kBlockM: query rows one tile computes, for head dimensions above 96
    small_head_tile_rows: int  # kBlockM for head dimensions up to 96
    packs_gqa: bool  # a KV group's query heads share a tile in a mixed (varlen) call
    source: str

    def rows(self, head_dim: int) -> int:
        """kBlockM at this head dimension."""
        return self.small_head_tile_rows if head_dim <= 96 else self.tile_rows


FA2_SPLIT_KV = AttentionKernel(
    name="FlashAttention-2 split-KV kernel (sm80)",
    tile_rows=64,
    small_head_tile_rows=64,
    packs_gqa=False,
    source="vllm-project/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h "
    "run_mha_fwd_splitkv_dispatch (kBlockM = 64); flash_api.cpp mha_varlen_fwd (paged KV forces it)",
)
FA3_PACKED = AttentionKernel(
    name="FlashAttention-3 (sm90)",
    tile_rows=128,
    small_head_tile_rows=192,
    packs_gqa=True,
    source="vllm-project/flash-attention hopper/tile_size.h tile_size_fwd_sm90 (kBlockM 128 for "
    "head dims above 96, 192 up to 96); hopper/heuristics.h should_pack_gqa (varlen: always)",
)

# GPU preset -> kernel (sim/scenario/presets.py GPU_PRESETS names). vLLM picks FA3 on compute
# capability 9.0 and FA2 below (vllm/attention/utils/fa_utils.py `get_flash_attn_version`).
ATTENTION_KERNELS: dict[str, AttentionKernel] = {
    "A100-40GB": FA2_SPLIT_KV,
    "A100-80GB": FA2_SPLIT_KV,
    "L4": FA2_SPLIT_KV,
    "H100-80GB": FA3_PACKED,
    "H100-PCIe-80GB": FA3_PACKED,
    "H200-141GB": FA3_PACKED,
}


def mixed_decode_query_rows(
    gpu_name: str, num_attention_heads: int, num_kv_heads: int, head_dim: int, is_mla: bool = False
) -> float:
    """Query rows per query head that one decoding sequence costs in a step that also prefills, in one
    attention call (module docstring): the kernel's tile rows, shared by a KV group's query heads
    when the kernel packs them; 1.0 (no padding) for a GPU whose kernel is not listed and for MLA."""
    kernel = ATTENTION_KERNELS.get(gpu_name)
    if kernel is None or is_mla:
        return 1.0
    group = max(1, num_attention_heads // max(1, num_kv_heads)) if kernel.packs_gqa else 1
    return max(1.0, kernel.rows(head_dim) / group)


__all__ = ["ATTENTION_KERNELS", "AttentionKernel", "mixed_decode_query_rows"]
