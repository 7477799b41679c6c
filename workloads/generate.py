"""Synthetic request tables: arrivals x lengths x max_tokens policy x sharing, all vectorised.

Why one function: every preset is just a set of its parameters, so presets, the CLI and notebooks
build requests the same way. Randomness comes from one numpy Generator, drawn in a fixed order, so a
seed reproduces a table exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from workloads.arrivals import ArrivalStream, make_arrivals, rescale_to_rate
from workloads.errors import param_error
from workloads.lengths import sample_lengths
from workloads.max_tokens import apply_policy
from workloads.schema import finalize
from workloads.sharing import assign_system_prompt, block_hashes, session_history
from workloads.spec import SpecLike, bind, format_spec, parse_spec, positive, positive_int
from workloads.transform import clip_to_model_len

DEFAULT_NUM_PROMPTS = 1000


def as_generator(seed: int | np.random.Generator | None) -> np.random.Generator:
    """The one Generator every draw comes from (an int seeds a fresh PCG64)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or (isinstance(seed, int | np.integer) and not isinstance(seed, bool) and seed >= 0):
        return np.random.default_rng(seed)
    raise param_error("seed", f"must be an integer >= 0 or a numpy Generator (got {seed!r})")


def generate(
    num_prompts: int | None = None,
    *,
    seed: int | np.random.Generator = 0,
    duration_s: float | None = None,
    request_rate: float | None = 1.0,
    arrival: SpecLike = "poisson",
    prompt_len: SpecLike = "lognormal(mean=161.31, cv=1.5, max=1024)",
    output_len: SpecLike = "lognormal(mean=337.99, cv=1.0, max=1024)",
    lengths: SpecLike | None = None,
    max_tokens_policy: SpecLike = "fixed(2048)",
    system_prompt_tokens: int = 0,
    system_prompt_fraction: float = 0.0,
    system_prompt_groups: int = 1,
    turns_per_session: float = 1.0,
    turn_gap_s: float = 30.0,
    block_hash_tokens: int | None = None,
    n: int | SpecLike | None = None,
    max_model_len: int | None = None,
    clip: bool = True,
) -> pd.DataFrame:
    """Build a request table; see docs/workloads.md for every parameter.

    Size: `num_prompts` requests, or every request arriving before `duration_s` (whichever ends first;
    1000 requests when neither is given). `request_rate` is the mean rate in requests/s (`inf`: all at
    0 s). `turns_per_session` > 1 makes multi-turn sessions (geometric number of turns with that mean,
    `turn_gap_s` mean gap between turns); `block_hash_tokens` adds Mooncake-style `block_hashes`.
    """
    rng = as_generator(seed)
    if num_prompts is not None:
        num_prompts = positive_int("num_prompts", num_prompts)
    if duration_s is not None:
        duration_s = positive("duration_s", duration_s)
    if request_rate is not None and request_rate != float("inf"):
        request_rate = positive("request_rate", request_rate)
    turns_per_session = positive("turns_per_session", turns_per_session)
    if turns_per_session < 1:
        raise param_error("turns_per_session", f"must be >= 1 (got {turns_per_session})")
    if max_model_len is not None:
        max_model_len = positive_int("max_model_len", max_model_len, minimum=2)

    draw = DrawSpec(
        request_rate,
        arrival,
        prompt_len,
        output_len,
        lengths,
        system_prompt_tokens,
        system_prompt_fraction,
        system_prompt_groups,
        turns_per_session,
        turn_gap_s,
    )
    arrival_name = parse_spec(arrival, "arrival")[0]
    target = _initial_count(num_prompts, duration_s, request_rate, arrival, arrival_name)
    while True:
        table, stream, described = _draw(target, rng, draw)
        enough = duration_s is None or arrival_name == "closed" or stream.arrival_s[-1] >= duration_s
        if enough or (num_prompts is not None and target >= num_prompts):
            break
        target *= 2  # the stream ended before duration_s: draw a longer one (still deterministic)
    keep = len(table["arrival_s"])
    if num_prompts is not None:
        keep = min(keep, num_prompts)
    if duration_s is not None and arrival_name != "closed":
        keep = min(keep, int(np.searchsorted(table["arrival_s"], duration_s, side="left")))
    if keep == 0:
        raise param_error("duration_s", f"no request arrives within {duration_s} s at this rate")
    table = {k: v[:keep] for k, v in table.items()}

    if n is not None:
        table["n"] = _parallel_samples(n, keep, rng)
    df = pd.DataFrame(table, copy=False)
    df.attrs.update(stream.attrs)
    if block_hash_tokens is not None:
        df["block_hashes"] = block_hashes(
            df["prompt_tokens"].to_numpy(),
            df["system_group"].to_numpy(),
            df["system_tokens"].to_numpy(),
            df["session_id"].to_numpy() if "session_id" in df else None,
            block_hash_tokens,
        )
        df.attrs["block_hash_tokens"] = int(block_hash_tokens)
    df = df.drop(columns=["system_group", "system_tokens"])
    df["max_tokens"], described["max_tokens_policy"] = apply_policy(
        max_tokens_policy, df["prompt_tokens"].to_numpy(), df["output_tokens"].to_numpy(), max_model_len
    )
    df.attrs["generator"] = described
    df = finalize(df)
    if max_model_len is not None:
        df = clip_to_model_len(df, max_model_len, clip=clip)
    return df


