"""Names for identical KV content: shared system prompts and prefix-block hash chains.

Why here: the contiguous family (which stores a copy per sequence, so it *duplicates*) and the paged
family (which shares physical blocks) must agree on what counts as identical content; both derive
their keys from a `SeqSpec` through these two functions.

Identity rules (documented in docs/allocators.md):
- `block_hashes` win over `prefix_group` when a sequence has both.
- A hash chain node j (tokens [j*H, min((j+1)*H, prompt))) is named by the hash of the chain of ids
  0..j, as vLLM names its blocks, so equal ids at different positions or after different prefixes
  are different content.
- A prefix group g with prefix_tokens p names the first p prompt tokens.
"""

from __future__ import annotations

from collections.abc import Hashable

from allocators.base import SeqSpec


def hash_chain(block_hashes: tuple[int, ...]) -> list[int]:
    """chain[j] = hash of (chain[j-1], block_hashes[j]): identity of the whole prefix up to block j."""
    chain: list[int] = []
    previous = 0
    for block_id in block_hashes:
        previous = hash((previous, block_id))
        chain.append(previous)
    return chain


def prompt_segments(seq: SeqSpec) -> list[tuple[Hashable, int]]:
    """Consecutive (key, tokens) segments naming a prefix of the prompt (for per-sequence copies)."""
    prompt = seq.prompt_tokens
    if seq.block_hashes and seq.block_hash_tokens > 0:
        size = seq.block_hash_tokens
        segments: list[tuple[Hashable, int]] = []
        for index, chain_id in enumerate(hash_chain(seq.block_hashes)):
            start = index * size
            if start >= prompt:
                break
            covered = min(size, prompt - start)
            segments.append((("h", chain_id, covered), covered))
        return segments
    if seq.prefix_group >= 0 and seq.prefix_tokens > 0:
        shared = min(seq.prefix_tokens, prompt)
        return [(("g", seq.prefix_group, shared), shared)]
    return []


