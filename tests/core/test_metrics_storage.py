"""The compact storage of the per-request log and the steps table (issue 16) keeps every value and dtype.

Why: RequestLog keeps typed array columns and one-byte finish codes, StepRecorder keeps column-major
buffers that become the table's columns without a copy; these tests pin the tables they produce
against values written out by hand, so a storage change cannot alter a result.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sim.core.metrics import (
    FINISH_KV_EXHAUSTED,
    FINISH_LENGTH,
    FINISH_REJECTED,
    FINISH_STOP,
    STEP_COLUMNS,
    RequestLog,
    StepRecorder,
    StepRow,
)


def _requests(num: int, n: list[int] | None = None) -> pd.DataFrame:
    table = pd.DataFrame(
        {
            "request_id": np.arange(100, 100 + num, dtype=np.int64),
            "arrival_s": np.arange(num, dtype=np.float64),
            "prompt_tokens": np.full(num, 10, np.int64),
            "output_tokens": np.full(num, 4, np.int64),
            "max_tokens": np.full(num, 8, np.int64),
        }
    )
    if n is not None:
        table["n"] = np.asarray(n, np.int64)
    return table


def _finish(log: RequestLog, req: int, arrival_s: float, emitted: list[int], reason: str) -> None:
    log.arrival_s[req] = arrival_s
    log.admitted_s[req] = arrival_s + 0.5
    log.samples_left[req] = len(emitted)
    log.first_token_s[req] = arrival_s + 1.0
    for j, tokens in enumerate(emitted):
        log.finish_sample(req, arrival_s + 1.0 + tokens + j, tokens, reason)


def test_request_log_table_values_and_dtypes() -> None:
    requests = _requests(5, n=[1, 2, 1, 1, 1])
    log = RequestLog(5)
    _finish(log, 0, 0.0, [4], FINISH_STOP)
    _finish(log, 1, 1.0, [3, 2], FINISH_STOP)  # two samples share the row
    log.arrival_s[2] = 2.0
    log.reject(2, 2.0, "prompt_tokens 10 leaves no room")
    _finish(log, 3, 3.0, [1], FINISH_KV_EXHAUSTED)
    _finish(log, 4, 4.0, [8], FINISH_LENGTH)
    log.preemptions[4] += 2
    log.recomputed_tokens[4] += 7
    assert log.num_done == 5
    table = log.to_frame(requests)

    assert table["generated_tokens"].tolist() == [4, 5, 0, 1, 8]
    assert table["finish_reason"].tolist() == [
        FINISH_STOP,
        FINISH_STOP,
        FINISH_REJECTED,
        FINISH_KV_EXHAUSTED,
        FINISH_LENGTH,
    ]
    assert table["rejection_reason"].tolist() == ["", "", "prompt_tokens 10 leaves no room", "", ""]
    assert table["rejected"].tolist() == [False, False, True, False, False]
    assert table["preemptions"].tolist() == [0, 0, 0, 0, 2]
    assert table["recomputed_tokens"].tolist() == [0, 0, 0, 0, 7]
    assert table["request_id"].tolist() == [100, 101, 102, 103, 104]
    # Request 0: first token at 1 s, finish at 5 s, 4 tokens: TPOT (5-1)/3 s, ITL span 4 s over 3 gaps.
    assert table["ttft_ms"].iloc[0] == 1000.0
    assert table["e2el_ms"].iloc[0] == 5000.0
    assert table["tpot_ms"].iloc[0] == pytest.approx(4000.0 / 3)
    assert table["itl_ms"].iloc[0] == pytest.approx(4000.0 / 3)
    assert table["normalized_latency_s_per_token"].iloc[0] == pytest.approx(5.0 / 4)
    # Rejected and single-token requests have no TPOT/ITL; the rejected one has no latency at all.
    assert math.isnan(table["tpot_ms"].iloc[3]) and math.isnan(table["itl_ms"].iloc[3])
    assert math.isnan(table["e2el_ms"].iloc[2]) and math.isnan(
        table["normalized_latency_s_per_token"].iloc[2]
    )
    ints = [c for c in table.columns if c not in ("rejected", "rejection_reason", "finish_reason")]
    for column in ints:
        assert table[column].dtype in (np.int64, np.float64), column
    assert table["rejected"].dtype == bool
    # The reason columns have the dtype pandas gives any column of Python strings.
    string_dtype = pd.DataFrame({"x": np.array(["a"], dtype=object)})["x"].dtype
    assert table["finish_reason"].dtype == string_dtype
    assert table["rejection_reason"].dtype == string_dtype


def test_request_log_kv_exhausted_wins_and_unknown_reasons_are_kept() -> None:
    log = RequestLog(2)
    _finish(log, 0, 0.0, [2, 3], FINISH_KV_EXHAUSTED)  # both samples truncated
    log.samples_left[1] = 2
    log.first_token_s[1] = 1.0
    log.arrival_s[1] = 0.0
    log.finish_sample(1, 3.0, 2, FINISH_KV_EXHAUSTED)
    log.finish_sample(1, 4.0, 3, FINISH_STOP)  # a later normal finish does not hide the truncation
    assert log.finish_reason(1) == FINISH_KV_EXHAUSTED
    log2 = RequestLog(1)
    _finish(log2, 0, 0.0, [2], "abort")  # a reason outside REASON_NAMES gets its own code
    assert log2.to_frame(_requests(1))["finish_reason"].tolist() == ["abort"]


def test_request_log_columns_are_compact() -> None:
    log = RequestLog(1000)
    for name in ("arrival_s", "admitted_s", "first_token_s", "finish_s", "generated_tokens", "preemptions"):
        assert getattr(log, name).itemsize * len(getattr(log, name)) == 8 * 1000, name
    assert log.finish_codes.itemsize == 1


@pytest.mark.parametrize(
    ("max_rows", "offered"),
    # 4096 and 5000 rows: columns span several pages, so halvings hand whole pages back to the OS.
    [(2, 37), (3, 37), (7, 37), (8, 37), (4096, 13_000), (5000, 21_001)],
)
def test_step_recorder_keeps_rows_on_the_stride(max_rows: int, offered: int) -> None:
    recorder = StepRecorder(max_rows)
    for i in range(offered):
        values = {name: i * 100 + j for j, name in enumerate(StepRow._fields)}
        recorder.offer(float(i), 0.5 * i, StepRow(**values))
    frame = recorder.to_frame()
    assert list(frame.columns) == list(STEP_COLUMNS)
    kept = [i for i in range(offered) if i % recorder.stride == 0][: recorder.size]
    assert len(frame) == len(kept) <= max_rows
    assert frame["time_s"].tolist() == [float(i) for i in kept]
    assert frame["duration_s"].tolist() == [0.5 * i for i in kept]
    for j, name in enumerate(StepRow._fields):
        assert frame[name].tolist() == [i * 100 + j for i in kept], name
        assert frame[name].dtype == np.int64


def test_step_recorder_writes_what_numpy_casts_gave() -> None:
    """Compiled, kept rows reach the columns through a C loop (`metrics._write_records`); values that
    are NumPy scalars, or a float in an integer column, give the table `np.fromiter` gave."""
    from sim.core.metrics import RECORD_ORDER

    width = len(RECORD_ORDER) - 2
    records = [
        (0.5, 0.25, *range(width)),
        (np.float64(1.5), np.float64(0.75), *(np.int64(10 + j) for j in range(width))),
        (2, 3, *(20 + j for j in range(width))),
        (3.5, 1.0, 2.7, *(30 + j for j in range(width - 1))),  # a float in an int column: truncated
    ]
    recorder = StepRecorder(16)
    for record in records:
        recorder.offer_record(record)
    frame = recorder.to_frame()
    for k, name in enumerate(RECORD_ORDER):
        dtype = np.float64 if name in ("time_s", "duration_s") else np.int64
        expected = np.fromiter((record[k] for record in records), dtype, len(records))
        assert frame[name].dtype == dtype, name
        assert frame[name].tolist() == expected.tolist(), name


def test_request_log_many_distinct_rejection_reasons() -> None:
    """More distinct reasons than a byte code holds (each names its own prompt length)."""
    num = 300
    log = RequestLog(num)
    for req in range(num):
        log.arrival_s[req] = float(req)
        log.reject(req, float(req), f"prompt_tokens {1000 + req} leaves no room")
    table = log.to_frame(_requests(num))
    assert table["rejection_reason"].tolist() == [
        f"prompt_tokens {1000 + r} leaves no room" for r in range(num)
    ]
    assert table["rejected"].all() and (table["finish_reason"] == FINISH_REJECTED).all()
