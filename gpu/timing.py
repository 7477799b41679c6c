"""Time kernels with CUDA events: warm-up, L2 flush between repeats, median and p10/p90.

Why each step: the first launch pays module loading and cold TLBs (warm-up); a decode step reads KV
that is not in L2 (so every repeat starts from a flushed L2, by READING a buffer >= 4x the L2 size,
read from the device at run time: a read leaves only clean lines, whereas zeroing a buffer would leave
tens of MB of dirty lines for the timed kernel to write back); GPU timings have a long right tail
(median, with p10/p90 for the spread, over >= 20 repeats). Kernels under ~20 us are dominated by launch
gaps, so they are timed as a CUDA graph of several launches, each on its own disjoint copy of the data
so that every launch still reads from DRAM, and the graph's time is divided by the number of launches.

Streams: uploads (`cupy.asarray`, fills) run on the legacy default stream, the timer on its own
non-blocking stream, which does NOT wait for the default stream. `time()` therefore synchronises the
whole device before its first launch, so no launch can read a block table, plan or pool that is still
in flight (tests/_gpu_fake_cupy.py models the two streams and fails on such a read).
"""

from __future__ import annotations

import time
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
    samples_s: tuple[float, ...] = ()  # every sample, per launch (for Vidur-style min/max/mean/std)

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
    return Timing(
        float(median),
        float(p10),
        float(p90),
        int(values.size),
        launches_per_sample,
        tuple(map(float, values)),
    )


def replicas_needed(working_set_bytes: int, l2_bytes: int, max_replicas: int = MAX_REPLICAS) -> int:
    """Disjoint copies a graph must cycle through so that its launches together overflow L2 4x."""
    if working_set_bytes <= 0:
        return 1
    need = -(-(L2_FLUSH_FACTOR * l2_bytes) // working_set_bytes)
    return int(min(max(need, 2), max_replicas))


class EventTimer:
    """CUDA-event timer on one non-blocking stream, with an L2-flush buffer sized from the device."""

    graph_below_s: float = GRAPH_BELOW_S  # kernels faster than this are timed as CUDA graphs

    def __init__(self, cupy: ModuleType, l2_bytes: int | None = None, *, kernels: Any, num_sms: int) -> None:
        self.cupy = cupy
        if l2_bytes is None:
            l2_bytes = int(cupy.cuda.runtime.getDeviceProperties(0)["l2CacheSize"])
        self.l2_bytes = int(l2_bytes)
        self.kernels = kernels
        self.num_sms = int(num_sms)
        self.flush_bytes = L2_FLUSH_FACTOR * self.l2_bytes // 16 * 16
        self.flush_buffer = cupy.zeros(self.flush_bytes, dtype=cupy.uint8)  # zeroed once, before any timing
        self.flush_sink = cupy.zeros(1, dtype=cupy.uint32)
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def synchronize_device(self) -> None:
        """Wait for every stream: uploads on the default stream must land before a timed launch."""
        self.cupy.cuda.runtime.deviceSynchronize()

    def flush_l2(self) -> None:
        """Evict L2 by streaming-reading a buffer 4x its size (on the current stream: the timing stream).

        Reading, not zeroing: a memset leaves dirty lines that the timed kernel would pay to write back.
        """
        self.kernels.stream_read(self.flush_buffer, self.flush_sink, self.num_sms)

    def _time_once(self, run: Callable[[], None]) -> float:
        start, end = self.cupy.cuda.Event(), self.cupy.cuda.Event()
        with self.stream:
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
        self.synchronize_device()  # uploads on the default stream complete before the first launch
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

    def warm_up(self, seconds: float = 1.0, nbytes: int = 2**30) -> int:
        """Keep the GPU busy with streaming reads for `seconds` so clocks ramp up before the ceilings.

        Why: an idle H200 sits at a few hundred MHz (SM 345 MHz idle, 1980 MHz under load, per
        /work/.library/device/KINDS.md); ceilings measured cold would understate the bandwidth.
        Returns the launches made. The buffer is freed (and the memory pool emptied) afterwards.
        """
        cp = self.cupy
        src = cp.zeros(nbytes // 16 * 16, dtype=cp.uint8)
        self.synchronize_device()
        launches = 0
        deadline = time.perf_counter() + seconds
        with self.stream:
            while True:
                for _ in range(8):
                    self.kernels.stream_read(src, self.flush_sink, self.num_sms)
                launches += 8
                self.stream.synchronize()
                if time.perf_counter() >= deadline:
                    break
        del src
        self.free_pool()
        return launches

    def free_pool(self) -> None:
        """Hand CuPy's cached blocks back to the device (after the ceilings' multi-GB buffers)."""
        self.synchronize_device()
        self.cupy.get_default_memory_pool().free_all_blocks()

    def copy_ceiling(self, nbytes: int, repeats: int = MIN_REPEATS) -> tuple[float, Timing]:
        """Device-to-device copy bandwidth, counting bytes read plus bytes written (bytes/s).

        The two buffers are released to the device afterwards, so they do not sit in CuPy's pool for
        the rest of the run.
        """
        cp = self.cupy
        buffers = [cp.empty(nbytes, dtype=cp.uint8), cp.empty(nbytes, dtype=cp.uint8)]  # src, dst
        buffers[0].fill(1)
        src_ptr, dst_ptr, stream_ptr = buffers[0].data.ptr, buffers[1].data.ptr, self.stream.ptr

        def run() -> None:
            cp.cuda.runtime.memcpyAsync(
                dst_ptr, src_ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice, stream_ptr
            )

        timing = self.time([run], repeats=repeats)
        buffers.clear()
        self.free_pool()
        return 2 * nbytes / timing.median_s, timing

    def read_ceiling(self, nbytes: int, repeats: int = MIN_REPEATS) -> tuple[float, Timing]:
        """Streaming-read bandwidth of the stream_read kernel over `nbytes` (bytes/s); buffer freed after."""
        cp = self.cupy
        buffers = [cp.ones(nbytes // 16 * 16, dtype=cp.uint8), cp.zeros(1, dtype=cp.uint32)]  # src, sink
        measured = int(buffers[0].nbytes)
        timing = self.time(
            [lambda: self.kernels.stream_read(buffers[0], buffers[1], self.num_sms)], repeats=repeats
        )
        buffers.clear()
        self.free_pool()
        return measured / timing.median_s, timing
