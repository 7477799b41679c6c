"""The linear layers' FLOPs: the embedding is a lookup and the LM head runs per sampled position.

vLLM v0.5.4 multiplies the LM head only for `sampling_metadata.selected_token_indices`
(vllm/model_executor/layers/logits_processor.py `_prune_hidden_states` before `_get_logits`) and
looks the embedding up (`VocabParallelEmbedding`), so a prefill token does 2 x (params - embedding -
LM head) FLOPs and each decoding sequence adds the LM head's (docs/cost_model.md "Linear layers").
"""

from __future__ import annotations

import pytest

from sim.cost.linear import lm_head_params, per_token_compute_params
from sim.cost.model import CostModel
from sim.scenario.presets import MODEL_PRESETS
from sim.scenario.quantization import embedding_params, quantized_model
from sim.scenario.scenario import default_scenario


def _cost(model: object, tp: int = 1) -> CostModel:
    scenario = default_scenario().with_overrides(model=model, gpu="H100-80GB", tensor_parallel_size=tp)
    return CostModel.from_scenario(scenario)


def test_prefill_tokens_skip_the_embedding_and_lm_head() -> None:
    model = MODEL_PRESETS["Llama-3-8B"]
    head = 128_256 * 4096
    assert lm_head_params(model) == head
    assert per_token_compute_params(model) == 8_030_261_248 - 2 * head
    cost = _cost("Llama-3-8B", tp=2)
    assert cost.flops_per_token == pytest.approx(2 * (8_030_261_248 - 2 * head) / 2)
    assert cost.lm_head_flops_per_seq == pytest.approx(2 * head / 2)  # vocabulary split over TP ranks


def test_a_tied_model_subtracts_its_one_table_once() -> None:
    model = MODEL_PRESETS["Llama-3-8B"].model_copy(update={"tied_embeddings": True})
    assert per_token_compute_params(model) == 8_030_261_248 - 128_256 * 4096


def test_a_model_without_vocabulary_keeps_every_parameter_per_token() -> None:
    model = MODEL_PRESETS["OPT-13B"]
    assert model.vocab_size is None and lm_head_params(model) == 0
    cost = _cost("OPT-13B")
    assert cost.flops_per_token == pytest.approx(2 * model.num_params)
    assert cost.lm_head_flops_per_seq == 0.0
    assert cost.linear_time_s(512, 512) == cost.linear_time_s(512)


def test_each_sampled_position_pays_the_lm_head_at_the_model_dtype_rate() -> None:
    cost = _cost("Llama-3-8B")
    tokens = 8192  # compute-bound: the smooth maximum is essentially the compute side
    extra = cost.linear_time_s(tokens, tokens) - cost.linear_time_s(tokens)
    lm_head_s = tokens * cost.lm_head_flops_per_seq / cost.flops_per_s
    assert extra == pytest.approx(lm_head_s, rel=0.05)
    # a decode step's LM head goes through batch_time_s with the step's sequences
    assert cost.batch_time_s(256, 256) > cost.overhead_time_s(256) + cost.linear_time_s(256)


def test_fp8_weights_keep_a_tied_models_one_table_at_the_model_dtype() -> None:
    """The FP8 checkpoint keeps the embedding (and an untied LM head) at the model dtype: a tied model
    (config.json `tie_word_embeddings`) has one table, counted once in its parameters, so it keeps one."""
    untied = MODEL_PRESETS["Llama-3-8B"]
    tied = untied.model_copy(update={"tied_embeddings": True})
    table = 128_256 * 4096
    assert embedding_params(untied) == 2 * table and embedding_params(tied) == table
    # the same parameter count with one table less kept at 2 bytes: one table's worth less memory
    kept_difference_bytes = table * (untied.dtype_bytes - 1)  # kept at dtype instead of 1-byte FP8
    untied_bytes = quantized_model(untied, "fp8").checkpoint_bytes
    tied_bytes = quantized_model(tied, "fp8").checkpoint_bytes
    assert untied_bytes - tied_bytes == kept_difference_bytes


def test_a_vocabulary_larger_than_the_model_is_refused() -> None:
    """The per-token FLOPs (params less the tables) must stay positive: a vocabulary whose tables
    reach num_params is refused when the model is built, naming the fields."""
    from pydantic import ValidationError

    fields = MODEL_PRESETS["Llama-3-8B"].model_dump()
    with pytest.raises(ValidationError, match="vocab_size=2000000"):
        type(MODEL_PRESETS["Llama-3-8B"])(**{**fields, "vocab_size": 2_000_000})
    tied = type(MODEL_PRESETS["Llama-3-8B"])(**{**fields, "vocab_size": 1_000_000, "tied_embeddings": True})
    assert per_token_compute_params(tied) == 8_030_261_248 - 1_000_000 * 4096 > 0
