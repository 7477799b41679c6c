"""Server-level terms that lie between the operator model and what a client measures.

Why they exist: the operator fits (sim/cost/fit.py) are within 10 % on measured GEMM files, yet a
whole server replayed against measured `vllm bench serve` runs was off by 16-44 % (issue 21). What
is missing is not one operator but the server around them, and it is modelled with seven
interpretable coefficients, each with bounds and a physical meaning, plus three serving-stack
switches (`stack_settings`, `frontend_blocks_engine`):

- `frontend_s`: time a request spends outside the engine as seen by the client: HTTP, the API
  server's tokenisation and request set-up before the engine sees it, and streaming the first chunk
  back. In vLLM v1 this is the API-server process of the API-server/engine-core split
  (vllm/v1/engine/async_llm.py `AsyncLLM.generate` -> `EngineCoreClient`, output processing in
  vllm/v1/engine/output_processor.py); in v0.5 `AsyncLLMEngine` in the same process. It adds to TTFT
  and end-to-end latency; in a closed loop (max_concurrency) it is also the gap between a response
  and the next request reaching the engine. Bounds [0, 0.5] s.
- `frontend_service_s`: the part of the front end's work that is serial: one API-server event loop
  tokenises and sets up requests one after another (vllm/entrypoints/openai/serving_completion.py
  in v0.5; the API-server process of v1), so a burst reaches the engine at most one request per
  `frontend_service_s` (a FIFO single server in front of the engine; `frontend_queue_s`). Bounds
  [0, 0.05] s.
- `flops_efficiency_scale`: the FLOP rate achieved inside a served step over the operator fit's
  (prefill GEMMs and attention): sampling, CUDA-graph padding, kernels at serving shapes and the
  clocks a loaded server sustains. It multiplies the effective FLOP/s. Bounds [0.25, 1.25].
- `overhead_scale`: the per-step CPU work actually exposed (scheduler, input preparation,
  detokenisation of every sequence's new token, output processing) over the engine preset's
  measured overhead (sim/cost/overhead.py). It multiplies both the per-step and per-sequence terms.
  Bounds [0, 4].
- `stream_chunk_s`: serial CPU time per streamed chunk when the front end shares the engine's event
  loop (v0) and streams every token as its own chunk: each step then pays it once per decoding
  sequence, on top of the engine's overhead. vLLM 0.5.4's API server turns each of a request's
  outputs into one server-sent event (vllm/entrypoints/openai/serving_completion.py
  `completion_stream_generator`: a JSON `data:` chunk per output, written by the same event loop that
  runs `AsyncLLMEngine.run_engine_loop`). Where the stream is coalesced (many tokens per chunk) the
  cost is spread and the term is 0. Bounds [0, 1 ms]; 0 in every shipped entry, optional in a
  profile (absent: 0).
- `frontend_turn_share`: the share of a request's intake (`frontend_service_s`) done in its handler's
  last turn on vLLM v1's API-server event loop. Each request is its own asyncio task that suspends
  several times before the engine core sees it (chat template and tokenisation,
  vllm/entrypoints/openai/serving_chat.py `_preprocess_chat`; `AsyncLLM.add_request` ->
  `EngineCoreClient.add_request_async`, vllm/v1/engine/async_llm.py), and asyncio runs ready tasks in
  turn, so a burst's handlers advance together and reach the engine over the last `turn_share` of
  the loop's busy period (`interleaved_leave_s`). 1: one request after another (the FIFO queue);
  0: all at the end. With the front end in the engine's process (v0) 1 keeps the whole busy period
  together, as before the share existed (`intake_turn_share`). Bounds [0, 1]; optional in a profile
  (absent: 1, the FIFO queue as before).
- `output_service_s`: the loop's time per request-output of a step (`AsyncLLM.output_handler` ->
  `OutputProcessor.process_outputs`, then the request's stream), on the same loop as the intake;
  a client sees a token when the loop has delivered it (sim/cost/output_path.py). Bounds [0, 2 ms];
  optional in a profile (absent: 0).

`ServerTerms.neutral()` changes nothing (the paper default and every run without a bench profile
keep their results). `kvsim bench replay` uses `shipped_terms(engine, gpu)` unless given
`--calibration PROFILE.json`; `kvsim bench fit` writes such a profile (`profile_document`), and
`--calibration` applies it to run, compare, sweep and capacity too (docs/cost_model.md "Whole server").
"""

