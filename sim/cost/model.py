"""How long one serving step takes: a sum of parts, each fitted or measured, optionally calibrated.

Why parts: a step runs the framework's CPU work, every layer's linear ops (GEMMs that read all weights
once and do 2 x parameters FLOPs per token, less the embedding table, which is a lookup, and the LM
head, which runs once per sampled position; plus elementwise kernels), the TP all-reduces and the
attention, one after another. Each part is checked on its own (docs/cost_model.md): the linear ops
against Vidur's measured per-layer times (`kvsim cost validate`, fitted per GPU in sim/cost/fit.py),
the all-reduce from measured NCCL tables, the overhead from public measurements per engine preset.
Only the attention depends on the context, and it is the max of two lines in the context sum (FLOPs
and KV bytes); everything else depends on the batch alone, which is constant while the engine jumps
k decode steps at once, so each of the k steps is one point on at most two straight lines
(`decode_step_durations_s`, vectorised).

A calibration profile from gpu/ (schema v1, docs/cost_model.md "Cost model") replaces the KV-read term
with a fit measured on the GPU for the allocator's real layout, and the paged layout factor with the
measured paged-over-contiguous ratio. Units: seconds, bytes, FLOPs; all per GPU of the TP group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.cost.limits import check_step_cost
from sim.cost.linear import lm_head_params, per_token_compute_params, routed_expert_weight_bytes
from sim.cost.network import AllReduceModel, CustomAllReduceModel
from sim.cost.overhead import DEFAULT_ENGINE
from sim.cost.parts import is_linear_profile, step_parts
from sim.cost.server import ServerTerms, is_bench_profile, scenario_terms
from sim.files import MAX_PROFILE_BYTES, check_input_file
from sim.scenario.quantization import linear_flops_scale

try:
    import cython
except ImportError:  # Cython is a build requirement, not a runtime one (docs/compiled_core.md)
    from allocators import cython_shim as cython

if TYPE_CHECKING:
    from sim.scenario.scenario import Scenario

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

    check_input_file(path, what="calibration profile", limit_bytes=MAX_PROFILE_BYTES)  # no /dev/zero
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


# `_decode_lines`'s split when one line wins every step (beyond any jump's length).
_NO_SPLIT = 1 << 62

# Longest jump `decode_steps_starting_before` searches with scalar steps; longer ones are searched in
# one vectorised pass (a Python step costs ~0.1 us, the vectorised search ~4 us whatever its length).
_SCALAR_SEARCH_STEPS = 48


@cython.locals(
    k=cython.Py_ssize_t,
    split=cython.longlong,
    intercept_a=cython.double,
    slope_a=cython.double,
    intercept_b=cython.double,
    slope_b=cython.double,
    out=cython.double[:],
    i=cython.Py_ssize_t,
)
def _line_durations(
    k: int, split: int, intercept_a: float, slope_a: float, intercept_b: float, slope_b: float
) -> np.ndarray:
    """Step i of k lasts intercept_a + slope_a x i before `split`, intercept_b + slope_b x i from it on.

    Compiled, a C loop into one new array: per element the float multiply and add NumPy's
    `intercept + slope * steps` does (i as a double is exact; no fused multiply-add: setup.py
    compiles with -ffp-contract=off), so the same floats, without the three or four NumPy calls on a
    short array per jump. As Python (`cython.compiled` false) it is those NumPy calls.
    """
    if not cython.compiled:
        steps = _float_arange(k)
        if split >= k:  # one side (compute or memory) wins every step: one vectorised line
            return intercept_a + slope_a * steps
        if split <= 0:
            return intercept_b + slope_b * steps
        durations = np.zeros(k, dtype=np.float64)
        durations[:split] = intercept_a + slope_a * steps[:split]
        durations[split:] = intercept_b + slope_b * steps[split:]
        return durations
    durations = np.empty(k, dtype=np.float64)
    out = durations
    for i in range(k):
        if i < split:
            out[i] = intercept_a + slope_a * i
        else:
            out[i] = intercept_b + slope_b * i
    return durations


@cython.locals(
    k=cython.longlong,
    split=cython.longlong,
    intercept_a=cython.double,
    slope_a=cython.double,
    intercept_b=cython.double,
    slope_b=cython.double,
    gap_s=cython.double,
    count=cython.longlong,
    start_s=cython.double,
    i=cython.longlong,
)
def _steps_starting_before(
    k: int, split: int, intercept_a: float, slope_a: float, intercept_b: float, slope_b: float, gap_s: float
) -> int:
    """1 + how many of steps 1..k-1 (durations as `_line_durations`) start before `gap_s`: the start
    of step i is the running sum of durations 0..i-1, added left to right as `cumsum` does; the same
    float operations as Python, in C where compiled."""
    count, start_s = 1, 0.0  # steps 0..k-2 end where steps 1..k-1 start
    for i in range(k - 1):
        if i < split:  # _line_durations's float, then cumsum's
            start_s += intercept_a + slope_a * i
        else:
            start_s += intercept_b + slope_b * i
        if start_s >= gap_s:
            return count
        count += 1
    return count


def expected_experts_touched(tokens: int, num_experts: int, experts_per_token: int) -> float:
    """Expected distinct experts of one MoE layer that `tokens` tokens select, each token routed to
    `experts_per_token` distinct of `num_experts`: E x (1 - (1 - k/E)^tokens).

    A modelling choice (docs/cost_model.md "MoE"): routing uniform and independent across tokens, so
    an expert is missed by one token with probability 1 - k/E. Real routers are imbalanced (popular
    experts), which touches fewer experts at the same batch (for independent tokens the uniform
    router maximises the expected count), so the weight reads here are, if anything, high.
    """
    if tokens <= 0 or num_experts <= 0:
        return 0.0
    missed = max(0.0, 1.0 - experts_per_token / float(num_experts)) ** tokens  # k <= E (ModelSpec checks it)
    return num_experts * (1.0 - missed)


def _float_arange(count: int) -> np.ndarray:
    """np.arange(count, dtype=float64) as a read-only view of a cached array (one per jump otherwise)."""
    global _FLOAT_ARANGE
    if count > _FLOAT_ARANGE.size:
        _FLOAT_ARANGE = np.arange(max(count, 2 * _FLOAT_ARANGE.size), dtype=np.float64)
        _FLOAT_ARANGE.flags.writeable = False
    return _FLOAT_ARANGE[:count]


@dataclass(frozen=True, slots=True)
class CostModel:
    """Step durations for one scenario. Build it with `CostModel.from_scenario(scenario)`.

    All coefficients are per GPU of the tensor-parallel group (every rank does 1/TP of the work in
    parallel). A step's time is the sum of its parts (docs/cost_model.md "Cost model"):
    framework overhead (engine preset, by batch size) + linear layers (fitted, by batch tokens)
    + TP all-reduce (measured tables, by batch tokens) + attention (max of the causal-pair FLOPs and
    the decode KV read, both lines in the context sum).
    """

    weight_bytes: float  # per GPU, read once per step
    kv_bytes_per_token: (
        float  # per GPU: K and V of every layer, read once per step per decoding token of context
    )
    num_layers: int
    flops_per_token: float  # 2 x compute params / TP, without the embedding table and the LM head
    attention_flops_per_pair: float  # 4 x layers x heads x head_dim / TP, per (query, key) pair
    hbm_bytes_per_s: float  # effective: peak x achieved fraction (fitted, or hbm_efficiency)
    flops_per_s: float  # effective: peak x achieved fraction (fitted, or flops_efficiency)
    pcie_bytes_per_s: float
    step_overhead_s: float  # per step, whatever the batch (engine preset's base, or the explicit knob)
    layout_factor: float  # paged-over-contiguous KV-read time (1.0 for contiguous layouts)
    block_size: int  # tokens per block of the allocator (or of the selected paged fit)
    kv_fit: KvReadFit | None = None  # measured KV-read fit for the allocator's layout
    kv_fit_scale: float = 1.0  # ratio applied when only the contiguous fit exists for a paged layout
    constant_step_s: float | None = None
    source: str = "analytic"
    overhead_per_seq_s: float = 0.0  # per sequence in the step (engine preset)
    gemm_bytes_per_token: float = 0.0  # all layers: GEMM inputs read and outputs written per token
    elementwise_bytes_per_token: float = 0.0  # all layers: norms, RoPE, activation, residual add
    smooth_p: float = math.inf  # exponent of the memory/compute smooth maximum (inf: hard max)
    linear_fixed_s: float = 0.0  # all layers: the kernels' latency floor per step
    all_reduce: AllReduceModel | CustomAllReduceModel | None = None  # None for TP 1
    all_reduce_elements_per_token: float = 0.0  # fp16-element equivalents of one token's hidden state
    all_reduces_per_step: int = 0  # 2 x layers with TP > 1
    engine: str = DEFAULT_ENGINE
    linear_fit_source: str = ""
    # GEMM FLOP rate of the linear layers over `flops_per_s` (FP8 weights on a GPU with FP8 tensor
    # cores: sim/scenario/quantization.py FP8_GEMM_SPEEDUP); attention keeps `flops_per_s`.
    linear_flops_scale: float = 1.0
    # LM-head FLOPs per sampled position (2 x vocabulary x hidden / TP), at the model dtype's rate (the
    # LM head is never quantized: sim/scenario/quantization.py). Each decoding sequence samples one
    # position per step; a prefill's one sampled position per prompt is left out (< 0.1 % of its step).
    lm_head_flops_per_seq: float = 0.0
    frontend_s: float = 0.0  # per request, outside the engine (sim/cost/server.py); added to TTFT and E2E
    frontend_service_s: float = 0.0  # per request, the front end's serial work before the engine sees it
    frontend_blocks_engine: bool = False  # the front end shares the engine's event loop (vLLM v0)
    server_source: str = "neutral"  # where the server-level terms come from
    # MoE: the routed experts' bytes per GPU (part of `weight_bytes`; 0 for a dense model) and the
    # routing; a step reads only the experts its tokens touch (`weight_read_bytes`).
    routed_expert_bytes: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    # Query rows per query head that a decoding sequence costs in a step that also prefills: the
    # attention kernel's padded query tile when one call runs both (sim/cost/attention_tiles.py;
    # 1.0 where the engine runs decodes in calls of their own). Decode-only steps do not use it.
    mixed_decode_query_rows: float = 1.0
    # Memos of the per-batch-size terms, keyed by the number of decoding sequences (bounded by
    # max_num_seqs): the engine prices the same few batch sizes on every turn. Same floats as computing
    # them afresh; not part of the model's value (compare=False) and empty in every copy.
    _decode_batch_memo: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _kv_lines_memo: dict[int, tuple[float, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _decode_lines_memo: dict[tuple[int, int], tuple[int, float, float, float, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def from_scenario(
        cls,
        scenario: Scenario,
        profile: dict[str, Any] | None = None,
        engine: str | None = None,
        server: ServerTerms | None = None,
    ) -> CostModel:
        """The scenario's cost model; loads `scenario.calibration` unless `profile` is given.

        `server`: the server-level terms (sim/cost/server.py); None takes them from a bench profile
        given as `scenario.calibration`, else neutral terms (the operator model alone).

        `engine` (default: the scenario's `engine` field when it has one, else "vllm-v0") selects the
        framework-overhead preset. Explicitly set `hbm_efficiency`, `flops_efficiency` and
        `step_overhead_s` override the GPU's fitted fractions and the engine's overhead.
        """
        model, gpu, tp = scenario.model_spec(), scenario.gpu_spec(), scenario.tensor_parallel_size
        calibration = scenario.calibration
        if (
            profile is None
            and calibration
            and not is_linear_profile(calibration)
            and not is_bench_profile(calibration)
        ):
            profile = load_calibration(calibration)  # a CSV calibrates the linear layers instead
        paged = scenario.allocator.entry().block_table_layout  # attention gathers through a block table
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
        terms = scenario_terms(scenario) if server is None else server
        parts = step_parts(scenario, engine, terms)
        cost = cls(
            weight_bytes=scenario.weight_bytes_per_gpu(),
            kv_bytes_per_token=scenario.kv_bytes_per_token_per_gpu(),
            num_layers=model.num_layers,
            flops_per_token=2.0 * per_token_compute_params(model) / tp,
            lm_head_flops_per_seq=2.0 * lm_head_params(model) / tp,
            attention_flops_per_pair=4.0 * model.num_layers * model.num_attention_heads * model.head_dim / tp,
            hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s * parts.hbm_fraction,
            flops_per_s=gpu.peak_flops * parts.flops_fraction * terms.flops_efficiency_scale,
            pcie_bytes_per_s=gpu.pcie_bandwidth_bytes_per_s,
            step_overhead_s=parts.overhead_base_s * terms.overhead_scale,
            layout_factor=layout_factor,
            block_size=kv_fit.block_size if kv_fit is not None and kv_fit.block_size else block_size,
            kv_fit=kv_fit,
            kv_fit_scale=kv_fit_scale,
            constant_step_s=scenario.constant_step_s,
            source=source if scenario.constant_step_s is None else "constant",
            overhead_per_seq_s=parts.overhead_per_seq_s * terms.overhead_scale
            + (terms.stream_chunk_s if parts.frontend_blocks_engine and terms.stream_chunk_s else 0.0),
            gemm_bytes_per_token=parts.gemm_bytes_per_token,
            elementwise_bytes_per_token=parts.elementwise_bytes_per_token,
            smooth_p=parts.smooth_p,
            linear_fixed_s=parts.linear_fixed_s,
            all_reduce=parts.all_reduce,
            all_reduce_elements_per_token=parts.all_reduce_elements_per_token,
            all_reduces_per_step=parts.all_reduces_per_step,
            engine=parts.engine,
            linear_fit_source=parts.linear_fit_source,
            linear_flops_scale=linear_flops_scale(model, gpu.name),
            frontend_s=terms.frontend_s,
            frontend_service_s=terms.frontend_service_s,
            frontend_blocks_engine=parts.frontend_blocks_engine,
            server_source=terms.source,
            routed_expert_bytes=routed_expert_weight_bytes(model) / tp,
            num_experts=model.num_experts,
            experts_per_token=model.experts_per_token,
            mixed_decode_query_rows=parts.mixed_decode_query_rows,
        )
        check_step_cost(cost, scenario)  # a step of inf (or 1e300) s is refused here, by its term
        return cost

    # -- the KV-read term -----------------------------------------------------------------------------------

    def _kv_read_lines(self, num_seqs: int) -> tuple[float, float]:
        """KV-read time of `num_seqs` decoding sequences as intercept + slope x context_tokens_sum.

        With a fit, blocks touched (gpu/'s definition) are one per sequence for the contiguous layout and,
        for a paged one, context / b + num_seqs x (b - 1) / (2b): the mean partial last block. Either
        keeps the time linear in the context sum. Memoised per `num_seqs` (`_kv_read_lines_afresh`).
        """
        lines = self._kv_lines_memo.get(num_seqs)
        if lines is None:
            lines = self._kv_lines_memo[num_seqs] = self._kv_read_lines_afresh(num_seqs)
        return lines

    def _kv_read_lines_afresh(self, num_seqs: int) -> tuple[float, float]:
        """`_kv_read_lines` computed from the coefficients (its memo's source)."""
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

    def offload_step_s(self, compute_s: float, load_tokens: int, store_tokens: int) -> float:
        """A step's duration with KV moved between the GPU and a CPU tier (allocators/cpu_tier.py).

        Loads (CPU -> GPU) come before the prefill that needs them, so they add to the step: vLLM
        loads a request's CPU hit before scheduling its prefill (vllm/v1/core/sched/scheduler.py
        `Scheduler.schedule`: a request whose connector load is async waits in
        WAITING_FOR_REMOTE_KVS). Stores (GPU -> CPU) run on their own CUDA stream beside the forward
        pass (vllm/v1/kv_offload/worker/cpu_gpu.py, `CpuGpuOffloadingHandlers`), so they cost time only
        when they take longer than the step; the two directions of a PCIe link do not contend.
        """
        return max(compute_s + self.swap_time_s(load_tokens), self.swap_time_s(store_tokens))

    # -- the parts of one step ------------------------------------------------------------------------------

    def overhead_time_s(self, num_seqs: int) -> float:
        """Framework (CPU) time exposed per step with `num_seqs` sequences (engine preset)."""
        return self.step_overhead_s + self.overhead_per_seq_s * max(0, num_seqs)

    def linear_time_s(self, tokens: int, sampled_seqs: int = 0) -> float:
        """All layers' linear ops (GEMMs, norms, activation, adds) for `tokens` batch tokens, of which
        `sampled_seqs` positions go through the LM head (the step's decoding sequences).

        fixed + smooth_max(weights and GEMM I/O over HBM, GEMM FLOPs over peak) + elementwise bytes
        over HBM (sim/cost/linear.py); the fraction of peak of each side is the GPU's fit.
        """
        if tokens <= 0:
            return 0.0
        weights = self.weight_bytes if self.routed_expert_bytes == 0.0 else self.weight_read_bytes(tokens)
        memory = (weights + tokens * self.gemm_bytes_per_token) / self.hbm_bytes_per_s
        compute = tokens * self.flops_per_token / (self.flops_per_s * self.linear_flops_scale)
        if sampled_seqs > 0 and self.lm_head_flops_per_seq:
            compute += sampled_seqs * self.lm_head_flops_per_seq / self.flops_per_s
        if math.isinf(self.smooth_p):
            gemm = max(memory, compute)
        else:
            big = max(memory, compute)
            p = self.smooth_p
            gemm = big * ((memory / big) ** p + (compute / big) ** p) ** (1.0 / p)
        return self.linear_fixed_s + gemm + tokens * self.elementwise_bytes_per_token / self.hbm_bytes_per_s

    def weight_read_bytes(self, tokens: int) -> float:
        """Weight bytes per GPU a step of `tokens` batch tokens reads: the dense part (attention, norms,
        router, shared experts, dense layers, embeddings: all of `weight_bytes` but the routed experts)
        + the routed experts x the expected fraction touched (`expected_experts_touched` / experts).

        Why: vLLM's fused MoE (vllm/model_executor/layers/fused_moe/fused_moe.py) groups the tokens by
        expert (`moe_align_block_size`, each group padded to BLOCK_SIZE_M) and launches blocks only
        for those groups, so an expert no token is routed to is never loaded. A dense model (no routed
        experts) reads `weight_bytes` whatever the batch.
        """
        if self.routed_expert_bytes == 0.0 or tokens <= 0:
            return self.weight_bytes
        touched = expected_experts_touched(tokens, self.num_experts, self.experts_per_token)
        dense = self.weight_bytes - self.routed_expert_bytes
        return dense + self.routed_expert_bytes * (touched / self.num_experts)

    def all_reduce_time_s(self, tokens: int) -> float:
        """TP all-reduces of one step: two per layer, each of tokens x hidden x dtype bytes (0 at TP 1)."""
        if self.all_reduce is None or tokens <= 0:
            return 0.0
        return self.all_reduces_per_step * self.all_reduce.time_s(tokens * self.all_reduce_elements_per_token)

    def attention_compute_time_s(self, attention_pairs: float) -> float:
        """FLOPs of `attention_pairs` causal (query, key) pairs (QK^T and PV) at the achieved FLOP/s."""
        return attention_pairs * self.attention_flops_per_pair / self.flops_per_s

    def memory_time_s(self, num_decode_seqs: int, decode_context_tokens: int) -> float:
        """The decode KV read (the memory side of attention), as in `_kv_read_lines`."""
        intercept, slope = self._kv_read_lines(num_decode_seqs)
        return intercept + slope * decode_context_tokens

    def step_attention_pairs(
        self, decode_context_tokens: int, prefill_context_tokens: int, prefilling: bool
    ) -> float:
        """(query, key) pairs per query head a step's attention computes: the prefill's causal pairs
        plus the decodes' context, each decode's padded to the kernel's query tile in a step that
        also prefills (`mixed_decode_query_rows`, sim/cost/attention_tiles.py)."""
        if prefilling and self.mixed_decode_query_rows != 1.0:
            return decode_context_tokens * self.mixed_decode_query_rows + prefill_context_tokens
        return decode_context_tokens + prefill_context_tokens

    def attention_time_s(
        self, num_decode_seqs: int, decode_context_tokens: int, attention_pairs: float
    ) -> float:
        """max(attention FLOPs, decode KV read): one fused attention call per layer does both."""
        return max(
            self.attention_compute_time_s(attention_pairs),
            self.memory_time_s(num_decode_seqs, decode_context_tokens),
        )

    def batch_time_s(self, tokens: int, num_seqs: int) -> float:
        """The parts that depend only on the batch (constant while a decode jump runs)."""
        return (
            self.overhead_time_s(num_seqs)
            + self.linear_time_s(tokens, num_seqs)
            + self.all_reduce_time_s(tokens)
        )

    def _decode_batch_time_s(self, num_seqs: int) -> float:
        """batch_time_s(num_seqs, num_seqs): a decode-only batch, memoised per batch size.

        Why a memo: every decode-only turn prices its batch (and a jump's first step) with the same
        handful of batch sizes; the key is bounded by max_num_seqs. Prefill batches are not memoised
        (their token counts vary without bound), only their KV-read lines.
        """
        fixed = self._decode_batch_memo.get(num_seqs)
        if fixed is None:
            fixed = self._decode_batch_memo[num_seqs] = self.batch_time_s(num_seqs, num_seqs)
        return fixed

    def step_time_s(
        self,
        prefill_tokens: int,
        num_decode_seqs: int,
        decode_context_tokens: int,
        prefill_context_tokens: int = 0,
    ) -> float:
        """Duration of one step: overhead + linear + all-reduce + attention; 0 for an empty step.

        `decode_context_tokens`: KV tokens attended by all decoding sequences together (their context
        sum). `prefill_context_tokens`: causal (query, key) pairs of the step's prefill, see
        `prefill_attention_pairs` (0 ignores prefill attention FLOPs). The overhead counts the decoding
        sequences (the engine passes no count of prefilling ones).
        """
        if prefill_tokens <= 0 and num_decode_seqs <= 0:
            return 0.0
        if self.constant_step_s is not None:
            return self.constant_step_s
        if prefill_tokens == 0:
            fixed = self._decode_batch_memo.get(num_decode_seqs)  # _decode_batch_time_s's memo, inlined
            if fixed is None:
                fixed = self._decode_batch_time_s(num_decode_seqs)
        else:
            fixed = self.batch_time_s(prefill_tokens + num_decode_seqs, num_decode_seqs)
        # attention_time_s, inlined (every turn): max(FLOPs of the pairs, the KV read), same floats and
        # the same tie rule as max() (the first argument unless the second is larger); the FLOPs as
        # attention_compute_time_s of step_attention_pairs, and the KV-read lines from
        # _kv_read_lines's memo, inlined too
        if prefill_tokens > 0 and self.mixed_decode_query_rows != 1.0:
            # one call runs both: each decode pays the kernel's padded query tile (no multiply by 1.0
            # otherwise, so the unpadded pairs stay the exact integer sum they were)
            pairs = decode_context_tokens * self.mixed_decode_query_rows + prefill_context_tokens
        else:
            pairs = decode_context_tokens + prefill_context_tokens
        compute = pairs * self.attention_flops_per_pair / self.flops_per_s
        lines = self._kv_lines_memo.get(num_decode_seqs)
        if lines is None:
            lines = self._kv_read_lines(num_decode_seqs)
        intercept, slope = lines
        memory = intercept + slope * decode_context_tokens
        return fixed + (memory if memory > compute else compute)

    # -- k decode-only steps at once ------------------------------------------------------------------------

    def _decode_lines(
        self, num_decode_seqs: int, context_tokens_sum: int
    ) -> tuple[int, float, float, float, float]:
        """(split, intercept, slope before it, intercept, slope from it on) of the decode steps from
        context sum C0 (step i has context C0 + i x n), the split not cut to any k; memoised for the
        last (n, C0) asked. Everything but attention depends on the batch only (n sequences, n
        tokens): a constant; the attention is the max of two lines in i (FLOPs, KV read), split at
        their crossing.

        Why a memo of one: a jump asks twice for the same batch and context (where the next arrival
        cuts it, then the durations of the steps it takes), and never again after (issue 24).
        """
        key = (num_decode_seqs, context_tokens_sum)
        memo = self._decode_lines_memo
        lines = memo.get(key)
        if lines is None:
            memo.clear()
            lines = memo[key] = self._decode_lines_afresh(num_decode_seqs, context_tokens_sum)
        return lines

    def _decode_lines_afresh(
        self, num_decode_seqs: int, context_tokens_sum: int
    ) -> tuple[int, float, float, float, float]:
        """`_decode_lines` computed from the coefficients (its memo's source)."""
        n = num_decode_seqs
        if self.constant_step_s is not None:
            return _NO_SPLIT, self.constant_step_s, 0.0, self.constant_step_s, 0.0
        fixed = self._decode_batch_time_s(n)
        compute_0 = fixed + self.attention_compute_time_s(context_tokens_sum)
        compute_1 = n * self.attention_flops_per_pair / self.flops_per_s
        kv_intercept, kv_slope = self._kv_read_lines(n)
        memory_0 = fixed + (kv_intercept + kv_slope * context_tokens_sum)  # memory_time_s, inlined
        memory_1 = n * kv_slope
        gap_0, gap_1 = compute_0 - memory_0, compute_1 - memory_1  # compute wins where gap >= 0
        if gap_1 == 0.0:  # parallel lines: one side wins every step
            split = _NO_SPLIT if gap_0 >= 0 else 0
            compute_first = True
        else:
            crossing = -gap_0 / gap_1
            split = max(0, math.ceil(crossing))
            compute_first = gap_1 < 0  # compute wins before the crossing when its slope is smaller
        if compute_first:
            return split, compute_0, compute_1, memory_0, memory_1
        return split, memory_0, memory_1, compute_0, compute_1

    def decode_step_durations_s(self, num_decode_seqs: int, context_tokens_sum: int, k: int) -> np.ndarray:
        """Each of the k steps' durations (vectorised), for recording a jump step by step if needed."""
        if k <= 0 or num_decode_seqs <= 0:
            return np.zeros(max(0, k), dtype=np.float64)
        # step i of k lasts intercept + slope x i: the first line before the split, the second from it
        split, intercept_a, slope_a, intercept_b, slope_b = self._decode_lines(
            num_decode_seqs, context_tokens_sum
        )
        # the split cut to k (the same steps on each line): a crossing far away can exceed a C integer
        return _line_durations(k, min(split, k), intercept_a, slope_a, intercept_b, slope_b)

    def decode_steps_starting_before(
        self, num_decode_seqs: int, context_tokens_sum: int, k: int, gap_s: float
    ) -> int:
        """1 + how many of steps 1..k-1 of `decode_step_durations_s(..., k)` start before `gap_s`.

        Step i starts at T(i) = d_0 + ... + d_{i-1} (summed left to right, as `cumsum` does), so this
        is `1 + searchsorted(cumsum(d[:-1]), gap_s, "left")` of the durations array, the same floats
        step by step. Why scalar: a jump is cut by the next arrival after a few steps, and a few
        scalar additions cost less than the four NumPy calls on tiny arrays that build and search
        the array (issue 24); a long search (k > _SCALAR_SEARCH_STEPS) stays vectorised as Python.
        Compiled, the loop is C arithmetic (`_steps_starting_before`) and runs whatever k: it stops at
        the first step that starts at or after the gap, as the vectorised search's answer does.
        """
        if k > _SCALAR_SEARCH_STEPS and not cython.compiled:
            starts = self.decode_step_durations_s(num_decode_seqs, context_tokens_sum, k)[:-1].cumsum()
            return 1 + int(starts.searchsorted(gap_s, side="left"))
        if k <= 0 or num_decode_seqs <= 0:
            split, intercept_a, slope_a, intercept_b, slope_b = _NO_SPLIT, 0.0, 0.0, 0.0, 0.0
        else:
            split, intercept_a, slope_a, intercept_b, slope_b = self._decode_lines(
                num_decode_seqs, context_tokens_sum
            )
        # the split cut to k, as in `decode_step_durations_s`
        return _steps_starting_before(k, min(split, k), intercept_a, slope_a, intercept_b, slope_b, gap_s)

    def describe(self) -> dict[str, Any]:
        """JSON-safe summary of the coefficients (goes into summary.json and `kvsim run` output)."""
        return {
            "source": self.source,
            "engine": self.engine,
            "layout_factor": self.layout_factor,
            "block_size": self.block_size,
            "kv_fit_layout": None if self.kv_fit is None else self.kv_fit.layout,
            # every weight once; an MoE step reads less at small batches (`weight_read_bytes`)
            "weight_read_s": self.weight_bytes / self.hbm_bytes_per_s,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "flops_per_s": self.flops_per_s,
            "linear_flops_scale": self.linear_flops_scale,
            "smooth_p": None if math.isinf(self.smooth_p) else self.smooth_p,
            "linear_fixed_s": self.linear_fixed_s,
            "linear_fit_source": self.linear_fit_source,
            "step_overhead_s": self.step_overhead_s,
            "overhead_per_seq_s": self.overhead_per_seq_s,
            "all_reduce_network": None if self.all_reduce is None else self.all_reduce.network,
            "constant_step_s": self.constant_step_s,
            "frontend_s": self.frontend_s,
            "frontend_service_s": self.frontend_service_s,
            "server_terms": self.server_source,
            "mixed_decode_query_rows": self.mixed_decode_query_rows,
        }
