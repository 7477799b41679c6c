"""Worked examples with hand-computed answers, one per behaviour the docs promise."""

from __future__ import annotations

import numpy as np
import pytest

from allocators import AllocatorConfigError, Layout, SeqSpec, available, make_allocator
from allocators.holes import HOLE_STAT_KEYS


def seq(seq_id: int, prompt: int, output: int = 1, max_tokens: int = 10_000, **kw: object) -> SeqSpec:
    return SeqSpec(seq_id=seq_id, prompt_tokens=prompt, max_tokens=max_tokens, output_tokens=output, **kw)


def grow_one(alloc: object, seq_id: int, tokens: int) -> None:
    assert alloc.grow(np.array([seq_id]), tokens).size == 0


# ---- the vLLM paper's example ----------------------------------------------------------------
def test_contiguous_reserves_max_model_len_and_wastes_95_35_pct() -> None:
    alloc = make_allocator("contiguous", capacity_tokens=49_152, max_model_len=8192)
    for seq_id, length in enumerate([180, 240, 95, 1300, 60, 410]):
        assert alloc.demand_tokens(seq(seq_id, length)) == 8192
        assert alloc.admit(seq(seq_id, length, output=0))
    parts = alloc.breakdown()
    assert parts.token_states == 2285
    assert parts.free == 0 and parts.allocated == 49_152
    assert parts.internal == 49_152 - 2285
    assert round(parts.waste_pct, 2) == 95.35


# ---- buddy rounding ------------------------------------------------------------------------
def test_buddy_rounds_slab_to_power_of_two_and_counts_rounding_as_internal() -> None:
    alloc = make_allocator("request_limit", capacity_tokens=1024, placement="buddy", reservation="oracle")
    request = seq(0, prompt=20, output=5)  # oracle reserves 25 slots; buddy hands out 32
    assert alloc.demand_tokens(request) == 32
    assert alloc.admit(request)
    parts = alloc.breakdown()
    assert (parts.token_states, parts.reservation, parts.internal) == (20, 5, 7)
    # 1024 split down to 32: free buddies of 32, 64, 128, 256, 512
    assert sorted(alloc.placement.hole_sizes().tolist()) == [32, 64, 128, 256, 512]
    # a 100-token demand needs a 128 block: the 32 and 64 buddies cannot serve it
    assert alloc.breakdown(100).external == 96
    assert alloc.breakdown(100).free == 1024 - 32 - 96
    alloc.release(0)
    assert alloc.placement.hole_sizes().tolist() == [1024]  # buddies merged back


def test_pow2_reservation_rounds_the_true_output_25_to_32() -> None:
    alloc = make_allocator("request_limit", capacity_tokens=1000, reservation="pow2")
    assert alloc.demand_tokens(seq(0, prompt=100, output=25)) == 132
    capped = make_allocator("request_limit", capacity_tokens=1000, reservation="pow2", max_model_len=120)
    assert capped.demand_tokens(seq(0, prompt=100, output=25)) == 120


def test_buddy_capacity_not_a_power_of_two_keeps_top_blocks_apart() -> None:
    alloc = make_allocator("contiguous", capacity_tokens=1000, max_model_len=600, placement="buddy")
    assert sorted(alloc.placement.hole_sizes().tolist()) == [8, 32, 64, 128, 256, 512]
    assert alloc.demand_tokens(seq(0, 10)) == 1024
    assert alloc.rejection_reason(seq(0, 10)) == "demand_exceeds_capacity"
    assert not alloc.admit(seq(0, 10))


def test_request_limit_reserves_prompt_plus_max_tokens() -> None:
    alloc = make_allocator("request_limit", capacity_tokens=1000, max_model_len=300)
    assert alloc.demand_tokens(seq(0, prompt=100, output=7, max_tokens=50)) == 150
    assert alloc.demand_tokens(seq(0, prompt=100, output=7, max_tokens=500)) == 300  # capped
    oracle = make_allocator("request_limit", capacity_tokens=1000, reservation="oracle")
    assert oracle.demand_tokens(seq(0, prompt=100, output=70, max_tokens=50)) == 150  # stops at max_tokens


