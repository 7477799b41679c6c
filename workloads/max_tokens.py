"""`max_tokens` policies: the limit each client sends with its request.

Why it matters: a per-request-limit allocator reserves prompt + max_tokens, so it is only as good as
the limits clients send. Most clients send a generous default (`fixed(2048)`, the default policy), an
honest client sends the true length (`exact`), a cautious one a multiple of it (`factor(k)`), and a
lazy one nothing at all (`none`: the model's maximum, i.e. max_model_len - prompt_tokens).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workloads.errors import param_error
from workloads.registry import Registry
from workloads.spec import SpecLike, bind, format_spec, parse_spec, positive, positive_int

MAX_TOKENS_POLICIES: Registry[Any] = Registry("max_tokens policy")
# The limit most clients send when the user sets none (OpenAI-style SDK defaults); the default policy.
DEFAULT_CLIENT_MAX_TOKENS = 2048


@MAX_TOKENS_POLICIES.register("fixed")
def fixed(
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    max_model_len: int | None,
    tokens: int = DEFAULT_CLIENT_MAX_TOKENS,
) -> np.ndarray:
    """Every client asks for the same limit (e.g. an SDK default of 2048)."""
    return np.full(len(prompt_tokens), positive_int("tokens", tokens), dtype=np.int64)


@MAX_TOKENS_POLICIES.register("exact")
def exact(prompt_tokens: np.ndarray, output_tokens: np.ndarray, max_model_len: int | None) -> np.ndarray:
    """The true output length: an oracle client."""
    return output_tokens.astype(np.int64, copy=True)


@MAX_TOKENS_POLICIES.register("factor")
def factor(
    prompt_tokens: np.ndarray, output_tokens: np.ndarray, max_model_len: int | None, k: float = 2.0
) -> np.ndarray:
    """k x the true length, rounded (at least 1)."""
    k = positive("k", k)
    return np.maximum(np.rint(output_tokens * k), 1).astype(np.int64)


@MAX_TOKENS_POLICIES.register("none")
def none(prompt_tokens: np.ndarray, output_tokens: np.ndarray, max_model_len: int | None) -> np.ndarray:
    """No limit sent: the server allows up to the model's maximum context (needs max_model_len)."""
    if max_model_len is None:
        raise param_error(
            "max_model_len", "max_tokens policy 'none' needs max_model_len (the model's maximum)"
        )
    return np.maximum(max_model_len - prompt_tokens, 1).astype(np.int64)


def apply_policy(
    spec: SpecLike, prompt_tokens: np.ndarray, output_tokens: np.ndarray, max_model_len: int | None
) -> tuple[np.ndarray, str]:
    """The max_tokens column for a policy spec such as 'fixed(2048)', 'exact', 'factor(1.5)' or 'none'."""
    name, args, kwargs = parse_spec(spec, "max_tokens_policy")
    fn = MAX_TOKENS_POLICIES.get(name)
    params = bind(fn, args, kwargs, "max_tokens_policy", skip=3)
    return fn(prompt_tokens, output_tokens, max_model_len, **params), format_spec(name, params)