from __future__ import annotations

import json
import math
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import KvsimError, ScenarioError
from sim.files import MAX_PROFILE_BYTES, read_text_bounded

PROFILE_KIND = "kvsim-bench-profile"
PROFILE_SCHEMA = 1

# (low, high) of each coefficient: the fit may not leave them, a profile outside them is refused.
BOUNDS: dict[str, tuple[float, float]] = {
    "frontend_s": (0.0, 0.5),
    "frontend_service_s": (0.0, 0.05),
    "flops_efficiency_scale": (0.25, 1.25),
    "overhead_scale": (0.0, 4.0),
    "stream_chunk_s": (0.0, 1e-3),
    "output_service_s": (0.0, 2e-3),
    "frontend_turn_share": (0.0, 1.0),
}
# Terms a profile may leave out (written before they existed), with the value that changes nothing.
OPTIONAL_TERMS: dict[str, float] = {
    "stream_chunk_s": 0.0,
    "output_service_s": 0.0,
    "frontend_turn_share": 1.0,
}


@dataclass(frozen=True, slots=True)
class ServerTerms:
    """The server-level coefficients (see the module docstring); `source` says where they come from."""

    frontend_s: float = 0.0
    frontend_service_s: float = 0.0
    flops_efficiency_scale: float = 1.0
    overhead_scale: float = 1.0
    stream_chunk_s: float = 0.0
    output_service_s: float = 0.0
    frontend_turn_share: float = 1.0
    # The serving stack (not fitted; None: the engine preset's own, see `stack_settings`):
    custom_all_reduce: bool | None = None  # vLLM's custom all-reduce on NVLink (else NCCL)
    ray_workers: bool | None = None  # TP workers driven over Ray (the v0 preset's measured overhead)
    frontend_in_engine_process: bool | None = None  # the front end shares the engine's event loop (v0)
    source: str = "neutral"

    @classmethod
    def neutral(cls) -> ServerTerms:
        """Terms that change nothing: the operator model alone."""
        return cls()

    def stack_settings(self, engine_stack: Mapping[str, bool]) -> tuple[bool, bool]:
        """(custom all-reduce, Ray workers): the explicit settings, else the engine's own.

        `engine_stack` is the engine policy's `serving_stack` (sim/engines/: vllm-v1 uses vLLM's
        custom all-reduce on NVLink and multiprocess workers without Ray; vllm-v0 the paper-era NCCL
        all-reduce and Ray workers, whose cost the preset's measured overhead includes).
        """
        custom = (
            engine_stack["custom_all_reduce"] if self.custom_all_reduce is None else self.custom_all_reduce
        )
        ray = engine_stack["ray_workers"] if self.ray_workers is None else self.ray_workers
        return bool(custom), bool(ray)

    def frontend_blocks_engine(self, engine_stack: Mapping[str, bool]) -> bool:
        """Whether the front end's serial work holds the engine back: the explicit setting, else the
        engine's own `frontend_in_engine_process` (vLLM v0's `AsyncLLMEngine` runs its engine loop in
        the API server's event loop, vllm/engine/async_llm_engine.py `run_engine_loop`; v1 moves the
        engine core to its own process, vllm/v1/engine/core_client.py)."""
        if self.frontend_in_engine_process is not None:
            return self.frontend_in_engine_process
        return bool(engine_stack["frontend_in_engine_process"])

    def stack(self) -> dict[str, bool | None]:
        """The stack settings as given (None: the engine preset's)."""
        return {
            "custom_all_reduce": self.custom_all_reduce,
            "ray_workers": self.ray_workers,
            "frontend_in_engine_process": self.frontend_in_engine_process,
        }

    def values(self) -> dict[str, float]:
        """The fitted numbers alone, keyed as in BOUNDS."""
        return {name: float(getattr(self, name)) for name in BOUNDS}

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def check_terms(values: dict[str, Any], where: str) -> dict[str, float]:
    """Each coefficient present, a finite number, inside its bounds; ScenarioError naming it otherwise."""
    checked: dict[str, float] = {}
    for name, (low, high) in BOUNDS.items():
        value = values.get(name, OPTIONAL_TERMS.get(name))
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ScenarioError(
                f"{where}: field '{name}': expected a number in [{low}, {high}] (got {value!r})"
            )
        if not low <= value <= high:
            raise ScenarioError(f"{where}: field '{name}': {value} is outside its bounds [{low}, {high}]")
        checked[name] = float(value)
    return checked


