"""Resolve a scenario's step-time parts: which fit, which overhead, which all-reduce table, what overrides.

Why its own module: `sim.cost.model.CostModel` only evaluates formulas; deciding where each coefficient
comes from (the GPU's fit in sim/cost/gpu_fits.py, the engine preset in sim/cost/overhead.py, the measured
all-reduce tables in sim/cost/network.py, or an explicit scenario knob) is a separate job, and it has
to work before and after the scenario gains an `engine` field (issue 12), hence the `getattr`s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.cost.attention_tiles import mixed_decode_query_rows
from sim.cost.gpu_fits import gpu_linear_fit, gpu_network
from sim.cost.linear import LAYER_OPS, LayerCoefficients, LayerShape, LinearFit, gemm_input_elements
from sim.cost.network import AllReduceModel, CustomAllReduceModel
from sim.cost.overhead import DEFAULT_ENGINE, engine_overhead
from sim.errors import ScenarioError
from sim.files import MAX_PROFILE_BYTES, check_input_file
from sim.scenario.quantization import activation_quant_kernels_per_layer

if TYPE_CHECKING:
    from sim.cost.server import ServerTerms
    from sim.scenario.scenario import Scenario


@dataclass(frozen=True, slots=True)
class StepParts:
    """The resolved coefficients of every part of a step except the KV read (per GPU, all layers)."""

    engine: str
    hbm_fraction: float
    flops_fraction: float
    smooth_p: float
    linear_fixed_s: float
    gemm_bytes_per_token: float
    elementwise_bytes_per_token: float
    overhead_base_s: float
    overhead_per_seq_s: float
    all_reduce: AllReduceModel | CustomAllReduceModel | None
    all_reduce_elements_per_token: float
    all_reduces_per_step: int
    linear_fit_source: str
    frontend_blocks_engine: bool = False  # the front end's serial work holds steps back (server.py)
    # Query rows per query head a decode costs in a step that also prefills (attention_tiles.py).
    mixed_decode_query_rows: float = 1.0


def explicit_value(scenario: Any, field: str) -> Any:
    """The what-if knob's value when the user gave one; None means the fit or the preset decides.

    Why None and not a number: the scenario's knobs default to None, so the fitted fractions and the
    engine's overhead are the defaults, and a scenario written to TOML and read back keeps them.
    """
    return getattr(scenario, field, None)


def scenario_engine(scenario: Any, engine: str | None = None) -> str:
    """The overhead preset: the argument, else the one the scenario's engine pays (a registered engine
    names it, `Scenario.framework_overhead`), else the scenario's `engine` field, else "vllm-v0"."""
    overhead_of = getattr(scenario, "framework_overhead", None)
    name = engine if engine is not None else overhead_of() if callable(overhead_of) else None
    if name is None:
        name = getattr(scenario, "engine", None)
    if name is None:
        return DEFAULT_ENGINE
    return str(getattr(name, "value", name)).strip().lower()


# The serving stack of a scenario-like object that names no registered engine: the paper-era vLLM
# (sim/engines/vllm_v0.py `serving_stack`, where each value's source is given).
PAPER_ERA_STACK: dict[str, bool] = {
    "custom_all_reduce": False,
    "ray_workers": True,
    "frontend_in_engine_process": True,
    "one_attention_call": False,
}


def engine_stack(scenario: Any) -> dict[str, bool]:
    """The serving stack the scenario's engine runs in (`Scenario.serving_stack`, from its engine
    policy), so no cost term names an engine; PAPER_ERA_STACK for an object without one."""
    stack_of = getattr(scenario, "serving_stack", None)
    return dict(stack_of()) if callable(stack_of) else dict(PAPER_ERA_STACK)


def is_linear_profile(path: str | None) -> bool:
    """Whether a `--calibration` file is a linear-layer profile (Vidur's CSV format), not a gpu/ JSON."""
    return path is not None and str(path).lower().endswith(".csv")


def linear_fit(calibration: str | None, gpu: Any) -> LinearFit:
    """The linear-layer coefficients: fitted to a `--calibration` CSV when one is given (a profile that
    `gpu/run_device.sh` writes, or any file `kvsim cost validate` reads), else the GPU's stored fit."""
    if not is_linear_profile(calibration):
        return gpu_linear_fit(gpu.name)
    path = Path(str(calibration)).resolve()
    check_input_file(path, what="calibration profile", limit_bytes=MAX_PROFILE_BYTES)  # no FIFO
    try:
        stamp = path.stat().st_mtime_ns
    except OSError as exc:
        raise ScenarioError(f"field 'calibration': {calibration}: cannot read ({exc.strerror})") from None
    return _fit_profile(str(path), stamp, float(gpu.hbm_bandwidth_bytes_per_s), float(gpu.peak_flops))


