"""How long one serving step takes: an analytic roofline, optionally calibrated on a real GPU.

Why a roofline: a decode step reads every weight once and every decoding sequence's KV once, and does
2 x parameters FLOPs per token, so its time is the larger of a memory time and a compute time, plus a
fixed per-step overhead (scheduling, sampling, kernel launches). Both times are linear in the step's
token count and context sum, which is what lets the engine jump k decode steps at once: the total of k
steps is a sum of the maximum of two lines, which has a closed form (`decode_steps_time_s`).

A calibration profile from gpu/ (schema v1, docs/cost_model.md "Cost model") replaces the KV-read term
with a fit measured on the GPU for the allocator's real layout, and the paged layout factor with the
measured paged-over-contiguous ratio. Units: seconds, bytes, FLOPs; all per GPU of the TP group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.step_cost_limits import check_step_cost

if TYPE_CHECKING:
    from sim.config import Scenario

# Analytic paged-layout factor: KV-read time of a paged kernel over a contiguous one at block size b is
# 1 + LAYOUT_BASE_OVERHEAD + LAYOUT_PER_BLOCK_OVERHEAD / b  (1.20 at b=1, 1.03 at b=16, 1.02 at b=128).
LAYOUT_BASE_OVERHEAD = 0.02
LAYOUT_PER_BLOCK_OVERHEAD = 0.18

# Which measured layout an allocator's KV looks like to the attention kernel.
PAGED_LAYOUT = "paged_shuffled"
CONTIGUOUS_LAYOUT = "contiguous"


def analytic_layout_factor(block_size: int) -> float:
    """Paged-over-contiguous KV-read time at `block_size` without a profile (see module constants).

    Why this shape: the per-block cost (block-table lookup, a partial vector load at each block edge)
    is paid once per block, so it shrinks as 1/b; a small floor remains for the indirection itself.
    The vLLM paper measured +20-26 % for its first kernel; current kernels are within a few percent.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1 (got {block_size})")
    return 1.0 + LAYOUT_BASE_OVERHEAD + LAYOUT_PER_BLOCK_OVERHEAD / block_size


def prefill_attention_pairs(chunk_tokens: Any, cached_tokens: Any = 0) -> Any:
    """Causal (query, key) pairs of prefilling `chunk_tokens` after `cached_tokens` already in the cache.

    The engine sums this over the step's prefilling sequences and passes it as `prefill_context_tokens`.
    Works elementwise on NumPy arrays.
    """
    chunk = np.asarray(chunk_tokens, dtype=np.int64)
    cached = np.asarray(cached_tokens, dtype=np.int64)
    pairs = chunk * cached + chunk * (chunk + 1) // 2
    return int(pairs) if pairs.ndim == 0 else pairs


# ------------------------------------------------------------------------------------------------------------
# Calibration profiles


def load_calibration(path: str | Path) -> dict[str, Any]:
    """Read and validate a calibration profile (gpu.profile, schema v1).

    Raises gpu.errors.GpuError, one line naming the file and the bad key, for a missing or bad file.
    """
    from gpu.profile import load_profile

    return load_profile(path)


def _nearest_block(candidates: list[int], block_size: int) -> int:
    """Nearest on a log scale (block sizes are powers of two in the grid); ties go to the smaller one."""
    return min(candidates, key=lambda b: (abs(math.log2(b) - math.log2(block_size)), b))


