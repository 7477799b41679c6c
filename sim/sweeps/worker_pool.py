"""Local worker processes, one pipe each, so that a dead worker is charged for its own task only.

Why not concurrent.futures.ProcessPoolExecutor: when one of its workers dies (OOM kill, segfault),
the whole pool breaks and every task in flight fails with BrokenProcessPool, without saying which
worker ran which task. A sweep then charges an attempt to every healthy cell that happened to run
beside a crashing one, and a healthy cell can end as "worker process died (3 attempts)". Here each
worker runs one task at a time over its own pipe: the parent always knows which task a dead worker
held, the other workers keep running, and only the dead one is replaced.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from typing import Any

JOIN_TIMEOUT_S = 5.0  # how long close() waits for an idle worker to exit before terminating it


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message`, the one-line error of a failed task."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _serve(conn: Connection) -> None:
    """Worker loop: receive (fn, arg), send back (True, value) or (False, one-line error); None stops.

    Ctrl-C reaches every process of the terminal's group; the parent alone handles it (it stops the
    workers), so a worker ignores SIGINT instead of printing its own traceback.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the CLI's SIGTERM handler (`sim.interrupts`), which would raise in a
    # task and print a traceback; a worker sent SIGTERM (`timeout`, a batch scheduler) just ends.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The parent started us with SIGINT blocked (see `_idle_worker`): now that it is ignored, a
    # Ctrl-C that arrived while this process was starting is dropped instead of raising in an import.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent went away
            return
        if message is None:
            return
        fn, arg = message
        try:
            reply: tuple[bool, Any] = (True, fn(arg))
        except Exception as exc:
            reply = (False, first_line(exc))
        try:
            conn.send(reply)
        except Exception as exc:
            conn.send((False, f"result cannot be sent back: {first_line(exc)}"))


@dataclass
class _Worker:
    """One worker process, the parent's end of its pipe, and the task it runs (None: idle)."""

    process: multiprocessing.process.BaseProcess
    conn: Connection
    task: str | None = None


@dataclass(frozen=True)
class TaskEvent:
    """A task that ended: `finished` (ok/value or ok=False/error) or its worker `died`."""

    key: str
    died: bool
    ok: bool = False
    value: Any = None
    error: str = ""


class WorkerPool:
    """`size` worker processes started on demand; `submit` hands one task to an idle worker."""

    def __init__(self, size: int, context: BaseContext) -> None:
        self.size = size
        self._context = context
        self._workers: list[_Worker] = []

    @property
    def busy(self) -> int:
        return sum(1 for w in self._workers if w.task is not None)

    def _idle_worker(self) -> _Worker:
        for worker in self._workers:
            if worker.task is None:
                return worker
        if len(self._workers) >= self.size:
            raise RuntimeError("every worker is busy")  # a caller bug: submit at most `size` tasks
        parent_end, child_end = self._context.Pipe(duplex=True)
        # Daemonic: ended with the parent even if close() is never called (a task must not itself
        # start processes, which simulation cells and capacity rows do not).
        process = self._context.Process(target=_serve, args=(child_end,), daemon=True)
        # SIGINT blocked while the worker starts, so it inherits the block and cannot die of a Ctrl-C
        # (with a traceback) before `_serve` ignores it; the parent gets any pending one right after.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child_end.close()
        worker = _Worker(process, parent_end)
        self._workers.append(worker)
        return worker

    def submit(self, key: str, fn: Callable[[Any], Any], arg: Any) -> None:
        """Start `fn(arg)` on an idle worker; raises what pickling `fn` or `arg` raises (nothing started)."""
        worker = self._idle_worker()
        try:
            worker.conn.send((fn, arg))  # pickles first, so a pickling error sends nothing
        except (BrokenPipeError, ConnectionResetError):  # an idle worker that died meanwhile: replace it
            self._retire(worker)
            worker = self._idle_worker()
            worker.conn.send((fn, arg))
        worker.task = key

    def wait_any(self) -> list[TaskEvent]:
        """Block until at least one busy worker finished its task or died; what happened to each."""
        busy = [w for w in self._workers if w.task is not None]
        if not busy:
            return []
        ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy]))
        events: list[TaskEvent] = []
        for worker in busy:
            if worker.conn not in ready and worker.process.sentinel not in ready:
                continue
            key = worker.task
            assert key is not None
            reply = _read_reply(worker.conn)
            if reply is None:  # the worker died while it ran this task: charge this task, nobody else
                self._retire(worker)
                events.append(TaskEvent(key, died=True))
                continue
            ok, payload = reply
            worker.task = None
            if not worker.process.is_alive():
                self._retire(worker)
            if ok:
                events.append(TaskEvent(key, died=False, ok=True, value=payload))
            else:
                events.append(TaskEvent(key, died=False, ok=False, error=str(payload)))
        return events

    def _retire(self, worker: _Worker) -> None:
        """Forget a dead (or abandoned) worker; a new one is started when a task needs it."""
        if worker.process.is_alive():
            worker.process.terminate()
        worker.process.join()
        worker.conn.close()
        self._workers.remove(worker)

    def abandon_running(self) -> None:
        """Stop the workers whose tasks nobody will read (the caller stopped early): no stale results."""
        for worker in [w for w in self._workers if w.task is not None]:
            self._retire(worker)

    def close(self) -> None:
        """Stop every worker: idle ones are asked to exit, busy or stuck ones are terminated."""
        self.abandon_running()
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except OSError:
                pass
        for worker in list(self._workers):
            worker.process.join(JOIN_TIMEOUT_S)
            self._retire(worker)


def _read_reply(conn: Connection) -> tuple[bool, Any] | None:
    """The worker's (ok, value-or-error) reply, or None when it died without a (complete) reply.

    A worker that sent its result and then died still finished its task, so the pipe is read first.
    """
    try:
        if not conn.poll():
            return None
        return conn.recv()
    except (EOFError, OSError):
        return None
    except Exception as exc:
        return False, f"result cannot be read: {first_line(exc)}"
