"""A sequence's token content as runs of named streams, for the radix tree (allocators/radix_tree.py).

Why runs: SGLang's radix tree (python/sglang/srt/mem_cache/radix_cache.py) is keyed by token ids;
kvsim has none. It names content instead (allocators/prefix_keys.py): a prefix group names the
first `prefix_tokens` tokens, a hash chain names blocks of `block_hash_tokens`, and a request's own
tokens (prompt tail and generated tokens) are named by `SeqSpec.content_key`. Token t of a sequence
is then identified by (stream, t): a *run* (stream, start, end) is a stretch of consecutive
positions of one stream. Two sequences hold identical KV for tokens [0, n) exactly when their runs
agree up to n, which is what a radix tree over token ids would find.

The streams mirror prefix_keys.sequence_block_keys, so the radix and paged allocators agree on what
is identical: ("h", chain id) per hash block, ("g", group) for a shared prefix, the content key for
the request's own tokens (a session's turns continue their group's stream), the content key with
("s", sample) for generated tokens of samples other than 0, and a stream unique to the sequence when
it has no content key (anonymous content never matches).
"""

from __future__ import annotations

from collections.abc import Hashable

from allocators.base import SeqSpec
from allocators.prefix_keys import hash_chain

Run = tuple[Hashable, int, int]  # (stream, start position, end position), end exclusive


def own_stream(seq: SeqSpec, anonymous_id: int) -> Hashable:
    """Stream of the request's own prompt tokens (after its named prefix)."""
    return ("anon", anonymous_id) if seq.content_key is None else seq.content_key


def generated_stream(seq: SeqSpec, anonymous_id: int) -> Hashable:
    """Stream of the tokens this sample generates: sample 0 continues the request's own stream."""
    if seq.content_key is None:
        return ("anon", anonymous_id)
    return seq.content_key if seq.sample == 0 else (*seq.content_key, "s", seq.sample)


def prompt_runs(seq: SeqSpec, anonymous_id: int) -> list[Run]:
    """Runs covering the prompt [0, seq.prompt_tokens) (a resumed sample's includes what it generated)."""
    prompt = seq.prompt_tokens
    runs: list[Run] = []
    if seq.block_hashes and seq.block_hash_tokens > 0:
        size = seq.block_hash_tokens
        for index, chain_id in enumerate(hash_chain(seq.block_hashes)):
            start = index * size
            if start >= prompt:
                break
            runs.append((("h", chain_id), start, min(start + size, prompt)))
    elif seq.prefix_group >= 0 and seq.prefix_tokens > 0:
        runs.append((("g", seq.prefix_group), 0, min(seq.prefix_tokens, prompt)))
    named_end = runs[-1][2] if runs else 0
    own_end = prompt if seq.content_key is None else max(named_end, min(prompt, seq.content_prompt_tokens))
    extend_runs(runs, own_stream(seq, anonymous_id), named_end, own_end)
    extend_runs(runs, generated_stream(seq, anonymous_id), own_end, prompt)
    return runs


def extend_runs(runs: list[Run], stream: Hashable, start: int, end: int) -> None:
    """Append [start, end) of `stream`, merging with the last run when it is the same stream."""
    if end <= start:
        return
    if runs and runs[-1][0] == stream and runs[-1][2] == start:
        runs[-1] = (stream, runs[-1][1], end)
    else:
        runs.append((stream, start, end))


def runs_upto(runs: list[Run], end: int) -> list[Run]:
    """The runs cut at position `end`."""
    out: list[Run] = []
    for stream, start, stop in runs:
        if start >= end:
            break
        out.append((stream, start, min(stop, end)))
    return out


def page_key(runs: list[Run], index: int, position: int, page_tokens: int) -> tuple:
    """Identity of the page starting at `position` (runs[index] covers it): its streams and their ends.

    SGLang keys a node's children by the first page of token ids (radix_cache.py `get_child_key`,
    `page_size` ids when page_size > 1); here a page is identified by the streams it holds.
    """
    page_end = position + page_tokens
    parts: list[tuple[Hashable, int]] = []
    for stream, _, stop in runs[index:]:
        parts.append((stream, min(stop, page_end) - position))
        if stop >= page_end:
            break
    return tuple(parts)