@dataclass(frozen=True, slots=True)
class KvReadFit:
    """Measured time of ONE attention kernel call (one layer).

    t = a_s + bytes / bytes_per_s + c_s_per_block x blocks_touched; a step calls it once per layer.
    """

    layout: str
    block_size: int  # 0 for the contiguous layout
    a_s: float
    bytes_per_s: float
    c_s_per_block: float

    @classmethod
    def select(cls, profile: dict[str, Any], layout: str, block_size: int) -> KvReadFit | None:
        """The attention fit for `layout`; paged layouts at the nearest measured block size.

        Contiguous fits carry block_size 0 (the layout has no blocks; gpu/ counts one per sequence).
        """
        fits = [f for f in profile.get("fits", []) if f["kernel"] == "attention" and f["layout"] == layout]
        if layout != CONTIGUOUS_LAYOUT:
            fits = [f for f in fits if int(f["block_size"]) >= 1]
        if not fits:
            return None
        if layout == CONTIGUOUS_LAYOUT:
            fit = fits[0]
            return cls(layout, 0, float(fit["a_s"]), float(fit["bytes_per_s"]), float(fit["c_s_per_block"]))
        nearest = _nearest_block([int(f["block_size"]) for f in fits], block_size)
        fit = next(f for f in fits if int(f["block_size"]) == nearest)
        return cls(layout, nearest, float(fit["a_s"]), float(fit["bytes_per_s"]), float(fit["c_s_per_block"]))


def profile_ratio(profile: dict[str, Any], block_size: int, kernel: str = "attention") -> float | None:
    """The measured paged-over-contiguous ratio at the nearest block size, or None if the profile has none."""
    by_block = profile.get("ratios", {}).get(kernel, {})
    if not by_block:
        return None
    nearest = _nearest_block([int(b) for b in by_block], block_size)
    return float(by_block[str(nearest)])


# ------------------------------------------------------------------------------------------------------------
# The cost model


_FLOAT_ARANGE = np.arange(1024, dtype=np.float64)
_FLOAT_ARANGE.flags.writeable = False


def _float_arange(count: int) -> np.ndarray:
    """np.arange(count, dtype=float64) as a read-only view of a cached array (one per jump otherwise)."""
    global _FLOAT_ARANGE
    if count > _FLOAT_ARANGE.size:
        _FLOAT_ARANGE = np.arange(max(count, 2 * _FLOAT_ARANGE.size), dtype=np.float64)
        _FLOAT_ARANGE.flags.writeable = False
    return _FLOAT_ARANGE[:count]


def _sum_linear(first: int, stop: int, intercept: float, slope: float) -> float:
    """sum of (intercept + slope * i) for i in [first, stop)."""
    count = stop - first
    if count <= 0:
        return 0.0
    return count * intercept + slope * (first + stop - 1) * count / 2.0


def _sum_i(first: int, stop: int) -> float:
    return (first + stop - 1) * (stop - first) / 2.0


