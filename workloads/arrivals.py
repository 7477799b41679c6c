"""Arrival processes: when each request reaches the server, in seconds from the first one.

Why a registry of vectorised functions: one million arrivals must cost milliseconds, and every
process must be nameable from the CLI (`--param arrival='gamma(cv=3)'`). Every process starts at 0 s
and takes its randomness from the one numpy Generator the caller threads through.

`closed(users, think_s)` is a spec, not a stream: the engine drives a closed loop (a user sends its
next request `think_s` after its previous one finished). Here it yields arrival_s = 0.0 for every
request and records `{"users": U, "think_s": T}` in `df.attrs["closed_loop"]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workloads.errors import param_error
from workloads.registry import Registry
from workloads.spec import SpecLike, bind, format_spec, parse_spec, positive, positive_int


@dataclass
class ArrivalStream:
    """Arrival times plus attributes the engine must see (e.g. the closed-loop spec)."""

    arrival_s: np.ndarray
    attrs: dict[str, Any] = field(default_factory=dict)
    description: str = ""


ARRIVALS: Registry[Any] = Registry("arrival")


def _need_rate(rate: float | None) -> float:
    if rate is None:
        raise param_error("request_rate", "this arrival process needs a rate (request_rate > 0)")
    if rate == float("inf"):
        return rate
    return positive("request_rate", rate)


def _from_gaps(gaps_s: np.ndarray) -> np.ndarray:
    """Cumulative arrival times from inter-arrival gaps; the first request arrives at 0 s."""
    arrival_s = np.empty(len(gaps_s), dtype=np.float64)
    if len(gaps_s):
        arrival_s[0] = 0.0
        np.cumsum(gaps_s[1:], out=arrival_s[1:])
    return arrival_s


@ARRIVALS.register("poisson")
def poisson(num_requests: int, rng: np.random.Generator, rate: float | None = None) -> np.ndarray:
    """Exponential gaps with mean 1/rate (memoryless traffic, what `vllm bench serve` sends by default)."""
    rate = _need_rate(rate)
    if rate == float("inf"):
        return np.zeros(num_requests)
    return _from_gaps(rng.exponential(1.0 / rate, size=num_requests))


@ARRIVALS.register("gamma")
def gamma(
    num_requests: int, rng: np.random.Generator, rate: float | None = None, cv: float = 2.0
) -> np.ndarray:
    """Gamma gaps with mean 1/rate and coefficient of variation `cv` (cv > 1 is burstier than Poisson)."""
    rate = _need_rate(rate)
    cv = positive("cv", cv)
    if rate == float("inf"):
        return np.zeros(num_requests)
    shape = 1.0 / (cv * cv)
    return _from_gaps(rng.gamma(shape, 1.0 / (rate * shape), size=num_requests))


@ARRIVALS.register("constant")
def constant(num_requests: int, rng: np.random.Generator, rate: float | None = None) -> np.ndarray:
    """Evenly spaced arrivals, 1/rate apart (no randomness: a load-test baseline)."""
    rate = _need_rate(rate)
    if rate == float("inf"):
        return np.zeros(num_requests)
    return np.arange(num_requests, dtype=np.float64) / rate


@ARRIVALS.register("onoff")
def onoff(
    num_requests: int,
    rng: np.random.Generator,
    rate: float | None = None,
    on_s: float = 10.0,
    off_s: float = 10.0,
) -> np.ndarray:
    """Poisson bursts during `on_s`-long busy periods separated by `off_s` of silence.

    `rate` is the long-run mean rate; inside a burst requests come at rate * (on_s + off_s) / on_s.
    Built by drawing a Poisson stream in "busy time" and inserting an idle gap after every on_s of it.
    """
    rate = _need_rate(rate)
    on_s = positive("on_s", on_s)
    off_s = positive("off_s", off_s, allow_zero=True)
    if rate == float("inf"):
        return np.zeros(num_requests)
    busy_rate = rate * (on_s + off_s) / on_s
    busy_time_s = _from_gaps(rng.exponential(1.0 / busy_rate, size=num_requests))
    return busy_time_s + np.floor(busy_time_s / on_s) * off_s


@ARRIVALS.register("closed")
def closed(num_requests: int, rng: np.random.Generator, users: int = 8, think_s: float = 1.0) -> np.ndarray:
    """Closed loop: all arrival_s are 0.0; the engine releases requests as users finish and think."""
    positive_int("users", users)
    positive("think_s", think_s, allow_zero=True)
    return np.zeros(num_requests, dtype=np.float64)


def arrival_sets_rate(spec: SpecLike) -> bool:
    """Whether an arrival spec decides the rate itself: it names a `rate`, or it is a closed loop.

    Why: a preset's documented rate applies only when the caller's arrival leaves the rate open
    (`gamma(cv=3)` takes the preset's rate; `poisson(rate=3)` and `closed(users=8)` do not).
    """
    name, args, kwargs = parse_spec(spec, "arrival")
    params = bind(ARRIVALS.get(name), args, kwargs, "arrival", skip=2)
    return name == "closed" or params.get("rate") is not None


def rescale_to_rate(arrival_s: np.ndarray, request_rate: float) -> np.ndarray:
    """Stretch or squeeze arrivals so their mean rate ((N-1) / span) equals `request_rate`.

    Keeps the shape of the stream (burstiness, order); `inf` sends everything at 0 s, as in vllm bench.
    A stream with zero span (all at one instant) becomes evenly spaced at the target rate.
    """
    request_rate = positive("request_rate", request_rate)
    if request_rate == float("inf"):
        return np.zeros_like(arrival_s, dtype=np.float64)
    if len(arrival_s) < 2:
        return arrival_s - (arrival_s[0] if len(arrival_s) else 0.0)
    start_s = float(arrival_s[0])
    span_s = float(arrival_s[-1]) - start_s
    if span_s <= 0:
        return np.arange(len(arrival_s), dtype=np.float64) / request_rate
    target_span_s = (len(arrival_s) - 1) / request_rate
    return (arrival_s - start_s) * (target_span_s / span_s)


def make_arrivals(
    spec: SpecLike, num_requests: int, rng: np.random.Generator, request_rate: float | None
) -> ArrivalStream:
    """Draw `num_requests` arrivals from `spec`; `request_rate` fills a missing rate, or rescales to it."""
    name, args, kwargs = parse_spec(spec, "arrival")
    fn = ARRIVALS.get(name)
    params = bind(fn, args, kwargs, "arrival", skip=2)
    if name == "closed":
        arrival_s = fn(num_requests, rng, **params)
        users = positive_int("users", params["users"])
        return ArrivalStream(
            arrival_s,
            {"closed_loop": {"users": users, "think_s": float(params["think_s"])}},
            format_spec(name, params),
        )
    own_rate = params.get("rate")
    if own_rate is None:
        params["rate"] = request_rate
    arrival_s = fn(num_requests, rng, **params)
    if own_rate is not None and request_rate is not None and request_rate != own_rate:
        arrival_s = rescale_to_rate(arrival_s, request_rate)
        params["rate"] = request_rate
    return ArrivalStream(arrival_s, {}, format_spec(name, params))
