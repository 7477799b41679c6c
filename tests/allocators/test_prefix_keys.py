"""Block names computed the fast ways equal the definition, `sequence_block_keys`.

Why: the paged allocator names a released sequence's blocks by extending its (cached) prompt keys
(`extended_block_keys`) and caches prompt keys by content fields only (`_cached_block_keys`); both
must give exactly the keys `sequence_block_keys` defines, for hash chains, prefix groups, content
keys, samples and any length below or past the prompt. Likewise admission's cached block pieces
(`_cached_block_pieces`, keyed by the prompt length capped at the named content) and `block_pieces`.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from allocators.base import SeqSpec
from allocators.paged import _cached_block_keys, _cached_block_pieces
from allocators.prefix_keys import block_pieces, extended_block_keys, sequence_block_keys

_SPECS = st.builds(
    SeqSpec,
    seq_id=st.integers(0, 50),
    prompt_tokens=st.integers(1, 200),
    max_tokens=st.integers(0, 100),
    output_tokens=st.integers(0, 100),
    prefix_group=st.sampled_from([-1, 0, 3]),
    prefix_tokens=st.integers(0, 120),
    block_hashes=st.sampled_from([(), (11, 12, 13), (11, 12, 23, 24, 25)]),
    block_hash_tokens=st.sampled_from([0, 8, 20]),
    content_key=st.sampled_from([None, ("r", 1), ("r", 2, "t")]),
    content_prompt_tokens=st.integers(0, 200),
    sample=st.integers(0, 2),
    first_chunk_tokens=st.integers(0, 64),
)


@given(seq=_SPECS, block_size=st.sampled_from([1, 4, 16]), num_tokens=st.integers(0, 400))
def test_extended_keys_match_the_definition(seq: SeqSpec, block_size: int, num_tokens: int) -> None:
    prompt_keys = tuple(sequence_block_keys(seq, block_size))
    assert _cached_block_keys(seq, block_size) == prompt_keys
    expected = tuple(sequence_block_keys(seq, block_size, num_tokens))
    assert extended_block_keys(seq, block_size, num_tokens, prompt_keys) == expected


@given(seq=_SPECS, block_size=st.sampled_from([1, 4, 16]), skip=st.booleans())
def test_cached_pieces_match_the_definition(seq: SeqSpec, block_size: int, skip: bool) -> None:
    assert _cached_block_pieces(seq, block_size, skip) == block_pieces(
        seq, block_size, skip_whole_blocks=skip
    )