# Shipped defaults, per engine preset and GPU preset, fitted with `kvsim bench fit`'s grid
# (benchmarks/bench_fidelity.py --fit prints every number here and its leave-one-file-out error):
# - vllm-v0: the "later script" runs of ../shared/bench/vllm_bench (LambdaLabsML/vllm-benchmark,
#   vLLM 0.5.4 with --gpu-memory-utilization 0.95 --max-num-seqs 1024, the configuration whose flags
#   are recorded; sim/bench/lambda_set.py), 7 files per GPU, with vLLM 0.5.4's stack (custom
#   all-reduce, multiprocess workers, front end in the engine's event loop). FP8 models' linear
#   layers run as vLLM runs them (sim/scenario/quantization.py): W8A8 on H100 (then the datasheet's
#   2x GEMM rate, one activation-quantization kernel per GEMM), weight-only Marlin on A100 (then 0.85
#   of the BF16 rate once compute-bound). With that FP8 decode is no longer too fast, and the A100
#   fit's front-end delay fell from 0.23 s to 0.095 s (it had stood in for the FP8 runs' missing
#   decode time). With the embedding as a lookup and the LM head per sampled position (sim/cost/linear.py
#   `per_token_compute_params`) the refit moved it to 0 s with 4 ms per request (A100) and the
#   H100's from 0.161 s to 0.182 s; the FLOP and overhead scales stayed. With the FP8 GEMM rates
#   at served figures (H100 W8A8 1.69x, inside vLLM's measured kernel range; Marlin 0.8, recalibrated on
#   Table 3's p10-p90 span) the refit kept every vllm-v0 term here (held out, all 27 runs, median
#   |error| TTFT / TPOT / E2E / req/s 7.1 / 4.4 / 6.2 / 1.7 -> 4.3 / 4.2 / 2.6 / 2.1 %); only
#   EARLIER_TERMS moved.
#   The earlier-script runs keep these GPU-side terms with their own front end and stream cost
#   (sim/bench/lambda_set.py EARLIER_TERMS).
# - vllm-v1: the gpustack rows of ../shared/bench/published.csv (vLLM 0.11, `vllm serve` defaults;
#   sim/bench/published_set.py), H100 fitted over PUBLISHED_GRID on its 9 "1x H100 SXM" rows (Qwen3-8B,
#   14B; until the Qwen3-32B "1x H100" rows were found to be an H100 PCIe, on all 14), with the API-server
#   loop modelled (a burst taken in together, `frontend_turn_share`; outputs through the same loop,
#   `output_service_s`); the front end is the API server's (CPU), so the A100 keeps the H100 fit's
#   front-end terms (the A100 rows have no low-load run to identify them) and fits only its FLOP
#   scale (1.0 over 0.35-1.0). On the grid's edges: frontend_turn_share 0.25 (its lowest point) and
#   output_service_s 0.1 ms (its highest); frontend_service_s 15 ms and the FLOP scale (then 0.6)
#   are interior. Before the loop was modelled: 20 ms per request, FIFO, FLOP scale 0.45. With the
#   embedding as a lookup and the LM head per sampled position (Qwen3's per-token FLOPs 5-15 %
#   lower) the FLOP scales were refitted with the other terms held (H100 over 0.45 / 0.5 / 0.55 /
#   0.6: 0.5 in place of 0.6, now a PUBLISHED_GRID point; A100 over 0.8 / 0.9 / 1.0: still 1.0).
#   The full PUBLISHED_GRID refit on the 9 SXM rows alone returns the same point (0.043 s, 15 ms, FLOP
#   scale 0.5, share 0.25, 0.1 ms; held out TTFT / TPOT / req/s 5.4 / 3.7 / 4.8 %), and the A100's FLOP
#   scale with its front end stays 1.0. The H100 PCIe (the Qwen3-32B rows) takes the SXM's front-end
#   terms (same API server and vLLM build) and, by the A100's rule, a FLOP scale fitted on its own 5
#   rows (0.7; each row held out: 0.7-0.75): with the SXM's 0.5 its rows ran 10-25 % slow
#   (docs/cost_model.md "The Qwen3-32B "1x H100" rows ran on an H100 PCIe").
# Other engine/GPU pairs get neutral terms (the operator model alone).
_V0_STACK: dict[str, Any] = {
    "custom_all_reduce": True,
    "ray_workers": False,
    "frontend_in_engine_process": True,
}
_V1_H100: dict[str, Any] = {
    "frontend_s": 0.043,
    "frontend_service_s": 0.015,
    "flops_efficiency_scale": 0.5,
    "overhead_scale": 1.0,
    "frontend_turn_share": 0.25,
    "output_service_s": 1e-4,
}
SHIPPED_TERMS: dict[tuple[str, str], dict[str, Any]] = {
    ("vllm-v0", "A100-80GB"): {
        "frontend_s": 0.0,
        "frontend_service_s": 0.004,
        "flops_efficiency_scale": 1.0,
        "overhead_scale": 0.3,
        **_V0_STACK,
    },
    ("vllm-v0", "H100-80GB"): {
        "frontend_s": 0.182,
        "frontend_service_s": 0.002,
        "flops_efficiency_scale": 0.85,
        "overhead_scale": 0.15,
        **_V0_STACK,
    },
    ("vllm-v1", "A100-80GB"): {
        "frontend_s": 0.043,
        "frontend_service_s": 0.015,
        "flops_efficiency_scale": 1.0,
        "overhead_scale": 1.0,
        "frontend_turn_share": 0.25,
        "output_service_s": 1e-4,
    },
    ("vllm-v1", "H100-80GB"): _V1_H100,
    # Same GH100 chip, kernels and vLLM build as the SXM part: its front-end terms; its FLOP scale
    # fitted on its own 5 published rows with them held (the A100's rule; BOARD_FLOP_SCALES), each row
    # held out 0.7-0.75 (docs/cost_model.md "The Qwen3-32B "1x H100" rows ran on an H100 PCIe").
    ("vllm-v1", "H100-PCIe-80GB"): {**_V1_H100, "flops_efficiency_scale": 0.7},
}


