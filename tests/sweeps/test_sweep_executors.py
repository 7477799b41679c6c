"""Backends: local processes retry cells whose worker dies; ordinary errors are returned, not retried."""

from __future__ import annotations

from pathlib import Path

import _sweep_helpers as helpers
import pytest

from sim.sweeps.executors import (
    DaskExecutor,
    ExecutorError,
    LocalProcessExecutor,
    check_backend_args,
    make_executor,
)


def test_local_pool_retries_a_task_whose_worker_died(tmp_path: Path) -> None:
    executor = LocalProcessExecutor(2)
    try:
        outcomes = {
            o.key: o
            for o in executor.map_unordered(
                helpers.square_or_die, [(str(i), (i, str(tmp_path))) for i in range(6)]
            )
        }
        assert {k: o.value for k, o in outcomes.items()} == {str(i): i * i for i in range(6)}
        assert all(o.ok for o in outcomes.values())
        assert outcomes["3"].attempts == 2  # died once, then succeeded
        assert executor.running == 0
        # a task that always kills its worker ends as a failure, and the pool still works afterwards
        [dead] = list(executor.map_unordered(helpers.always_die, [("x", 0)]))
        assert not dead.ok and dead.attempts == 3 and "worker process died" in dead.error
        [raised] = list(executor.map_unordered(helpers.raise_value_error, [("y", 5)]))
        assert not raised.ok and raised.attempts == 1 and raised.error == "ValueError: bad value 5"
    finally:
        executor.close()


def test_local_pool_charges_only_the_task_of_the_worker_that_died(tmp_path: Path) -> None:
    """A healthy cell running beside a crashing one is not charged for the crashes (issue 11, part 4)."""
    executor = LocalProcessExecutor(2)
    try:
        items = [("healthy", ("wait", str(tmp_path))), ("crash", ("crash", str(tmp_path)))]
        outcomes = {o.key: o for o in executor.map_unordered(helpers.crash_or_wait, items)}
    finally:
        executor.close()
    assert sorted(p.name for p in tmp_path.glob("died-*")) == ["died-1", "died-2", "died-3"]
    healthy, crash = outcomes["healthy"], outcomes["crash"]
    assert healthy.ok and healthy.value == "ok" and healthy.attempts == 1
    assert not crash.ok and crash.attempts == 3 and crash.error == "worker process died (3 attempts)"


class CrashOneTask:
    """A LocalProcessExecutor on which the task of `crash_key` kills its worker every time it runs."""

    def __init__(self, crash_key: str, marker_dir: Path, jobs: int | None) -> None:
        self.inner = LocalProcessExecutor(jobs)
        self.slots = self.inner.slots
        self.crash_key = crash_key
        self.marker_dir = str(marker_dir)

    @property
    def running(self) -> int:
        return self.inner.running

    def map_unordered(self, fn, items, on_start=None):  # type: ignore[no-untyped-def]
        wrapped = [(key, (key == self.crash_key, fn, arg, self.marker_dir)) for key, arg in items]
        return self.inner.map_unordered(helpers.crash_or_call, wrapped, on_start)

    def close(self) -> None:
        self.inner.close()


def test_capacity_charges_only_the_row_whose_worker_died(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kvsim capacity` runs on the same executors: a healthy row beside a crashing one is planned."""
    import sim.sweeps.executors
    from sim.planning.capacity import capacity
    from sim.planning.slo import Slo
    from sim.scenario.scenario import Scenario

    monkeypatch.setattr(
        sim.sweeps.executors,
        "make_executor",
        lambda *, jobs, scheduler, dask_local: CrashOneTask("paged|2048|1", tmp_path, jobs),
    )
    scenario = Scenario.from_dict(
        {
            "kv_cache_memory": 800 * 1024 * 4096,
            "max_model_len": 2048,
            "max_num_seqs": 1,
            "constant_step_s": 0.01,
            "num_prompts": 50,
            "workload": {
                "source": "sharegpt",
                "arrival": "constant",
                "max_tokens_policy": "exact",
                "params": {"prompt_len": "fixed(32)", "output_len": "fixed(10)"},
            },
        }
    )
    plan = capacity(
        scenario, slo=Slo(ttft_p99_s=0.015), allocators=["contiguous", "paged"], max_model_lens=[2048], jobs=2
    )
    assert sorted(p.name for p in tmp_path.glob("died-*")) == ["died-1", "died-2", "died-3"]
    assert len(list(tmp_path.glob("started-*"))) == 1  # the healthy row ran once, never restarted
    assert plan.failures == {"paged|2048|1": "worker process died (3 attempts)"}
    assert [(r["allocator"], r["max_model_len"]) for r in plan.rows] == [("contiguous", 2048)]
    assert plan.rows[0]["max_rate_req_s"] > 0


def test_local_pool_left_early_hands_no_stale_result_to_the_next_map() -> None:
    executor = LocalProcessExecutor(2)
    try:
        outcomes = executor.map_unordered(
            helpers.sleep_then_echo, [("fast", ("fast", 0.0)), ("slow", ("slow", 30.0))]
        )
        assert next(outcomes).key == "fast"
        outcomes.close()  # the caller stops reading while "slow" still runs
        assert executor.running == 0
        again = list(executor.map_unordered(helpers.sleep_then_echo, [("next", ("next", 0.0))]))
        assert [(o.key, o.value, o.attempts) for o in again] == [("next", "next", 1)]
    finally:
        executor.close()


def test_local_pool_reports_an_argument_that_does_not_pickle() -> None:
    executor = LocalProcessExecutor(1)
    try:
        items = [("bad", lambda: None), ("good", ("good", 0.0))]
        outcomes = {o.key: o for o in executor.map_unordered(helpers.sleep_then_echo, items)}
    finally:
        executor.close()
    assert not outcomes["bad"].ok and "pickle" in outcomes["bad"].error.lower()
    assert outcomes["good"].ok and outcomes["good"].value == "good"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"jobs": 0, "scheduler": None, "dask_local": None}, "argument 'jobs': must be an integer >= 1"),
        (
            {"jobs": None, "scheduler": None, "dask_local": -1},
            "argument 'dask_local': must be an integer >= 1",
        ),
        ({"jobs": None, "scheduler": "tcp://x:1", "dask_local": 2}, "exclusive"),
        ({"jobs": None, "scheduler": "localhost", "dask_local": None}, "tcp://HOST:PORT"),
    ],
)
def test_bad_backend_flags(kwargs: dict, message: str) -> None:
    with pytest.raises(ExecutorError, match=message):
        check_backend_args(**kwargs)
    with pytest.raises(ExecutorError, match=message):
        make_executor(**kwargs)


def test_dask_cluster_reschedules_the_task_of_a_dead_worker(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    import logging

    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.CRITICAL,
    ) as cluster:
        executor = make_executor(scheduler=cluster.scheduler_address)
        try:
            assert executor.remote and executor.slots == 2
            items = [(str(i), (i, str(tmp_path))) for i in range(5)]
            outcomes = {o.key: o for o in executor.map_unordered(helpers.square_or_die, items)}
            assert {k: o.value for k, o in outcomes.items() if o.ok} == {str(i): i * i for i in range(5)}
            assert (tmp_path / "seen-3").exists()  # value 3 really killed a worker before succeeding
        finally:
            executor.close()


def test_unreachable_scheduler_is_one_line() -> None:
    pytest.importorskip("distributed")
    with pytest.raises(ExecutorError, match=r"argument 'scheduler' \(tcp://127.0.0.1:9\): cannot connect"):
        DaskExecutor(scheduler="tcp://127.0.0.1:9", connect_timeout_s=0.5)
