"""When requests reach the server: the engine's arrival source (open loop or closed loop of users).

Why its own module: arrivals are the one input of the engine that is a process of its own (a closed
loop feeds back finished requests as new arrivals); the engine only peeks at and pops from it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np
import pandas as pd


class ArrivalSource:
    """When requests reach the server: an open loop (table times) or a closed loop of users.

    Closed loop (`df.attrs["closed_loop"] = {"users": U, "think_s": T}`): the first U requests
    arrive at 0; whenever a request ends (finished or rejected) its user sends the next unsent
    request of the table T seconds later. Per session (a `think_s` column): `_init_sessions`.
    Pending arrivals sit in a heap so the server can peek at the next one.
    """

    def __init__(self, requests: pd.DataFrame) -> None:
        self.num_requests = len(requests)
        spec = requests.attrs.get("closed_loop")
        self._next_turn: list[int] | None = None  # a closed loop per session (`think_s`): see below
        self.closed = spec is not None or "think_s" in requests
        self._heap: list[tuple[float, int]] = []
        if "think_s" in requests:
            self._init_sessions(requests)
        elif self.closed:
            users = int(spec["users"])
            self.think_s = float(spec["think_s"])
            if users < 1 or self.think_s < 0 or not math.isfinite(self.think_s):
                raise ValueError(f"closed_loop needs users >= 1 and finite think_s >= 0 (got {spec})")
            self._next_unsent = min(users, self.num_requests)
            self._heap = [(0.0, req) for req in range(self._next_unsent)]
        else:
            # A memoryview reads Python floats as fast as a list, in 8 bytes a request instead of ~32.
            self._times = memoryview(np.ascontiguousarray(requests["arrival_s"].to_numpy(np.float64)))
            self._ptr = 0
        self.on_push: Callable[[float], None] | None = None
        # Time of the next arrival not yet released (inf when none is pending), kept up to date by every
        # pop and push: the engine reads it on every turn, and an attribute read costs a fraction of a call.
        self.next_s = math.inf
        self._update_next()

    def _update_next(self) -> None:
        if self.closed:
            self.next_s = self._heap[0][0] if self._heap else math.inf
        else:
            self.next_s = self._times[self._ptr] if self._ptr < self.num_requests else math.inf

    def peek_s(self) -> float:
        """Time of the next arrival not yet released (inf when none is pending): `next_s`."""
        return self.next_s

    def pop_due(self, now_s: float) -> list[tuple[float, int]]:
        """Remove and return every (arrival_s, request) with arrival_s <= now_s, in order."""
        due: list[tuple[float, int]] = []
        if self.closed:
            heap = self._heap
            while heap and heap[0][0] <= now_s:
                due.append(heapq.heappop(heap))
            self.next_s = heap[0][0] if heap else math.inf
            return due
        times, ptr = self._times, self._ptr
        while ptr < self.num_requests and times[ptr] <= now_s:
            due.append((times[ptr], ptr))
            ptr += 1
        self._ptr = ptr
        self.next_s = times[ptr] if ptr < self.num_requests else math.inf
        return due

    def _init_sessions(self, requests: pd.DataFrame) -> None:
        """A closed loop per session: first turns at their own `arrival_s`, each later turn `think_s`
        after the previous turn of its session ended (answered or rejected).

        Why: a multi-turn trace records when each turn was sent on the server it was measured on; on a
        slower or faster simulated server a user still reads the answer, then thinks, then sends the
        next turn (workloads: docs/workloads.md "Multi-turn sessions"). Rows without a session
        (session_id -1) arrive at their own time.
        """
        sessions = requests["session_id"].to_numpy(np.int64)
        rows = pd.Series(np.arange(self.num_requests), dtype=np.int64)
        in_session = sessions >= 0
        following = rows[in_session].groupby(sessions[in_session]).shift(-1)
        next_turn = np.full(self.num_requests, -1, dtype=np.int64)
        next_turn[in_session] = following.fillna(-1).to_numpy(dtype=np.int64)
        later = np.zeros(self.num_requests, dtype=bool)
        later[next_turn[next_turn >= 0]] = True
        times = requests["arrival_s"].to_numpy(np.float64)
        self._next_turn = next_turn.tolist()
        self._think_s = requests["think_s"].to_numpy(np.float64).tolist()
        self._heap = [
            (float(times[req]), int(req)) for req in np.flatnonzero(~later)
        ]  # sorted: arrival order
        self._next_unsent = len(self._heap)  # counts requests released into the heap

    def request_done(self, req: int, now_s: float) -> None:
        """Closed loop: the user of `req` thinks, then sends the next unsent request (per session: the
        next turn of `req`'s session)."""
        if self._next_turn is not None:
            nxt = self._next_turn[req]
            if nxt >= 0:
                at_s = now_s + self._think_s[nxt]
                heapq.heappush(self._heap, (at_s, nxt))
                self.next_s = self._heap[0][0]
                self._next_unsent += 1
                if self.on_push is not None:
                    self.on_push(at_s)
            return
        if not self.closed or self._next_unsent >= self.num_requests:
            return
        at_s = now_s + self.think_s
        heapq.heappush(self._heap, (at_s, self._next_unsent))
        self.next_s = self._heap[0][0]
        self._next_unsent += 1
        if self.on_push is not None:
            self.on_push(at_s)

    @property
    def exhausted(self) -> bool:
        if self.closed:
            return not self._heap and self._next_unsent >= self.num_requests
        return self._ptr >= self.num_requests