@lru_cache(maxsize=16)
def _fit_profile(path: str, stamp_ns: int, hbm_bytes_per_s: float, peak_flops: float) -> LinearFit:
    """One Nelder-Mead fit per file version and GPU (~50 ms; sweeps build many cost models)."""
    from sim.cost.fit import ProfileArrays, fit_linear
    from sim.cost.profiles import read_linear_profile

    rows = ProfileArrays.of(read_linear_profile(path))
    return fit_linear([rows], hbm_bytes_per_s, peak_flops, source=f"fitted to {Path(path).name}")


def step_parts(scenario: Scenario, engine: str | None = None, server: ServerTerms | None = None) -> StepParts:
    """All coefficients of the scenario's step time that do not depend on the KV layout.

    `server` decides the serving stack at TP > 1 (sim/cost/server.py `stack_settings`): vLLM's custom
    all-reduce or NCCL, and whether the preset's multi-GPU (Ray) overhead applies.
    """
    from sim.cost.server import ServerTerms

    model, gpu, tp = scenario.model_spec(), scenario.gpu_spec(), scenario.tensor_parallel_size
    name = scenario_engine(scenario, engine)
    try:
        overhead = engine_overhead(name)
    except ValueError as exc:
        raise ScenarioError(f"field 'engine': {exc}") from None
    fit = linear_fit(scenario.calibration, gpu)
    hbm = explicit_value(scenario, "hbm_efficiency")
    flops = explicit_value(scenario, "flops_efficiency")
    shape = LayerShape.from_model(model)
    per_layer = LayerCoefficients.of(shape, tp, compute_params=None)
    # FP8 W8A8: each GEMM input is quantized by its own kernel first (sim/scenario/quantization.py).
    # Each such kernel costs the fitted latency floor of one of the layer's LAYER_OPS kernels, and
    # reads its input at the model dtype and writes it in 1 byte.
    quant_kernels = activation_quant_kernels_per_layer(model, gpu.name)
    quant_bytes_per_token = quant_kernels / 4 * gemm_input_elements(shape, tp) * (model.dtype_bytes + 1)
    terms = server or ServerTerms.neutral()
    stack = engine_stack(scenario)
    custom, ray = terms.stack_settings(stack)
    multi_gpu = tp > 1 and ray
    base_s = overhead.base_s + (overhead.multi_gpu_base_s if multi_gpu else 0.0)
    per_seq_s = overhead.per_seq_s + (overhead.multi_gpu_per_seq_s if multi_gpu else 0.0)
    fixed_overhead = explicit_value(scenario, "step_overhead_s")
    if fixed_overhead is not None:  # an explicit per-step constant replaces the engine's model
        base_s, per_seq_s = float(fixed_overhead), 0.0
    all_reduce: AllReduceModel | CustomAllReduceModel | None = None
    if tp > 1:
        network, scale = gpu_network(gpu.name)
        all_reduce = AllReduceModel.for_group(network, tp, time_scale=scale)
        if custom and CustomAllReduceModel.applies(network, tp, scale):
            all_reduce = CustomAllReduceModel.for_group(all_reduce, tp)
    return StepParts(
        engine=name,
        hbm_fraction=fit.hbm_fraction if hbm is None else float(hbm),
        flops_fraction=fit.flops_fraction if flops is None else float(flops),
        smooth_p=fit.smooth_p,
        linear_fixed_s=model.num_layers * fit.fixed_s * (1.0 + quant_kernels / len(LAYER_OPS)),
        gemm_bytes_per_token=model.num_layers * per_layer.gemm_bytes_per_token,
        elementwise_bytes_per_token=model.num_layers
        * (per_layer.elementwise_bytes_per_token + quant_bytes_per_token),
        overhead_base_s=base_s,
        overhead_per_seq_s=per_seq_s,
        all_reduce=all_reduce,
        all_reduce_elements_per_token=model.hidden_size * model.dtype_bytes / 2.0,
        all_reduces_per_step=2 * model.num_layers if tp > 1 else 0,
        linear_fit_source=fit.source,
        frontend_blocks_engine=terms.frontend_blocks_engine(stack),
        mixed_decode_query_rows=mixed_decode_query_rows(
            gpu.name, model.num_attention_heads, model.num_kv_heads, model.head_dim, model.is_mla
        )
        if stack.get("one_attention_call", False)
        else 1.0,
    )


__all__ = ["StepParts", "explicit_value", "is_linear_profile", "linear_fit", "scenario_engine", "step_parts"]