def shipped_terms(engine: str, gpu: str) -> ServerTerms:
    """The shipped server terms for an engine preset on a GPU preset (neutral when none are shipped)."""
    entry = SHIPPED_TERMS.get((engine, gpu))
    if entry is None:
        return ServerTerms.neutral()
    return ServerTerms(**entry, source=f"shipped {engine} {gpu} (sim/cost/server.py)")


# ------------------------------------------------------------------------------------------------------------
# Profiles written by `kvsim bench fit`


def is_bench_profile(path: str | None) -> bool:
    """Whether a `--calibration` file is a bench profile (a JSON whose "kind" is PROFILE_KIND)."""
    if path is None or not str(path).lower().endswith(".json"):
        return False
    try:
        status = Path(path).stat()
    except OSError:
        return False
    if not stat.S_ISREG(status.st_mode):  # a FIFO or device is never read here (it could block forever);
        return False  # the calibration reader refuses it in one line (sim.files.check_input_file)
    return _profile_kind(str(Path(path).resolve()), status.st_mtime_ns) == PROFILE_KIND


@lru_cache(maxsize=32)
def _profile_kind(path: str, stamp_ns: int) -> str | None:
    try:
        data = json.loads(read_text_bounded(path, what="bench profile", limit_bytes=MAX_PROFILE_BYTES))
    except ValueError:  # not JSON, or refused by the bounded reader (KvsimError is a ValueError)
        return None
    return data.get("kind") if isinstance(data, dict) else None