def _sum_i2(first: int, stop: int) -> float:
    def upto(n: int) -> float:  # sum of i^2 for i in [0, n)
        return (n - 1) * n * (2 * n - 1) / 6.0

    return upto(stop) - upto(first)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Step durations for one scenario. Build it with `CostModel.from_scenario(scenario)`.

    All coefficients are per GPU of the tensor-parallel group (every rank does 1/TP of the work in
    parallel; the all-reduce between ranks is not modelled).
    """

    weight_bytes: float  # per GPU, read once per step
    kv_bytes_per_token: (
        float  # per GPU: K and V of every layer, read once per step per decoding token of context
    )
    num_layers: int
    flops_per_token: float  # 2 x params / TP
    attention_flops_per_pair: float  # 4 x layers x heads x head_dim / TP, per (query, key) pair
    hbm_bytes_per_s: float  # effective: peak x hbm_efficiency
    flops_per_s: float  # effective: peak x flops_efficiency
    pcie_bytes_per_s: float
    step_overhead_s: float
    layout_factor: float  # paged-over-contiguous KV-read time (1.0 for contiguous layouts)
    block_size: int  # tokens per block of the allocator (or of the selected paged fit)
    kv_fit: KvReadFit | None = None  # measured KV-read fit for the allocator's layout
    kv_fit_scale: float = 1.0  # ratio applied when only the contiguous fit exists for a paged layout
    constant_step_s: float | None = None
    source: str = "analytic"

    @classmethod
    def from_scenario(cls, scenario: Scenario, profile: dict[str, Any] | None = None) -> CostModel:
        """The scenario's cost model; loads `scenario.calibration` unless `profile` is given."""
        model, gpu, tp = scenario.model_spec(), scenario.gpu_spec(), scenario.tensor_parallel_size
        if profile is None and scenario.calibration:
            profile = load_calibration(scenario.calibration)
        paged = scenario.allocator.name == "paged"
        block_size = scenario.block_size
        layout_factor = analytic_layout_factor(block_size) if paged else 1.0
        kv_fit, kv_fit_scale, source = None, 1.0, "analytic"
        if profile is not None:
            device = str(profile.get("device", {}).get("name", "unknown device"))
            source = f"profile:{device}" + ("" if profile.get("measured", False) else " (not measured)")
            ratio = profile_ratio(profile, block_size) if paged else None
            if ratio is not None:
                layout_factor = ratio
            kv_fit = KvReadFit.select(profile, PAGED_LAYOUT if paged else CONTIGUOUS_LAYOUT, block_size)
            if kv_fit is None and paged:  # only the contiguous fit: scale it by the layout factor
                kv_fit = KvReadFit.select(profile, CONTIGUOUS_LAYOUT, block_size)
                kv_fit_scale = layout_factor
        if scenario.kv_layout_factor is not None:  # an explicit what-if wins over both
            layout_factor = scenario.kv_layout_factor
            if kv_fit is not None and kv_fit.layout == CONTIGUOUS_LAYOUT:
                kv_fit_scale = layout_factor
        cost = cls(
            weight_bytes=scenario.weight_bytes_per_gpu(),
            kv_bytes_per_token=scenario.kv_bytes_per_token_per_gpu(),
            num_layers=model.num_layers,
            flops_per_token=2.0 * model.num_params / tp,
            attention_flops_per_pair=4.0 * model.num_layers * model.num_attention_heads * model.head_dim / tp,
            hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s * scenario.hbm_efficiency,
            flops_per_s=gpu.peak_flops * scenario.flops_efficiency,
            pcie_bytes_per_s=gpu.pcie_bandwidth_bytes_per_s,
            step_overhead_s=scenario.step_overhead_s,
            layout_factor=layout_factor,
            block_size=kv_fit.block_size if kv_fit is not None and kv_fit.block_size else block_size,
            kv_fit=kv_fit,
            kv_fit_scale=kv_fit_scale,
            constant_step_s=scenario.constant_step_s,
            source=source if scenario.constant_step_s is None else "constant",
        )
        check_step_cost(cost, scenario)  # a step of inf (or 1e300) s is refused here, by its term
        return cost

    # -- the KV-read term -----------------------------------------------------------------------------------

    def _kv_read_lines(self, num_seqs: int) -> tuple[float, float]:
        """KV-read time of `num_seqs` decoding sequences as intercept + slope x context_tokens_sum.

        With a fit, blocks touched (gpu/'s definition) are one per sequence for the contiguous layout and,
        for a paged one, context / b + num_seqs x (b - 1) / (2b): the mean partial last block. Either
        keeps the time linear in the context sum.
        """
        if num_seqs <= 0:
            return 0.0, 0.0
        fit = self.kv_fit
        if fit is None:
            return 0.0, self.kv_bytes_per_token * self.layout_factor / self.hbm_bytes_per_s
        per_block = self.num_layers * fit.c_s_per_block
        slope = self.kv_bytes_per_token / fit.bytes_per_s
        if fit.block_size == 0:
            blocks_fixed = float(num_seqs)
        else:
            blocks_fixed = num_seqs * (fit.block_size - 1) / (2.0 * fit.block_size)
            slope += per_block / fit.block_size
        intercept = self.num_layers * fit.a_s + per_block * blocks_fixed
        return intercept * self.kv_fit_scale, slope * self.kv_fit_scale

    def kv_read_time_s(
        self, num_seqs: int, context_tokens_sum: int, num_blocks_touched: int | None = None
    ) -> float:
        """Time to read the KV of `num_seqs` sequences holding `context_tokens_sum` tokens, over all layers.

        `num_blocks_touched`: block-table entries over all sequences (one layer), used only with a paged
        calibration fit (None: estimated as in `_kv_read_lines`); a contiguous fit counts one per sequence.
        """
        if num_seqs <= 0 or context_tokens_sum <= 0:
            return 0.0
        fit = self.kv_fit
        if fit is None or num_blocks_touched is None or fit.block_size == 0:
            intercept, slope = self._kv_read_lines(num_seqs)
            return intercept + slope * context_tokens_sum
        kv_bytes = context_tokens_sum * self.kv_bytes_per_token
        seconds = (
            self.num_layers * (fit.a_s + fit.c_s_per_block * num_blocks_touched) + kv_bytes / fit.bytes_per_s
        )
        return seconds * self.kv_fit_scale

    def swap_time_s(self, tokens: int) -> float:
        """Moving `tokens` of KV over PCIe one way (each rank moves its own shard in parallel)."""
        return max(0, tokens) * self.kv_bytes_per_token / self.pcie_bytes_per_s

    # -- one step -------------------------------------------------------------------------------------------

    def compute_time_s(self, tokens: int, attention_pairs: int) -> float:
        return (
            tokens * self.flops_per_token + attention_pairs * self.attention_flops_per_pair
        ) / self.flops_per_s

    def memory_time_s(self, num_decode_seqs: int, decode_context_tokens: int) -> float:
        intercept, slope = self._kv_read_lines(num_decode_seqs)
        return self.weight_bytes / self.hbm_bytes_per_s + intercept + slope * decode_context_tokens

    def step_time_s(
        self,
        prefill_tokens: int,
        num_decode_seqs: int,
        decode_context_tokens: int,
        prefill_context_tokens: int = 0,
    ) -> float:
        """Duration of one step: max(compute, memory) + overhead; 0 for an empty step.

        `decode_context_tokens`: KV tokens attended by all decoding sequences together (their context
        sum). `prefill_context_tokens`: causal (query, key) pairs of the step's prefill, see
        `prefill_attention_pairs` (0 ignores prefill attention FLOPs).
        """
        if prefill_tokens <= 0 and num_decode_seqs <= 0:
            return 0.0
        if self.constant_step_s is not None:
            return self.constant_step_s
        compute = self.compute_time_s(
            prefill_tokens + num_decode_seqs, decode_context_tokens + prefill_context_tokens
        )
        memory = self.memory_time_s(num_decode_seqs, decode_context_tokens)
        return max(compute, memory) + self.step_overhead_s

    # -- k decode-only steps at once ------------------------------------------------------------------------

    def _decode_pieces(
        self, num_decode_seqs: int, context_tokens_sum: int, k: int
    ) -> list[tuple[int, int, float, float]]:
        """Step i of k (context sum C0 + i x n) lasts intercept + slope x i on each range [lo, hi)."""
        n = num_decode_seqs
        if self.constant_step_s is not None:
            return [(0, k, self.constant_step_s, 0.0)]
        compute_0 = self.compute_time_s(n, context_tokens_sum) + self.step_overhead_s
        compute_1 = n * self.attention_flops_per_pair / self.flops_per_s
        memory_0 = self.memory_time_s(n, context_tokens_sum) + self.step_overhead_s
        _, kv_slope = self._kv_read_lines(n)
        memory_1 = n * kv_slope
        gap_0, gap_1 = compute_0 - memory_0, compute_1 - memory_1  # compute wins where gap >= 0
        if gap_1 == 0.0:  # parallel lines: one side wins every step
            split = k if gap_0 >= 0 else 0
            compute_first = True
        else:
            crossing = -gap_0 / gap_1
            split = min(k, max(0, math.ceil(crossing)))
            compute_first = gap_1 < 0  # compute wins before the crossing when its slope is smaller
        if compute_first:
            return [(0, split, compute_0, compute_1), (split, k, memory_0, memory_1)]
        return [(0, split, memory_0, memory_1), (split, k, compute_0, compute_1)]

    def decode_steps_time_s(self, num_decode_seqs: int, context_tokens_sum: int, k: int) -> float:
        """Exact total of k decode-only steps in which every sequence grows by one token per step.

        Step i has context sum `context_tokens_sum + i x num_decode_seqs`; equals the sum of
        `step_time_s(0, n, C0 + i n)` for i in range(k), in O(1).
        """
        if k <= 0 or num_decode_seqs <= 0:
            return 0.0
        pieces = self._decode_pieces(num_decode_seqs, context_tokens_sum, k)
        return sum(_sum_linear(lo, hi, intercept, slope) for lo, hi, intercept, slope in pieces)

    def decode_steps_weighted_sum(
        self, num_decode_seqs: int, context_tokens_sum: int, k: int, value_0: float, value_slope: float
    ) -> float:
        """sum over the k steps of duration_i x (value_0 + value_slope x i): exact time-weighted integrals.

        For a quantity that grows linearly over the jump (token states, context sum), this is its
        integral over simulated time, so time-weighted averages stay exact across multi-step jumps.
        """
        if k <= 0 or num_decode_seqs <= 0:
            return 0.0
        total = 0.0
        for lo, hi, intercept, slope in self._decode_pieces(num_decode_seqs, context_tokens_sum, k):
            if hi <= lo:
                continue
            count, sum_i, sum_i2 = hi - lo, _sum_i(lo, hi), _sum_i2(lo, hi)
            total += intercept * value_0 * count + (intercept * value_slope + slope * value_0) * sum_i
            total += slope * value_slope * sum_i2
        return total

    def decode_step_durations_s(self, num_decode_seqs: int, context_tokens_sum: int, k: int) -> np.ndarray:
        """Each of the k steps' durations (vectorised), for recording a jump step by step if needed."""
        if k <= 0 or num_decode_seqs <= 0:
            return np.zeros(max(0, k), dtype=np.float64)
        steps = _float_arange(k)
        pieces = [
            piece
            for piece in self._decode_pieces(num_decode_seqs, context_tokens_sum, k)
            if piece[1] > piece[0]
        ]
        if len(pieces) == 1:  # one side (compute or memory) wins every step: one vectorised line
            _, _, intercept, slope = pieces[0]
            return intercept + slope * steps
        durations = np.zeros(k, dtype=np.float64)
        for lo, hi, intercept, slope in pieces:
            durations[lo:hi] = intercept + slope * steps[lo:hi]
        return durations

    def decode_steps_within_s(
        self, num_decode_seqs: int, context_tokens_sum: int, budget_s: float, k_max: int
    ) -> int:
        """Largest k <= k_max whose k decode steps end no later than `budget_s` (the next arrival).

        Binary search over the closed form: O(log k_max) evaluations.
        """
        if k_max <= 0 or budget_s < 0:
            return 0
        if num_decode_seqs <= 0:
            return k_max
        lo, hi = 0, k_max
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.decode_steps_time_s(num_decode_seqs, context_tokens_sum, mid) <= budget_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def describe(self) -> dict[str, Any]:
        """JSON-safe summary of the coefficients (goes into summary.json and `kvsim run` output)."""
        return {
            "source": self.source,
            "layout_factor": self.layout_factor,
            "block_size": self.block_size,
            "kv_fit_layout": None if self.kv_fit is None else self.kv_fit.layout,
            "weight_read_s": self.weight_bytes / self.hbm_bytes_per_s,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "flops_per_s": self.flops_per_s,
            "step_overhead_s": self.step_overhead_s,
            "constant_step_s": self.constant_step_s,
        }
