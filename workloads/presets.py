"""Named workloads: a preset is a name plus parameters of `generate`, overridable by the caller.

Why presets carry their sources: a capacity planner must be able to tell where every number came
from (docs/workloads.md repeats them with references). All presets run without any file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workloads.registry import Registry


@dataclass(frozen=True)
class Preset:
    """A workload by name: `params` are `generate()` keyword arguments, `source` says where they come from."""

    name: str
    description: str
    params: dict[str, Any] = field(default_factory=dict)
    source: str = ""


PRESETS: Registry[Preset] = Registry("preset")


def _add(preset: Preset) -> None:
    PRESETS.add(preset.name, preset)


# ShareGPT as `vllm bench serve --dataset-name sharegpt` sends it (issue 21 §4): vLLM's sampler takes the
# first human turn of ShareGPT V3 conversations as the prompt, drops pairs with prompt or answer < 4
# tokens, prompt > 1024 or prompt + answer > 2048, and sends max_tokens = the reference answer's length.
# Percentiles measured from ../shared/bench/vllm_bench (LambdaLabsML/vllm-benchmark, vLLM 0.5.4,
# 320 prompts, seed 0; numbers used as facts, credit Lambda): prompts are the `input_lens` of the
# Llama-3 tokenizer (mean 204.9, p50 77, p99 770, max 933); outputs are the generated `output_lens` of
# Meta-Llama-3-8B-Instruct, empty answers dropped, 4 runs pooled (1,212 answers: mean 216.3, p50 186,
# p99 759, max 780). No lognormal fits the prompts (median 77 against mean 205), hence percentiles.
VLLM_BENCH_SHAREGPT_PROMPT = (
    "percentiles(((0, 4), (5, 8), (10, 10), (15, 12), (20, 16), (25, 22), (30, 27), (35, 35), (40, 45), "
    "(45, 59), (50, 77), (55, 122), (60, 178), (65, 242), (70, 306), (75, 338), (80, 392), (85, 480), "
    "(90, 612), (95, 692), (99, 770), (100, 933)))"
)
VLLM_BENCH_SHAREGPT_OUTPUT = (
    "percentiles(((0, 3), (5, 8), (10, 12), (15, 17), (20, 22), (25, 26), (30, 41), (35, 59), (40, 99), "
    "(45, 147), (50, 186), (55, 216), (60, 250), (65, 290), (70, 322), (75, 355), (80, 392), (85, 434), "
    "(90, 490), (95, 573), (99, 759), (100, 780)))"
)

_add(
    Preset(
        "sharegpt",
        "ShareGPT as `vllm bench serve --dataset-name sharegpt` sends it (Llama-3 tokens), Poisson arrivals",
        {
            "prompt_len": VLLM_BENCH_SHAREGPT_PROMPT,
            "output_len": VLLM_BENCH_SHAREGPT_OUTPUT,
            "request_rate": 2.0,
            "max_tokens_policy": "exact",
        },
        "vllm bench serve --dataset-name sharegpt (vLLM 0.5.4 benchmark_serving.py), measured in "
        "LambdaLabsML/vllm-benchmark results/prompt_320: input mean 204.9 / p50 77 / p99 770; "
        "Llama-3-8B-Instruct output mean 216.3 / p50 186 / p99 759",
    )
)

# ShareGPT as used in the vLLM paper (Kwon et al., SOSP 2023, Fig. 11): mean 161.31 input and 337.99
# output tokens. vLLM's benchmark keeps prompts <= 1024 and prompt + output <= 2048 (OPT's context), so
# both are truncated at 1024. The cvs (1.5, 1.0) are our choice for a long tail; they are not published.
SHAREGPT_PROMPT = "lognormal(mean=161.31, cv=1.5, max=1024)"
SHAREGPT_OUTPUT = "lognormal(mean=337.99, cv=1.0, max=1024)"

_add(
    Preset(
        "sharegpt-paper",
        "ShareGPT chat: long-tailed prompts and outputs (vLLM paper statistics), Poisson arrivals",
        {"prompt_len": SHAREGPT_PROMPT, "output_len": SHAREGPT_OUTPUT, "request_rate": 2.0},
        "Kwon et al., SOSP 2023 (vLLM), Fig. 11: mean input 161.31, mean output 337.99 tokens",
    )
)
_add(
    Preset(
        "alpaca",
        "Alpaca instructions: short prompts and outputs (vLLM paper statistics), Poisson arrivals",
        {
            "prompt_len": "lognormal(mean=19.31, cv=0.8, max=512)",
            "output_len": "lognormal(mean=58.45, cv=1.0, max=512)",
            "request_rate": 10.0,
        },
        "Kwon et al., SOSP 2023 (vLLM), Fig. 11: mean input 19.31, mean output 58.45 tokens",
    )
)
# Azure LLM inference trace 2023, conversation: input mean 1,155 / p99 4,142 (max 14,050); output mean
# 211 / p99 601 (max 1,000); 19,366 requests in 58 min = 5.5 req/s, near-Poisson (gap CV 1.09).
# A lognormal with that mean and p99 has cv 0.71 (input) and 0.54 (output): solve
# p99/mean = exp(2.326 s - s^2/2) for s, cv = sqrt(exp(s^2) - 1).
_add(
    Preset(
        "azure-conv",
        "Azure LLM inference 2023, conversation service: lognormal fits to its mean and p99, 5.5 req/s",
        {
            "prompt_len": "lognormal(mean=1155, cv=0.71, max=14050)",
            "output_len": "lognormal(mean=211, cv=0.54, max=1000)",
            "request_rate": 5.5,
        },
        "Patel et al., ISCA 2024 (Splitwise), AzureLLMInferenceTrace_conv: input mean 1,155 / p99 4,142; "
        "output mean 211 / p99 601; 5.5 req/s",
    )
)
_add(
    Preset(
        "chat-system-prompt",
        "ShareGPT-like chat where 80 % of requests start with one shared 900-token system prompt",
        {
            "prompt_len": SHAREGPT_PROMPT,
            "output_len": SHAREGPT_OUTPUT,
            "request_rate": 2.0,
            "system_prompt_tokens": 900,
            "system_prompt_fraction": 0.8,
            "system_prompt_groups": 1,
        },
        "sharegpt-paper's lengths plus a 900-token preamble on 80 % of requests (the prefix-sharing "
        "scenario of the vLLM paper, Sec. 6.4, scaled to a typical production system prompt)",
    )
)
# Long-context chat, fitted to the Mooncake conversation trace's published statistics: input mean
# 12,035 / p99 85,400 (max 126,195), output mean 343 / p99 1,118 (max 2,000). With truncation at those
# maxima, a lognormal needs cv 1.9 (input) and 0.65 (output) to reach the published p99s.
_add(
    Preset(
        "long-context",
        "Long-context chat (Mooncake statistics): prompts of 12k tokens on average, up to 126k",
        {
            "prompt_len": "lognormal(mean=12035, cv=1.9, max=126000)",
            "output_len": "lognormal(mean=343, cv=0.65, max=2000)",
            "request_rate": 0.5,
        },
        "Qin et al., FAST 2025 (Mooncake), conversation trace: input mean 12,035 / p99 85,400; "
        "output mean 343 / p99 1,118",
    )
)


def presets() -> list[str]:
    """Names of every preset, sorted."""
    return PRESETS.names()