def _initial_count(
    num_prompts: int | None,
    duration_s: float | None,
    rate: float | None,
    arrival: SpecLike,
    arrival_name: str,
) -> int:
    if duration_s is None or arrival_name == "closed":
        if num_prompts is not None:
            return num_prompts
        if duration_s is not None:  # closed loop for a duration: each user sends at most duration/think + 1
            params = bind(*_closed_fn(arrival), "arrival", skip=2)
            think_s = float(params["think_s"])
            if think_s <= 0:
                raise param_error(
                    "num_prompts", "a closed loop with think_s = 0 and duration_s needs num_prompts"
                )
            return int(params["users"]) * (math.floor(duration_s / think_s) + 1)
        return DEFAULT_NUM_PROMPTS
    if rate is None:
        rate = parse_spec(arrival, "arrival")[2].get("rate") or 1.0
    if rate == float("inf"):
        raise param_error("duration_s", "cannot bound an infinite-rate stream by duration; give num_prompts")
    expected = int(duration_s * rate * 1.2) + 64
    return min(expected, num_prompts) if num_prompts is not None else expected


def _closed_fn(arrival: SpecLike) -> tuple[Any, tuple, dict]:
    from workloads.arrivals import ARRIVALS

    name, args, kwargs = parse_spec(arrival, "arrival")
    return ARRIVALS.get(name), args, kwargs


@dataclass(frozen=True)
class DrawSpec:
    """What one draw of requests needs besides its size and generator (`generate`'s arguments as given).

    Why a value: a draw may be repeated with a larger count (when a stream ends before duration_s),
    and the single-turn and session paths take the same ten settings; one frozen value keeps them
    from drifting apart.
    """

    request_rate: float | None
    arrival: SpecLike
    prompt_len: SpecLike
    output_len: SpecLike
    lengths: SpecLike | None
    system_tokens: int
    system_fraction: float
    system_groups: int
    turns_per_session: float
    turn_gap_s: float


def _draw(
    count: int, rng: np.random.Generator, spec: DrawSpec
) -> tuple[dict[str, np.ndarray], ArrivalStream, dict[str, str]]:
    """One draw of `count` requests, sorted by arrival (columns as NumPy arrays)."""
    if spec.turns_per_session != 1:
        return _draw_sessions(count, rng, spec)
    stream = make_arrivals(spec.arrival, count, rng, spec.request_rate)
    prompt, output, described = sample_lengths(spec.prompt_len, spec.output_len, spec.lengths, count, rng)
    group, preamble = assign_system_prompt(
        count, rng, spec.system_tokens, spec.system_fraction, spec.system_groups
    )
    described["arrival"] = stream.description
    table = {
        "arrival_s": stream.arrival_s,
        "prompt_tokens": prompt + preamble,
        "output_tokens": output,
        "system_group": group,
        "system_tokens": preamble,
    }
    if spec.system_tokens and spec.system_fraction:
        table["prefix_group"] = group
        table["prefix_tokens"] = preamble
    return table, stream, described


