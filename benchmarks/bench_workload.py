"""The benchmark workload of issue 16 in one place: engine.py, calls_per_turn.py, results_identity.py.

Why one definition: the speed figures (engine.py), the call counts (calls_per_turn.py) and the
results-identity check (results_identity.py `bench20k`) must all run the same scenario, or a
speed-up could be measured on one workload and proven harmless on another.

The scenario: Azure LLM inference conversation lengths (resampled from
/work/shared/traces/azure_conv_2023/AzureLLMInferenceTrace_conv.csv; the azure-conv preset when the
trace is absent), Poisson 4 req/s, LLaMA-2-7B on an A100-80GB, paged allocator with block 16,
max_num_seqs 128.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

AZURE_CONV = REPO.parent / "shared" / "traces" / "azure_conv_2023" / "AzureLLMInferenceTrace_conv.csv"


def bench_scenario(num_prompts: int, *, require_trace: bool = False):  # returns sim.Scenario
    """The issue-16 benchmark scenario with `num_prompts` requests.

    `require_trace`: return None when the Azure trace is absent instead of falling back to the
    azure-conv preset (results_identity.py skips the scenario then).
    """
    from sim.scenario.scenario import Scenario, WorkloadSpec

    if AZURE_CONV.is_file():
        params = {"lengths": f"empirical(source='{AZURE_CONV}')"}
    elif require_trace:
        return None
    else:
        params = {}
    return Scenario(
        name="bench-engine",
        model="LLaMA-2-7B",
        gpu="A100-80GB",
        max_num_seqs=128,
        block_size=16,
        allocator="paged",
        num_prompts=num_prompts,
        workload=WorkloadSpec(source="azure-conv", request_rate=4.0, params=params),
    )


def lengths_source() -> str:
    """Where the benchmark's lengths come from, for the printed header."""
    if AZURE_CONV.is_file():
        return f"resampled from {AZURE_CONV.name}"
    return "azure-conv preset (trace not found)"
