"""Shared prompt content: system prompts, multi-turn sessions, and their prefix-block ids.

Why here and not in the allocators: which tokens are *identical* across requests is a property of
the workload. The allocators only see it as `prefix_group`/`prefix_tokens` (one shared prefix per
request) or `block_hashes` (Mooncake style: equal id = identical block of `block_hash_tokens`).

Conventions (see docs/workloads.md):
- system prompt: `prefix_group` = its group (0..groups-1), `prefix_tokens` = its length, and the
  preamble is *included* in `prompt_tokens`.
- session turn k: `prefix_group` = the session's own group (numbered after the system groups),
  `prefix_tokens` = the history (every earlier turn's prompt text and output, plus the session's
  preamble); turn 1 has prefix_tokens 0. Across sessions, the preamble is shared only through
  block_hashes.
- block_hashes: a request's prompt is cut into ceil(prompt / B) blocks. Full blocks that lie inside
  the system preamble get the group's ids; other full blocks of a session's prompt get the session's
  stream ids (turn k's prompt is a prefix of the session's token stream); every other block
  (the last partial one, or text of a one-off request) gets a fresh id.
"""

from __future__ import annotations

import numpy as np

from workloads.spec import positive, positive_int


def assign_system_prompt(
    num: int, rng: np.random.Generator, tokens: int, fraction: float, groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """Pick which requests carry a shared preamble: returns (group or -1, preamble tokens or 0)."""
    tokens = positive_int("system_prompt_tokens", tokens, minimum=0)
    fraction = positive("system_prompt_fraction", fraction, allow_zero=True)
    if fraction > 1:
        from workloads.errors import param_error

        raise param_error("system_prompt_fraction", f"must be in [0, 1] (got {fraction})")
    groups = positive_int("system_prompt_groups", groups)
    if tokens == 0 or fraction == 0:
        return np.full(num, -1, dtype=np.int64), np.zeros(num, dtype=np.int64)
    uses = rng.random(num) < fraction
    group = np.where(uses, rng.integers(0, groups, size=num), -1).astype(np.int64)
    return group, np.where(uses, tokens, 0).astype(np.int64)


def session_history(
    session_id: np.ndarray, new_tokens: np.ndarray, output_tokens: np.ndarray, preamble_tokens: np.ndarray
) -> np.ndarray:
    """History length before each turn, rows in session-major order (all turns of a session adjacent).

    history_k = preamble + sum over earlier turns j of (new_tokens_j + output_tokens_j).
    """
    per_turn = new_tokens + output_tokens
    running = np.cumsum(per_turn) - per_turn  # tokens before this row, across all sessions
    starts = np.ones(len(session_id), dtype=bool)
    starts[1:] = session_id[1:] != session_id[:-1]
    session_start_running = np.maximum.accumulate(np.where(starts, running, 0))
    return running - session_start_running + preamble_tokens


def block_hashes(
    prompt_tokens: np.ndarray,
    system_group: np.ndarray,
    system_tokens: np.ndarray,
    session_id: np.ndarray | None,
    block_tokens: int,
) -> np.ndarray:
    """Prefix-block ids per request (object array of list[int]); see the module docstring for the rule."""
    block_tokens = positive_int("block_hash_tokens", block_tokens)
    num = len(prompt_tokens)
    num_blocks = -(-prompt_tokens // block_tokens)
    system_full = np.where(system_group >= 0, system_tokens // block_tokens, 0)
    stream_full = prompt_tokens // block_tokens if session_id is not None else system_full
    system_blocks = int(system_full.max(initial=0))
    num_groups = int(system_group.max(initial=-1)) + 1
    session_base = num_groups * system_blocks
    session_blocks = int(num_blocks.max(initial=0))
    num_sessions = int(session_id.max(initial=-1)) + 1 if session_id is not None else 0
    unique_base = session_base + num_sessions * session_blocks

    row = np.repeat(np.arange(num), num_blocks)
    first_block = np.cumsum(num_blocks) - num_blocks
    j = np.arange(len(row), dtype=np.int64) - np.repeat(first_block, num_blocks)
    ids = unique_base + np.arange(len(row), dtype=np.int64)  # fresh ids by default
    in_system = j < system_full[row]
    ids[in_system] = system_group[row[in_system]] * system_blocks + j[in_system]
    if session_id is not None:
        in_stream = ~in_system & (j < stream_full[row])
        ids[in_stream] = session_base + session_id[row[in_stream]] * session_blocks + j[in_stream]
    out = np.empty(num, dtype=object)
    out[:] = [part.tolist() for part in np.split(ids, first_block[1:])] if num else []
    return out
