"""Where sweep cells run: local worker processes, or a Dask distributed cluster.

Why an abstraction: a sweep (and the capacity planner's independent bisections) is a bag of independent,
seconds-long tasks. The caller only needs "run fn over these items, hand me outcomes as they finish,
tell me how many are running", whether the workers are 2 local processes or 200 cluster cores. Both
backends retry a task whose worker *process dies* (OOM kill, segfault): locally, the dead worker is
replaced and only the task it ran is charged an attempt and resubmitted; Dask's scheduler reschedules
it itself (up to its `allowed-failures`), and recomputes a finished result lost with its worker. An
ordinary exception is not retried: `fn` is expected to return its own failure.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any, Protocol

from sim.errors import KvsimError
from sim.sweeps.worker_pool import WorkerPool, first_line

DEFAULT_MAX_ATTEMPTS = 3  # a task whose worker dies is tried at most this many times


class ExecutorError(KvsimError):
    """A backend that cannot start: bad --jobs, unreachable scheduler, Dask not installed."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one task: `value` is fn's return value when `ok`, else `error` is one line."""

    key: str
    ok: bool
    value: Any
    error: str
    attempts: int


class CellExecutor(Protocol):
    """Runs `fn(arg)` for every (key, arg) and yields an Outcome per key as each finishes."""

    slots: int

    @property
    def running(self) -> int: ...

    def map_unordered(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[tuple[str, Any]],
        on_start: Callable[[], None] | None = None,
    ) -> Iterator[Outcome]: ...

    def close(self) -> None: ...


def _first_line(exc: BaseException) -> str:
    return first_line(exc)


def _died(key: str, attempts: int) -> Outcome:
    return Outcome(key, False, None, f"worker process died ({attempts} attempts)", attempts)


class LocalProcessExecutor:
    """Local worker processes with at most `jobs` tasks in flight; a dead worker is replaced.

    Workers are started with "spawn": the parent may hold threads (the progress bar, Dask) and a
    forked child could inherit a held lock. Each worker runs one task at a time over its own pipe
    (`sim.sweeps.worker_pool`), so when a worker dies only the task it was running is charged an attempt and
    retried; the tasks of the other workers run on undisturbed.
    """

    def __init__(
        self,
        jobs: int | None = None,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        start_method: str = "spawn",
    ) -> None:
        if jobs is None:
            jobs = os.cpu_count() or 1
        _check_count("jobs", jobs)
        self.slots = jobs
        self.max_attempts = max_attempts
        self._pool = WorkerPool(jobs, multiprocessing.get_context(start_method))

    @property
    def running(self) -> int:
        return self._pool.busy

    def map_unordered(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[tuple[str, Any]],
        on_start: Callable[[], None] | None = None,
    ) -> Iterator[Outcome]:
        """Outcomes in completion order; `on_start()` is called whenever tasks were handed to workers."""
        args = dict(items)
        pending: deque[str] = deque(key for key, _ in items)
        attempts: Counter[str] = Counter()
        try:
            while pending or self._pool.busy:
                started = False
                while pending and self._pool.busy < self.slots:
                    key = pending.popleft()
                    attempts[key] += 1
                    try:
                        self._pool.submit(key, fn, args[key])
                    except Exception as exc:
                        yield Outcome(key, False, None, _first_line(exc), attempts[key])
                        continue
                    started = True
                if started and on_start is not None:
                    on_start()
                for event in self._pool.wait_any():
                    key = event.key
                    if not event.died:
                        yield Outcome(key, event.ok, event.value, event.error, attempts[key])
                    elif attempts[key] < self.max_attempts:
                        pending.appendleft(key)  # only the task of the dead worker is tried again
                    else:
                        yield _died(key, attempts[key])
        finally:
            # The caller stopped early (an exception, Ctrl-C, a break): results nobody will read must
            # not reach the next map_unordered, so the workers still running tasks are stopped.
            self._pool.abandon_running()

    def close(self) -> None:
        self._pool.close()


