"""The start-up profile's reserve (sim/scenario/memory_profile.py): hand-computed terms per engine."""

from __future__ import annotations

from sim.scenario.memory_profile import NON_TORCH_RESERVE_BYTES, profile_reserve
from sim.scenario.presets import model_preset
from sim.scenario.scenario import Scenario

MiB = 1024**2


def test_v1_sampler_pass_dominates_on_a_large_vocabulary() -> None:
    # Qwen3-32B under vLLM v1's H100 budgets: 8,192 batched tokens, 1,024 dummy requests.
    reserve = profile_reserve(model_preset("Qwen3-32B"), "vllm-v1", 8192, 1024)
    hidden = 8192 * 5120 * 2
    assert reserve.forward_peak_bytes == hidden * 10
    # bf16 logits held by the caller + float32 cast + top-k masked logits + softmax (FlashInfer path)
    assert reserve.sampler_peak_bytes == hidden + 1024 * 151936 * (2 + 4 + 4 + 4)
    assert reserve.total_bytes == NON_TORCH_RESERVE_BYTES + reserve.sampler_peak_bytes


def test_v0_sampler_sorts_the_vocabulary() -> None:
    # vLLM 0.5.4's native top-k/top-p: 38 bytes per logit beyond the bf16 logits.
    reserve = profile_reserve(model_preset("Llama-3.1-8B"), "vllm-v0", 2048, 1024)
    assert reserve.sampler_peak_bytes == 2048 * 4096 * 2 + 1024 * 128256 * (2 + 38)


def test_dummy_requests_are_capped_by_the_token_budget() -> None:
    few = profile_reserve(model_preset("Qwen3-32B"), "vllm-v1", 512, 1024)
    assert few.sampler_peak_bytes == 512 * 5120 * 2 + 512 * 151936 * 14


def test_no_sampler_term_without_a_vocabulary_or_a_profiled_sampler() -> None:
    assert profile_reserve(model_preset("LLaMA-2-7B"), "vllm-v1", 8192, 1024).sampler_peak_bytes == 0
    assert profile_reserve(model_preset("Qwen3-32B"), "sglang", 8192, 1024).sampler_peak_bytes == 0


def test_qwen3_32b_kv_space_on_a100_and_h100_under_vllm_serve_defaults() -> None:
    """The gpustack A100 ShareGPT run needed --max-model-len 32768: vLLM v0.11 refuses a max_model_len
    whose KV does not fit (kv_cache_utils.check_enough_kv_cache_memory), and the profile leaves the A100
    under 40,960 tokens. The H100's budgets (8,192 tokens, 1,024 requests) reserve more still."""
    a100 = Scenario(model="Qwen3-32B", gpu="A100-80GB", engine="vllm-v1", max_model_len=32768)
    h100 = Scenario(model="Qwen3-32B", gpu="H100-80GB", engine="vllm-v1")
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    assert 32768 < a100.kv_capacity_tokens() < 40960
    assert h100.kv_capacity_tokens() < a100.kv_capacity_tokens()
    # ...yet the H100's 32K row ran: one 32,000 + 77-token request fits (a sorting sampler would not).
    assert h100.kv_capacity_tokens() >= 32000 + 77
