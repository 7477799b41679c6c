"""What vLLM's start-up memory profile takes from the KV budget besides the weights, term by term.

Why a module of its own: vLLM does not size the KV cache from a formula but from a measured dummy
pass, and which pass it runs differs between the engines kvsim models. The scenario asks this module
for the bytes the profile reserves per GPU (`profile_reserve`); every term names what vLLM
runs and where (docs/cost_model.md "The KV budget").

vLLM v1 (vllm/v1/worker/gpu_worker.py `Worker.determine_available_memory`, vllm/utils/mem_utils.py
`memory_profiling`): KV bytes = total x gpu_memory_utilization - weights - the torch peak increase of
`GPUModelRunner.profile_run` - the non-torch increase since start-up. `profile_run` runs
`_dummy_run(max_num_batched_tokens)` and then `_dummy_sampler_run` on the last hidden state of each of
its min(max_num_seqs, max_num_batched_tokens) dummy requests, with temperature 0.5, top-p 0.9 and
top-k vocab - 1, so the sampler sorts or filters a (requests x vocabulary) float32 tensor. vLLM v0
(v0.5.4, vllm/worker/worker.py `determine_num_available_blocks`, model_runner.py `profile_run`): the
same two phases, max_num_seqs sequences sharing max_num_batched_tokens, the sampler with top-p 0.99
and top-k vocab - 1, and the peak read as the drop in free device memory. CUDA graphs are captured
after the KV cache is allocated in both (v0.11.0's estimate of graph memory came later, behind
`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`, vllm-project/vllm PR #30515), so they take nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.scenario.presets import ModelSpec

MiB = 1024**2

# Non-torch memory the profile counts (cuBLAS/NCCL workspaces, kernels loaded by the dummy pass).
# vLLM v1 logs it as "non-torch forward increase memory": 0.04-0.61 GiB in published start-up logs.
NON_TORCH_RESERVE_BYTES = 512 * MiB
# Live activations of the dummy forward pass per batched token, in hidden_size elements (residual,
# norm output, QKV, attention output and the MLP's widened intermediate at the peak).
ACTIVATION_WIDTH_HIDDENS = 10

# Bytes per (dummy request x vocabulary entry) that the dummy sampler pass holds at its peak, beyond
# the logits themselves (model dtype, still held by `_dummy_sampler_run`). Engines not listed run no
# profiled sampler pass (SGLang sizes its pool by mem_fraction_static): 0.
SAMPLER_BYTES_PER_LOGIT: dict[str, int] = {
    # vLLM v0.11.0 Sampler.forward casts the logits to float32 (4) and, with FlashInfer installed
    # (the CUDA image's default until vllm-project/vllm PR #26859, after v0.11.0), samples top-k and
    # top-p with `flashinfer.sampling.top_k_top_p_sampling_from_logits`, which writes the top-k
    # masked logits (4) and their softmax (4) as new float32 tensors
    # (vllm/v1/sample/ops/topk_topp_sampler.py `flashinfer_sample`).
    "vllm-v1": 4 + 4 + 4,
    # vLLM v0.5.4 Sampler.forward casts to float32 (4); `_apply_top_k_top_p` sorts (values 4, int64
    # indices 8), builds the top-k mask (bool 1), softmax (4), cumsum (4), the top-p mask (1), the
    # inverse permutation (int64 8) and gathers the result (4), all live at its return
    # (vllm/model_executor/layers/sampler.py).
    "vllm-v0": 4 + 4 + 8 + 1 + 4 + 4 + 1 + 8 + 4,
}


@dataclass(frozen=True)
class ProfileReserve:
    """Bytes per GPU the start-up profile keeps from the KV cache besides the weights."""

    non_torch_bytes: int
    forward_peak_bytes: int  # the dummy forward pass at max_num_batched_tokens
    sampler_peak_bytes: int  # the dummy sampler pass, with the forward's output still held

    @property
    def activation_peak_bytes(self) -> int:
        """The torch peak increase: the larger of the two phases (they run one after the other)."""
        return max(self.forward_peak_bytes, self.sampler_peak_bytes)

    @property
    def total_bytes(self) -> int:
        return self.non_torch_bytes + self.activation_peak_bytes


def sampler_requests(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Dummy requests of the profile run: vLLM v1 `_dummy_run` splits the tokens over
    min(max_num_seqs, tokens) requests; v0 requires max_num_batched_tokens >= max_num_seqs."""
    return min(max_num_seqs, max_num_batched_tokens)


def profile_reserve(
    model: ModelSpec, engine: str, max_num_batched_tokens: int, max_num_seqs: int
) -> ProfileReserve:
    """The profile's reserve for `model` under `engine`'s dummy passes (see the module docstring).

    The sampler term needs the vocabulary; a model without one (the older presets) gets none, as before.
    """
    hidden_bytes = max_num_batched_tokens * model.hidden_size * model.dtype_bytes
    forward = hidden_bytes * ACTIVATION_WIDTH_HIDDENS
    per_logit = SAMPLER_BYTES_PER_LOGIT.get(engine, 0)
    sampler = 0
    if model.vocab_size is not None and per_logit > 0:
        logits = sampler_requests(max_num_seqs, max_num_batched_tokens) * model.vocab_size
        sampler = hidden_bytes + logits * (model.dtype_bytes + per_logit)
    return ProfileReserve(NON_TORCH_RESERVE_BYTES, forward, sampler)
