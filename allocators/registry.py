"""The allocator registry: names -> constructors, with every argument checked at the boundary.

Why checks here and not in the classes: the classes assume valid arguments (they run in the hot
loop); users reach them only through `make_allocator`, which turns every bad argument into one
`AllocatorConfigError` line naming the parameter, the value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from allocators.base import Allocator, AllocatorConfigError
from allocators.contiguous import RESERVATION_POLICIES, SlabAllocator, reserve_max_model_len
from allocators.hybrid import HybridPagedAllocator
from allocators.paged import PagedAllocator
from allocators.placement import available_placements, make_placement
from allocators.virtual import VirtualAllocator
from allocators.windowed import LayerPlan, UniformWindowAccounting, WindowedSlabAllocator, layer_plan

DEFAULT_PAGE_BYTES = 2 * 1024 * 1024  # vAttention maps 2 MiB pages by default

_MISSING = object()


def _int_param(allocator: str, field: str, value: Any, *, minimum: int = 1) -> int:
    """`value` as an int >= minimum, or AllocatorConfigError naming the field and the range."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int and hasattr(value, "__index__") and not isinstance(value, bool):
        try:
            value = value.__index__()
            is_int = True
        except TypeError:
            is_int = False
    if not is_int or value < minimum:
        raise AllocatorConfigError(f"{allocator}: {field} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _bool_param(allocator: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise AllocatorConfigError(f"{allocator}: {field} must be true or false, got {value!r}")
    return value


def _choice_param(allocator: str, field: str, value: Any, allowed: list[str]) -> str:
    if value not in allowed:
        raise AllocatorConfigError(f"{allocator}: unknown {field} {value!r}; allowed: {', '.join(allowed)}")
    return str(value)


def _required(allocator: str, field: str, value: Any, meaning: str) -> Any:
    if value is _MISSING or value is None:
        raise AllocatorConfigError(f"{allocator}: {field} is required ({meaning})")
    return value


def _window_plan(name: str, num_layers: Any, num_window_layers: Any, window_tokens: Any) -> LayerPlan | None:
    """The sliding-window layout when the model has window layers (allocators/windowed.py), else None."""
    if num_window_layers is None or num_window_layers == 0:
        return None
    layers = _int_param(name, "num_layers", _required(name, "num_layers", num_layers, "layers of the model"))
    windowed = _int_param(name, "num_window_layers", num_window_layers)
    window = _int_param(
        name, "window_tokens", _required(name, "window_tokens", window_tokens, "the sliding window")
    )
    if windowed > layers:
        raise AllocatorConfigError(
            f"{name}: num_window_layers must be <= num_layers ({layers}), got {windowed}"
        )
    return layer_plan(layers, windowed, window)


def _make_contiguous(
    capacity_tokens: int,
    max_model_len: Any = _MISSING,
    placement: Any = "first_fit",
    num_layers: Any = None,
    num_window_layers: Any = None,
    window_tokens: Any = None,
) -> Allocator:
    name = "contiguous"
    max_len = _int_param(
        name, "max_model_len", _required(name, "max_model_len", max_model_len, "slots per slab")
    )
    where = _choice_param(name, "placement", placement, available_placements())
    plan = _window_plan(name, num_layers, num_window_layers, window_tokens)
    if plan is not None:
        slots = capacity_tokens * plan.num_layers
        return WindowedSlabAllocator(
            name, slots, make_placement(where, slots), reserve_max_model_len(max_len), max_len, plan
        )
    return SlabAllocator(
        name, capacity_tokens, make_placement(where, capacity_tokens), reserve_max_model_len(max_len), max_len
    )


def _make_request_limit(
    capacity_tokens: int,
    max_model_len: Any = None,
    placement: Any = "first_fit",
    reservation: Any = "limit",
    num_layers: Any = None,
    num_window_layers: Any = None,
    window_tokens: Any = None,
) -> Allocator:
    name = "request_limit"
    max_len = None if max_model_len is None else _int_param(name, "max_model_len", max_model_len)
    where = _choice_param(name, "placement", placement, available_placements())
    policy = _choice_param(name, "reservation", reservation, sorted(RESERVATION_POLICIES))
    plan = _window_plan(name, num_layers, num_window_layers, window_tokens)
    if plan is not None:
        slots = capacity_tokens * plan.num_layers
        return WindowedSlabAllocator(
            name, slots, make_placement(where, slots), RESERVATION_POLICIES[policy](max_len), max_len, plan
        )
    return SlabAllocator(
        name,
        capacity_tokens,
        make_placement(where, capacity_tokens),
        RESERVATION_POLICIES[policy](max_len),
        max_len,
    )


def _make_paged(
    capacity_tokens: int,
    block_size: Any = 16,
    enable_prefix_caching: Any = False,
    share_prefixes: Any = True,
    max_model_len: Any = None,
    num_layers: Any = None,
    num_window_layers: Any = None,
    window_tokens: Any = None,
) -> Allocator:
    name = "paged"
    size = _int_param(name, "block_size", block_size)
    if size > capacity_tokens:
        raise AllocatorConfigError(
            f"paged: block_size must be <= capacity_tokens ({capacity_tokens}), got {size}"
        )
    caching = _bool_param(name, "enable_prefix_caching", enable_prefix_caching)
    sharing = _bool_param(name, "share_prefixes", share_prefixes)
    if caching and not sharing:
        raise AllocatorConfigError("paged: enable_prefix_caching=true needs share_prefixes=true")
    max_len = None if max_model_len is None else _int_param(name, "max_model_len", max_model_len)
    paged = PagedAllocator(
        name,
        capacity_tokens,
        size,
        enable_prefix_caching=caching,
        share_prefixes=sharing,
        max_model_len=max_len,
    )
    plan = _window_plan(name, num_layers, num_window_layers, window_tokens)
    return paged if plan is None else UniformWindowAccounting(paged, plan)


def _make_hybrid(
    capacity_tokens: int,
    block_size: Any = 16,
    max_model_len: Any = None,
    num_layers: Any = _MISSING,
    num_window_layers: Any = _MISSING,
    window_tokens: Any = _MISSING,
    enable_prefix_caching: Any = False,
    prefill_chunk_tokens: Any = None,
) -> Allocator:
    """vLLM v1's hybrid KV-cache manager (allocators/hybrid.py); needs a model with window layers."""
    name = "hybrid"
    size = _int_param(name, "block_size", block_size)
    if _bool_param(name, "enable_prefix_caching", enable_prefix_caching):
        raise AllocatorConfigError(
            "hybrid: prefix caching under sliding windows is not modelled yet; use paged for prefix caching"
        )
    _required(name, "num_window_layers", num_window_layers, "layers with a sliding window")
    plan = _window_plan(name, num_layers, num_window_layers, window_tokens)
    if plan is None:
        raise AllocatorConfigError(
            "hybrid: the model has no sliding-window layers (num_window_layers 0); use paged"
        )
    max_len = None if max_model_len is None else _int_param(name, "max_model_len", max_model_len)
    chunk = (
        None
        if prefill_chunk_tokens is None
        else _int_param(name, "prefill_chunk_tokens", prefill_chunk_tokens)
    )
    return HybridPagedAllocator(
        capacity_tokens, size, plan, max_model_len=max_len, prefill_chunk_tokens=chunk
    )


def _make_virtual(
    capacity_tokens: int,
    max_model_len: Any = _MISSING,
    page_bytes: Any = DEFAULT_PAGE_BYTES,
    bytes_per_token_per_layer: Any = _MISSING,
    num_layers: Any = None,
    num_window_layers: Any = None,
    window_tokens: Any = None,
) -> Allocator:
    name = "virtual"
    max_len = _int_param(
        name,
        "max_model_len",
        _required(name, "max_model_len", max_model_len, "the virtual range per sequence"),
    )
    page = _int_param(name, "page_bytes", page_bytes)
    per_token = _int_param(
        name,
        "bytes_per_token_per_layer",
        _required(
            name, "bytes_per_token_per_layer", bytes_per_token_per_layer, "kv_heads x head_dim x dtype_bytes"
        ),
    )
    if page % per_token != 0:
        raise AllocatorConfigError(
            f"virtual: page_bytes ({page}) must be a multiple of bytes_per_token_per_layer ({per_token}) "
            f"(kv_heads x head_dim x dtype_bytes), e.g. 2097152 with 8192 gives 256 tokens per page"
        )
    if page // per_token > capacity_tokens:
        raise AllocatorConfigError(
            f"virtual: one page holds {page // per_token} tokens, "
            f"more than capacity_tokens ({capacity_tokens})"
        )
    layers = None if num_layers is None else _int_param(name, "num_layers", num_layers)
    virtual = VirtualAllocator(capacity_tokens, max_len, page, per_token, layers)
    plan = _window_plan(name, num_layers, num_window_layers, window_tokens)
    return virtual if plan is None else UniformWindowAccounting(virtual, plan)


_FACTORIES: dict[str, Callable[..., Allocator]] = {
    "contiguous": _make_contiguous,
    "request_limit": _make_request_limit,
    "paged": _make_paged,
    "virtual": _make_virtual,
    "hybrid": _make_hybrid,
}

_WINDOW_PARAMS = frozenset({"num_layers", "num_window_layers", "window_tokens"})

_PARAMS: dict[str, frozenset[str]] = {
    "contiguous": frozenset({"max_model_len", "placement"}) | _WINDOW_PARAMS,
    "request_limit": frozenset({"max_model_len", "placement", "reservation"}) | _WINDOW_PARAMS,
    "paged": frozenset({"block_size", "enable_prefix_caching", "share_prefixes", "max_model_len"})
    | _WINDOW_PARAMS,
    "virtual": frozenset({"max_model_len", "page_bytes", "bytes_per_token_per_layer", "num_layers"})
    | _WINDOW_PARAMS,
    "hybrid": frozenset({"block_size", "max_model_len", "enable_prefix_caching", "prefill_chunk_tokens"})
    | _WINDOW_PARAMS,
}


def available() -> list[str]:
    """Allocator names `make_allocator` accepts."""
    return list(_FACTORIES)


def accepted_params(name: str) -> frozenset[str]:
    """Parameter names `name` accepts (besides capacity_tokens), so callers can filter a config."""
    if name not in _PARAMS:
        raise AllocatorConfigError(f"unknown allocator {name!r}; allowed: {', '.join(available())}")
    return _PARAMS[name]


def make_allocator(name: str, capacity_tokens: Any = _MISSING, **params: Any) -> Allocator:
    """Build the allocator `name` over `capacity_tokens` token slots; see docs/allocators.md."""
    allowed = accepted_params(name)
    capacity = _int_param(
        name, "capacity_tokens", _required(name, "capacity_tokens", capacity_tokens, "token slots")
    )
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise AllocatorConfigError(
            f"{name}: unknown parameter {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}"
        )
    return _FACTORIES[name](capacity, **params)
