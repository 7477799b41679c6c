"""The static waste calculator: how much of the reserved KV memory a set of sequences really uses.

Why it drives the real allocators instead of a formula: the number it prints must be the number
the simulator would measure, so each family's figure comes from admitting every sequence into that
allocator (with room for all of them), growing it to its final length and reading `breakdown()`.
`used` = token_states + duplicated (slots holding KV), `reserved` = every slot the allocator holds
for them (capacity - free - external), `waste_pct` = 1 - used / reserved.

The vLLM paper's example: max_model_len 8192 and sequences of 180, 240, 95, 1300, 60 and 410
tokens use 2,285 of the 49,152 slots a contiguous allocator reserves: 95.35 % wasted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from allocators import SeqSpec, make_allocator
from allocators.builtin import DEFAULT_PAGE_BYTES
from allocators.placement import next_pow2
from sim.errors import ScenarioError
from workloads.max_tokens import DEFAULT_CLIENT_MAX_TOKENS

DEFAULT_BYTES_PER_TOKEN_PER_LAYER = 8192  # Llama-2-7B fp16: 32 KV heads x 128 head dim x 2 bytes


@dataclass(frozen=True, slots=True)
class SequenceLength:
    """One sequence of the calculation: prompt and output tokens (prompt 0 when only a total is given)."""

    prompt_tokens: int
    output_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class WasteRow:
    """One allocator family's figure."""

    allocator: str
    used_tokens: int
    reserved_tokens: int
    waste_pct: float
    note: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def parse_lengths(values: list[str]) -> list[SequenceLength]:
    """Parse `TOKENS` or `PROMPT+OUTPUT` arguments; ScenarioError names the bad one."""
    if not values:
        raise ScenarioError("lengths: give at least one sequence length (TOKENS or PROMPT+OUTPUT)")
    parsed: list[SequenceLength] = []
    for index, text in enumerate(values, start=1):
        parts = text.split("+")
        try:
            numbers = [int(part) for part in parts]
        except ValueError:
            numbers = []
        if len(numbers) == 1 and numbers[0] >= 1:
            parsed.append(SequenceLength(0, numbers[0]))
        elif len(numbers) == 2 and numbers[0] >= 0 and numbers[1] >= 1:
            parsed.append(SequenceLength(numbers[0], numbers[1]))
        else:
            raise ScenarioError(
                f"lengths: argument {index} ({text!r}) must be TOKENS or PROMPT+OUTPUT "
                "(integers, TOKENS and OUTPUT >= 1, PROMPT >= 0)"
            )
    return parsed


def _measure(
    name: str,
    label: str,
    note: str,
    sequences: list[SequenceLength],
    max_tokens: list[int],
    unit_tokens: int,
    **params: object,
) -> WasteRow:
    """Admit every sequence into a fresh allocator with room for all, grow each to its end, measure.

    `max_tokens[i]` is sequence i's client limit (it stops there if its output is longer).
    `unit_tokens` is the allocation grain (block or page): each sequence gets room for its
    power-of-two-rounded worst case plus one grain, so every admission and growth succeeds.
    """
    longest = max(seq.total_tokens for seq in sequences)
    room = next_pow2(max(int(params.get("max_model_len", 1)), longest)) + unit_tokens
    allocator = make_allocator(name, capacity_tokens=room * len(sequences), **params)
    for seq_id, (seq, limit) in enumerate(zip(sequences, max_tokens, strict=True)):
        spec = SeqSpec(seq_id, seq.prompt_tokens, limit, seq.output_tokens)
        if not allocator.admit(spec):  # pragma: no cover - capacity is sized for every sequence
            raise RuntimeError(f"{name}: could not admit sequence {seq_id}")
        generated = spec.final_tokens - seq.prompt_tokens
        if generated and allocator.grow(np.array([seq_id]), generated).size:  # pragma: no cover
            raise RuntimeError(f"{name}: sequence {seq_id} could not grow to {spec.final_tokens}")
    parts = allocator.breakdown(0)
    used = parts.token_states + parts.duplicated
    reserved = parts.capacity - parts.free - parts.external
    waste = 0.0 if reserved == 0 else 100.0 * (1.0 - used / reserved)
    return WasteRow(label, used, reserved, waste, note)


