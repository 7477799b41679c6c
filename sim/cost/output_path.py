"""The API-server loop's output path: when the client sees what the engine produced (vLLM v1).

Why a model of its own: vLLM v1 runs the engine core in its own process, but every output still
passes through the API server's one asyncio event loop before a client sees it. The engine core
sends one `EngineCoreOutputs` batch per step (vllm/v1/engine/core_client.py `AsyncMPClient`:
`process_outputs_socket` -> `outputs_queue`); `AsyncLLM.output_handler` (vllm/v1/engine/async_llm.py)
takes the batches in order and runs `OutputProcessor.process_outputs` on each (per request:
incremental detokenisation, stop checks, a `RequestOutput`; at most VLLM_V1_OUTPUT_PROC_CHUNK_SIZE
requests between yields), which puts each request's output into its `RequestOutputCollector`
(vllm/v1/engine/output_processor.py); the request's own task then streams it as a server-sent event
(vllm/entrypoints/openai/serving_chat.py / serving_completion.py). The same loop also takes in new
requests (HTTP, chat template, tokenisation, `add_request`). So when the loop is behind, outputs wait
behind the loop's other work, and a request whose consumer has not run yet gets its outputs merged
(`RequestOutputCollector.put` adds a new delta to the pending one): the client sees fewer, larger
chunks, and the first chunk late.

The model: the loop is one FIFO server. Its work arrives as the front end's intake (each request's
`frontend_service_s`, laid out as sim/cost/server.py `frontend_arrivals` takes a burst in:
`intake_jobs`; open-loop runs) and as the engine's outputs (each step's
outputs at the step's end, `output_service_s` per request-output, the per-request cost of
`process_outputs` plus that request's share of streaming). A request's first token and its last
token reach the client when the loop has done all work that arrived up to the step that produced
them. Merging is implicit: the client's TTFT, E2E and TPOT = (E2E - TTFT) / (output - 1) depend only
on when its first and its last chunk leave, however many chunks lay between.

Approximations (stated so that they can be checked): the engine's arrivals are the intake's
(sim/cost/server.py `frontend_arrivals`), not delayed by output work that competes with intake (in a
burst no output exists before the intake's busy period ends); the iterations of a multi-iteration
decode jump are spread evenly over it; with a sampled steps table (`step_rows_stride` > 1) each
kept row stands for `stride` rows. `output_service_s` 0 changes nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["apply_output_path", "fifo_finish_s", "intake_jobs", "loop_work", "visible_s"]


def fifo_finish_s(arrival_s: np.ndarray, work_s: np.ndarray) -> np.ndarray:
    """When a FIFO single server finishes each job, jobs sorted by arrival.

    finish[k] = max(finish[k-1], arrival[k]) + work[k], in closed form: with C the cumulative work,
    finish[k] = C[k] + max over j <= k of (arrival[j] - C[j-1]) (a running maximum, no Python loop).
    """
    arrival = np.asarray(arrival_s, dtype=np.float64)
    work = np.asarray(work_s, dtype=np.float64)
    if arrival.size == 0:
        return arrival.copy()
    done = np.cumsum(work)
    before = done - work
    return done + np.maximum.accumulate(arrival - before)


def intake_jobs(
    send_s: np.ndarray, leave_s: np.ndarray, service_s: float, turn_share: float
) -> tuple[np.ndarray, np.ndarray]:
    """(times, work) of the intake's jobs on the loop, as sim/cost/server.py `frontend_arrivals` lays
    them out: each request's earlier turns, (1 - turn_share) x service_s, from its send time, and its
    last turn, turn_share x service_s, ending when it leaves for the engine. Jobs of no work are left
    out. Why the last turn apart: outputs that reach the loop while a burst's last turns are being
    done wait for the turn in progress, not for the whole burst (the loop takes ready tasks in turn).
    """
    send = np.asarray(send_s, dtype=np.float64)
    leave = np.asarray(leave_s, dtype=np.float64)
    first_work, last_work = (1.0 - turn_share) * service_s, turn_share * service_s
    times, work = [], []
    if first_work > 0.0:
        times.append(send)
        work.append(np.full(send.size, first_work))
    if last_work > 0.0:
        times.append(np.maximum(leave - last_work, send))
        work.append(np.full(send.size, last_work))
    if not times:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(times), np.concatenate(work)


def loop_work(
    steps: Any, stride: int, output_service_s: float, intake: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times, work) of the loop's jobs, sorted by time: each step's outputs at its end, and
    the intake's jobs (`intake_jobs`) when given.

    A jump row (`iterations` > 1) becomes `iterations` jobs spaced evenly over its duration, each
    with its share of the row's generated tokens; a sampled table's rows count `stride` times.
    """
    start = steps["time_s"].to_numpy(np.float64)
    duration = steps["duration_s"].to_numpy(np.float64)
    iterations = np.maximum(steps["iterations"].to_numpy(np.int64), 1)
    tokens = steps["generated_tokens"].to_numpy(np.float64) * float(max(stride, 1))
    row = np.repeat(np.arange(start.size), iterations)
    # index of each iteration inside its row: 0, 1, ..., iterations - 1
    first_of_row = np.cumsum(iterations) - iterations
    within = np.arange(row.size) - np.repeat(first_of_row, iterations)
    times = start[row] + duration[row] * (within + 1) / iterations[row]
    work = tokens[row] / iterations[row] * output_service_s
    if intake is not None and intake[0].size:
        times = np.concatenate([intake[0], times])
        work = np.concatenate([intake[1], work])
    order = np.argsort(times, kind="stable")  # intake first among equal times: it was there first
    return times[order], work[order]


