"""Refuse a cost model whose steps overflow: the largest step a scenario allows must take a finite,
bounded time.

Why: a custom GPU with `hbm_bandwidth_bytes_per_s = 1e-300`, a `step_overhead_s` of 1e300 s or a
calibration fit with absurd coefficients gave steps of inf (or 1e300) seconds. The engine then
crashed deep inside a multi-step jump (`OverflowError: cannot convert float infinity to integer`),
or wrote a summary whose durations and percentages read inf. One check when the cost model is built
names the term that is out of range instead.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sim.errors import ScenarioError

if TYPE_CHECKING:
    from sim.cost.model import CostModel
    from sim.scenario.scenario import Scenario

# Longest step any scenario may have. The slowest real steps are seconds (a 32k-token prefill of a
# 70B model on one GPU: ~10 s by the roofline of docs/cost_model.md); an hour is a typo, not a GPU.
MAX_STEP_S = 3600.0


def largest_step_terms_s(cost: CostModel, scenario: Scenario) -> dict[str, float]:
    """Upper bounds of each term of a step's duration at the scenario's limits, by what sets them.

    The largest step batches max_num_batched_tokens tokens and max_num_seqs sequences, reads at most
    the whole KV capacity, lets each batched token attend at most max_model_len keys (and decodes
    beside a prefill at most the KV capacity, each at the kernel's padded query tile:
    sim/cost/attention_tiles.py), and may swap the whole KV capacity.
    """
    tokens = int(scenario.max_num_batched_tokens or 1)
    seqs = int(scenario.max_num_seqs)
    context = int(scenario.kv_capacity_tokens())
    keys_per_token = min(context, int(scenario.max_model_len or context))
    # Memory and compute first: a bandwidth or FLOPs of ~0 is named by the term it breaks, before the
    # linear layers (which use both) read nan.
    return {
        "step_overhead_s": float(cost.overhead_time_s(seqs)),
        "constant_step_s": float(cost.constant_step_s or 0.0),
        "memory (gpu.hbm_bandwidth_bytes_per_s x hbm_efficiency, or the calibration fit)": float(
            cost.memory_time_s(seqs, context)
        ),
        "compute (gpu.peak_flops x flops_efficiency) of attention": float(
            cost.attention_compute_time_s(tokens * keys_per_token + cost.mixed_decode_query_rows * context)
        ),
        "linear layers (fitted to gpu.peak_flops and gpu.hbm_bandwidth_bytes_per_s)": float(
            cost.linear_time_s(tokens + seqs, seqs)
        ),
        "all-reduce (tensor_parallel_size)": float(cost.all_reduce_time_s(tokens + seqs)),
        "swap (gpu.pcie_bandwidth_bytes_per_s)": float(cost.swap_time_s(context)),
    }


def check_step_cost(cost: CostModel, scenario: Scenario) -> None:
    """Raise ScenarioError when a term of the largest step is not finite or longer than MAX_STEP_S."""
    for term, seconds in largest_step_terms_s(cost, scenario).items():
        if not math.isfinite(seconds) or seconds > MAX_STEP_S:
            raise ScenarioError(
                f"step cost: the {term} term of the largest step would take {seconds:.3g} s "
                f"(at most {MAX_STEP_S:g} s); check that term's numbers"
            )
