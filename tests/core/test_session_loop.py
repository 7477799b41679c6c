"""Issue 21 §4: multi-turn sessions in a trace replay closed-loop per session (think time after each answer).

A trace with `session_id`, `turn` and `think_s` keeps the timestamps of first turns only; each later
turn is sent its `think_s` after the previous turn of its session was answered, so a slower server
delays a user's next turn as a real user would be delayed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import sim
from sim.scenario.scenario import Scenario
from workloads.errors import WorkloadError

ROWS = (
    "arrival_s,prompt_tokens,output_tokens,session_id,turn,think_s\n"
    "0.0,100,20,0,1,0\n"
    "1.0,120,30,1,1,0\n"
    "5.0,200,20,0,2,3.5\n"
    "6.0,300,25,1,2,2.0\n"
    "9.0,400,10,0,3,1.0\n"
)


def run_sessions(tmp_path: Path, step_s: float, **overrides: object) -> pd.DataFrame:
    path = tmp_path / "sessions.csv"
    path.write_text(ROWS)
    scenario = Scenario(workload=str(path), constant_step_s=step_s, **overrides)
    run = sim.simulate(scenario)
    assert run.summary["workload"]["clock"]["kind"] == "session-loop"
    return run.requests.sort_values("request_id").set_index("request_id")


@pytest.mark.parametrize("step_s", [0.01, 0.05])
def test_each_later_turn_is_sent_its_think_time_after_the_previous_answer(
    tmp_path: Path, step_s: float
) -> None:
    requests = run_sessions(tmp_path, step_s)
    assert requests.loc[0, "arrival_s"] == 0.0 and requests.loc[1, "arrival_s"] == 1.0  # first turns
    for turn, previous, think_s in ((2, 0, 3.5), (3, 1, 2.0), (4, 2, 1.0)):
        assert requests.loc[turn, "arrival_s"] == pytest.approx(requests.loc[previous, "finish_s"] + think_s)


def test_a_slower_server_delays_the_later_turns(tmp_path: Path) -> None:
    fast, slow = run_sessions(tmp_path, 0.01), run_sessions(tmp_path, 0.05)
    assert (slow.loc[[2, 3, 4], "arrival_s"] > fast.loc[[2, 3, 4], "arrival_s"]).all()


def test_stepping_every_iteration_gives_the_same_requests(tmp_path: Path) -> None:
    path = tmp_path / "sessions.csv"
    path.write_text(ROWS)
    scenario = Scenario(workload=str(path))
    jumps, steps = sim.simulate(scenario), sim.simulate(scenario, multi_step=False)
    # times summed over a jump vs step by step: equal to rounding (tests/core/test_engine_jumps.py)
    pd.testing.assert_frame_equal(jumps.requests, steps.requests, check_exact=False, rtol=1e-9, atol=0)


def test_the_clock_line_says_closed_loop_per_session(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    frame = pd.read_csv(pd.io.common.StringIO(ROWS))
    path.write_text("".join(json.dumps(row) + "\n" for row in frame.to_dict("records")))
    run = sim.simulate(Scenario(workload=str(path)))
    assert run.summary["workload"]["clock"]["line"] == (
        "replaying 5 rows as 2 sessions in a closed loop: first turns at their own timestamps "
        "(mean 1.00 req/s), each later turn its think_s after the previous answer"
    )


SESSION_HEADER = "arrival_s,prompt_tokens,output_tokens,session_id,turn,think_s\n"
BAD_SESSIONS = [
    ("arrival_s,prompt_tokens,output_tokens,think_s\n0,5,5,0\n",
     "row 2, field 'session_id': think_s needs a session_id column"),
    (SESSION_HEADER + "0,5,5,0,1,-1\n", "row 2, field 'think_s': must be >= 0 (got -1)"),
    (SESSION_HEADER + "0,5,5,0,2,0\n1,5,5,0,1,1\n",
     "row 3, field 'turn': session 0's turn 1 comes after its turn 2"),
    (SESSION_HEADER + "0,5,5,0,1,1e12\n",
     "row 2, field 'think_s': 1e+12 s: a think time is at most 3.16224e+07 s"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), BAD_SESSIONS)
def test_bad_session_rows_are_one_line(tmp_path: Path, text: str, expected: str) -> None:
    import workloads

    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(WorkloadError) as caught:
        workloads.load(path)
    assert str(caught.value) == f"{path}: {expected}"