def load_profile_terms(path: str | Path) -> ServerTerms:
    """The terms a bench profile holds; ScenarioError (one line naming the file and field) if bad.

    Read once per file version: every `simulate` (each sweep cell, each replayed file) asks again.
    """
    try:
        stamp_ns = Path(path).stat().st_mtime_ns
    except OSError:
        stamp_ns = -1  # the reader below names the problem
    return _load_profile_terms(str(path), stamp_ns)


@lru_cache(maxsize=32)
def _load_profile_terms(path: str, stamp_ns: int) -> ServerTerms:
    where = str(path)
    try:
        data = json.loads(read_text_bounded(path, what="bench profile", limit_bytes=MAX_PROFILE_BYTES))
    except KvsimError as exc:
        raise ScenarioError(f"field 'calibration': {exc}") from None
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
    stack = data.get("stack", {})
    for name in ServerTerms().stack():
        if not isinstance(stack, dict) or not isinstance(stack.get(name), bool | None):
            raise ScenarioError(
                f"field 'calibration': {where}: field 'stack.{name}': expected true, false or null"
            )
    return ServerTerms(**values, **stack, source=f"bench profile {Path(path).name}")


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
        "stack": terms.stack(),
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
    "frontend_queue_s",
    "intake_turn_share",
    "is_bench_profile",
    "load_profile_terms",
    "profile_document",
    "scenario_terms",
    "shipped_terms",
]


def frontend_queue_s(send_s: np.ndarray, service_s: float) -> np.ndarray:
    """When each request (in send order) leaves a FIFO single server of `service_s` per request.

    leave[i] = max(send[i], leave[i-1]) + s, in closed form: (i+1) s + max over j <= i of (send[j] - j s),
    a running maximum (no Python loop over requests). `service_s` 0 returns the send times.
    """
    send = np.asarray(send_s, dtype=np.float64)
    if service_s == 0.0 or send.size == 0:
        return send.copy()
    index = np.arange(send.size, dtype=np.float64)
    return (index + 1.0) * service_s + np.maximum.accumulate(send - index * service_s)


def add_frontend_latency(requests: Any, frontend_s: float, queued_s: np.ndarray | None = None) -> None:
    """Add the front end's time to the client-seen TTFT and E2E columns, in place.

    `frontend_s` is added to every request; `queued_s` (per request, in request_id order) is the time
    each one spent in the front end's serial queue before the engine saw it (`frontend_queue_s` minus
    the send time). Why after the engine: the front end delays what the client sees, and the engine
    only sees the later arrival; TPOT and ITL (gaps after the first token) are unchanged.
    Server-side timestamps (`arrival_s`, `first_token_s`, `finish_s`) stay the engine's.
    """
    if frontend_s == 0.0 and queued_s is None:
        return
    added_ms = np.full(len(requests), frontend_s * 1e3)
    if queued_s is not None:
        added_ms = added_ms + np.asarray(queued_s, dtype=np.float64)[requests["request_id"].to_numpy()] * 1e3
    for column in ("ttft_ms", "e2el_ms"):
        if column in requests.columns:
            requests[column] = requests[column].to_numpy(np.float64) + added_ms


def busy_period_ends_s(send_s: np.ndarray, leave_s: np.ndarray) -> np.ndarray:
    """For each request, when the front end's busy period that served it ends.

    A busy period ends at leave[j] when the next request arrives later (send[j+1] > leave[j]) or j is
    the last; request i's period ends at the first such j >= i (a reversed running minimum).
    """
    return leave_s[_busy_period_last_index(send_s, leave_s)]


def _busy_period_last_index(send_s: np.ndarray, leave_s: np.ndarray) -> np.ndarray:
    """For each request, the index of the last request of its busy period (see busy_period_ends_s)."""
    last = np.full(leave_s.size, leave_s.size - 1, dtype=np.int64)
    idle_after = np.append(send_s[1:] > leave_s[:-1], True)
    last[idle_after] = np.flatnonzero(idle_after)
    return np.minimum.accumulate(last[::-1])[::-1]


