"""Time kernels with CUDA events: warm-up, L2 flush between repeats, median and p10/p90.

Why each step: the first launch pays module loading and cold TLBs (warm-up); a decode step reads KV
that is not in L2 (so every repeat starts from a flushed L2, by zeroing a buffer >= 4x the L2 size,
read from the device at run time); GPU timings have a long right tail (median, with p10/p90 for the
spread, over >= 20 repeats). Kernels under ~20 us are dominated by launch gaps, so they are timed as a
CUDA graph of several launches, each on its own disjoint copy of the data so that every launch still
reads from DRAM, and the graph's time is divided by the number of launches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

MIN_REPEATS = 20
GRAPH_BELOW_S = 20e-6
L2_FLUSH_FACTOR = 4
MAX_REPLICAS = 32  # disjoint copies a graph cycles through, at most


@dataclass(frozen=True)
class Timing:
    """Summary of one timed kernel: seconds per launch."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int
    launches_per_sample: int  # > 1 when timed as a CUDA graph of disjoint replicas

    def as_dict(self) -> dict[str, float | int]:
        return {
            "median_s": self.median_s,
            "p10_s": self.p10_s,
            "p90_s": self.p90_s,
            "repeats": self.repeats,
            "launches_per_sample": self.launches_per_sample,
        }


def summarize(samples_s: Sequence[float], launches_per_sample: int = 1) -> Timing:
    """Median and p10/p90 (linear interpolation) of per-sample seconds, divided per launch."""
    values = np.asarray(samples_s, dtype=np.float64) / launches_per_sample
    if values.size == 0 or not np.isfinite(values).all() or (values < 0).any():
        raise ValueError(f"need finite non-negative timing samples, got {samples_s!r}")
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return Timing(float(median), float(p10), float(p90), int(values.size), launches_per_sample)


def replicas_needed(working_set_bytes: int, l2_bytes: int, max_replicas: int = MAX_REPLICAS) -> int:
    """Disjoint copies a graph must cycle through so that its launches together overflow L2 4x."""
    if working_set_bytes <= 0:
        return 1
    need = -(-(L2_FLUSH_FACTOR * l2_bytes) // working_set_bytes)
    return int(min(max(need, 2), max_replicas))


class EventTimer:
    """CUDA-event timer on one non-blocking stream, with an L2-flush buffer sized from the device."""

    graph_below_s: float = GRAPH_BELOW_S  # kernels faster than this are timed as CUDA graphs

    def __init__(self, cupy: ModuleType, l2_bytes: int | None = None) -> None:
        self.cupy = cupy
        if l2_bytes is None:
            l2_bytes = int(cupy.cuda.runtime.getDeviceProperties(0)["l2CacheSize"])
        self.l2_bytes = int(l2_bytes)
        self.flush_bytes = L2_FLUSH_FACTOR * self.l2_bytes
        self.flush_buffer = cupy.empty(self.flush_bytes, dtype=cupy.uint8)
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def flush_l2(self) -> None:
        """Overwrite L2 by zeroing a buffer 4x its size (memset on the timing stream)."""
        self.cupy.cuda.runtime.memsetAsync(self.flush_buffer.data.ptr, 0, self.flush_bytes, self.stream.ptr)

    def _time_once(self, run: Callable[[], None]) -> float:
        start, end = self.cupy.cuda.Event(), self.cupy.cuda.Event()
        self.flush_l2()
        start.record(self.stream)
        run()
        end.record(self.stream)
        end.synchronize()
        return float(self.cupy.cuda.get_elapsed_time(start, end)) * 1e-3

    def time(
        self,
        launches: Sequence[Callable[[], None]],
        *,
        repeats: int = MIN_REPEATS,
        graph_below_s: float | None = None,
    ) -> Timing:
        """Time `launches[0]`; if it takes < graph_below_s, time a graph of all `launches` instead.

        `launches` are the same operation on disjoint replicas of its data (see replicas_needed);
        each must enqueue its kernels on the current stream.
        """
        repeats = max(int(repeats), MIN_REPEATS)
        graph_below_s = self.graph_below_s if graph_below_s is None else graph_below_s
        with self.stream:
            launches[0]()  # warm-up: module load, first-touch
            self.stream.synchronize()
            probe = summarize([self._time_once(launches[0]) for _ in range(3)])
            if probe.median_s >= graph_below_s or len(launches) == 1:
                samples = [self._time_once(launches[0]) for _ in range(repeats)]
                return summarize(samples)
            graph = self._capture(launches)
            graph.launch(self.stream)  # warm-up of the graph itself
            self.stream.synchronize()
            samples = [self._time_once(lambda: graph.launch(self.stream)) for _ in range(repeats)]
            return summarize(samples, launches_per_sample=len(launches))

    def _capture(self, launches: Sequence[Callable[[], None]]) -> Any:
        self.stream.begin_capture()
        try:
            for launch in launches:
                launch()
        finally:
            graph = self.stream.end_capture()
        return graph

    def copy_ceiling(self, nbytes: int, repeats: int = MIN_REPEATS) -> tuple[float, Timing]:
        """Device-to-device copy bandwidth, counting bytes read plus bytes written (bytes/s)."""
        cp = self.cupy
        src = cp.empty(nbytes, dtype=cp.uint8)
        dst = cp.empty(nbytes, dtype=cp.uint8)
        src.fill(1)

        def run() -> None:
            cp.cuda.runtime.memcpyAsync(
                dst.data.ptr, src.data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice, self.stream.ptr
            )

        timing = self.time([run], repeats=repeats)
        return 2 * nbytes / timing.median_s, timing

    def read_ceiling(
        self, kernels: Any, nbytes: int, num_sms: int, repeats: int = MIN_REPEATS
    ) -> tuple[float, Timing]:
        """Streaming-read bandwidth of the stream_read kernel over `nbytes` (bytes/s)."""
        cp = self.cupy
        src = cp.ones(nbytes // 16 * 16, dtype=cp.uint8)
        sink = cp.zeros(1, dtype=cp.uint32)
        timing = self.time([lambda: kernels.stream_read(src, sink, num_sms)], repeats=repeats)
        return nbytes / timing.median_s, timing
