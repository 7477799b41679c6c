"""Table-level transforms shared by presets and traces: trimming, time rescaling, max_model_len clipping.

Why separate: the same `--num-prompts`, `--time-scale`, `--request-rate` and `max_model_len` rules
must apply whether the requests came from a generator or a file, and clipping must be counted, never
silent.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workloads.arrivals import rescale_to_rate
from workloads.errors import param_error
from workloads.spec import positive, positive_int


def _take_rows(df: pd.DataFrame, rows: int) -> pd.DataFrame:
    out = df.iloc[:rows].reset_index(drop=True)
    out.attrs.update(df.attrs)
    return out


def retime(
    df: pd.DataFrame,
    *,
    num_prompts: int | None = None,
    duration_s: float | None = None,
    time_scale: float = 1.0,
    request_rate: float | None = None,
) -> pd.DataFrame:
    """Keep the first `num_prompts` rows, rescale time, then keep rows arriving before `duration_s`.

    `time_scale` multiplies every arrival time (2.0 = half as fast, 0.5 = twice as fast);
    `request_rate` instead rescales to a target mean rate. Giving both is ambiguous and an error.
    """
    time_scale = positive("time_scale", time_scale)
    if request_rate is not None and time_scale != 1.0:
        raise param_error("time_scale", "give either time_scale or request_rate, not both")
    if num_prompts is not None:
        df = _take_rows(df, positive_int("num_prompts", num_prompts))
    if df.attrs.get("closed_loop") is None:
        arrival_s = df["arrival_s"].to_numpy(dtype=np.float64)
        arrival_s = arrival_s - (arrival_s[0] if len(arrival_s) else 0.0)
        if request_rate is not None:
            arrival_s = rescale_to_rate(arrival_s, request_rate)
        elif time_scale != 1.0:
            arrival_s = arrival_s * time_scale
        df = df.assign(arrival_s=arrival_s)
        if duration_s is not None:
            duration_s = positive("duration_s", duration_s)
            keep = int(np.searchsorted(arrival_s, duration_s, side="left"))
            if keep == 0:
                raise param_error("duration_s", f"no request arrives within {duration_s} s")
            df = _take_rows(df, keep)
    return df


def clip_to_model_len(df: pd.DataFrame, max_model_len: int, *, clip: bool) -> pd.DataFrame:
    """Make every request fit `max_model_len`, counting what changed -- or only count, when clip=False.

    clip=True: a prompt longer than max_model_len - 1 is cut to max_model_len - 1 (room for one output
    token); then output_tokens and max_tokens are cut so prompt + output <= max_model_len. prefix_tokens
    and block_hashes are cut with the prompt. `attrs["clipped_requests"]` counts rows whose prompt or
    output changed, `attrs["clipped_max_tokens"]` rows whose max_tokens changed.
    clip=False: rows stay as they are; `attrs["over_length_prompts"]` counts prompts longer than
    max_model_len (the engine rejects those, as vLLM does) -- nothing is silently dropped.
    """
    max_model_len = positive_int("max_model_len", max_model_len, minimum=2)
    prompt = df["prompt_tokens"].to_numpy()
    if not clip:
        df.attrs["over_length_prompts"] = int(np.count_nonzero(prompt > max_model_len))
        return df
    output = df["output_tokens"].to_numpy()
    max_tokens = df["max_tokens"].to_numpy()
    new_prompt = np.minimum(prompt, max_model_len - 1)
    room = max_model_len - new_prompt
    new_output = np.minimum(output, room)
    new_max_tokens = np.minimum(max_tokens, room)
    changed = (new_prompt != prompt) | (new_output != output)
    updates: dict[str, np.ndarray] = {
        "prompt_tokens": new_prompt,
        "output_tokens": new_output,
        "max_tokens": new_max_tokens,
    }
    if "prefix_tokens" in df.columns:
        updates["prefix_tokens"] = np.minimum(df["prefix_tokens"].to_numpy(), new_prompt)
    attrs = dict(df.attrs)
    out = df.assign(**updates)
    if "block_hashes" in df.columns and attrs.get("block_hash_tokens") and changed.any():
        blocks = -(-new_prompt // int(attrs["block_hash_tokens"]))
        hashes = out["block_hashes"].to_numpy(dtype=object).copy()
        for i in np.flatnonzero(new_prompt != prompt):
            hashes[i] = list(hashes[i][: blocks[i]])
        out["block_hashes"] = hashes
    out.attrs.update(attrs)
    out.attrs["clipped_requests"] = int(attrs.get("clipped_requests", 0)) + int(np.count_nonzero(changed))
    out.attrs["clipped_max_tokens"] = int(np.count_nonzero(new_max_tokens != max_tokens))
    return out