# ---- external fragmentation from real holes ---------------------------------------------------
@pytest.mark.parametrize("placement, expected_offset", [("first_fit", 30), ("best_fit", 90)])
def test_holes_make_external_fragmentation(placement: str, expected_offset: int) -> None:
    alloc = make_allocator("request_limit", capacity_tokens=100, placement=placement, reservation="oracle")
    for seq_id in range(3):
        assert alloc.admit(seq(seq_id, prompt=20, output=10))  # slabs [0,30) [30,60) [60,90)
    alloc.release(1)  # holes: [30,60) and [90,100)
    assert alloc.breakdown(40).external == 40 and alloc.breakdown(40).free == 0
    assert alloc.breakdown(25).external == 10 and alloc.breakdown(25).free == 30
    assert alloc.breakdown(0).external == 0 and alloc.breakdown(0).free == 40
    stats = alloc.hole_stats()
    assert (stats["count"], stats["total_tokens"], stats["max_tokens"], stats["mean_tokens"]) == (
        2,
        40,
        30,
        20,
    )
    assert not alloc.admit(seq(7, prompt=35, output=5))  # 40 free, no 40-slot hole
    assert alloc.admit(seq(3, prompt=5, output=5))
    assert int(alloc.layout().offsets_tokens[alloc.layout().seq_ids.tolist().index(3)]) == expected_offset


# ---- paged internal waste and growth ----------------------------------------------------------
def test_paged_sequence_of_33_tokens_holds_3_blocks_with_15_internal() -> None:
    alloc = make_allocator("paged", capacity_tokens=1000, block_size=16)
    assert alloc.demand_tokens(seq(0, prompt=20, output=13)) == 32
    assert alloc.admit(seq(0, prompt=20, output=13))
    parts = alloc.breakdown()
    assert (parts.token_states, parts.reservation, parts.internal) == (20, 12, 0)
    assert parts.external == 1000 % 16 == 8
    grow_one(alloc, 0, 13)
    parts = alloc.breakdown()
    assert alloc.layout().block_table.shape == (1, 3)
    assert (parts.token_states, parts.reservation, parts.internal) == (33, 0, 15)
    assert parts.free == (62 - 3) * 16


def test_paged_max_uniform_growth_is_exact() -> None:
    alloc = make_allocator("paged", capacity_tokens=6 * 16, block_size=16)
    assert alloc.admit(seq(0, prompt=16))  # 1 block, full: needs a block at the next token
    assert alloc.admit(seq(1, prompt=20))  # 2 blocks, 12 free slots in the last
    assert alloc.admit(seq(2, prompt=16))  # 1 block; 2 free blocks remain
    ids = np.array([0, 1])
    # k tokens need: seq 0 ceil((16+k)/16)-1 blocks, seq 1 ceil((20+k)/16)-2 -> 2 blocks up to k=16
    assert alloc.max_uniform_growth(ids, 1000) == 16
    assert alloc.max_uniform_growth(ids, 5) == 5
    assert alloc.grow(ids, 17).tolist() == [1]  # seq 0 takes 2 blocks first, seq 1 finds none left
    assert alloc.lengths_tokens[[0, 1]].tolist() == [33, 20]


def test_paged_grow_serves_sequences_in_the_order_given() -> None:
    alloc = make_allocator("paged", capacity_tokens=3 * 4, block_size=4)
    for seq_id in range(3):
        assert alloc.admit(seq(seq_id, prompt=4))
    assert alloc.grow(np.array([2, 0, 1]), 1).tolist() == [2, 0, 1]  # no block left for anyone
    alloc.release(1)
    assert alloc.grow(np.array([2, 0]), 1).tolist() == [0]


# ---- sharing and duplication ------------------------------------------------------------------
def test_two_sequences_sharing_a_48_token_prefix_store_it_once() -> None:
    alloc = make_allocator("paged", capacity_tokens=1600, block_size=16)
    first = seq(0, prompt=60, prefix_group=7, prefix_tokens=48)
    second = seq(1, prompt=70, prefix_group=7, prefix_tokens=48)
    assert alloc.admit(first)
    assert alloc.demand_tokens(second) == 2 * 16  # 5 prompt blocks, 3 already live
    assert alloc.admit(second)
    assert alloc.prefix_hit_tokens(0) == 0 and alloc.prefix_hit_tokens(1) == 48
    table = alloc.layout().block_table
    assert table[0, :3].tolist() == table[1, :3].tolist()
    assert alloc.pool.refcount[table[0, :3]].tolist() == [2, 2, 2]
    parts = alloc.breakdown()
    assert parts.token_states == 48 + 12 + 22 and parts.duplicated == 0
    assert alloc.num_blocks - alloc.pool.num_free == 6
    alloc.release(0)
    assert alloc.pool.refcount[table[1, :3]].tolist() == [1, 1, 1]


