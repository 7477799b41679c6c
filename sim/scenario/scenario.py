"""The Scenario: one simulation's full description, validated once, with vLLM's names.

Why pydantic with `extra="forbid"`: a scenario comes from TOML files, CLI flags and sweep grids, and a
misspelt key must be refused with one line naming it rather than silently ignored. Every error leaves
this module as `sim.errors.ScenarioError` whose message is one line: the field and the allowed range.

Derived defaults (`max_model_len` from the model, `max_num_batched_tokens`, `num_prompts`) are filled
after validation without marking them as set, so `with_overrides(model=...)` re-derives them for the
new model instead of keeping the old model's numbers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

import allocators
from allocators import AllocatorEntry, SpecWord
from sim.engines import DEFAULT_ENGINE, EnginePolicy, engine_policy
from sim.errors import ScenarioError
from sim.files import json_safe
from sim.scenario.memory_profile import profile_reserve
from sim.scenario.overrides import check_field, deep_copy, one_line, set_dotted
from sim.scenario.presets import (
    GPU_PRESETS,
    MODEL_PRESETS,
    GpuSpec,
    ModelSpec,
    canonical_gpu_name,
    canonical_model_name,
    gpu_preset,
    kv_layer_bytes_per_gpu,
    model_preset,
)
from sim.scenario.toml_io import read_toml, to_toml
from sim.scenario.units import format_bytes, parse_bytes, parse_duration_s

# ----------------------------------------------------------------------------------------------------------
# Allocators: the registry declares each family (allocators.entry); the scenario only supplies its fields

# Allocator parameters that the scenario owns, and the scenario field each comes from (one source of
# truth: the cost model and the engine read them from the scenario too). An allocator's entry says which
# of them it takes (`scenario_params`); `allocator_params()` fills those in.
SCENARIO_OWNED_PARAMS: dict[str, str] = {
    "capacity_tokens": "kv_cache_memory",
    "max_model_len": "max_model_len",
    "block_size": "block_size",
    "enable_prefix_caching": "enable_prefix_caching",
    "bytes_per_token_per_layer": "model",
    "num_layers": "model",
    "num_window_layers": "model",
    "window_tokens": "model",
    "prefill_chunk_tokens": "max_num_batched_tokens",
}

DEFAULT_NUM_PROMPTS = 1000

# vLLM's --kv-cache-dtype values and their bytes per element (None: the model's dtype). fp8 means
# fp8_e4m3 on CUDA (vllm/config/cache.py CacheDType; vllm/utils STR_DTYPE_TO_TORCH_DTYPE).
KV_CACHE_DTYPE_BYTES: dict[str, int | None] = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def _allocator_entry(name: str) -> AllocatorEntry:
    """The registry's entry for `name` (ValueError listing the known names, for pydantic)."""
    try:
        return allocators.allocator_entry(name)
    except allocators.AllocatorConfigError:
        raise ValueError(f"unknown allocator {name!r} (known: {', '.join(allocators.available())})") from None


def _spec_word_value(word: SpecWord, token: str) -> Any | None:
    """`token` as the value of `word`, or None when it is not a word of that kind."""
    if word.kind == "bytes":
        return parse_bytes(token, field="allocator")
    normalised = token.lower().replace("-", "_")
    return normalised if normalised in word.choices else None


def parse_allocator(text: str) -> dict[str, Any]:
    """'request_limit:pow2:best_fit' -> {'name': 'request_limit', 'params': {...}}; ValueError if unknown.

    The words after the name are the allocator's own `spec_words` (its entry in the registry), in any
    order: a placement (first_fit|best_fit|buddy) for the contiguous family, a reservation
    (limit|oracle|pow2) for request_limit, a page size ("64KiB") for virtual.
    """
    parts = [part.strip() for part in text.strip().split(":")]
    name = parts[0].lower().replace("-", "_")
    entry = _allocator_entry(name)
    params: dict[str, Any] = {}
    for token in parts[1:]:
        for word in entry.spec_words:
            if word.param in params:
                continue
            value = _spec_word_value(word, token)
            if value is not None:
                params[word.param] = value
                break
        else:
            allowed = " and ".join(
                f"{word.describe} ({'|'.join(word.choices)})" if word.choices else word.describe
                for word in entry.spec_words
            )
            raise ValueError(
                f"{text!r}: unexpected {token!r}; after {name!r} the allowed parts are {allowed or 'nothing'}"
            )
    return {"name": name, "params": params}


