"""Read a `vllm bench serve --save-result [--save-detailed]` JSON into a checked `BenchFile`.

Why its own module: the file is the user's measurement, the ground truth a replay is judged by, so
every field the replay uses is checked once here and a bad file is one line naming the file and the
field (exit 2), never a traceback half-way through a simulation. Field meanings follow vLLM's
`benchmarks/benchmark_serving.py` (`calculate_metrics`, `benchmark`) and `vllm bench serve`
(vllm/benchmarks/serve.py): lengths in tokens, `ttfts` and `itls` in seconds, aggregates in ms.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import KvsimError
from sim.files import MAX_PROFILE_BYTES, read_text_bounded

# Aggregates the replay compares, as vLLM names them (ms, or per second for throughputs).
AGGREGATE_FIELDS: tuple[str, ...] = (
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
)
# Older benchmark_serving.py (vLLM <= 0.6) names end-to-end latency `*_latency_ms`; today's `*_e2el_ms`.
_E2EL_OLD_NAMES = {
    "mean_e2el_ms": "mean_latency_ms",
    "median_e2el_ms": "median_latency_ms",
    "p99_e2el_ms": "p99_latency_ms",
}


class BenchFileError(KvsimError):
    """A bench result file that cannot be replayed: names the file and the field."""


@dataclass(frozen=True)
class BenchFile:
    """One measured run: its requests (send order), arrival process and measured aggregates."""

    path: Path
    sha256: str
    model_id: str
    num_prompts: int
    completed: int
    input_lens: np.ndarray  # tokens per request, send order
    output_lens: np.ndarray  # generated tokens per request (0: empty answer or failed)
    ttfts_s: np.ndarray | None  # per request, seconds; None when the file has none
    ok: np.ndarray  # per request: succeeded (errors "" or no errors list)
    request_rate: float  # req/s; inf: all sent at once
    burstiness: float  # gamma shape of inter-arrival times (1: Poisson)
    max_concurrency: int | None  # client-side cap on requests in flight (closed loop)
    duration_s: float
    measured: dict[str, float] = field(default_factory=dict)  # vLLM's aggregates, NaN when absent

    @property
    def name(self) -> str:
        """Short label: the parent folder and the file name (Lambda's files share names across GPUs)."""
        return f"{self.path.parent.name}/{self.path.name}"

    @property
    def failed_run(self) -> bool:
        """Most requests failed: the server died part-way; not a latency or throughput target."""
        return self.completed < 0.9 * self.num_prompts

    def failed_run_line(self) -> str:
        """Why a failed run is not replayed, in one line naming the file."""
        return (
            f"{self.path}: only {self.completed} of {self.num_prompts} requests completed (the server "
            "failed part-way): not a latency or throughput target"
        )


def _fail(path: Path, what: str) -> BenchFileError:
    return BenchFileError(f"{path}: {what}")


def _count(data: dict[str, Any], key: str, path: Path, *, default: int | None = None) -> int:
    """A whole, finite number of requests ("inf" or 2.5 is one line naming the field)."""
    value = _number(data, key, path, default=default)
    if not (math.isfinite(value) and value == int(value)):
        raise _fail(path, f"field '{key}': expected a whole number (got {data.get(key)!r})")
    return int(value)


def _number(data: dict[str, Any], key: str, path: Path, *, default: float | None = None) -> float:
    value = data.get(key, default)
    if value is None:
        raise _fail(path, f"field '{key}': missing")
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(path, f"field '{key}': expected a number (got {value!r})")
    return float(value)


def _int_list(data: dict[str, Any], key: str, path: Path, count: int) -> np.ndarray:
    values = data.get(key)
    if values is None:
        raise _fail(
            path, f"field '{key}': missing (replay needs per-request lengths: vllm bench serve --save-result)"
        )
    if not isinstance(values, list) or len(values) != count:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise _fail(path, f"field '{key}': expected a list of {count} (num_prompts) entries (got {got})")
    for row, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _fail(path, f"field '{key}' row {row}: expected a token count >= 0 (got {value!r})")
    return np.asarray(values, dtype=np.int64)


def _float_list(data: dict[str, Any], key: str, path: Path, count: int) -> np.ndarray | None:
    values = data.get(key)
    if values is None:
        return None
    if not isinstance(values, list) or len(values) != count:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise _fail(path, f"field '{key}': expected a list of {count} (num_prompts) entries (got {got})")
    for row, value in enumerate(values):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise _fail(path, f"field '{key}' row {row}: expected seconds >= 0 (got {value!r})")
    return np.asarray(values, dtype=np.float64)


def _errors_ok(data: dict[str, Any], path: Path, count: int) -> np.ndarray:
    errors = data.get("errors")
    if errors is None:
        return np.ones(count, dtype=bool)
    if not isinstance(errors, list) or len(errors) != count:
        raise _fail(path, f"field 'errors': expected a list of {count} (num_prompts) entries")
    return np.asarray([not error for error in errors], dtype=bool)


def read_bench_file(path: str | Path) -> BenchFile:
    """The checked contents of one result file; BenchFileError (one line) for anything unusable."""
    path = Path(path)
    try:
        path.stat()
    except OSError as exc:
        raise _fail(path, f"cannot read ({exc.strerror})") from None
    try:  # regular files only, bounded: /dev/zero or a FIFO must not hang (issue 23)
        raw = read_text_bounded(path, what="bench result file", limit_bytes=MAX_PROFILE_BYTES).encode()
    except KvsimError as exc:
        raise BenchFileError(str(exc)) from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _fail(path, f"not JSON ({exc})".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise _fail(path, "expected a JSON object (a vllm bench serve --save-result file)")
    listed = data.get("input_lens")
    num_prompts = _count(data, "num_prompts", path, default=len(listed) if isinstance(listed, list) else None)
    if num_prompts < 1:
        raise _fail(path, f"field 'num_prompts': expected >= 1 (got {num_prompts})")
    input_lens = _int_list(data, "input_lens", path, num_prompts)
    output_lens = _int_list(data, "output_lens", path, num_prompts)
    rate = _number(data, "request_rate", path, default=math.inf)
    if not rate > 0:
        raise _fail(path, f"field 'request_rate': expected > 0 or \"inf\" (got {rate})")
    burstiness = _number(data, "burstiness", path, default=1.0)
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise _fail(path, f"field 'burstiness': expected a finite number > 0 (got {burstiness})")
    concurrency = data.get("max_concurrency")
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise _fail(path, f"field 'max_concurrency': expected an integer >= 1 or null (got {concurrency!r})")
    measured = {}
    for key in AGGREGATE_FIELDS:
        source = key if key in data else _E2EL_OLD_NAMES.get(key, key)
        value = data.get(source)
        measured[key] = (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
        )
    ok = _errors_ok(data, path, num_prompts)
    return BenchFile(
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        model_id=str(data.get("model_id", "")),
        num_prompts=num_prompts,
        completed=_count(data, "completed", path, default=int(ok.sum())),
        input_lens=input_lens,
        output_lens=output_lens,
        ttfts_s=_float_list(data, "ttfts", path, num_prompts),
        ok=ok,
        request_rate=rate,
        burstiness=burstiness,
        max_concurrency=concurrency,
        duration_s=_number(data, "duration", path, default=math.nan),
        measured=measured,
    )