@pytest.mark.parametrize(
    "name, params",
    [
        ("contiguous", {"max_model_len": 100}),
        ("virtual", {"max_model_len": 100, "page_bytes": 64, "bytes_per_token_per_layer": 4}),
        ("paged", {"block_size": 16, "share_prefixes": False}),
    ],
)
def test_unshared_prefix_counts_as_duplicated(name: str, params: dict) -> None:
    alloc = make_allocator(name, capacity_tokens=1600, **params)
    assert alloc.admit(seq(0, prompt=60, prefix_group=7, prefix_tokens=48))
    assert alloc.admit(seq(1, prompt=70, prefix_group=7, prefix_tokens=48))
    parts = alloc.breakdown()
    assert (parts.token_states, parts.duplicated) == (48 + 12 + 22, 48)


def test_partial_tail_of_a_shared_prefix_is_duplicated_in_paged() -> None:
    alloc = make_allocator("paged", capacity_tokens=1600, block_size=16)
    assert alloc.admit(seq(0, prompt=50, prefix_group=1, prefix_tokens=40))
    assert alloc.admit(seq(1, prompt=50, prefix_group=1, prefix_tokens=40))
    # blocks 0-1 (32 tokens) shared; prefix tokens 32..39 sit in each sequence's own block 2
    assert alloc.breakdown().duplicated == 8
    assert alloc.prefix_hit_tokens(1) == 32


def test_equal_block_hashes_share_blocks_along_the_hash_chain() -> None:
    alloc = make_allocator("paged", capacity_tokens=4096, block_size=16)
    assert alloc.admit(seq(0, prompt=40, block_hashes=(5, 6, 7), block_hash_tokens=16))
    assert alloc.admit(seq(1, prompt=40, block_hashes=(5, 6, 9), block_hash_tokens=16))
    assert alloc.admit(seq(2, prompt=40, block_hashes=(6, 6, 7), block_hash_tokens=16))  # other chain
    assert alloc.prefix_hit_tokens(1) == 32  # blocks 0 and 1 match; the last block is partial
    assert alloc.prefix_hit_tokens(2) == 0  # same ids, different prefix: no match


def test_fork_shares_blocks_and_copies_the_partial_block_on_first_write() -> None:
    alloc = make_allocator("paged", capacity_tokens=1600, block_size=16)
    assert alloc.admit(seq(0, prompt=20))
    assert alloc.fork(0, seq(1, prompt=20))
    table = alloc.layout().block_table
    assert table[0].tolist() == table[1].tolist()
    assert alloc.breakdown().token_states == 20 and alloc.breakdown().duplicated == 0
    assert alloc.prefix_hit_tokens(1) == 20
    used_before = alloc.num_blocks - alloc.pool.num_free
    grow_one(alloc, 1, 1)  # the child writes into the shared partial block: copy on write
    assert alloc.num_blocks - alloc.pool.num_free == used_before + 1
    parts = alloc.breakdown()
    assert (parts.token_states, parts.duplicated) == (21, 4)  # 4 copied tokens exist twice
    grow_one(alloc, 0, 1)  # the parent is now the only holder: writes in place
    assert alloc.num_blocks - alloc.pool.num_free == used_before + 1
    assert alloc.breakdown().token_states == 22
    alloc.release(0)  # the original partial block goes: the copy is no longer a duplicate
    assert alloc.breakdown().duplicated == 0 and alloc.breakdown().token_states == 21


def test_contiguous_fork_copies_into_a_new_slab() -> None:
    alloc = make_allocator("contiguous", capacity_tokens=300, max_model_len=100)
    assert alloc.admit(seq(0, prompt=30))
    assert alloc.fork(0, seq(1, prompt=30))
    parts = alloc.breakdown()
    assert (parts.token_states, parts.duplicated, parts.free) == (30, 30, 100)
    assert alloc.fork(0, seq(2, prompt=30))
    assert not alloc.fork(0, seq(3, prompt=30))  # no room for a fourth slab
    alloc.release(0)
    assert alloc.breakdown().duplicated == 30  # seqs 1 and 2 still hold the same 30 tokens