class AllocatorSpec(BaseModel):
    """Which allocator and its own parameters (placement, reservation, page_bytes, ...)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = "paged"
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_allocator(value)
        return value

    @field_validator("name")
    @classmethod
    def _known_name(cls, name: str) -> str:
        if ":" in name:
            raise ValueError(f"must be a bare allocator name; give {name!r} as the whole allocator string")
        return parse_allocator(name)["name"]

    @field_validator("params")
    @classmethod
    def _no_scenario_owned(cls, params: dict[str, Any]) -> dict[str, Any]:
        for key in params:
            if key in SCENARIO_OWNED_PARAMS:
                raise ValueError(
                    f"{key!r} comes from the scenario; set {SCENARIO_OWNED_PARAMS[key]!r} instead"
                )
        return params

    def entry(self) -> AllocatorEntry:
        """What the registry knows of this allocator family."""
        return _allocator_entry(self.name)

    @property
    def label(self) -> str:
        """Short display name: 'paged', 'request_limit:oracle', 'contiguous:buddy' (spec-word order)."""
        parts = [self.name]
        for word in self.entry().spec_words:
            if word.param not in self.params:
                continue
            value = self.params[word.param]
            if word.kind == "bytes":
                parts.append(format_bytes(value).replace(" ", "").replace(".00", ""))
            else:
                parts.append(str(value))
        return ":".join(parts)


class WorkloadSpec(BaseModel):
    """Arguments for `workloads.load`: a preset name or a trace path plus the vLLM-bench knobs."""

    model_config = ConfigDict(extra="forbid", strict=True)

    source: str = "sharegpt"
    # None: the source's own clock -- a trace's timestamps, a preset's documented rate (filled in below)
    request_rate: float | None = Field(default=None, gt=0)
    time_scale: float = Field(default=1.0, gt=0)
    arrival: str | None = None  # arrival process name (poisson, gamma, ...); None: the source's default
    max_tokens_policy: str | None = None  # fixed(N) | exact | factor(k) | none; None: the source's default
    fmt: str | None = None
    on_bad_row: Literal["error", "skip"] = "error"
    clip: bool | None = None  # clip lengths to max_model_len (counted); None: presets clip, traces do not
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("request_rate", "time_scale", mode="before")
    @classmethod
    def _infinite_text(cls, value: Any) -> Any:
        return _non_finite_float_text(value)

    @field_validator("source")
    @classmethod
    def _non_empty(cls, source: str) -> str:
        if not source.strip():
            raise ValueError("must be a workload preset name or a trace file path (got '')")
        return source


def _check_arrival_span(num_prompts: int, request_rate: float | None) -> None:
    """Refuse, naming the rate, a run whose arrivals would span more than a trace may.

    Why: `--request-rate 1e-300` generated arrivals 1e300 s apart, and the request-table check
    (`workloads.schema.MAX_TRACE_SPAN_S`, 366 days) then blamed "row 2" of a trace the user never
    gave (issue 23). The mean span of `num_prompts` arrivals is (num_prompts - 1) / rate.
    """
    from workloads.schema import MAX_TRACE_SPAN_S

    if request_rate is None or not math.isfinite(request_rate) or num_prompts < 2:
        return
    span_s = (num_prompts - 1) / request_rate
    if span_s > MAX_TRACE_SPAN_S:
        raise ScenarioError(
            f"field 'workload.request_rate': {num_prompts:,} requests at {request_rate:g} req/s arrive "
            f"over about {span_s / 86400:.3g} days; a run spans at most {MAX_TRACE_SPAN_S / 86400:.0f} "
            f"days (raise the rate or lower num_prompts)"
        )


NON_FINITE_FLOAT_TEXT: dict[str, float] = {
    "inf": math.inf,
    "+inf": math.inf,
    "-inf": -math.inf,
    "nan": math.nan,
}


def _non_finite_float_text(value: Any) -> Any:
    """The strings "inf", "-inf" and "nan" as floats; any other value unchanged.

    Why: the models are strict (a string is not a number: `block_size = "16"` is refused), but strict
    JSON has no inf/nan, so `to_dict()` writes them as these strings (`_json_safe`), and a summary.json
    or a `--set workload.request_rate=inf` must read back.
    """
    if isinstance(value, str) and value.strip().lower() in NON_FINITE_FLOAT_TEXT:
        return NON_FINITE_FLOAT_TEXT[value.strip().lower()]
    return value


GIB = 1024**3


def kv_offloading_gib(value: Any) -> Any:
    """`kv_offloading_size` in GiB, vLLM's unit: a bare number is GiB, a size with a unit is converted.

    Why GiB and not bytes like `kv_cache_memory`: vLLM's `--kv-offloading-size 64` means 64 GiB
    (vllm/config/cache.py `CacheConfig.kv_offloading_size`), so a user's number must mean the same
    here, and the value written to summary.json must read back as the same size.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = parse_bytes(value, field="kv_offloading_size") / GIB
    else:
        return value
    if not math.isfinite(number):
        raise ValueError(f"field 'kv_offloading_size': must be a finite size in GiB (got {value!r})")
    return number


