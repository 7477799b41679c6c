"""The built-in allocator families, each declared once: contiguous, request_limit, paged, virtual,
radix, hybrid.

Why one entry per family: an entry is all that the scenario, the CLI and the reports know about an
allocator (see `allocators.entry`). Its factory checks every argument at the boundary and builds the
class, which assumes valid arguments because it runs in the hot loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allocators.base import Allocator, AllocatorConfigError
from allocators.contiguous import RESERVATION_POLICIES, SlabAllocator, reserve_max_model_len
from allocators.entry import (
    MISSING,
    AllocatorEntry,
    SpecWord,
    bool_param,
    choice_param,
    int_param,
    required,
)
from allocators.hybrid import HybridPagedAllocator
from allocators.hybrid_caching import HybridPrefixCachingAllocator
from allocators.paged import PagedAllocator
from allocators.placement import available_placements, make_placement
from allocators.radix import RadixAllocator
from allocators.virtual import VirtualAllocator
from allocators.windowed import LayerPlan, UniformWindowAccounting, WindowedSlabAllocator, layer_plan

# vAttention maps physical memory in pages; 2 MiB is CUDA's native VMM granularity (vAttention, §5).
DEFAULT_PAGE_BYTES = 2 * 1024 * 1024

_PLACEMENT_WORD = SpecWord("placement", "a placement", tuple(available_placements()))


def default_page_bytes(bytes_per_token_per_layer: int) -> int:
    """The largest whole number of one layer's per-token K (or V) bytes that fits in 2 MiB (>= one)."""
    return max(1, DEFAULT_PAGE_BYTES // bytes_per_token_per_layer) * bytes_per_token_per_layer


# A model's sliding-window layout (allocators/windowed.py); every family accepts it, and the scenario
# supplies it from the model (num_window_layers 0 or absent: every layer is full attention).
_WINDOW_PARAMS = frozenset({"num_layers", "num_window_layers", "window_tokens"})


def _window_plan(name: str, num_layers: Any, num_window_layers: Any, window_tokens: Any) -> LayerPlan | None:
    """The sliding-window layout when the model has window layers (allocators/windowed.py), else None."""
    if num_window_layers is None or num_window_layers == 0:
        return None
    layers = int_param(name, "num_layers", required(name, "num_layers", num_layers, "layers of the model"))
    windowed = int_param(name, "num_window_layers", num_window_layers)
    window = int_param(
        name, "window_tokens", required(name, "window_tokens", window_tokens, "the sliding window")
    )
    if windowed > layers:
        raise AllocatorConfigError(
            f"{name}: num_window_layers must be <= num_layers ({layers}), got {windowed}"
        )
    return layer_plan(layers, windowed, window)


def _make_contiguous(
    capacity_tokens: int,
    max_model_len: Any = MISSING,
    placement: Any = "first_fit",
    num_layers: Any = None,
    num_window_layers: Any = None,
    window_tokens: Any = None,
) -> Allocator:
    name = "contiguous"
    max_len = int_param(
        name, "max_model_len", required(name, "max_model_len", max_model_len, "slots per slab")
    )
    where = choice_param(name, "placement", placement, available_placements())
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
    max_len = None if max_model_len is None else int_param(name, "max_model_len", max_model_len)
    where = choice_param(name, "placement", placement, available_placements())
    policy = choice_param(name, "reservation", reservation, sorted(RESERVATION_POLICIES))
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


def _block_size(name: str, block_size: Any, capacity_tokens: int) -> int:
    """A block (page) size that fits the cache at least once."""
    size = int_param(name, "block_size", block_size)
    if size > capacity_tokens:
        raise AllocatorConfigError(
            f"{name}: block_size must be <= capacity_tokens ({capacity_tokens}), got {size}"
        )
    return size


def _make_paged(
    capacity_tokens: int,
    block_size: Any = 16,
    enable_prefix_caching: Any = False,
    share_prefixes: Any = True,
    max_model_len: Any = None,
    num_layers: Any = None,
    num_window_layers: Any = None,
    window_tokens: Any = None,
    cpu_tier_tokens: Any = None,
) -> Allocator:
    name = "paged"
    size = _block_size(name, block_size, capacity_tokens)
    caching = bool_param(name, "enable_prefix_caching", enable_prefix_caching)
    sharing = bool_param(name, "share_prefixes", share_prefixes)
    if caching and not sharing:
        raise AllocatorConfigError("paged: enable_prefix_caching=true needs share_prefixes=true")
    max_len = None if max_model_len is None else int_param(name, "max_model_len", max_model_len)
    tier = None if cpu_tier_tokens is None else int_param(name, "cpu_tier_tokens", cpu_tier_tokens, minimum=0)
    if tier is not None and not caching:
        # the tier holds prefix-cache blocks by their content keys (allocators/cpu_tier.py)
        raise AllocatorConfigError("paged: cpu_tier_tokens (a CPU tier) needs enable_prefix_caching=true")
    paged = PagedAllocator(
        name,
        capacity_tokens,
        size,
        enable_prefix_caching=caching,
        share_prefixes=sharing,
        max_model_len=max_len,
        cpu_tier_tokens=tier,
    )
    plan = _window_plan(name, num_layers, num_window_layers, window_tokens)
    return paged if plan is None else UniformWindowAccounting(paged, plan)


def _make_hybrid(
    capacity_tokens: int,
    block_size: Any = 16,
    max_model_len: Any = None,
    num_layers: Any = MISSING,
    num_window_layers: Any = MISSING,
    window_tokens: Any = MISSING,
    enable_prefix_caching: Any = False,
    prefill_chunk_tokens: Any = None,
) -> Allocator:
    """vLLM v1's hybrid KV-cache manager (allocators/hybrid.py); needs a model with window layers."""
    name = "hybrid"
    size = int_param(name, "block_size", block_size)
    caching = bool_param(name, "enable_prefix_caching", enable_prefix_caching)
    required(name, "num_window_layers", num_window_layers, "layers with a sliding window")
    plan = _window_plan(name, num_layers, num_window_layers, window_tokens)
    if plan is None:
        raise AllocatorConfigError(
            "hybrid: the model has no sliding-window layers (num_window_layers 0); use paged"
        )
    max_len = None if max_model_len is None else int_param(name, "max_model_len", max_model_len)
    chunk = (
        None
        if prefill_chunk_tokens is None
        else int_param(name, "prefill_chunk_tokens", prefill_chunk_tokens)
    )
    # prefix caching under sliding windows: vLLM's hit rule (allocators/hybrid_caching.py)
    cls = HybridPrefixCachingAllocator if caching else HybridPagedAllocator
    return cls(capacity_tokens, size, plan, max_model_len=max_len, prefill_chunk_tokens=chunk)


def _make_radix(
    capacity_tokens: int,
    block_size: Any = 1,
    max_model_len: Any = None,
    num_layers: Any = None,
    num_window_layers: Any = None,
    window_tokens: Any = None,
) -> Allocator:
    """SGLang's token pool with its radix cache (allocators/radix.py); block_size is SGLang's --page-size."""
    name = "radix"
    size = _block_size(name, block_size, capacity_tokens)
    if _window_plan(name, num_layers, num_window_layers, window_tokens) is not None:
        raise AllocatorConfigError(
            "radix: models with sliding-window layers are not modelled (SGLang uses SWARadixCache "
            "there); use paged or hybrid"
        )
    max_len = None if max_model_len is None else int_param(name, "max_model_len", max_model_len)
    return RadixAllocator(capacity_tokens, size, max_len)


def _make_virtual(
    capacity_tokens: int,
    max_model_len: Any = MISSING,
    page_bytes: Any = None,
    bytes_per_token_per_layer: Any = MISSING,
    num_layers: Any = None,
    num_window_layers: Any = None,
    window_tokens: Any = None,
) -> Allocator:
    name = "virtual"
    max_len = int_param(
        name,
        "max_model_len",
        required(name, "max_model_len", max_model_len, "the virtual range per sequence"),
    )
    per_token = int_param(
        name,
        "bytes_per_token_per_layer",
        required(
            name, "bytes_per_token_per_layer", bytes_per_token_per_layer, "kv_heads x head_dim x dtype_bytes"
        ),
    )
    page = default_page_bytes(per_token) if page_bytes is None else int_param(name, "page_bytes", page_bytes)
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
    layers = None if num_layers is None else int_param(name, "num_layers", num_layers)
    virtual = VirtualAllocator(capacity_tokens, max_len, page, per_token, layers)
    plan = _window_plan(name, num_layers, num_window_layers, window_tokens)
    return virtual if plan is None else UniformWindowAccounting(virtual, plan)


def _one_max_model_len(params: Mapping[str, Any]) -> tuple[int, str]:
    """One slab of max_model_len; window layers reserve only their window (allocators/windowed.py)."""
    max_len = int(params["max_model_len"])
    needed = max_len
    windowed = params.get("num_window_layers") or 0
    if windowed:
        layers = int(params["num_layers"])
        window = min(max_len, int(params.get("window_tokens") or max_len))
        needed = -(-((layers - windowed) * max_len + windowed * window) // layers)
    return needed, f"one max_model_len={max_len} sequence"


def _one_block(params: Mapping[str, Any]) -> tuple[int, str]:
    return int(params["block_size"]), f"one block of block_size={params['block_size']}"


def _one_page(params: Mapping[str, Any]) -> tuple[int, str]:
    per_token = int(params["bytes_per_token_per_layer"])
    page = params.get("page_bytes") or default_page_bytes(per_token)
    page_tokens = max(1, int(page) // per_token)
    return page_tokens, f"one page ({page_tokens} tokens)"


def _default_page(params: Mapping[str, Any]) -> dict[str, Any]:
    return {"page_bytes": default_page_bytes(int(params["bytes_per_token_per_layer"]))}


def _page_bytes_problem(params: Mapping[str, Any]) -> tuple[str, str] | None:
    page, per_token = params.get("page_bytes"), int(params["bytes_per_token_per_layer"])
    if page is None or (isinstance(page, int) and page >= per_token and page % per_token == 0):
        return None
    return (
        "page_bytes",
        f"must be a positive multiple of {per_token} bytes (one layer's K for one token per GPU), "
        f"e.g. {default_page_bytes(per_token)}",
    )


BUILTIN_ENTRIES: tuple[AllocatorEntry, ...] = (
    AllocatorEntry(
        name="contiguous",
        factory=_make_contiguous,
        params=frozenset({"max_model_len", "placement"}) | _WINDOW_PARAMS,
        scenario_params=frozenset({"max_model_len"}) | _WINDOW_PARAMS,
        scenario_defaults=frozenset({"placement"}),
        spec_words=(_PLACEMENT_WORD,),
        min_capacity=_one_max_model_len,
    ),
    AllocatorEntry(
        name="request_limit",
        factory=_make_request_limit,
        params=frozenset({"max_model_len", "placement", "reservation"}) | _WINDOW_PARAMS,
        scenario_params=frozenset({"max_model_len"}) | _WINDOW_PARAMS,
        scenario_defaults=frozenset({"placement"}),
        spec_words=(
            SpecWord("reservation", "a reservation", tuple(sorted(RESERVATION_POLICIES))),
            _PLACEMENT_WORD,
        ),
    ),
    AllocatorEntry(
        name="paged",
        factory=_make_paged,
        params=frozenset(
            {"block_size", "enable_prefix_caching", "share_prefixes", "max_model_len", "cpu_tier_tokens"}
        )
        | _WINDOW_PARAMS,
        scenario_params=frozenset({"block_size", "enable_prefix_caching", "max_model_len", "cpu_tier_tokens"})
        | _WINDOW_PARAMS,
        scenario_defaults=frozenset({"share_prefixes"}),
        min_capacity=_one_block,
        block_table_layout=True,
    ),
    AllocatorEntry(
        name="virtual",
        factory=_make_virtual,
        params=frozenset({"max_model_len", "page_bytes", "bytes_per_token_per_layer"}) | _WINDOW_PARAMS,
        scenario_params=frozenset({"max_model_len", "bytes_per_token_per_layer"}) | _WINDOW_PARAMS,
        spec_words=(SpecWord("page_bytes", "a page size such as 64KiB", kind="bytes"),),
        min_capacity=_one_page,
        check=_page_bytes_problem,
        derived_defaults=_default_page,
    ),
    AllocatorEntry(
        name="radix",
        factory=_make_radix,
        params=frozenset({"block_size", "max_model_len"}) | _WINDOW_PARAMS,
        scenario_params=frozenset({"block_size", "max_model_len"}) | _WINDOW_PARAMS,
        min_capacity=_one_block,
    ),
    AllocatorEntry(
        name="hybrid",
        factory=_make_hybrid,
        params=frozenset({"block_size", "max_model_len", "enable_prefix_caching", "prefill_chunk_tokens"})
        | _WINDOW_PARAMS,
        scenario_params=frozenset(
            {"block_size", "max_model_len", "enable_prefix_caching", "prefill_chunk_tokens"}
        )
        | _WINDOW_PARAMS,
        min_capacity=_one_block,
        block_table_layout=True,
    ),
)