# ---- prefix caching (vLLM automatic prefix caching) --------------------------------------------
def test_prefix_cache_keeps_full_blocks_and_evicts_least_recently_freed_first() -> None:
    alloc = make_allocator("paged", capacity_tokens=4 * 4, block_size=4, enable_prefix_caching=True)
    system = {"prefix_group": 1, "prefix_tokens": 8}
    assert alloc.admit(seq(0, prompt=10, **system))  # blocks: 2 named + 1 partial
    alloc.release(0)
    parts = alloc.breakdown()
    assert parts.cached == 8 and parts.free == 16 and parts.token_states == 0
    assert alloc.admit(seq(1, prompt=9, **system))
    assert alloc.prefix_hit_tokens(1) == 8
    alloc.release(1)
    # free queue (head first): 3, 2 (partial), 1, 0 -> a 3-block prompt evicts block 1, keeps block 0
    assert alloc.admit(seq(2, prompt=12))
    assert alloc.breakdown().cached == 4
    alloc.release(2)
    assert alloc.admit(seq(3, prompt=8, **system))
    assert alloc.prefix_hit_tokens(3) == 4  # block 0 survived, block 1 was evicted


def test_without_prefix_caching_released_blocks_are_forgotten() -> None:
    alloc = make_allocator("paged", capacity_tokens=64, block_size=4)
    system = {"prefix_group": 1, "prefix_tokens": 8}
    assert alloc.admit(seq(0, prompt=10, **system))
    alloc.release(0)
    assert alloc.breakdown().cached == 0
    assert alloc.admit(seq(1, prompt=10, **system))
    assert alloc.prefix_hit_tokens(1) == 0


# ---- virtual (vAttention) ----------------------------------------------------------------------
def test_virtual_maps_pages_of_page_bytes_over_bytes_per_token_per_layer() -> None:
    alloc = make_allocator(
        "virtual",
        capacity_tokens=10_000,
        max_model_len=4096,
        page_bytes=2 * 1024 * 1024,
        bytes_per_token_per_layer=8192,
        num_layers=32,
    )
    assert alloc.tokens_per_page == 256 and alloc.num_blocks == 39
    assert alloc.admit(seq(0, prompt=300, output=10))
    parts = alloc.breakdown()
    assert (parts.token_states, parts.reservation, parts.internal) == (300, 10, 202)
    assert parts.external == 10_000 - 39 * 256
    assert alloc.physical_bytes_mapped() == 2 * 2 * 1024 * 1024 * 2 * 32
    layout = alloc.layout()
    assert layout.kind == "paged" and layout.block_size == 256
    assert alloc.max_uniform_growth(np.array([0]), 10_000) == 4096 - 300
    assert alloc.grow(np.array([0]), 4096 - 299).tolist() == [0]  # past the virtual range


# ---- layout, holes, rejection ----------------------------------------------------------------
@pytest.mark.parametrize(
    "name, params",
    [
        ("contiguous", {"max_model_len": 64}),
        ("paged", {"block_size": 8}),
    ],
)
def test_layout_round_trips_through_npz(tmp_path, name: str, params: dict) -> None:
    alloc = make_allocator(name, capacity_tokens=256, **params)
    assert alloc.admit(seq(4, prompt=20))
    assert alloc.admit(seq(9, prompt=3))
    layout = alloc.layout()
    path = tmp_path / "layout.npz"
    layout.to_npz(str(path))
    back = Layout.from_npz(str(path))
    assert back.kind == layout.kind and back.seq_ids.tolist() == [4, 9]
    assert back.lengths_tokens.tolist() == [20, 3]
    if name == "paged":
        assert back.block_table.tolist() == [[0, 1, 2], [3, -1, -1]]
    else:
        assert back.offsets_tokens.tolist() == [0, 64] and back.reserved_tokens.tolist() == [64, 64]


