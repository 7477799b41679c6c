"""The capacity tests' known server: one sequence at a time, 10 steps of 10 ms per request = 10 req/s.

Shared by tests/planning/test_capacity.py and test_capacity_steady.py, which check the planner
against these hand-computed figures.
"""

from __future__ import annotations

from sim.planning.sizing import ProbeSizing

STEP_S = 0.01  # every step takes 10 ms
PROMPT_TOKENS = 32
OUTPUT_TOKENS = 10
KV_TOKENS = 4096  # OPT-13B: 800 KiB per token
KNOWN = {
    "name": "known",
    "kv_cache_memory": 800 * 1024 * KV_TOKENS,
    "max_model_len": 2048,
    "max_num_seqs": 1,
    # one step admits every saturation prompt (the memory arithmetic below); vllm-v0's own default,
    # max(max_model_len, 2048) = 2048, would admit 64 prompts per step, which then grow into a 3rd block
    "max_num_batched_tokens": 8192,
    "constant_step_s": STEP_S,
    "num_prompts": 100,
    "workload": {
        "source": "sharegpt",
        "arrival": "constant",
        "max_tokens_policy": "exact",
        "params": {"prompt_len": f"fixed({PROMPT_TOKENS})", "output_len": f"fixed({OUTPUT_TOKENS})"},
    },
}
# Small runs keep the capacity tests at seconds: probes of at least 100 prompts (the scenario's own
# count), confirmations of 10 x that. The full batch here is one sequence, so the batch rule adds nothing.
SMALL = ProbeSizing(min_prompts=100, batch_turnovers=8.0, confirm_factor=10.0)