def full_block_keys(seq: SeqSpec, block_size: int) -> list[Hashable]:
    """Keys of the prompt's leading full, named blocks of `block_size` tokens (stops at the first unnamed).

    Block i (tokens [i*B, (i+1)*B)) is named when all its tokens lie in named content: inside the
    shared prefix for a prefix group, or inside hash blocks 0..J-1 (J = ceil((i+1)*B / H)) for
    hashes, where it is named by (chain id of hash block J-1, i). Keys are small tuples built in one
    comprehension: admission of a long prompt touches every block, so this is on the hot path.
    """
    prompt = seq.prompt_tokens
    if seq.block_hashes and seq.block_hash_tokens > 0:
        size = seq.block_hash_tokens
        chain = hash_chain(seq.block_hashes)
        named_blocks = min(prompt, len(chain) * size) // block_size
        return [(chain[((index + 1) * block_size - 1) // size], index) for index in range(named_blocks)]
    if seq.prefix_group >= 0 and seq.prefix_tokens > 0:
        group = seq.prefix_group
        return [("g", group, index) for index in range(min(seq.prefix_tokens, prompt) // block_size)]
    return []


def sequence_block_keys(seq: SeqSpec, block_size: int, num_tokens: int | None = None) -> list[Hashable]:
    """Keys of the leading full blocks of a sequence's first `num_tokens` tokens (default: the prompt).

    Why: vLLM hashes every full block, prompt or generated (vllm/v1/core/block_pool.py
    `BlockPool.cache_full_blocks`), so a recompute-resumed request or a session's next turn hits the
    blocks its earlier tokens filled. Named content (hash chain, prefix group) keeps its keys
    (`full_block_keys`); after it, blocks are named by `seq.content_key` and their index, and blocks
    holding generated tokens (past `content_prompt_tokens`) of a sample other than 0 also by the
    sample. With no content key this is `full_block_keys` for the prompt.
    """
    tokens = seq.prompt_tokens if num_tokens is None else num_tokens
    keys = full_block_keys(seq, block_size)[: tokens // block_size]
    if seq.content_key is None:
        return keys
    base, sample, shared_blocks = seq.content_key, seq.sample, seq.content_prompt_tokens // block_size
    # one comprehension (admission names every prompt block): sample 0 and shared blocks by index only
    if sample == 0:
        keys.extend([(*base, index) for index in range(len(keys), tokens // block_size)])
    else:
        keys.extend(
            [
                (*base, index) if index < shared_blocks else (*base, "s", sample, index)
                for index in range(len(keys), tokens // block_size)
            ]
        )
    return keys


def extended_block_keys(
    seq: SeqSpec, block_size: int, num_tokens: int, prompt_keys: tuple[Hashable, ...]
) -> tuple[Hashable, ...]:
    """`sequence_block_keys(seq, block_size, num_tokens)`, given the prompt's keys (the default call).

    Why: a released sequence names its filled blocks (prompt and generated); its prompt's keys were
    computed at admission (and are cached), so only the generated blocks' keys are new. The same
    keys: without a content key the named blocks all lie in the prompt; with one, the prompt's keys
    are one per full prompt block and later blocks follow the same rule as in `sequence_block_keys`.
    """
    full = num_tokens // block_size
    if seq.content_key is None or full <= len(prompt_keys):
        return prompt_keys[:full]
    base, sample, shared_blocks = seq.content_key, seq.sample, seq.content_prompt_tokens // block_size
    return prompt_keys + tuple(
        [
            (*base, index) if sample == 0 or index < shared_blocks else (*base, "s", sample, index)
            for index in range(len(prompt_keys), full)
        ]
    )


def named_segments(seq: SeqSpec) -> list[tuple[int, int, tuple[Hashable, ...]]]:
    """(start, end, identity) of each named stretch of the prompt, in order."""
    prompt = seq.prompt_tokens
    if seq.block_hashes and seq.block_hash_tokens > 0:
        size = seq.block_hash_tokens
        stretches: list[tuple[int, int, tuple[Hashable, ...]]] = []
        for index, chain_id in enumerate(hash_chain(seq.block_hashes)):
            start = index * size
            if start >= prompt:
                break
            stretches.append((start, min(start + size, prompt), ("h", chain_id)))
        return stretches
    if seq.prefix_group >= 0 and seq.prefix_tokens > 0:
        return [(0, min(seq.prefix_tokens, prompt), ("g", seq.prefix_group))]
    return []


def block_pieces(
    seq: SeqSpec, block_size: int, skip_whole_blocks: bool = False
) -> dict[int, list[tuple[Hashable, int]]]:
    """Prompt block index -> (key, tokens) of the named pieces in it, for blocks holding named tokens.

    A piece is the part of one named stretch that falls in one block; for a given block size it
    is the same for every sequence with that stretch, so two blocks holding the same piece hold
    identical KV (a shared block holds it once; two private blocks hold it twice: duplicated).
    Pieces cover a prefix of each block's tokens.

    `skip_whole_blocks` leaves out blocks that one stretch fills entirely. With prefix sharing on,
    such a block is named by its full-block key and stored once, so it can never be a duplicate;
    skipping it makes admission cost O(stretches) instead of O(blocks).
    """
    pieces: dict[int, list[tuple[Hashable, int]]] = {}
    for start, end, identity in named_segments(seq):
        first, last = start // block_size, -(-end // block_size)  # blocks [first, last) overlap it
        # only a stretch's first and last blocks can be partly filled by it
        indices = sorted({first, last - 1}) if skip_whole_blocks else range(first, last)
        for index in indices:
            low = max(start, index * block_size)
            high = min(end, (index + 1) * block_size)
            if skip_whole_blocks and high - low == block_size:
                continue
            pieces.setdefault(index, []).append(((*identity, index, high - low), high - low))
    return pieces
