"""`load()`: the one entry point that turns a preset name, a trace file or a DataFrame into a
validated request table.

Why one function: the engine, the CLI and notebooks must apply `num_prompts`, `request_rate`,
`time_scale`, `max_model_len` and the max_tokens policy identically, whatever the source.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from workloads import clock
from workloads.arrivals import arrival_sets_rate, make_arrivals
from workloads.errors import WorkloadError, param_error
from workloads.generate import as_generator, generate
from workloads.max_tokens import DEFAULT_CLIENT_MAX_TOKENS, apply_policy
from workloads.presets import PRESETS
from workloads.readers import read_trace
from workloads.schema import finalize, validate
from workloads.spec import positive, positive_int
from workloads.transform import clip_to_model_len, retime

GENERATE_PARAMS = tuple(
    p
    for p in inspect.signature(generate).parameters
    if p not in {"num_prompts", "seed", "duration_s", "max_model_len", "clip"}
)
TRACE_PARAMS = ("max_tokens_policy", "arrival")
DEFAULT_MAX_TOKENS_POLICY = f"fixed({DEFAULT_CLIENT_MAX_TOKENS})"


def load(
    source: str | os.PathLike[str] | pd.DataFrame,
    *,
    seed: int | np.random.Generator = 0,
    num_prompts: int | None = None,
    duration_s: float | None = None,
    request_rate: float | None = None,
    time_scale: float = 1.0,
    max_model_len: int | None = None,
    fmt: str | None = None,
    on_bad_row: str = "error",
    clip: bool | None = None,
    **params: Any,
) -> pd.DataFrame:
    """A validated request table from a preset name, a trace file, or a DataFrame.

    - preset (`sharegpt`, `alpaca`, `azure-conv`, `chat-system-prompt`, `long-context`): `params`
      override the preset's `generate()` parameters, e.g. `max_tokens_policy="exact"`.
    - trace file: format detected from content (`fmt` overrides); `params` may set `max_tokens_policy`
      (applied when given, or when the file has no max_tokens column) and `arrival` (for length-only files).
    - `time_scale` multiplies arrival times; `request_rate` rescales them to a mean rate instead.
    - `max_model_len` with `clip` (default: True for presets, False for traces): see
      `workloads.transform.clip_to_model_len` -- clipping is counted in attrs["clipped_requests"], and
      without it over-long prompts are counted in attrs["over_length_prompts"] and left for the engine
      to reject.
    """
    if max_model_len is not None:
        max_model_len = positive_int("max_model_len", max_model_len, minimum=2)
    time_scale = positive("time_scale", time_scale)
    opts = LoadOptions(seed, num_prompts, duration_s, request_rate, time_scale, max_model_len)
    if isinstance(source, pd.DataFrame):
        if params:
            raise param_error(next(iter(params)), "not a parameter of a DataFrame source (it is used as is)")
        df = _from_frame(source, opts)
        label = df.attrs.get("source", "<DataFrame>")
        clip = False if clip is None else clip
    elif isinstance(source, str) and source in PRESETS:
        if fmt is not None:
            raise param_error("format", f"is for trace files; {source!r} is a preset")
        df = _from_preset(source, opts, clip, params)
        label = source
        clip = None  # generate() already clipped
    elif isinstance(source, str | os.PathLike) and (os.path.exists(source) or _looks_like_path(str(source))):
        df = _from_file(source, opts, fmt, on_bad_row, params)
        label = str(source)
        clip = False if clip is None else clip
    else:
        known = ", ".join(PRESETS.names())
        raise param_error("source", f"{source!r} is neither a preset ({known}) nor an existing file")
    if clip is not None and max_model_len is not None:
        df = clip_to_model_len(df, max_model_len, clip=clip)
    df.attrs["source"] = label
    for key in ("clipped_requests", "skipped_rows"):
        df.attrs.setdefault(key, 0)
    return validate(df)


def _looks_like_path(source: str) -> bool:
    return os.sep in source or "." in os.path.basename(source)


@dataclass(frozen=True)
class LoadOptions:
    """`load()`'s source-independent options, checked once and handed to each source's reader as one value.

    Why: every source (DataFrame, preset, trace file) applies the same size, timing and length
    options; passing them as one value keeps the three paths' signatures short and identical.
    """

    seed: int | np.random.Generator
    num_prompts: int | None
    duration_s: float | None
    request_rate: float | None
    time_scale: float
    max_model_len: int | None


def _from_frame(frame: pd.DataFrame, opts: LoadOptions) -> pd.DataFrame:
    validate(frame)
    df = retime(
        frame,
        num_prompts=opts.num_prompts,
        duration_s=opts.duration_s,
        time_scale=opts.time_scale,
        request_rate=opts.request_rate,
    )
    df = finalize(df)
    df.attrs["clock"] = _replay_clock(df, frame["arrival_s"].to_numpy(), opts, opts.request_rate)
    return df


def _replay_clock(
    df: pd.DataFrame, own_arrival_s: np.ndarray, opts: LoadOptions, request_rate: float | None
) -> dict[str, Any]:
    """The clock record of rows kept from a table with its own timestamps (`own_arrival_s`, all rows).

    `retime` always keeps a prefix of the rows, so the kept rows' own mean rate is that of the first
    len(df) timestamps.
    """
    if "closed_loop" in df.attrs:
        return clock.closed_clock(df, f"replaying {len(df):,} rows")
    return clock.trace_clock(
        df,
        total_rows=len(own_arrival_s),
        own_rate_req_s=clock.mean_rate_req_s(own_arrival_s[: len(df)]),
        num_prompts=opts.num_prompts,
        duration_s=opts.duration_s,
        request_rate=request_rate,
        time_scale=opts.time_scale,
    )


def _from_preset(name: str, opts: LoadOptions, clip: bool | None, params: dict[str, Any]) -> pd.DataFrame:
    unknown = [k for k in params if k not in GENERATE_PARAMS]
    if unknown:
        raise param_error(
            unknown[0], f"not a parameter of preset {name!r} (parameters: {', '.join(GENERATE_PARAMS)})"
        )
    documented_rate = PRESETS.get(name).params.get("request_rate")
    merged = {**PRESETS.get(name).params, **params}
    kind = clock.GIVEN_RATE if "request_rate" in params else clock.PRESET_RATE
    if "arrival" in params and "request_rate" not in params and arrival_sets_rate(params["arrival"]):
        merged["request_rate"] = None  # the caller's own arrival rate beats the preset's default rate
        kind = clock.ARRIVAL_RATE
    if opts.request_rate is not None:
        if opts.time_scale != 1.0:
            raise param_error("time_scale", "give either time_scale or request_rate, not both")
        merged["request_rate"] = opts.request_rate
        kind = clock.GIVEN_RATE
    # time_scale stretches the generated clock: draw up to duration_s / time_scale, then scale.
    df = generate(
        opts.num_prompts,
        seed=opts.seed,
        duration_s=None if opts.duration_s is None else opts.duration_s / opts.time_scale,
        max_model_len=opts.max_model_len,
        clip=True if clip is None else clip,
        **merged,
    )
    if opts.time_scale != 1.0:
        attrs = dict(df.attrs)
        df = df.assign(arrival_s=df["arrival_s"].to_numpy() * opts.time_scale)
        df.attrs.update(attrs)
    df.attrs["clock"] = clock.preset_clock(
        df,
        name=name,
        kind=kind,
        arrival=str(df.attrs.get("generator", {}).get("arrival", merged.get("arrival", "poisson"))),
        documented_rate_req_s=documented_rate,
        time_scale=opts.time_scale,
    )
    return df


def _from_file(
    path: str | os.PathLike[str], opts: LoadOptions, fmt: str | None, on_bad_row: str, params: dict[str, Any]
) -> pd.DataFrame:
    unknown = [k for k in params if k not in TRACE_PARAMS]
    if unknown:
        raise param_error(
            unknown[0], f"not a parameter of a trace file (parameters: {', '.join(TRACE_PARAMS)})"
        )
    trace = read_trace(path, fmt=fmt, on_bad_row=on_bad_row)
    df = trace.table
    df.attrs.update(trace.attrs)
    num_prompts, request_rate = opts.num_prompts, opts.request_rate
    total_rows = len(df)
    own_arrival_s = df["arrival_s"].to_numpy() if "arrival_s" in df.columns else None
    if own_arrival_s is None:  # length-only file: draw arrivals
        if num_prompts is not None:
            df = df.iloc[: positive_int("num_prompts", num_prompts)].reset_index(drop=True)
            df.attrs.update(trace.attrs)
            num_prompts = None
        rng = as_generator(opts.seed)
        arrival = params.get("arrival", "poisson")
        if request_rate is None and not arrival_sets_rate(arrival):
            why = f"{trace.file} has no timestamps: give a request_rate or an arrival with a rate"
            raise param_error("request_rate", why)
        stream = make_arrivals(arrival, len(df), rng, request_rate)
        df = df.assign(arrival_s=stream.arrival_s)
        df.attrs.update(stream.attrs)
        request_rate = None
    elif "arrival" in params:
        raise param_error(
            "arrival", f"{trace.file} has its own timestamps; 'arrival' is for length-only files"
        )
    df = retime(
        df,
        num_prompts=num_prompts,
        duration_s=opts.duration_s,
        time_scale=opts.time_scale,
        request_rate=request_rate,
    )
    policy = params.get("max_tokens_policy")
    if policy is not None or "max_tokens" not in df.columns:
        df["max_tokens"], _ = apply_policy(
            policy or DEFAULT_MAX_TOKENS_POLICY,
            df["prompt_tokens"].to_numpy(dtype=np.int64),
            df["output_tokens"].to_numpy(dtype=np.int64),
            opts.max_model_len,
        )
    df = finalize(df)
    if own_arrival_s is None:
        df.attrs["clock"] = clock.drawn_clock(df, total_rows=total_rows, arrival=stream.description)
    else:
        df.attrs["clock"] = _replay_clock(df, own_arrival_s, opts, request_rate)
    return df


__all__ = ["load", "WorkloadError"]
