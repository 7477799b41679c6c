"""Server-level terms that lie between the operator model and what a client measures.

Why they exist: the operator fits (sim/cost/fit.py) are within 10 % on measured GEMM files, yet a
whole server replayed against measured `vllm bench serve` runs was off by 16-44 % (issue 21). What
is missing is not one operator but the server around them, and it is modelled with three
interpretable coefficients, each with bounds and a physical meaning:

- `frontend_s`: time a request spends outside the engine as seen by the client: HTTP, the API
  server's tokenisation and request set-up before the engine sees it, and streaming the first chunk
  back. In vLLM v1 this is the API-server process of the API-server/engine-core split
  (vllm/v1/engine/async_llm.py `AsyncLLM.generate` -> `EngineCoreClient`, output processing in
  vllm/v1/engine/output_processor.py); in v0.5 `AsyncLLMEngine` in the same process. It adds to TTFT
  and end-to-end latency; in a closed loop (max_concurrency) it is also the gap between a response
  and the next request reaching the engine. Bounds [0, 0.5] s.
- `flops_efficiency_scale`: the FLOP rate achieved inside a served step over the operator fit's
  (prefill GEMMs and attention): sampling, CUDA-graph padding, kernels at serving shapes and the
  clocks a loaded server sustains. It multiplies the effective FLOP/s. Bounds [0.25, 1.25].
- `overhead_scale`: the per-step CPU work actually exposed (scheduler, input preparation,
  detokenisation of every sequence's new token, output processing) over the engine preset's
  measured overhead (sim/cost/overhead.py). It multiplies both the per-step and per-sequence terms.
  Bounds [0, 4].

`ServerTerms.neutral()` changes nothing (the paper default and every run without a bench profile
keep their results). `kvsim bench replay` uses `shipped_terms(engine, gpu)` unless given
`--calibration PROFILE.json`; `kvsim bench fit` writes such a profile (`write_profile`), and
`--calibration` applies it to run, compare, sweep and capacity too (docs/cost_model.md "Whole server").
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from sim.errors import ScenarioError

PROFILE_KIND = "kvsim-bench-profile"
PROFILE_SCHEMA = 1

# (low, high) of each coefficient: the fit may not leave them, a profile outside them is refused.
BOUNDS: dict[str, tuple[float, float]] = {
    "frontend_s": (0.0, 0.5),
    "flops_efficiency_scale": (0.25, 1.25),
    "overhead_scale": (0.0, 4.0),
}


@dataclass(frozen=True, slots=True)
class ServerTerms:
    """The server-level coefficients (see the module docstring); `source` says where they come from."""

    frontend_s: float = 0.0
    flops_efficiency_scale: float = 1.0
    overhead_scale: float = 1.0
    source: str = "neutral"

    @classmethod
    def neutral(cls) -> ServerTerms:
        """Terms that change nothing: the operator model alone."""
        return cls()

    @property
    def is_neutral(self) -> bool:
        return self.frontend_s == 0.0 and self.flops_efficiency_scale == 1.0 and self.overhead_scale == 1.0

    def values(self) -> dict[str, float]:
        """The fitted numbers alone, keyed as in BOUNDS."""
        return {name: float(getattr(self, name)) for name in BOUNDS}

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def check_terms(values: dict[str, Any], where: str) -> dict[str, float]:
    """Each coefficient present, a finite number, inside its bounds; ScenarioError naming it otherwise."""
    checked: dict[str, float] = {}
    for name, (low, high) in BOUNDS.items():
        value = values.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ScenarioError(
                f"{where}: field '{name}': expected a number in [{low}, {high}] (got {value!r})"
            )
        if not low <= value <= high:
            raise ScenarioError(f"{where}: field '{name}': {value} is outside its bounds [{low}, {high}]")
        checked[name] = float(value)
    return checked


# Shipped defaults, per engine preset and GPU preset: `kvsim bench fit` on ../shared/bench/vllm_bench
# (Lambda's vLLM 0.5.4 runs, engine vllm-v0) per GPU, reproduced by `benchmarks/bench_fidelity.py --fit`.
# Their leave-one-file-out error is in docs/cost_model.md "Whole server". A pair not listed uses the
# engine's row under "*", else neutral terms.
SHIPPED_TERMS: dict[tuple[str, str], dict[str, float]] = {}


def shipped_terms(engine: str, gpu: str) -> ServerTerms:
    """The shipped server terms for an engine preset on a GPU preset (neutral when none are shipped)."""
    for key in ((engine, gpu), (engine, "*")):
        if key in SHIPPED_TERMS:
            return ServerTerms(**SHIPPED_TERMS[key], source=f"shipped {key[0]} {key[1]} (sim/cost/server.py)")
    return ServerTerms.neutral()


# ------------------------------------------------------------------------------------------------------------
# Profiles written by `kvsim bench fit`


def is_bench_profile(path: str | None) -> bool:
    """Whether a `--calibration` file is a bench profile (a JSON whose "kind" is PROFILE_KIND)."""
    if path is None or not str(path).lower().endswith(".json"):
        return False
    try:
        stamp = Path(path).stat().st_mtime_ns
    except OSError:
        return False
    return _profile_kind(str(Path(path).resolve()), stamp) == PROFILE_KIND


@lru_cache(maxsize=32)
def _profile_kind(path: str, stamp_ns: int) -> str | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data.get("kind") if isinstance(data, dict) else None


def load_profile_terms(path: str | Path) -> ServerTerms:
    """The terms a bench profile holds; ScenarioError (one line naming the file and field) if bad."""
    where = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ScenarioError(f"field 'calibration': {where}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise ScenarioError(f"field 'calibration': {where}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ScenarioError(f"field 'calibration': {where}: field 'kind': expected {PROFILE_KIND!r}")
    if data.get("schema") != PROFILE_SCHEMA:
        raise ScenarioError(f"field 'calibration': {where}: field 'schema': expected {PROFILE_SCHEMA}")
    terms = data.get("terms")
    if not isinstance(terms, dict):
        raise ScenarioError(f"field 'calibration': {where}: field 'terms': expected an object")
    values = check_terms(terms, f"field 'calibration': {where}")
    return ServerTerms(**values, source=f"bench profile {Path(path).name}")


def scenario_terms(scenario: Any) -> ServerTerms:
    """The server terms a scenario asks for: its `--calibration` bench profile, else neutral."""
    path = getattr(scenario, "calibration", None)
    if path is not None and is_bench_profile(path):
        return load_profile_terms(path)
    return ServerTerms.neutral()


def profile_document(
    terms: ServerTerms, fitted_on: list[dict[str, Any]], report: dict[str, Any]
) -> dict[str, Any]:
    """The JSON a bench fit writes: kind, schema, terms, bounds, the files it was fitted on and errors."""
    return {
        "kind": PROFILE_KIND,
        "schema": PROFILE_SCHEMA,
        "terms": terms.values(),
        "bounds": {name: list(bounds) for name, bounds in BOUNDS.items()},
        "fitted_on": fitted_on,
        "errors": report,
    }


__all__ = [
    "BOUNDS",
    "PROFILE_KIND",
    "ServerTerms",
    "add_frontend_latency",
    "check_terms",
    "is_bench_profile",
    "load_profile_terms",
    "profile_document",
    "scenario_terms",
    "shipped_terms",
]


def add_frontend_latency(requests: Any, frontend_s: float) -> None:
    """Add the front end's per-request time to the client-seen TTFT and E2E columns, in place.

    Why after the engine: the front end runs beside the engine (another process in vLLM v1), so it
    delays what the client sees without taking engine time; TPOT and ITL (gaps after the first
    token) are unchanged. Server-side timestamps (`first_token_s`, `finish_s`) stay the engine's.
    """
    if frontend_s == 0.0:
        return
    added_ms = frontend_s * 1e3
    for column in ("ttft_ms", "e2el_ms"):
        if column in requests.columns:
            requests[column] = requests[column] + added_ms