def _parse_bytes_or_none(value: Any, field: str) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str | float):
        return parse_bytes(value, field=field)
    return value


class Scenario(BaseModel):
    """One simulation: model, GPU, engine knobs (vLLM names), allocator, workload, seed, cost knobs."""

    model_config = ConfigDict(extra="forbid", validate_default=True, strict=True)

    name: str = "run"
    model: str | ModelSpec = "OPT-13B"
    gpu: str | GpuSpec = "A100-40GB"
    tensor_parallel_size: int = Field(default=1, ge=1, le=1024)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    kv_cache_memory: int | None = Field(default=None, ge=1)  # bytes per GPU; overrides utilization
    activation_reserve: int | None = Field(default=None, ge=0)  # bytes per GPU; None: estimated
    max_model_len: int | None = Field(default=None, ge=1)  # None: the model's max context
    allow_long_max_model_len: bool = False
    # Which engine is modelled: any name registered in sim/engines (docs/engines.md); its policy plans
    # the steps and fills the defaults of the fields below that the user did not set.
    engine: str = DEFAULT_ENGINE
    max_num_seqs: int = Field(default=256, ge=1)  # unset: the engine preset's default
    max_num_batched_tokens: int | None = Field(default=None, ge=1)  # None: the engine preset's default
    enable_chunked_prefill: bool = False  # unset: the engine preset's default
    # "auto": vLLM v0's own choice when --preemption-mode is unset (swap groups of > 1 sequence)
    preemption_mode: Literal["recompute", "swap", "auto"] = "recompute"  # unset: the preset's default
    swap_space: int = Field(default=4 * 1024**3, ge=0)  # CPU swap bytes per GPU (vLLM: --swap-space 4)
    enable_prefix_caching: bool = False  # unset: the engine preset's default
    # vLLM's --kv-offloading-size: GiB of CPU memory for a tier under the prefix cache, summed over the
    # TP group (allocators/cpu_tier.py); None: no tier. Allocators without a tier ignore it.
    kv_offloading_size: float | None = Field(default=None, ge=0)
    block_size: int = Field(default=16, ge=1)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"  # vLLM's --kv-cache-dtype
    allocator: AllocatorSpec = Field(default_factory=AllocatorSpec)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    seed: int = Field(default=0, ge=0)
    duration_s: float | None = Field(default=None, gt=0)
    num_prompts: int | None = Field(default=None, ge=1)  # None: a trace's every row; a preset's 1000
    calibration: str | None = None  # gpu/ profile JSON (KV reads), or a linear-layer profile CSV
    export_layouts_every: int | None = Field(default=None, ge=1)  # steps
    # Cost model knobs (docs/cost_model.md "Cost model").
    # What-if knobs of the cost model; None (the default) means the engine preset's overhead and the
    # GPU's fitted fractions (sim/cost/parts.py), so a scenario written to TOML and read back still
    # uses the fit.
    step_overhead_s: float | None = Field(default=None, ge=0)
    hbm_efficiency: float | None = Field(default=None, gt=0, le=1)
    flops_efficiency: float | None = Field(default=None, gt=0, le=1)
    kv_layout_factor: float | None = Field(default=None, gt=0)  # None: from block size / profile
    constant_step_s: float | None = Field(default=None, gt=0)  # every step takes this long (tests, what-ifs)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ScenarioError(one_line(exc)) from None

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Scenario:  # type: ignore[override]
        if isinstance(obj, dict):
            return cls(**obj)
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise ScenarioError(one_line(exc)) from None

    # -- field parsing ------------------------------------------------------------------------------------

    @field_validator("model", mode="before")
    @classmethod
    def _model_preset_or_spec(cls, value: Any) -> Any:
        if isinstance(value, str):
            from sim.scenario.hf_config import looks_like_config_path, model_spec_from_file

            if looks_like_config_path(value):
                return model_spec_from_file(value)
            return canonical_model_name(value)
        return value

    @field_validator("engine")
    @classmethod
    def _registered_engine(cls, name: str) -> str:
        engine_policy(name)  # ValueError naming the registered engines
        return name

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_preset_or_spec(cls, value: Any) -> Any:
        if isinstance(value, str):
            return canonical_gpu_name(value)
        return value

    @field_validator("kv_cache_memory", mode="before")
    @classmethod
    def _kv_cache_memory_bytes(cls, value: Any) -> Any:
        return _parse_bytes_or_none(value, "kv_cache_memory")

    @field_validator("activation_reserve", mode="before")
    @classmethod
    def _activation_reserve_bytes(cls, value: Any) -> Any:
        return _parse_bytes_or_none(value, "activation_reserve")

    @field_validator("swap_space", mode="before")
    @classmethod
    def _swap_space_bytes(cls, value: Any) -> Any:
        return _parse_bytes_or_none(value, "swap_space")

    @field_validator("kv_offloading_size", mode="before")
    @classmethod
    def _kv_offloading_gib(cls, value: Any) -> Any:
        return kv_offloading_gib(value)

    @field_validator("duration_s", "step_overhead_s", "constant_step_s", mode="before")
    @classmethod
    def _seconds(cls, value: Any, info: Any) -> Any:
        if isinstance(value, str):
            return parse_duration_s(value, field=info.field_name)
        return value

    @field_validator(
        "gpu_memory_utilization", "hbm_efficiency", "flops_efficiency", "kv_layout_factor", mode="before"
    )
    @classmethod
    def _infinite_text(cls, value: Any) -> Any:
        return _non_finite_float_text(value)

    @field_validator("allocator", mode="before")
    @classmethod
    def _allocator_string(cls, value: Any) -> Any:
        return parse_allocator(value) if isinstance(value, str) else value

    @field_validator("workload", mode="before")
    @classmethod
    def _workload_string(cls, value: Any) -> Any:
        return {"source": value} if isinstance(value, str) else value

    # -- derived defaults and impossible scenarios --------------------------------------------------------

    @model_validator(mode="after")
    def _resolve_and_check(self) -> Scenario:
        model, gpu, tp = self.model_spec(), self.gpu_spec(), self.tensor_parallel_size
        if model.num_attention_heads % tp != 0:
            raise ValueError(
                f"field 'tensor_parallel_size': must divide {model.name}'s num_attention_heads="
                f"{model.num_attention_heads} (got {tp})"
            )
        if model.num_kv_heads % tp != 0 and tp % model.num_kv_heads != 0:
            raise ValueError(
                f"field 'tensor_parallel_size': must divide {model.name}'s num_kv_heads={model.num_kv_heads} "
                f"or be a multiple of it (got {tp})"
            )
        if self.max_model_len is None:
            object.__setattr__(self, "max_model_len", model.max_context_tokens)
        elif self.max_model_len > model.max_context_tokens and not self.allow_long_max_model_len:
            raise ValueError(
                f"field 'max_model_len': must be <= {model.max_context_tokens}, {model.name}'s max context "
                f"(got {self.max_model_len}); set allow_long_max_model_len = true to override"
            )
        self._apply_engine_preset(gpu)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"field 'max_num_batched_tokens': must be >= max_model_len={self.max_model_len} "
                f"without chunked prefill (got {self.max_num_batched_tokens}); "
                "enable_chunked_prefill = true allows it"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"field 'max_num_batched_tokens': must be >= max_num_seqs={self.max_num_seqs} "
                f"(got {self.max_num_batched_tokens})"
            )
        if self.kv_offloading_size is not None:
            self._check_offloading()
        self._derive_workload_size_and_clock()
        self._check_memory(model, gpu)
        return self

    def _derive_workload_size_and_clock(self) -> None:
        """A preset's size (1000 requests) and documented rate when not given; a trace's own clock.

        Why (issue 20 §3): a trace with timestamps is evidence -- it replays on its own clock with every
        row unless `request_rate` / `num_prompts` are given, so nothing is filled in for it. A preset
        is generated, so it needs a size, and runs at the rate its docs state (azure-conv 5.5 req/s)
        unless the caller's `request_rate`, or an `arrival` with its own rate, says otherwise. The
        values are filled without marking them set, so `with_overrides(**{"workload.source": ...})`
        re-derives them for the new source instead of carrying a preset's rate onto a trace.
        """
        from workloads.arrivals import arrival_sets_rate
        from workloads.presets import PRESETS

        spec = self.workload
        if spec.source not in PRESETS:
            return
        if self.num_prompts is None and self.duration_s is None:
            object.__setattr__(self, "num_prompts", DEFAULT_NUM_PROMPTS)
        arrival = spec.arrival if spec.arrival is not None else spec.params.get("arrival")
        if spec.request_rate is not None or "request_rate" in spec.params or spec.time_scale != 1.0:
            return  # a time scale stretches the preset's own clock; a rate with it is ambiguous
        if arrival is not None and arrival_sets_rate(arrival):
            return
        filled = spec.model_copy()
        object.__setattr__(filled, "request_rate", PRESETS.get(spec.source).params.get("request_rate"))
        object.__setattr__(self, "workload", filled)

    def _apply_engine_preset(self, gpu: GpuSpec) -> None:
        """Fill the fields the user did not set from the engine preset; refuse what the engine cannot do.

        Why `model_fields_set`: a preset sets defaults, and explicit flags override them. Values filled
        here are not marked as set, so `with_overrides(engine=...)` re-derives them for the new engine.
        """
        given = self.model_fields_set
        policy = self.engine_policy()
        for name, value in policy.preset_flags.items():
            if name not in given:
                if name == "allocator":  # a preset names its allocator by the string form (sglang: radix)
                    value = AllocatorSpec.model_validate(value)
                object.__setattr__(self, name, value)
        problem = policy.preemption_mode_problem(self.preemption_mode)
        if problem is not None:
            raise ValueError(f"field 'preemption_mode': {problem}")
        tokens, seqs = policy.default_budgets(
            max_model_len=self.max_model_len,
            chunked=self.enable_chunked_prefill,
            gpu_name=gpu.name,
            gpu_memory_bytes=gpu.memory_bytes,
        )
        if "max_num_seqs" not in given:
            object.__setattr__(self, "max_num_seqs", seqs)
        if self.max_num_batched_tokens is None:
            object.__setattr__(self, "max_num_batched_tokens", max(tokens, self.max_num_seqs))

    def _check_offloading(self) -> None:
        """The CPU tier is vLLM v1's KV-offloading connector under the prefix cache (docs/engines.md).

        It keeps prefix-cache blocks, so it needs prefix caching; and v1 only recomputes preempted
        requests, so a swapped-out sequence (whose KV would come back twice, by swap and by load) is
        refused rather than modelled.
        """
        if not self.enable_prefix_caching:
            raise ValueError(
                f"field 'kv_offloading_size': the CPU tier keeps prefix-cache blocks, so it needs "
                f"enable_prefix_caching = true (vllm-v1's default) (got {self.kv_offloading_size} GiB)"
            )
        if self.preemption_mode != "recompute":
            raise ValueError(
                f"field 'kv_offloading_size': the CPU tier is vLLM v1's KV connector, which recomputes "
                f'preempted requests; set preemption_mode = "recompute" (got {self.preemption_mode!r})'
            )

    def _check_memory(self, model: ModelSpec, gpu: GpuSpec) -> None:
        tp = self.tensor_parallel_size
        weights = self.weight_bytes_per_gpu()
        if weights > gpu.memory_bytes:
            raise ValueError(
                f"field 'tensor_parallel_size': {model.name}'s weights need {format_bytes(weights)} "
                f"per GPU at tensor_parallel_size={tp}, "
                f"more than {gpu.name}'s {format_bytes(gpu.memory_bytes)}"
            )
        if self.kv_cache_memory is not None:
            if weights + self.kv_cache_memory > gpu.memory_bytes:
                raise ValueError(
                    f"field 'kv_cache_memory': must be <= {format_bytes(gpu.memory_bytes - weights)} "
                    f"({gpu.name}'s memory minus {format_bytes(weights)} of weights per GPU) "
                    f"(got {format_bytes(self.kv_cache_memory)})"
                )
        elif self.kv_budget_bytes_per_gpu() <= 0:
            usable = gpu.memory_bytes * self.gpu_memory_utilization
            raise ValueError(
                f"field 'gpu_memory_utilization': no memory left for the KV cache: {gpu.name} x "
                f"{self.gpu_memory_utilization} = {format_bytes(usable)} - weights {format_bytes(weights)} - "
                f"activation reserve {format_bytes(self.activation_reserve_bytes_per_gpu())}; raise it, "
                "raise tensor_parallel_size or set kv_cache_memory"
            )
        entry, params = self.allocator.entry(), self.allocator_params()
        problem = entry.problem(params)
        if problem is not None:
            param, what = problem
            raise ValueError(f"field 'allocator.params.{param}': {what} (got {params.get(param)!r})")
        capacity = self.kv_capacity_tokens()
        budget_field = "kv_cache_memory" if self.kv_cache_memory is not None else "gpu_memory_utilization"
        needed, what = entry.capacity_needed(params)
        if capacity < needed:
            raise ValueError(
                f"field '{budget_field}': the KV budget holds {capacity} tokens, less than {what} that the "
                f"{self.allocator.name} allocator needs"
            )

    # -- specs and memory plan ----------------------------------------------------------------------------

    def model_spec(self) -> ModelSpec:
        return MODEL_PRESETS[self.model] if isinstance(self.model, str) else self.model

    def gpu_spec(self) -> GpuSpec:
        return GPU_PRESETS[self.gpu] if isinstance(self.gpu, str) else self.gpu

    def kv_heads_per_gpu(self) -> int:
        """KV heads each tensor-parallel rank holds (replicated when tp exceeds the KV heads, as in vLLM)."""
        return max(1, self.model_spec().num_kv_heads // self.tensor_parallel_size)

    def kv_dtype_bytes(self) -> int:
        """Bytes per KV element: the model's dtype for kv_cache_dtype "auto", 1 for the fp8 variants."""
        fixed = KV_CACHE_DTYPE_BYTES[self.kv_cache_dtype]
        return self.model_spec().dtype_bytes if fixed is None else fixed

    def kv_bytes_per_token_per_layer_per_gpu(self) -> int:
        """Bytes of one layer's K (or V) tensor for one token on one GPU: the virtual allocator's unit.

        MLA caches one latent per layer, (kv_lora_rank + qk_rope_head_dim) wide, and tensor
        parallelism does not split it: vLLM's ModelConfig.get_num_kv_heads (vllm/config/model.py)
        returns 1 per GPU when use_mla ("When using MLA during decode it becomes MQA") and the head
        size is kv_lora_rank + qk_rope_head_dim, so every rank holds the whole latent (docs/cost_model.md).
        """
        return kv_layer_bytes_per_gpu(self.model_spec(), self.kv_dtype_bytes(), self.tensor_parallel_size)

    def kv_bytes_per_token_per_gpu(self) -> int:
        model = self.model_spec()
        return model.kv_tensors_per_layer * model.num_layers * self.kv_bytes_per_token_per_layer_per_gpu()

    def kv_bytes_per_token(self) -> int:
        """Bytes one token's KV costs over the whole TP group (OPT-13B: 819,200 = 800 KiB)."""
        return self.kv_bytes_per_token_per_gpu() * self.tensor_parallel_size

    def weight_bytes_per_gpu(self) -> int:
        return math.ceil(self.model_spec().weight_bytes / self.tensor_parallel_size)

    def activation_reserve_bytes_per_gpu(self) -> int:
        """What vLLM's start-up profile keeps from the KV cache besides the weights (bytes per GPU).

        `activation_reserve` when set; else the estimate of sim/scenario/memory_profile.py: non-torch
        memory plus the larger of the dummy forward pass and the dummy sampler pass.
        """
        if self.activation_reserve is not None:
            return self.activation_reserve
        reserve = profile_reserve(
            self.model_spec(), self.engine, self.max_num_batched_tokens, self.max_num_seqs
        )
        return reserve.total_bytes

    def kv_budget_bytes_per_gpu(self) -> int:
        """kv_cache_memory, else memory x utilization - weights/TP - activation reserve (may be <= 0)."""
        if self.kv_cache_memory is not None:
            return self.kv_cache_memory
        usable = math.floor(self.gpu_spec().memory_bytes * self.gpu_memory_utilization)
        return usable - self.weight_bytes_per_gpu() - self.activation_reserve_bytes_per_gpu()

    def kv_budget_bytes(self) -> int:
        return self.kv_budget_bytes_per_gpu() * self.tensor_parallel_size

    def kv_capacity_tokens(self) -> int:
        """Token slots of KV cache: the same on every rank, so the TP group's capacity."""
        return max(0, self.kv_budget_bytes_per_gpu()) // self.kv_bytes_per_token_per_gpu()

    def swap_space_tokens(self) -> int:
        return self.swap_space // self.kv_bytes_per_token_per_gpu()

    def kv_offloading_tokens(self) -> int | None:
        """Token slots of the CPU tier (whole blocks), or None without one.

        As vLLM sizes it (vllm/config/vllm.py: `cpu_bytes_to_use = kv_offloading_size * (1 << 30)`;
        vllm/v1/kv_offload/cpu.py `CPUOffloadingSpec`: blocks = bytes // bytes of one block over the
        whole TP group, `page_size_bytes * tensors * world_size`).
        """
        if self.kv_offloading_size is None:
            return None
        block_bytes = self.block_size * self.kv_bytes_per_token()
        return int(self.kv_offloading_size * GIB) // block_bytes * self.block_size

    def max_concurrency(self, tokens_per_request: int | None = None) -> float:
        """vLLM's 'Maximum concurrency for N tokens per request: X x' (N defaults to max_model_len).

        As vLLM computes it (vllm/v1/core/kv_cache_utils.py `get_max_concurrency_for_kv_cache_config`):
        whole blocks of the cache divided by the blocks one request needs, its tokens rounded up to
        whole blocks (`cdiv(max_model_len, block_size)`).
        """
        tokens = tokens_per_request or self.max_model_len
        blocks_per_request = -(-tokens // self.block_size)
        return (self.kv_capacity_tokens() // self.block_size) / blocks_per_request

    # -- what other packages are called with --------------------------------------------------------------

    def allocator_params(self) -> dict[str, Any]:
        """Full kwargs for `allocators.make_allocator(self.allocator.name, **params)`.

        The scenario supplies the parameters the allocator's entry names in `scenario_params`, from
        its own fields; the rest are the user's `allocator.params`.
        """
        model = self.model_spec()
        supplied: dict[str, Any] = {
            "max_model_len": self.max_model_len,
            "block_size": self.block_size,
            "enable_prefix_caching": self.enable_prefix_caching,
            "num_layers": model.num_layers,
            "bytes_per_token_per_layer": self.kv_bytes_per_token_per_layer_per_gpu(),
            # the model's sliding-window layout (allocators/windowed.py); 0 window layers: none
            "num_window_layers": model.num_window_layers,
            "window_tokens": model.sliding_window_tokens,
            # per-chunk admission of the hybrid manager under chunked prefill
            "prefill_chunk_tokens": self.max_num_batched_tokens if self.enable_chunked_prefill else None,
            # the CPU tier of the prefix cache (--kv-offloading-size), where the allocator has one
            "cpu_tier_tokens": self.kv_offloading_tokens(),
        }
        entry = self.allocator.entry()
        params: dict[str, Any] = {"capacity_tokens": self.kv_capacity_tokens(), **self.allocator.params}
        params.update(
            {
                key: value
                for key, value in supplied.items()
                if key in entry.scenario_params and value is not None
            }
        )
        # Defaults that depend on the engine preset, where the user gave none: the paper's Orca baselines
        # place slabs with the buddy allocator (v0, §6.1); vLLM shares blocks across requests only
        # through its prefix cache (v1 kv_cache_manager `get_computed_blocks` returns nothing with
        # caching off), so sharing without caching only when asked for (allocator.params.share_prefixes).
        defaults: dict[str, Any] = {"share_prefixes": self.enable_prefix_caching}
        placement = self.engine_policy().compare_placement
        if placement is not None:
            defaults["placement"] = placement
        for key, value in defaults.items():
            if key in entry.scenario_defaults and key not in params:
                params[key] = value
        return entry.complete(params)

    def engine_policy(self) -> EnginePolicy:
        """The registered policy of this scenario's engine (its rules and preset defaults)."""
        return engine_policy(self.engine)

    def framework_overhead(self) -> str:
        """The sim/cost/overhead.py preset whose per-step CPU overhead this scenario's engine pays."""
        return self.engine_policy().framework_overhead

    def serving_stack(self) -> dict[str, bool]:
        """The serving stack this scenario's engine runs in (engine policy `serving_stack`)."""
        return dict(self.engine_policy().serving_stack)

    def make_allocator(self) -> Any:
        import allocators

        return allocators.make_allocator(self.allocator.name, **self.allocator_params())

    def rng(self) -> np.random.Generator:
        """The run's one random stream (every random draw derives from `seed`)."""
        return np.random.default_rng(self.seed)

    def load_workload(self, rng: np.random.Generator | None = None) -> Any:
        """The request table for this scenario (a pandas DataFrame validated by workloads).

        Refused first, with one line naming the flag, when the requests asked for cannot fit in
        memory (`sim.scenario.memory_guard`).
        """
        import workloads
        from sim.scenario.memory_guard import check_request_memory

        spec = self.workload
        if self.num_prompts is not None:
            check_request_memory(self.num_prompts, "num_prompts")
            _check_arrival_span(self.num_prompts, spec.request_rate)
        elif (
            self.duration_s is not None
            and isinstance(spec.request_rate, int | float)
            and math.isfinite(spec.request_rate)
        ):
            check_request_memory(self.duration_s * spec.request_rate, "duration_s")
        extra: dict[str, Any] = dict(spec.params)
        if spec.arrival is not None:
            extra["arrival"] = spec.arrival
        if spec.max_tokens_policy is not None:
            extra["max_tokens_policy"] = spec.max_tokens_policy
        return workloads.load(
            spec.source,
            seed=rng if rng is not None else self.rng(),
            num_prompts=self.num_prompts,
            duration_s=self.duration_s,
            # a rate derived from a preset's docs is the preset's own: workloads says so in its clock line
            request_rate=spec.request_rate if "request_rate" in spec.model_fields_set else None,
            time_scale=spec.time_scale,
            max_model_len=self.max_model_len,
            fmt=spec.fmt,
            on_bad_row=spec.on_bad_row,
            clip=spec.clip,
            **extra,
        )

    # -- loading, overriding, saving ----------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> Scenario:
        """Build from plain data (TOML table, summary.json's "scenario"), then apply dotted overrides."""
        if not isinstance(data, dict):
            raise ScenarioError(f"a scenario must be a table of fields (got {type(data).__name__})")
        merged = deep_copy(data)
        for key, value in overrides.items():
            if value is not None:
                set_dotted(merged, key, value)
        return cls(**merged)

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> Scenario:
        """Load a TOML scenario; overrides (dotted keys, None = not given) win over the file."""
        path = Path(path)
        data = read_toml(path)
        for key in overrides:
            check_field(key)
        try:
            return cls.from_dict(data, **overrides)
        except ScenarioError as exc:
            raise ScenarioError(f"{path}: {exc}") from None

    def with_overrides(self, **overrides: Any) -> Scenario:
        """A new scenario with dotted keys changed ('workload.request_rate': 4); None = leave as is.

        Only explicitly set fields are carried over, so derived defaults follow the new values.
        """
        data = self.model_dump(exclude_unset=True)
        for key, value in overrides.items():
            check_field(key)
            if value is None:
                continue
            head = key.split(".", 1)[0]
            current = data.get(head, getattr(self, head))
            if "." in key and head in ("model", "gpu") and isinstance(current, str):
                # Changing one number of a preset: start from the preset's numbers, renamed.
                try:
                    spec = model_preset(current) if head == "model" else gpu_preset(current)
                except ValueError as exc:
                    raise ScenarioError(f"field '{head}': {exc}") from None
                data[head] = spec.model_dump() | {"name": f"{spec.name}-custom"}
            set_dotted(data, key, value)
        return Scenario(**data)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, with derived defaults filled in (goes into summary.json); inf is written "inf"."""
        data = self.model_dump(mode="json")
        # Left out when off, so a run without a CPU tier records the scenario it always did.
        if data.get("kv_offloading_size") is None:
            data.pop("kv_offloading_size", None)
        return json_safe(data)  # the one JSON rule (sim.files): "inf" reads back

    def to_toml(self) -> str:
        """The scenario as TOML text that `from_toml` reads back to an equal scenario."""
        return to_toml(self.to_dict())


def default_scenario() -> Scenario:
    """The vLLM paper's setting: OPT-13B on an A100-40GB, 12 GiB of KV, the paper's ShareGPT (preset
    `sharegpt-paper`) at 2 req/s, 2048 context."""
    return Scenario(
        name="default",
        model="OPT-13B",
        gpu="A100-40GB",
        kv_cache_memory="12GiB",
        max_model_len=2048,
        # the preset's documented 2 req/s and 1000 prompts, derived rather than set: a `--workload
        # trace.csv` on top of this scenario then replays the trace on its own clock, every row
        workload=WorkloadSpec(source="sharegpt-paper"),
    )
