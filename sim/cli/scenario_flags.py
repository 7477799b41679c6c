"""The scenario flags, declared once: the same names on run, compare and capacity, one builder.

Why one table: every command that simulates takes the same scenario (a `--config` TOML, vLLM-named
flags, `--set` pairs), and a user should meet the same flag with the same meaning everywhere. Each
`ScenarioFlag` names its parameter, its typer option and the scenario field it sets;
`@scenario_options` adds them all to a command's signature (typer reads the signature) and hands
the command one `flags` dict; `scenario_from_flags` turns that dict into a `Scenario`.

The library speaks in field names, the CLI in flag names: `FIELD_FLAGS` maps one to the other, and
`sim.cli.app` rewrites "field 'max_num_seqs'" in a user error to "--max-num-seqs".
"""

from __future__ import annotations

import datetime
import functools
import inspect
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer


@dataclass(frozen=True)
class ScenarioFlag:
    """One scenario option: the command parameter, its type, its typer option and its scenario field."""

    param: str
    kind: Any
    option: Any
    field: str | None  # dotted Scenario field; None for --config and --set, which are not one field
    convert: Callable[[Any], Any] | None = None


def _swap_space(text: str | None) -> str | None:
    """vLLM's --swap-space is in GiB; a plain number here means the same, a unit is taken as given."""
    if text is None:
        return None
    try:
        return f"{float(text)}GiB"
    except ValueError:
        return text


SCENARIO_FLAGS: tuple[ScenarioFlag, ...] = (
    ScenarioFlag(
        "config", Path | None, typer.Option("--config", help="Scenario TOML file; flags override it."), None
    ),
    ScenarioFlag("model", str | None, typer.Option("--model", help="Model preset or config.json."), "model"),
    ScenarioFlag("gpu", str | None, typer.Option("--gpu", help="GPU preset (kvsim presets)."), "gpu"),
    ScenarioFlag(
        "engine",
        str | None,
        typer.Option(
            "--engine",
            help="Engine: vllm-v0 (the paper's, default), vllm-v1 (today's), or any registered.",
        ),
        "engine",
    ),
    ScenarioFlag(
        "block_size", int | None, typer.Option("--block-size", help="Tokens per KV block."), "block_size"
    ),
    ScenarioFlag(
        "kv_cache_dtype",
        str | None,
        typer.Option("--kv-cache-dtype", help="KV cache dtype as in vLLM: auto | fp8 | fp8_e4m3 | fp8_e5m2."),
        "kv_cache_dtype",
    ),
    ScenarioFlag(
        "gpu_memory_utilization",
        float | None,
        typer.Option("--gpu-memory-utilization", help="Fraction of GPU memory used."),
        "gpu_memory_utilization",
    ),
    ScenarioFlag(
        "kv_cache_memory",
        str | None,
        typer.Option("--kv-cache-memory", help="KV budget per GPU, e.g. 12GiB."),
        "kv_cache_memory",
    ),
    ScenarioFlag(
        "max_model_len",
        int | None,
        typer.Option("--max-model-len", help="Max context (prompt + output)."),
        "max_model_len",
    ),
    ScenarioFlag(
        "max_num_seqs",
        int | None,
        typer.Option("--max-num-seqs", help="Max running sequences per step."),
        "max_num_seqs",
    ),
    ScenarioFlag(
        "max_num_batched_tokens",
        int | None,
        typer.Option("--max-num-batched-tokens", help="Token budget per step."),
        "max_num_batched_tokens",
    ),
    ScenarioFlag(
        "enable_chunked_prefill",
        bool | None,
        typer.Option("--enable-chunked-prefill/--no-enable-chunked-prefill", help="Chunked prefill."),
        "enable_chunked_prefill",
    ),
    ScenarioFlag(
        "enable_prefix_caching",
        bool | None,
        typer.Option("--enable-prefix-caching/--no-enable-prefix-caching", help="Prefix caching."),
        "enable_prefix_caching",
    ),
    ScenarioFlag(
        "preemption_mode",
        str | None,
        typer.Option("--preemption-mode", help="recompute | swap | auto (vllm-v0's own choice)."),
        "preemption_mode",
    ),
    ScenarioFlag(
        "swap_space",
        str | None,
        typer.Option("--swap-space", help="CPU swap space per GPU: GiB as in vLLM (4) or a size (8GiB)."),
        "swap_space",
        _swap_space,
    ),
    ScenarioFlag(
        "kv_offloading_size",
        str | None,
        typer.Option(
            "--kv-offloading-size",
            help="CPU tier for the prefix cache, as vLLM: GiB summed over the TP group (64) or a size "
            "(500GB); needs prefix caching.",
        ),
        "kv_offloading_size",
    ),
    ScenarioFlag(
        "tensor_parallel_size",
        int | None,
        typer.Option("--tensor-parallel-size", help="GPUs per model replica."),
        "tensor_parallel_size",
    ),
    ScenarioFlag(
        "workload",
        str | None,
        typer.Option("--workload", help="Workload preset or trace file."),
        "workload.source",
    ),
    ScenarioFlag(
        "request_rate",
        float | None,
        typer.Option("--request-rate", help="Mean arrival rate (req/s)."),
        "workload.request_rate",
    ),
    ScenarioFlag(
        "num_prompts", int | None, typer.Option("--num-prompts", help="Number of requests."), "num_prompts"
    ),
    ScenarioFlag(
        "duration",
        str | None,
        typer.Option("--duration", help="Keep requests arriving within, e.g. 10m."),
        "duration_s",
    ),
    ScenarioFlag(
        "time_scale",
        float | None,
        typer.Option("--time-scale", help="Multiply trace arrival times (2 = half as fast)."),
        "workload.time_scale",
    ),
    ScenarioFlag(
        "fmt", str | None, typer.Option("--format", help="Trace format; detected by default."), "workload.fmt"
    ),
    ScenarioFlag(
        "on_bad_row",
        str | None,
        typer.Option("--on-bad-row", help="Bad trace rows: error (default) or skip (and count)."),
        "workload.on_bad_row",
    ),
    ScenarioFlag("seed", int | None, typer.Option("--seed", help="Random seed."), "seed"),
    ScenarioFlag(
        "quantization",
        str | None,
        typer.Option(
            "--quantization", help="Weights as vLLM's --quantization: fp8 | none (default: as stored)."
        ),
        None,  # not a field: it rewrites --model's spec (sim/scenario/quantization.py)
    ),
    ScenarioFlag(
        "calibration",
        str | None,
        typer.Option("--calibration", help="Calibration profile JSON (kvsim calibrate)."),
        "calibration",
    ),
    ScenarioFlag(
        "name", str | None, typer.Option("--name", help="Scenario name (default results folder)."), "name"
    ),
    ScenarioFlag(
        "set_pairs",
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Any scenario field, dotted: --set hbm_efficiency=0.7 --set workload.params.lengths=... "
            "(TOML values; repeatable).",
        ),
        None,
    ),
)