def _draw_sessions(
    count: int, rng: np.random.Generator, spec: DrawSpec
) -> tuple[dict[str, np.ndarray], ArrivalStream, dict[str, str]]:
    """Multi-turn sessions: session starts follow `arrival`; turns follow `turn_gap_s` (exponential) gaps.

    Rows are built session-major (so histories are cumulative sums), then merged by arrival time;
    cutting the merged stream keeps a prefix of every session's turns.
    """
    turn_gap_s = positive("turn_gap_s", spec.turn_gap_s, allow_zero=True)
    num_sessions = int(math.ceil(count / spec.turns_per_session)) + 1
    turns = rng.geometric(1.0 / spec.turns_per_session, size=num_sessions)
    while turns.sum() < count:  # rare: too few turns drawn; add sessions
        turns = np.concatenate([turns, rng.geometric(1.0 / spec.turns_per_session, size=num_sessions)])
    num_sessions = len(turns)
    session_rate = None if spec.request_rate is None else spec.request_rate / spec.turns_per_session
    starts = make_arrivals(spec.arrival, num_sessions, rng, session_rate)
    total = int(turns.sum())
    session_id = np.repeat(np.arange(num_sessions, dtype=np.int64), turns)
    first_row = np.cumsum(turns) - turns
    turn = np.arange(total, dtype=np.int64) - np.repeat(first_row, turns) + 1
    gaps_s = rng.exponential(turn_gap_s, size=total) if turn_gap_s > 0 else np.zeros(total)
    gaps_s[first_row] = 0.0
    offsets_s = np.cumsum(gaps_s)
    offsets_s -= np.repeat(offsets_s[first_row], turns)
    arrival_s = starts.arrival_s[session_id] + offsets_s

    new_text, output, described = sample_lengths(spec.prompt_len, spec.output_len, spec.lengths, total, rng)
    group_per_session, preamble_per_session = assign_system_prompt(
        num_sessions, rng, spec.system_tokens, spec.system_fraction, spec.system_groups
    )
    preamble = preamble_per_session[session_id]
    history = session_history(session_id, new_text, output, preamble)
    num_groups = spec.system_groups if spec.system_tokens and spec.system_fraction else 0

    order = np.argsort(arrival_s, kind="stable")
    table = {
        "arrival_s": arrival_s[order],
        "prompt_tokens": (history + new_text)[order],
        "output_tokens": output[order],
        "prefix_group": (num_groups + session_id)[order],
        "prefix_tokens": np.where(turn > 1, history, 0)[order],
        "session_id": session_id[order],
        "turn": turn[order],
        "system_group": group_per_session[session_id][order],
        "system_tokens": preamble[order],
    }
    if "closed_loop" not in starts.attrs and spec.request_rate is not None:
        table["arrival_s"] = rescale_to_rate(table["arrival_s"][:count], spec.request_rate)
        table = {k: (v if k == "arrival_s" else v[:count]) for k, v in table.items()}
    described["arrival"] = starts.description
    described["sessions"] = format_spec(
        "geometric_turns", {"mean": spec.turns_per_session, "turn_gap_s": turn_gap_s}
    )
    return table, starts if "closed_loop" in starts.attrs else ArrivalStream(table["arrival_s"]), described


def _parallel_samples(n: int | SpecLike, count: int, rng: np.random.Generator) -> np.ndarray:
    """The `n` column: a constant (parallel samples / beam width) or any length distribution spec."""
    if isinstance(n, int | np.integer) and not isinstance(n, bool):
        return np.full(count, positive_int("n", n), dtype=np.int64)
    from workloads.lengths import LENGTHS

    name, args, kwargs = parse_spec(n, "n")
    fn = LENGTHS.get(name)
    return fn(count, rng, **bind(fn, args, kwargs, "n", skip=2)).astype(np.int64)
