"""A decode that shares an attention call with a prefill pays the kernel's padded query tile.

Why: vLLM v1 runs one FlashAttention varlen call over a mixed step; the kernel computes whole tiles of
kBlockM query rows, so a one-row decode costs a tile's worth of FLOPs over its whole context
(sim/cost/attention_tiles.py has the kernel sources). These tests pin the rows per kernel, that
only mixed steps of an engine with one call pay them, and that decode-only steps are untouched.
"""

from __future__ import annotations

import dataclasses

import pytest

from sim.cost.attention_tiles import ATTENTION_KERNELS, mixed_decode_query_rows
from sim.cost.model import CostModel
from sim.engines.registry import available_engines, engine_policy
from sim.scenario.scenario import Scenario


def test_rows_per_kernel() -> None:
    # FA2 (A100): one 64-row tile per query head, whatever the GQA group
    assert mixed_decode_query_rows("A100-80GB", 40, 8, 128) == 64.0
    assert mixed_decode_query_rows("A100-40GB", 40, 40, 128) == 64.0
    # FA3 (H100, H200): a KV group's query heads share a 128-row tile (192 rows up to head dim 96)
    assert mixed_decode_query_rows("H100-80GB", 40, 8, 128) == pytest.approx(25.6)
    assert mixed_decode_query_rows("H100-PCIe-80GB", 64, 8, 128) == 16.0
    assert mixed_decode_query_rows("H200-141GB", 32, 32, 128) == 128.0
    assert mixed_decode_query_rows("H100-80GB", 32, 8, 64) == 48.0
    # a GPU whose kernel was not read: the real FLOPs
    assert mixed_decode_query_rows("MI300X", 64, 8, 128) == 1.0
    assert mixed_decode_query_rows("B200", 64, 8, 128) == 1.0
    assert all(kernel.source for kernel in ATTENTION_KERNELS.values())
    # MLA backends split a step's decodes from its prefills: no padding
    assert mixed_decode_query_rows("H200-141GB", 128, 128, 192, is_mla=True) == 1.0


def test_an_mla_model_on_vllm_v1_pays_no_tile() -> None:
    scenario = Scenario(
        model="DeepSeek-V3", gpu="H200-141GB", engine="vllm-v1", name="mla", tensor_parallel_size=8
    )
    assert scenario.model_spec().is_mla
    assert CostModel.from_scenario(scenario).mixed_decode_query_rows == 1.0


def test_every_engine_says_whether_one_call_runs_a_mixed_step() -> None:
    stacks = {name: dict(engine_policy(name).serving_stack) for name in available_engines()}
    assert all("one_attention_call" in stack for stack in stacks.values()), stacks
    assert stacks["vllm-v1"]["one_attention_call"] is True
    assert stacks["vllm-v0"]["one_attention_call"] is False


def _cost(engine: str, gpu: str = "A100-80GB") -> CostModel:
    return CostModel.from_scenario(Scenario(model="Llama-3-8B", gpu=gpu, engine=engine, name="tiles"))


def test_only_mixed_steps_of_a_one_call_engine_pay_the_tile() -> None:
    v1, v0 = _cost("vllm-v1"), _cost("vllm-v0")
    assert v1.mixed_decode_query_rows == 64.0 and v0.mixed_decode_query_rows == 1.0
    unpadded = dataclasses.replace(v1, mixed_decode_query_rows=1.0)
    # a decode-only step: identical with or without the padding
    for n, context in ((1, 100), (64, 64 * 4_000), (256, 256 * 30_000)):
        assert v1.step_time_s(0, n, context) == unpadded.step_time_s(0, n, context)
        assert (
            v1.decode_step_durations_s(n, context, 8).tolist()
            == unpadded.decode_step_durations_s(n, context, 8).tolist()
        )
    # a prefill-only step: identical too
    assert v1.step_time_s(2_048, 0, 0, 2_048 * 1_024) == unpadded.step_time_s(2_048, 0, 0, 2_048 * 1_024)
    # a mixed step: 8 decodes at 32K context beside a 2,040-token chunk cost 64 rows each
    decode_context, chunk_pairs = 8 * 32_000, 2_040 * 20_000
    padded = v1.step_time_s(2_040, 8, decode_context, chunk_pairs)
    plain = unpadded.step_time_s(2_040, 8, decode_context, chunk_pairs)
    extra_flops = decode_context * (64.0 - 1.0) * v1.attention_flops_per_pair
    assert padded - plain == pytest.approx(extra_flops / v1.flops_per_s, rel=1e-9)
    assert v1.step_attention_pairs(decode_context, chunk_pairs, prefilling=True) == (
        decode_context * 64.0 + chunk_pairs
    )
    unmixed = v1.step_attention_pairs(decode_context, chunk_pairs, prefilling=False)
    assert unmixed == decode_context + chunk_pairs


def test_packed_decode_only_tiles_are_memory_bound_at_the_datasheet_rates() -> None:
    """The module's reason for leaving decode-only steps unpadded: per KV head and key, a tile of R
    query rows does 4 x R x head_dim FLOPs (QK^T and PV) on 4 x head_dim bytes of 2-byte K and V, so
    R FLOPs per KV byte: 64 (FA2) and 128 (FA3), below each GPU's datasheet FLOP-per-byte ridge."""
    from sim.scenario.presets import GPU_PRESETS

    for gpu, rows_per_kv_head in (("A100-80GB", 64), ("H100-80GB", 128), ("H100-PCIe-80GB", 128)):
        spec = GPU_PRESETS[gpu]
        ridge = spec.peak_flops / spec.hbm_bandwidth_bytes_per_s
        assert rows_per_kv_head < ridge, (gpu, ridge)
