"""Length distributions for prompts and outputs, in tokens (integers >= 1).

Why these: `fixed` and `uniform` for worked examples, `lognormal(mean, cv)` for the long-tailed
lengths that chat traces show (the presets use it, fitted to published means and tails), `zipf` for
heavier tails, and `empirical` to resample observed (prompt, output) *pairs* jointly, which keeps
their correlation. All are vectorised and draw from the caller's numpy Generator.

`lognormal(mean, cv, max=None, min=1)`: `mean` is the mean of the distribution *after* truncation to
[min, max] (the location is solved for it), `cv` the shape of the untruncated parent. Truncation
redraws out-of-range samples instead of clipping them, so no spike appears at `max`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from workloads.errors import param_error
from workloads.registry import Registry
from workloads.spec import SpecLike, bind, format_spec, parse_spec, positive, positive_int

LENGTHS: Registry[Any] = Registry("length distribution")
JOINT = {"empirical"}  # distributions that yield (prompt, output) pairs


def _phi(x: float) -> float:
    """Standard normal CDF, accurate in the lower tail (erfc does not cancel)."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _mass(a: float, b: float) -> float:
    """P(a <= Z <= b) for a standard normal Z, without cancellation in either tail."""
    if a > 0:
        return _phi(-a) - _phi(-b)
    return _phi(b) - _phi(a)


def _truncated_lognormal_mean(mu: float, sigma: float, low: float, high: float) -> float:
    """E[X | low <= X <= high] for ln X ~ N(mu, sigma^2) (closed form)."""
    log_low = math.log(low) if low > 0 else -math.inf
    log_high = math.log(high) if math.isfinite(high) else math.inf
    mass = _mass((log_low - mu) / sigma, (log_high - mu) / sigma)
    if mass <= 1e-300:  # all mass outside: the mean sits at the nearer bound
        return low if mu < log_low else high
    shifted = _mass((log_low - mu - sigma * sigma) / sigma, (log_high - mu - sigma * sigma) / sigma)
    return math.exp(mu + sigma * sigma / 2.0) * shifted / mass


def solve_lognormal_mu(mean: float, sigma: float, low: float, high: float) -> float:
    """The location mu whose [low, high]-truncated lognormal has the given mean (bisection)."""
    if not low < mean < high:
        raise param_error(
            "mean", f"must lie strictly between min and max ({low:g} < mean < {high:g}; got {mean:g})"
        )
    lo_mu = math.log(low) - 10 * sigma
    hi_mu = (math.log(high) if math.isfinite(high) else math.log(mean)) + 10 * sigma
    for _ in range(200):
        mid = 0.5 * (lo_mu + hi_mu)
        if _truncated_lognormal_mean(mid, sigma, low, high) < mean:
            lo_mu = mid
        else:
            hi_mu = mid
    return 0.5 * (lo_mu + hi_mu)


@LENGTHS.register("fixed")
def fixed(num: int, rng: np.random.Generator, tokens: int = 128) -> np.ndarray:
    """Every request has exactly `tokens` tokens."""
    return np.full(num, positive_int("tokens", tokens), dtype=np.int64)


@LENGTHS.register("uniform")
def uniform(num: int, rng: np.random.Generator, low: int = 1, high: int = 1024) -> np.ndarray:
    """Integers drawn uniformly from [low, high], both ends included."""
    low = positive_int("low", low)
    high = positive_int("high", high)
    if high < low:
        raise param_error("high", f"must be >= low ({low}; got {high})")
    return rng.integers(low, high, size=num, endpoint=True, dtype=np.int64)


@LENGTHS.register("lognormal")
def lognormal(
    num: int,
    rng: np.random.Generator,
    mean: float = 256.0,
    cv: float = 1.0,
    max: int | None = None,
    min: int = 1,
) -> np.ndarray:
    """Long-tailed lengths with the given mean and coefficient of variation, truncated to [min, max]."""
    mean = positive("mean", mean)
    cv = positive("cv", cv)
    min_tokens = positive_int("min", min)
    max_tokens = math.inf if max is None else positive_int("max", max)
    if max_tokens < min_tokens:
        raise param_error("max", f"must be >= min ({min_tokens}; got {max})")
    sigma = math.sqrt(math.log1p(cv * cv))
    # Continuous bounds half a token wide so that rounding lands on [min, max] without bias.
    low, high = min_tokens - 0.5, max_tokens + 0.5
    mu = solve_lognormal_mu(mean, sigma, low, high)
    if _mass((math.log(low) - mu) / sigma, (math.log(high) - mu) / sigma) < 1e-4:
        raise param_error(
            "max", f"lognormal(mean={mean:g}, cv={cv:g}) puts almost no mass in [{min_tokens}, {max}]"
        )
    values = np.exp(rng.normal(mu, sigma, size=num))
    for _ in range(10_000):  # redraw out-of-range samples; the expected count shrinks geometrically
        bad = np.flatnonzero((values < low) | (values >= high))
        if bad.size == 0:
            break
        values[bad] = np.exp(rng.normal(mu, sigma, size=bad.size))
    return np.clip(np.rint(values), min_tokens, max_tokens).astype(np.int64)