class DaskExecutor:
    """Cells on a Dask distributed cluster: an existing scheduler, or a LocalCluster we start.

    A worker that dies has its tasks rescheduled by the scheduler; after `allowed-failures`
    deaths the task fails with KilledWorker, which becomes a failed cell, never a crashed sweep.
    """

    def __init__(
        self,
        *,
        scheduler: str | None = None,
        local_workers: int | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if (scheduler is None) == (local_workers is None):
            raise ExecutorError("give exactly one of --scheduler ADDR and --dask-local N")
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:
            raise ExecutorError("Dask is not installed: pip install 'kvsim[dask]'") from exc
        self._cluster = None
        if local_workers is not None:
            _check_count("dask_local", local_workers)
            self._cluster = LocalCluster(
                n_workers=local_workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            self.client = Client(self._cluster)
        else:
            try:
                self.client = Client(scheduler, timeout=f"{connect_timeout_s}s")
            except (OSError, TimeoutError, ValueError) as exc:
                raise ExecutorError(
                    f"argument 'scheduler' ({scheduler}): cannot connect ({_first_line(exc)})"
                ) from exc
        self.remote = local_workers is None
        self._in_flight = 0

    @property
    def slots(self) -> int:
        threads = self.client.nthreads()
        return max(1, sum(threads.values()))

    @property
    def running(self) -> int:
        return min(self._in_flight, self.slots)

    def map_unordered(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[tuple[str, Any]],
        on_start: Callable[[], None] | None = None,
    ) -> Iterator[Outcome]:
        """Outcomes in completion order; `on_start()` is called once every task is submitted."""
        from distributed import as_completed

        futures = {
            self.client.submit(fn, arg, key=f"kvsim-{key}-{os.urandom(4).hex()}", pure=False): key
            for key, arg in items
        }
        self._in_flight = len(futures)
        if on_start is not None:
            on_start()
        try:
            for future in as_completed(list(futures)):
                key = futures[future]
                self._in_flight -= 1
                # Not `future.status`: a task that finished on a worker that died before its result was
                # read is "lost" and recomputed; its status is then "lost" or "pending", not "error".
                # result() waits for the recompute (or raises the task's error, KilledWorker included).
                try:
                    value = future.result()
                except (Exception, CancelledError) as exc:
                    yield Outcome(key, False, None, _first_line(exc), 1)
                else:
                    yield Outcome(key, True, value, "", 1)
                future.release()
        finally:
            for future in futures:
                if not future.done():
                    future.cancel()
            self._in_flight = 0

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def _check_count(argument: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ExecutorError(f"argument '{argument}': must be an integer >= 1 (got {value!r})")


def check_backend_args(*, jobs: int | None, scheduler: str | None, dask_local: int | None) -> None:
    """Refuse contradictory or out-of-range backend flags before any cell runs."""
    _check_count("jobs", jobs)
    _check_count("dask_local", dask_local)
    if scheduler is not None and dask_local is not None:
        raise ExecutorError("argument 'scheduler' and argument 'dask_local' are exclusive: give one of them")
    if scheduler is not None and (not isinstance(scheduler, str) or "://" not in scheduler):
        raise ExecutorError(
            f"argument 'scheduler': must be an address such as tcp://HOST:PORT (got {scheduler!r})"
        )


def make_executor(
    *, jobs: int | None = None, scheduler: str | None = None, dask_local: int | None = None
) -> LocalProcessExecutor | DaskExecutor:
    """The backend the flags ask for: Dask when --scheduler or --dask-local is given, else processes."""
    check_backend_args(jobs=jobs, scheduler=scheduler, dask_local=dask_local)
    if scheduler is not None or dask_local is not None:
        return DaskExecutor(scheduler=scheduler, local_workers=dask_local)
    return LocalProcessExecutor(jobs)
