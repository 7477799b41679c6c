"""vAttention-style allocator: virtually contiguous KV, physical pages mapped on demand.

Why it is a paged allocator underneath: each sequence reserves a virtual range of `max_model_len`
tokens, which costs no physical memory; physical pages of `page_bytes` are mapped into it as the
sequence grows (CUDA virtual memory management). Because each layer's K and V are separate
tensors, one page holds `page_bytes / bytes_per_token_per_layer` tokens of one tensor, and the page
is mapped in every tensor at once. In token slots that is exactly a block pool whose block size is
the tokens per page: internal waste is under one page per tensor, there is no external
fragmentation beyond the pool remainder.

What differs from `paged`: the attention kernel sees a contiguous virtual range, so physical
pages are not shared between sequences: shared prefixes are stored once per sequence
(`duplicated`) and `fork` copies the parent's pages. Growth past `max_model_len` fails (the
virtual range ends there).
"""

from __future__ import annotations

from allocators.paged import PagedAllocator


class VirtualAllocator(PagedAllocator):
    """Physical pages of `tokens_per_page` token slots mapped on demand into per-sequence ranges."""

    def __init__(
        self,
        capacity_tokens: int,
        max_model_len: int,
        page_bytes: int,
        bytes_per_token_per_layer: int,
        num_layers: int | None = None,
    ) -> None:
        self.page_bytes = page_bytes
        self.bytes_per_token_per_layer = bytes_per_token_per_layer
        self.num_layers = num_layers
        self.tokens_per_page = page_bytes // bytes_per_token_per_layer
        super().__init__(
            "virtual",
            capacity_tokens,
            block_size=self.tokens_per_page,
            enable_prefix_caching=False,
            share_prefixes=False,
            fork_copies=True,
            max_model_len=max_model_len,
        )
        # Swap space is counted token by token, as before abilities were declared (the engine rounded
        # only the `paged` family to blocks); vAttention (ASPLOS 2025) models no swap to CPU memory.
        self.swap_block_tokens = 1

    def physical_bytes_mapped(self) -> int | None:
        """Bytes of physical pages mapped now, all layers, K and V (None without num_layers)."""
        if self.num_layers is None:
            return None
        pages_per_tensor = self.num_blocks - self.pool.num_free
        return pages_per_tensor * self.page_bytes * 2 * self.num_layers