@LENGTHS.register("zipf")
def zipf(num: int, rng: np.random.Generator, a: float = 1.2, max: int = 4096, min: int = 1) -> np.ndarray:
    """P(k) proportional to k**-a on the integers [min, max] (exact inverse-CDF sampling)."""
    a = positive("a", a)
    min_tokens = positive_int("min", min)
    max_tokens = positive_int("max", max)
    if max_tokens < min_tokens:
        raise param_error("max", f"must be >= min ({min_tokens}; got {max_tokens})")
    support = np.arange(min_tokens, max_tokens + 1, dtype=np.float64)
    cdf = np.cumsum(support**-a)
    cdf /= cdf[-1]
    return (
        (np.searchsorted(cdf, rng.random(num), side="right") + min_tokens)
        .astype(np.int64)
        .clip(max=max_tokens)
    )


@LENGTHS.register("percentiles")
def percentiles(num: int, rng: np.random.Generator, points: Any = None) -> np.ndarray:
    """Inverse-CDF sampling through stated percentiles: `points` = ((0, min), (p, tokens), ..., (100, max)).

    Why: a measured length distribution that no lognormal fits (vllm bench's ShareGPT prompts: median
    77, mean 205, p99 770) is given by its percentiles -- published facts, not the data set itself.
    Between two points the length is linear in the percentile, rounded to a whole token.
    """
    if points is None:
        raise param_error("points", "percentiles needs ((0, min), ..., (100, max)) pairs")
    try:
        table = np.array([(float(p), float(t)) for p, t in points], dtype=np.float64)
    except (TypeError, ValueError):
        raise param_error("points", f"must be (percent, tokens) pairs (got {points!r})") from None
    percent, tokens = table[:, 0], table[:, 1]
    if len(table) < 2 or percent[0] != 0 or percent[-1] != 100 or np.any(np.diff(percent) <= 0):
        raise param_error("points", "percents must rise strictly from 0 to 100")
    if np.any(np.diff(tokens) < 0) or tokens[0] < 1 or not np.all(np.isfinite(tokens)):
        raise param_error("points", "tokens must be finite, >= 1 and non-decreasing")
    return np.rint(np.interp(rng.random(num) * 100.0, percent, tokens)).astype(np.int64)


@LENGTHS.register("empirical")
def empirical(num: int, rng: np.random.Generator, source: Any = None) -> np.ndarray:
    """Resample observed (prompt, output) pairs with replacement; returns a (2, num) array.

    `source` is a trace file (any format `workloads.read_trace` reads, including length-only CSVs such
    as ShareGPT statistics) or an array-like of shape (N, 2).
    """
    pairs = _empirical_pairs(source)
    rows = rng.integers(0, len(pairs), size=num)
    return pairs[rows].T.copy()


def _empirical_pairs(source: Any) -> np.ndarray:
    if source is None:
        raise param_error(
            "source", "empirical needs a file path or an (N, 2) array of (prompt, output) lengths"
        )
    if isinstance(source, str):
        from workloads.readers import read_trace  # readers depend on us only through load(); import late

        table = read_trace(source).table
        pairs = np.column_stack([table["prompt_tokens"].to_numpy(), table["output_tokens"].to_numpy()])
    else:
        pairs = np.asarray(source)
        if pairs.ndim != 2 or pairs.shape[1] != 2 or len(pairs) == 0:
            raise param_error("source", f"must have shape (N, 2) with N >= 1 (got {pairs.shape})")
        if not np.all(np.isfinite(pairs.astype(np.float64))) or np.any(pairs < 1):
            raise param_error("source", "lengths must be finite and >= 1")
    return pairs.astype(np.int64)


def sample_lengths(
    prompt_spec: SpecLike,
    output_spec: SpecLike,
    joint_spec: SpecLike | None,
    num: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """Draw prompt and output lengths: jointly from `joint_spec` when given, else independently."""
    if joint_spec is not None:
        name, args, kwargs = parse_spec(joint_spec, "lengths")
        if name not in JOINT:
            raise param_error(
                "lengths", f"{name!r} is not a joint distribution (joint: {', '.join(sorted(JOINT))})"
            )
        fn = LENGTHS.get(name)
        params = bind(fn, args, kwargs, "lengths", skip=2)
        pair = fn(num, rng, **params)
        return pair[0], pair[1], {"lengths": format_spec(name, params)}
    out: list[np.ndarray] = []
    described: dict[str, str] = {}
    for field, spec in (("prompt_len", prompt_spec), ("output_len", output_spec)):
        name, args, kwargs = parse_spec(spec, field)
        fn = LENGTHS.get(name)
        params = bind(fn, args, kwargs, field, skip=2)
        values = fn(num, rng, **params)
        if name in JOINT:  # one column of the pairs: 0 = prompt, 1 = output
            values = values[0 if field == "prompt_len" else 1]
        out.append(values)
        described[field] = format_spec(name, params)
    return out[0], out[1], described