def request_limits(
    sequences: list[SequenceLength], max_model_len: int, max_tokens: int | None
) -> tuple[int, list[int]]:
    """(the client limit, each sequence's limit) for the request_limit:limit row.

    Without `max_tokens` the limit is the client default (2048, workloads' default max_tokens policy):
    a request_limit allocator is only as good as the limits clients send, so the row must always be
    there. Each limit is clipped to max_model_len - prompt, as workloads clip max_tokens.
    """
    limit = max_tokens if max_tokens is not None else DEFAULT_CLIENT_MAX_TOKENS
    return limit, [max(1, min(limit, max_model_len - seq.prompt_tokens)) for seq in sequences]


def static_waste(
    sequences: list[SequenceLength],
    *,
    max_model_len: int,
    max_tokens: int | None = None,
    block_size: int = 16,
    page_bytes: int = DEFAULT_PAGE_BYTES,
    bytes_per_token_per_layer: int = DEFAULT_BYTES_PER_TOKEN_PER_LAYER,
    placement: str = "first_fit",
) -> list[WasteRow]:
    """Used vs reserved slots per allocator family for sequences that run to their final length.

    Rows: contiguous (slab = max_model_len), request_limit:limit (slab = prompt + max_tokens, the
    client default 2048 when `max_tokens` is None; see `request_limits`), request_limit:oracle and
    :pow2 (the vLLM paper's Orca baselines), paged (`block_size`), virtual (pages of `page_bytes`).
    Only an explicit `max_tokens` stops sequences early in every row; the default limit stops them
    only in the request_limit:limit row, where that is what a client's default would do.
    """
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise ScenarioError(f"max_model_len must be an integer >= 1, got {max_model_len!r}")
    if max_tokens is not None and (isinstance(max_tokens, bool) or max_tokens < 1):
        raise ScenarioError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    for index, seq in enumerate(sequences, start=1):
        if seq.total_tokens > max_model_len:
            raise ScenarioError(
                f"lengths: sequence {index} has {seq.total_tokens} tokens, "
                f"more than max_model_len ({max_model_len})"
            )
    limits = [max_tokens if max_tokens is not None else max_model_len] * len(sequences)
    client_limit, client_limits = request_limits(sequences, max_model_len, max_tokens)
    source = "--max-tokens" if max_tokens is not None else "default client limit"
    clipped = " (at most max_model_len - prompt)" if client_limits != [client_limit] * len(sequences) else ""
    tokens_per_page = max(1, page_bytes // max(1, bytes_per_token_per_layer))
    rows = [
        _measure(
            "contiguous",
            "contiguous",
            f"slab = max_model_len ({max_model_len}), {placement}",
            sequences,
            limits,
            1,
            max_model_len=max_model_len,
            placement=placement,
        )
    ]
    variants = [
        ("limit", f"slab = prompt + max_tokens ({source} {client_limit}){clipped}", client_limits),
        ("oracle", "slab = prompt + true output", limits),
        ("pow2", "slab = prompt + pow2(true output)", limits),
    ]
    for reservation, note, seq_limits in variants:
        rows.append(
            _measure(
                "request_limit",
                f"request_limit:{reservation}",
                f"{note}, {placement}",
                sequences,
                seq_limits,
                1,
                max_model_len=max_model_len,
                placement=placement,
                reservation=reservation,
            )
        )
    paged_grain = block_size if isinstance(block_size, int) and block_size > 0 else 1
    rows.append(
        _measure(
            "paged",
            "paged",
            f"block_size {block_size}",
            sequences,
            limits,
            paged_grain,
            block_size=block_size,
        )
    )
    rows.append(
        _measure(
            "virtual",
            "virtual",
            f"{tokens_per_page} tokens per {page_bytes} B page",
            sequences,
            limits,
            tokens_per_page,
            max_model_len=max_model_len,
            page_bytes=page_bytes,
            bytes_per_token_per_layer=bytes_per_token_per_layer,
        )
    )
    return rows
