"""The built-in allocator families, each declared once: contiguous, request_limit, paged, virtual.

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
from allocators.paged import PagedAllocator
from allocators.placement import available_placements, make_placement
from allocators.virtual import VirtualAllocator

# vAttention maps physical memory in pages; 2 MiB is CUDA's native VMM granularity (vAttention, §5).
DEFAULT_PAGE_BYTES = 2 * 1024 * 1024

_PLACEMENT_WORD = SpecWord("placement", "a placement", tuple(available_placements()))


def default_page_bytes(bytes_per_token_per_layer: int) -> int:
    """The largest whole number of one layer's per-token K (or V) bytes that fits in 2 MiB (>= one)."""
    return max(1, DEFAULT_PAGE_BYTES // bytes_per_token_per_layer) * bytes_per_token_per_layer


def _make_contiguous(
    capacity_tokens: int, max_model_len: Any = MISSING, placement: Any = "first_fit"
) -> Allocator:
    name = "contiguous"
    max_len = int_param(
        name, "max_model_len", required(name, "max_model_len", max_model_len, "slots per slab")
    )
    where = choice_param(name, "placement", placement, available_placements())
    return SlabAllocator(
        name, capacity_tokens, make_placement(where, capacity_tokens), reserve_max_model_len(max_len), max_len
    )


def _make_request_limit(
    capacity_tokens: int, max_model_len: Any = None, placement: Any = "first_fit", reservation: Any = "limit"
) -> Allocator:
    name = "request_limit"
    max_len = None if max_model_len is None else int_param(name, "max_model_len", max_model_len)
    where = choice_param(name, "placement", placement, available_placements())
    policy = choice_param(name, "reservation", reservation, sorted(RESERVATION_POLICIES))
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
) -> Allocator:
    name = "paged"
    size = int_param(name, "block_size", block_size)
    if size > capacity_tokens:
        raise AllocatorConfigError(
            f"paged: block_size must be <= capacity_tokens ({capacity_tokens}), got {size}"
        )
    caching = bool_param(name, "enable_prefix_caching", enable_prefix_caching)
    sharing = bool_param(name, "share_prefixes", share_prefixes)
    if caching and not sharing:
        raise AllocatorConfigError("paged: enable_prefix_caching=true needs share_prefixes=true")
    max_len = None if max_model_len is None else int_param(name, "max_model_len", max_model_len)
    return PagedAllocator(
        name,
        capacity_tokens,
        size,
        enable_prefix_caching=caching,
        share_prefixes=sharing,
        max_model_len=max_len,
    )


def _make_virtual(
    capacity_tokens: int,
    max_model_len: Any = MISSING,
    page_bytes: Any = None,
    bytes_per_token_per_layer: Any = MISSING,
    num_layers: Any = None,
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
    return VirtualAllocator(capacity_tokens, max_len, page, per_token, layers)


def _one_max_model_len(params: Mapping[str, Any]) -> tuple[int, str]:
    return int(params["max_model_len"]), f"one max_model_len={params['max_model_len']} sequence"


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
        params=frozenset({"max_model_len", "placement"}),
        scenario_params=frozenset({"max_model_len"}),
        scenario_defaults=frozenset({"placement"}),
        spec_words=(_PLACEMENT_WORD,),
        min_capacity=_one_max_model_len,
    ),
    AllocatorEntry(
        name="request_limit",
        factory=_make_request_limit,
        params=frozenset({"max_model_len", "placement", "reservation"}),
        scenario_params=frozenset({"max_model_len"}),
        scenario_defaults=frozenset({"placement"}),
        spec_words=(
            SpecWord("reservation", "a reservation", tuple(sorted(RESERVATION_POLICIES))),
            _PLACEMENT_WORD,
        ),
    ),
    AllocatorEntry(
        name="paged",
        factory=_make_paged,
        params=frozenset({"block_size", "enable_prefix_caching", "share_prefixes", "max_model_len"}),
        scenario_params=frozenset({"block_size", "enable_prefix_caching", "max_model_len"}),
        scenario_defaults=frozenset({"share_prefixes"}),
        min_capacity=_one_block,
        block_table_layout=True,
    ),
    AllocatorEntry(
        name="virtual",
        factory=_make_virtual,
        params=frozenset({"max_model_len", "page_bytes", "bytes_per_token_per_layer", "num_layers"}),
        scenario_params=frozenset({"max_model_len", "bytes_per_token_per_layer", "num_layers"}),
        spec_words=(SpecWord("page_bytes", "a page size such as 64KiB", kind="bytes"),),
        min_capacity=_one_page,
        check=_page_bytes_problem,
        derived_defaults=_default_page,
    ),
)