def visible_s(event_s: np.ndarray, job_s: np.ndarray, finish_s: np.ndarray) -> np.ndarray:
    """When the loop has done all jobs that arrived up to each event time (the event itself a step's end).

    A tolerance of 1 ns takes the job of the step that ends at the event even where a jump's evenly
    spread iteration ends differ from the engine's in the last bits; never earlier than the event.
    """
    event = np.asarray(event_s, dtype=np.float64)
    index = np.searchsorted(job_s, event + 1e-9, side="right") - 1
    done = np.where(index >= 0, finish_s[np.maximum(index, 0)], -np.inf)
    return np.maximum(event, done)


def apply_output_path(
    requests: Any,
    steps: Any,
    totals: dict[str, Any],
    output_service_s: float,
    intake: tuple[np.ndarray, np.ndarray] | None = None,
) -> None:
    """Move each request's client-seen first and last token to when the loop delivers them, in place.

    Updates `ttft_ms`, `e2el_ms`, `tpot_ms` and `itl_ms` (the per-token gap after the first:
    (E2E - TTFT) / (tokens - 1) from the client's view) and `totals["duration_s"]` (the client's
    last chunk). `intake`: the intake's jobs (`intake_jobs`; None for a closed loop, whose sends the
    engine makes). Engine-side timestamps (`first_token_s`, `finish_s`) stay the
    engine's. `output_service_s` 0: nothing changes.
    """
    if output_service_s == 0.0 or len(requests) == 0 or len(steps) == 0:
        return
    stride = int(totals.get("step_rows_stride", 1) or 1)
    job_s, work_s = loop_work(steps, stride, output_service_s, intake)
    finish_s = fifo_finish_s(job_s, work_s)
    first = requests["first_token_s"].to_numpy(np.float64)
    last = requests["finish_s"].to_numpy(np.float64)
    ok = np.isfinite(first) & np.isfinite(last)
    first_late = np.zeros(len(requests))
    last_late = np.zeros(len(requests))
    first_late[ok] = visible_s(first[ok], job_s, finish_s) - first[ok]
    last_late[ok] = visible_s(last[ok], job_s, finish_s) - last[ok]
    ttft = requests["ttft_ms"].to_numpy(np.float64) + first_late * 1e3
    e2el = requests["e2el_ms"].to_numpy(np.float64) + last_late * 1e3
    per_sample = requests["generated_tokens"].to_numpy(np.float64)
    if "n" in requests:
        per_sample = per_sample / np.maximum(requests["n"].to_numpy(np.float64), 1.0)
    gaps = per_sample - 1.0
    stretch_ms = np.divide((last_late - first_late) * 1e3, gaps, out=np.zeros(len(requests)), where=gaps > 0)
    requests["ttft_ms"] = ttft
    requests["e2el_ms"] = e2el
    for column in ("tpot_ms", "itl_ms"):
        if column in requests.columns:
            requests[column] = requests[column].to_numpy(np.float64) + stretch_ms
    if ok.any():
        totals["duration_s"] = max(float(totals["duration_s"]), float((last + last_late)[ok].max()))