def interleaved_leave_s(
    send_s: np.ndarray, leave_s: np.ndarray, service_s: float, turn_share: float
) -> np.ndarray:
    """When each request leaves a front end whose loop takes pending requests in turn.

    Each request's work `service_s` ends with a last turn of `turn_share` x `service_s` (the part
    after its handler's last suspension, ending in the hand-off to the engine). An event loop that
    runs ready tasks in turn does the earlier parts of every pending request first, then the last
    turns in order, so within a busy period request i leaves at end - turn_share x s x (requests of
    the period after i). 1 gives the FIFO queue (`leave_s`), 0 the end of the busy period for all.
    Never earlier than the FIFO leave time.
    """
    last = _busy_period_last_index(send_s, leave_s)
    after = last - np.arange(leave_s.size)
    return np.maximum(leave_s, leave_s[last] - turn_share * service_s * after)


def intake_turn_share(blocking: bool, turn_share: float) -> float:
    """The share of a request's intake in its last turn, as `frontend_arrivals` lays a burst out.

    Why the front end in the engine's process (vLLM v0) reads 1 as 0: its neutral value keeps the
    rule that held before the share existed, every request of a busy period reaching the engine
    when the period ends (`busy_period_ends_s`, which `interleaved_leave_s` gives at share 0). A
    fitted share below 1 is the v1 reading for v0 too: vLLM 0.5.4's engine loop is one more task on
    the event loop of the process that runs `AsyncLLMEngine` (by default in 0.5.4 the RPC server
    process of the multiprocessing front end, vllm/entrypoints/openai/rpc/server.py, vLLM PR #6883,
    which takes each request in as its own task), and its step awaits the model in a worker thread
    (vllm/engine/async_llm_engine.py `engine_step` -> `step_async` -> `execute_model_async`;
    vllm/executor/gpu_executor.py `GPUExecutorAsync.execute_model_async`: `make_async`), so the
    engine takes turns with the burst's requests and prefills what has reached `add_request` while
    the rest of the burst is still taken in.
    """
    if blocking and turn_share >= 1.0:
        return 0.0
    return turn_share


def frontend_arrivals(
    requests: Any, service_s: float, blocking: bool = False, turn_share: float = 1.0
) -> tuple[Any, np.ndarray | None]:
    """The request table as the engine sees it behind the front end's serial queue, and each
    request's time in that queue (indexed by request_id); (the table, None) when nothing changes.

    Pipelined (v1, `blocking` False): a request reaches the engine when the front end is done with
    it (`frontend_queue_s`), or, with `turn_share` < 1, when the loop reaches its last turn among a
    burst's interleaved requests (`interleaved_leave_s`). In the engine's process (v0, `blocking`
    True): the event loop handles every pending request before the engine loop runs again, so the
    requests of one busy period all reach the engine when it ends (`busy_period_ends_s`): a burst of
    320 requests at 3 ms each starts its first prefill ~1 s late, as measured
    (../shared/bench/vllm_bench: the first TTFTs of a burst are ~1 s); with a fitted `turn_share`
    < 1 they reach it over the period's last share as in v1 (`intake_turn_share`). The engine's
    steps during a busy period are not slowed (an approximation). A closed loop's arrivals are
    made by the engine's own arrival source, so it is left as is (`kvsim bench replay` adds the
    front end to its think time instead).
    """
    if service_s == 0.0 or requests.attrs.get("closed_loop") is not None or len(requests) == 0:
        return requests, None
    send = requests["arrival_s"].to_numpy(np.float64)
    leave = frontend_queue_s(send, service_s)
    if blocking and turn_share >= 1.0:
        leave = busy_period_ends_s(send, leave)
    elif turn_share < 1.0:
        leave = interleaved_leave_s(send, leave, service_s, turn_share)
    ids = requests["request_id"].to_numpy()
    queued = np.zeros(int(ids.max()) + 1)
    queued[ids] = leave - send
    engine_view = requests.copy()
    engine_view["arrival_s"] = leave
    return engine_view, queued