@pytest.mark.parametrize("name", available())
def test_hole_stats_and_rejection_reason(name: str) -> None:
    params = {
        "contiguous": {"max_model_len": 64},
        "request_limit": {"max_model_len": 64},
        "paged": {"block_size": 8, "max_model_len": 64},
        "radix": {"block_size": 1, "max_model_len": 64},
        "virtual": {"max_model_len": 64, "page_bytes": 32, "bytes_per_token_per_layer": 4},
        "hybrid": {
            "block_size": 8,
            "max_model_len": 64,
            "num_layers": 1,
            "num_window_layers": 1,
            "window_tokens": 64,
        },
    }[name]
    alloc = make_allocator(name, capacity_tokens=256, **params)
    assert set(alloc.hole_stats()) == set(HOLE_STAT_KEYS)
    assert alloc.hole_stats()["total_tokens"] == 256
    assert alloc.rejection_reason(seq(0, prompt=10)) == ""
    assert alloc.rejection_reason(seq(0, prompt=65)) == "prompt_exceeds_max_model_len"
    assert not alloc.admit(seq(0, prompt=65))


def test_double_admit_and_unknown_release_are_engine_bugs() -> None:
    alloc = make_allocator("paged", capacity_tokens=256)
    assert alloc.admit(seq(0, prompt=10))
    with pytest.raises(RuntimeError):
        alloc.admit(seq(0, prompt=10))
    with pytest.raises(RuntimeError):
        alloc.release(5)


# ---- bad arguments ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, params, fragment",
    [
        ("paged", {"capacity_tokens": 0}, "capacity_tokens must be an integer >= 1, got 0"),
        ("paged", {"capacity_tokens": -5}, "capacity_tokens must be an integer >= 1"),
        ("paged", {"capacity_tokens": "lots"}, "capacity_tokens must be an integer >= 1"),
        ("paged", {"capacity_tokens": 100, "block_size": 0}, "block_size must be an integer >= 1, got 0"),
        ("paged", {"capacity_tokens": 100, "block_size": 200}, "block_size must be <= capacity_tokens"),
        (
            "paged",
            {"capacity_tokens": 100, "enable_prefix_caching": "yes"},
            "enable_prefix_caching must be true or false",
        ),
        (
            "paged",
            {"capacity_tokens": 100, "page_bytes": 4},
            "unknown parameter 'page_bytes'; allowed: block_size",
        ),
        (
            "virtual",
            {
                "capacity_tokens": 10_000,
                "max_model_len": 10,
                "page_bytes": 1000,
                "bytes_per_token_per_layer": 8192,
            },
            "page_bytes (1000) must be a multiple of",
        ),
        (
            "virtual",
            {"capacity_tokens": 10_000, "max_model_len": 10},
            "bytes_per_token_per_layer is required",
        ),
        ("contiguous", {"capacity_tokens": 100}, "max_model_len is required"),
        (
            "contiguous",
            {"capacity_tokens": 100, "max_model_len": 10, "placement": "worst_fit"},
            "unknown placement 'worst_fit'; allowed: best_fit, buddy, first_fit",
        ),
        (
            "request_limit",
            {"capacity_tokens": 100, "reservation": "guess"},
            "unknown reservation 'guess'; allowed: limit, oracle, pow2",
        ),
        ("vattention", {"capacity_tokens": 100}, "unknown allocator 'vattention'; allowed: contiguous"),
    ],
)
def test_bad_arguments_raise_one_line_config_error(name: str, params: dict, fragment: str) -> None:
    with pytest.raises(AllocatorConfigError) as caught:
        make_allocator(name, **params)
    assert isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert fragment in message and "\n" not in message


@pytest.mark.parametrize("name", available())
def test_every_allocator_satisfies_the_protocol(name: str) -> None:
    from allocators import Allocator, accepted_params

    required = {
        "contiguous": {"max_model_len": 64},
        "virtual": {"max_model_len": 64, "bytes_per_token_per_layer": 4, "page_bytes": 64},
        "hybrid": {"num_layers": 1, "num_window_layers": 1, "window_tokens": 16},
    }
    alloc = make_allocator(name, capacity_tokens=256, **required.get(name, {}))
    assert isinstance(alloc, Allocator) and alloc.capacity_tokens == 256
    assert set(required.get(name, {})) <= accepted_params(name)