# Flags that only some commands take (a single run's allocator, layout snapshots).
ALLOCATOR_FLAG = ScenarioFlag(
    "allocator",
    str | None,
    typer.Option("--allocator", help="e.g. paged, request_limit:oracle."),
    "allocator",
)
LAYOUTS_FLAG = ScenarioFlag(
    "export_layouts",
    int | None,
    typer.Option("--export-layouts", help="Write a layout snapshot every N steps."),
    "export_layouts_every",
)


def _flag_name(flag: ScenarioFlag) -> str:
    """'--enable-prefix-caching' from '--enable-prefix-caching/--no-enable-prefix-caching'."""
    declared = flag.option.default if isinstance(flag.option.default, str) else f"--{flag.param}"
    return declared.split("/")[0]


# Scenario field -> the flag that sets it, for error messages (`sim.cli.app`).
FIELD_FLAGS: dict[str, str] = {
    flag.field: _flag_name(flag)
    for flag in (*SCENARIO_FLAGS, ALLOCATOR_FLAG, LAYOUTS_FLAG)
    if flag.field is not None
}


def scenario_options(
    *extra: ScenarioFlag, skip: tuple[str, ...] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command so that it takes every scenario flag (plus `extra`) and receives `flags`.

    The command declares its own parameters and a keyword `flags: dict`; typer sees the own
    parameters followed by the scenario options, each an `Annotated[type, typer.Option(...)]`.
    `skip` leaves out flags the command gives another meaning (capacity's list of TP sizes).
    """
    declared = tuple(flag for flag in (*SCENARIO_FLAGS, *extra) if flag.param not in skip)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "flags"]
        added = [
            inspect.Parameter(
                flag.param,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[flag.kind, flag.option],
            )
            for flag in declared
        ]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            flags = {flag.param: kwargs.pop(flag.param, None) for flag in declared}
            return command(flags=flags, **kwargs)

        wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added
        )
        wrapper.__annotations__ = {}  # typer reads the signature above, not the command's own hints
        return wrapper

    return decorate


def parse_set_value(text: str) -> Any:
    """A `--set` value: a TOML literal (0.7, true, [1, 2], "x") when it parses as one, else the text.

    Why TOML: scenario files are TOML, so `--set k=v` means what `k = v` means in a file; bare words
    (`paged`, `12GiB`, `gamma(cv=3)`) stay strings so nobody has to quote them in a shell. TOML dates
    are kept as text: no scenario field is a date.
    """
    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text
    if isinstance(value, datetime.date | datetime.time):
        return text
    return value


def parse_set_pairs(pairs: list[str]) -> dict[str, Any]:
    """`--set dotted.key=value` pairs as overrides; an unknown key raises ScenarioError listing valid ones."""
    from sim.errors import ScenarioError
    from sim.scenario.overrides import check_field

    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ScenarioError(f"--set: expected KEY=VALUE, e.g. hbm_efficiency=0.7 (got {pair!r})")
        check_field(key)
        overrides[key] = parse_set_value(text.strip())
    return overrides


def merge_overrides(flags: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    """Named flags plus `--set` pairs; the same field given both ways is refused (which one would win?)."""
    from sim.errors import ScenarioError

    both = [key for key in sets if flags.get(key) is not None]
    if both:
        raise ScenarioError(f"--set {both[0]}: already given by its own flag; give it once")
    return {**flags, **sets}


def _field_overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """Flag values keyed by scenario field (dotted where nested); None = not given."""
    known = (*SCENARIO_FLAGS, ALLOCATOR_FLAG, LAYOUTS_FLAG)
    overrides: dict[str, Any] = {}
    for flag in known:
        if flag.field is None or flag.param not in flags:
            continue
        value = flags[flag.param]
        overrides[flag.field] = flag.convert(value) if flag.convert is not None else value
    return overrides


def _base_scenario(config: Path | None, overrides: dict[str, Any], name: str, base: Any) -> Any:
    """The scenario the flags start from.

    A `--config` file when given. Otherwise `base` when the command has one (a sweep spec's base
    scenario). Otherwise the embedded default (the vLLM paper's setting: OPT-13B
    on an A100-40GB with 12 GiB of KV) unless `--model` or `--gpu` names another pair; then vLLM's
    own defaults (KV budget from `gpu_memory_utilization`, the model's context), because the paper's
    12 GiB and 2048 tokens mean nothing for another model or GPU.
    """
    from sim.scenario.scenario import Scenario, default_scenario

    if config is not None:
        return Scenario.from_toml(config)
    if base is not None:
        return base
    if overrides.get("model") is None and overrides.get("gpu") is None:
        return default_scenario()
    return Scenario(name=name)


def build_scenario(
    config: Path | None, overrides: dict[str, Any], *, name: str = "run", base: Any = None
) -> Any:
    """The base scenario (see `_base_scenario`) with the given field overrides on top.

    Overrides go through `with_overrides` in every case, so a dotted key into a preset
    (`model.num_layers`) works the same with and without a config file.
    """
    given = {key: value for key, value in overrides.items() if value is not None}
    scenario = _base_scenario(config, given, name, base).with_overrides(**given)
    if "workload.time_scale" in given and "workload.request_rate" not in given:
        scenario = _keep_trace_rate(scenario)
    return scenario


def _keep_trace_rate(scenario: Any) -> Any:
    """The scenario with workload.request_rate cleared: a time scale replays the trace's own timestamps.

    Why: `workloads.load` refuses time_scale together with request_rate (ambiguous), and the default
    scenario has a rate, so `--time-scale 2` alone would always fail. None cannot travel through
    `with_overrides` (None means "not given" there), hence the explicit rebuild.
    """
    from sim.scenario.scenario import Scenario

    data = scenario.model_dump(exclude_unset=True)
    workload = data.get("workload")
    data["workload"] = dict(workload) if isinstance(workload, dict) else scenario.workload.model_dump()
    data["workload"]["request_rate"] = None
    return Scenario(**data)


def scenario_from_flags(flags: dict[str, Any], *, name: str = "run", base: Any = None) -> Any:
    """The Scenario a command's flags describe (--config, named flags, then --set pairs)."""
    from sim.files import plain_name

    if flags.get("name") is not None:
        plain_name(flags["name"])  # it names the default results folder: results/<name>
    if flags.get("quantization") not in (None, "none"):
        from sim.scenario.quantization import quantized_flag_model

        flags = {**flags, "model": quantized_flag_model(flags.get("model"), flags["quantization"])}
    overrides = merge_overrides(_field_overrides(flags), parse_set_pairs(flags.get("set_pairs") or []))
    return build_scenario(flags.get("config"), overrides, name=name, base=base)
