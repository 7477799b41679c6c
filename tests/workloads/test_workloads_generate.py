"""Generators, presets, max_tokens policies, sharing and clipping: statistics, invariants, determinism."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import workloads
from workloads.describe import prefix_hit_tokens_from_groups, prefix_hit_tokens_from_hashes
from workloads.errors import WorkloadError


def gap_cv(df: pd.DataFrame) -> float:
    gaps = np.diff(df["arrival_s"].to_numpy())
    return float(gaps.std() / gaps.mean())


# ---------------------------------------------------------------- presets


@pytest.mark.parametrize(
    "name", ["sharegpt", "sharegpt-paper", "alpaca", "azure-conv", "chat-system-prompt", "long-context"]
)
def test_every_preset_runs_without_a_file_and_is_valid(name: str) -> None:
    df = workloads.load(name, num_prompts=500, seed=1)
    assert len(df) == 500
    assert df.attrs["source"] == name
    assert list(df["request_id"]) == list(range(500))
    assert (np.diff(df["arrival_s"]) >= 0).all() and df["arrival_s"].iloc[0] == 0.0
    assert (df[["prompt_tokens", "output_tokens", "max_tokens"]] >= 1).all().all()
    if name == "sharegpt":  # vllm bench sends max_tokens = the reference answer's length
        assert (df["max_tokens"] == df["output_tokens"]).all()
    else:
        assert (df["max_tokens"] == 2048).all()  # default policy fixed(2048)
    workloads.validate(df)


def test_presets_lists_the_six_names() -> None:
    assert workloads.presets() == [
        "alpaca",
        "azure-conv",
        "chat-system-prompt",
        "long-context",
        "sharegpt",
        "sharegpt-paper",
    ]


def test_sharegpt_is_what_vllm_bench_serve_sends() -> None:
    """Issue 21 §4: the measured percentiles of vllm bench's ShareGPT requests (Llama-3 tokenizer)."""
    df = workloads.load("sharegpt", num_prompts=200_000, seed=7)
    prompt, output = df["prompt_tokens"].to_numpy(), df["output_tokens"].to_numpy()
    assert prompt.mean() == pytest.approx(204.9, rel=0.03) and output.mean() == pytest.approx(216.3, rel=0.03)
    assert np.percentile(prompt, [50, 99]) == pytest.approx([77, 770], rel=0.05)
    assert np.percentile(output, [50, 99]) == pytest.approx([186, 759], rel=0.05)
    assert prompt.min() >= 4 and prompt.max() <= 933 and output.max() <= 780


@pytest.mark.parametrize(
    ("name", "prompt_mean", "output_mean"),
    [
        ("sharegpt-paper", 161.31, 337.99),
        ("alpaca", 19.31, 58.45),
        ("azure-conv", 1155, 211),
        ("long-context", 12035, 343),
    ],
)
def test_preset_means_match_published_statistics(name: str, prompt_mean: float, output_mean: float) -> None:
    df = workloads.load(name, num_prompts=200_000, seed=7)
    assert df["prompt_tokens"].mean() == pytest.approx(prompt_mean, rel=0.03)
    assert df["output_tokens"].mean() == pytest.approx(output_mean, rel=0.03)


@pytest.mark.parametrize(
    ("name", "prompt_p99", "output_p99"), [("azure-conv", 4142, 601), ("long-context", 85_400, 1118)]
)
def test_fitted_presets_match_published_tails(name: str, prompt_p99: float, output_p99: float) -> None:
    df = workloads.load(name, num_prompts=200_000, seed=7)
    assert np.percentile(df["prompt_tokens"], 99) == pytest.approx(prompt_p99, rel=0.08)
    assert np.percentile(df["output_tokens"], 99) == pytest.approx(output_p99, rel=0.08)


def test_azure_preset_rate_is_near_poisson_5_5() -> None:
    df = workloads.load("azure-conv", num_prompts=50_000, seed=2)
    assert workloads.describe(df)["mean_rate"] == pytest.approx(5.5, rel=0.02)
    assert gap_cv(df) == pytest.approx(1.0, abs=0.03)


def test_chat_system_prompt_shares_900_tokens_on_80_percent() -> None:
    df = workloads.load("chat-system-prompt", num_prompts=20_000, seed=3)
    shared = df["prefix_group"] >= 0
    assert shared.mean() == pytest.approx(0.8, abs=0.015)
    assert (df.loc[shared, "prefix_tokens"] == 900).all()
    assert (df.loc[~shared, "prefix_tokens"] == 0).all()
    assert (df.loc[shared, "prompt_tokens"] > 900).all()  # the preamble is included in the prompt
    assert df.loc[~shared, "prompt_tokens"].mean() == pytest.approx(161.31, rel=0.05)


def test_preset_parameters_are_overridable() -> None:
    df = workloads.load("sharegpt", num_prompts=1000, request_rate=8, max_tokens_policy="exact", seed=0)
    assert (df["max_tokens"] == df["output_tokens"]).all()
    assert workloads.describe(df)["mean_rate"] == pytest.approx(8.0, rel=0.1)
    df = workloads.load(
        "sharegpt", num_prompts=100, prompt_len="fixed(64)", output_len=("uniform", {"low": 5, "high": 9})
    )
    assert (df["prompt_tokens"] == 64).all() and df["output_tokens"].between(5, 9).all()


def test_default_size_is_1000_requests() -> None:
    assert len(workloads.load("alpaca")) == 1000


# ---------------------------------------------------------------- determinism


def test_same_seed_same_table_and_different_seed_different_table() -> None:
    kwargs = dict(num_prompts=2000, turns_per_session=3, block_hash_tokens=16, n="uniform(1, 4)")
    a = workloads.load("chat-system-prompt", seed=11, **kwargs)
    b = workloads.load("chat-system-prompt", seed=11, **kwargs)
    pd.testing.assert_frame_equal(a, b)
    assert a.attrs == b.attrs
    c = workloads.load("chat-system-prompt", seed=12, **kwargs)
    assert not a["prompt_tokens"].equals(c["prompt_tokens"])


def test_a_generator_is_threaded_through_and_global_state_is_untouched() -> None:
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    rng = np.random.default_rng(5)
    first = workloads.load("sharegpt", num_prompts=300, seed=rng)
    second = workloads.load("sharegpt", num_prompts=300, seed=rng)  # the same generator, advanced
    assert not first["prompt_tokens"].equals(second["prompt_tokens"])
    again = workloads.load("sharegpt", num_prompts=300, seed=np.random.default_rng(5))
    pd.testing.assert_frame_equal(first, again)
    assert (np.random.get_state()[1] == before).all()


# ---------------------------------------------------------------- arrivals


def test_poisson_gamma_constant_onoff_rates_and_burstiness() -> None:
    common = dict(
        num_prompts=40_000, request_rate=4.0, prompt_len="fixed(10)", output_len="fixed(10)", seed=4
    )
    poisson = workloads.load("sharegpt", arrival="poisson", **common)
    gamma = workloads.load("sharegpt", arrival="gamma(cv=3)", **common)
    constant = workloads.load("sharegpt", arrival="constant", **common)
    onoff = workloads.load("sharegpt", arrival="onoff(on_s=5, off_s=15)", **common)
    for df in (poisson, gamma, constant, onoff):
        assert workloads.describe(df)["mean_rate"] == pytest.approx(4.0, rel=0.03)
    assert gap_cv(poisson) == pytest.approx(1.0, abs=0.03)
    assert gap_cv(gamma) == pytest.approx(3.0, rel=0.1)
    assert gap_cv(constant) == pytest.approx(0.0, abs=1e-9)
    assert gap_cv(onoff) > 1.5
    busy = np.mod(onoff["arrival_s"].to_numpy(), 20.0)
    assert (busy <= 5.0 + 1e-9).all()  # nothing arrives in the idle 15 s of each 20 s period


def test_request_rate_rescales_an_arrival_with_its_own_rate() -> None:
    df = workloads.load("sharegpt", num_prompts=1000, arrival="gamma(rate=1, cv=2)", request_rate=10)
    assert (len(df) - 1) / df["arrival_s"].iloc[-1] == pytest.approx(10.0)
    assert (workloads.load("sharegpt", num_prompts=50, request_rate=math.inf)["arrival_s"] == 0).all()
    own = workloads.load("sharegpt", num_prompts=20_000, arrival="poisson(6)")  # not the preset's 2 req/s
    assert workloads.describe(own)["mean_rate"] == pytest.approx(6.0, rel=0.03)


def test_time_scale_multiplies_arrival_times() -> None:
    base = workloads.load("sharegpt", num_prompts=100, seed=3)
    slow = workloads.load("sharegpt", num_prompts=100, seed=3, time_scale=2.0)
    np.testing.assert_allclose(slow["arrival_s"], 2.0 * base["arrival_s"])
    own_rate = dict(num_prompts=100, seed=3, arrival="gamma(rate=5, cv=2)")
    np.testing.assert_allclose(
        workloads.load("sharegpt", time_scale=0.5, **own_rate)["arrival_s"],
        0.5 * workloads.load("sharegpt", **own_rate)["arrival_s"],
    )
    window = workloads.load("sharegpt", duration_s=300, time_scale=3.0, seed=3)
    assert window["arrival_s"].max() < 300 and len(window) == pytest.approx(200, rel=0.2)
    with pytest.raises(WorkloadError, match="time_scale"):
        workloads.load("sharegpt", num_prompts=10, time_scale=2.0, request_rate=3)


def test_closed_loop_is_a_spec_for_the_engine() -> None:
    df = workloads.load("sharegpt", arrival="closed(users=16, think_s=2.5)", num_prompts=64)
    assert (df["arrival_s"] == 0.0).all()
    assert df.attrs["closed_loop"] == {"users": 16, "think_s": 2.5}
    bounded = workloads.load("sharegpt", arrival="closed(4, 10)", duration_s=100)
    assert len(bounded) == 4 * 11  # each user sends at most duration / think + 1 requests


def test_duration_keeps_requests_arriving_before_it() -> None:
    df = workloads.load("sharegpt", duration_s=200, request_rate=3, seed=9)
    assert df["arrival_s"].iloc[-1] < 200
    assert len(df) == pytest.approx(600, rel=0.15)


# ---------------------------------------------------------------- lengths


def test_length_distributions() -> None:
    rng = np.random.default_rng(0)
    lognormal = workloads.LENGTHS.get("lognormal")(100_000, rng, mean=500, cv=0.8)
    assert lognormal.mean() == pytest.approx(500, rel=0.02)
    assert lognormal.std() / lognormal.mean() == pytest.approx(0.8, rel=0.05)
    truncated = workloads.LENGTHS.get("lognormal")(100_000, rng, mean=300, cv=2.0, max=1000, min=20)
    assert truncated.min() >= 20 and truncated.max() <= 1000
    assert truncated.mean() == pytest.approx(300, rel=0.02)  # the mean is of the truncated distribution
    uniform = workloads.LENGTHS.get("uniform")(10_000, rng, low=3, high=7)
    assert set(np.unique(uniform)) == {3, 4, 5, 6, 7}
    zipf = workloads.LENGTHS.get("zipf")(50_000, rng, a=1.2, max=100)
    counts = np.bincount(zipf)
    assert zipf.min() >= 1 and zipf.max() <= 100 and counts[1] > counts[2] > counts[10]
    assert counts[1] / counts[2] == pytest.approx(2**1.2, rel=0.1)


def test_empirical_resamples_observed_pairs_jointly() -> None:
    pairs = np.array([[10, 1000], [2000, 5], [300, 300]])
    df = workloads.load("sharegpt", num_prompts=3000, lengths=("empirical", {"source": pairs}), seed=1)
    drawn = set(zip(df["prompt_tokens"], df["output_tokens"], strict=True))
    assert drawn == {(10, 1000), (2000, 5), (300, 300)}


def test_empirical_from_a_file(tmp_path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n7,70\n8,80\n")
    df = workloads.load("sharegpt", num_prompts=100, lengths=f"empirical({str(path)!r})")
    assert set(zip(df["prompt_tokens"], df["output_tokens"], strict=True)) <= {(7, 70), (8, 80)}


# ---------------------------------------------------------------- max_tokens policies and clipping


def test_max_tokens_policies() -> None:
    common = dict(num_prompts=500, seed=2)
    exact = workloads.load("sharegpt", max_tokens_policy="exact", **common)
    factor = workloads.load("sharegpt", max_tokens_policy="factor(1.5)", **common)
    fixed = workloads.load("sharegpt", max_tokens_policy="fixed(512)", **common)
    none = workloads.load("sharegpt", max_tokens_policy="none", max_model_len=4096, **common)
    assert (exact["max_tokens"] == exact["output_tokens"]).all()
    assert (factor["max_tokens"] == np.rint(1.5 * factor["output_tokens"])).all()
    assert (fixed["max_tokens"] == 512).all()
    assert (none["max_tokens"] == 4096 - none["prompt_tokens"]).all()
    with pytest.raises(WorkloadError, match="field 'max_model_len'"):
        workloads.load("sharegpt", num_prompts=10, max_tokens_policy="none")


def test_clipping_to_max_model_len_is_counted() -> None:
    df = workloads.load("long-context", num_prompts=2000, max_model_len=8192, seed=5)
    raw = workloads.load("long-context", num_prompts=2000, seed=5)
    total = df["prompt_tokens"] + df["output_tokens"]
    assert (total <= 8192).all() and (df["prompt_tokens"] <= 8191).all()
    assert (df["prompt_tokens"] + df["max_tokens"] <= 8192).all()
    expected = int(((raw["prompt_tokens"] + raw["output_tokens"]) > 8192).sum())
    assert df.attrs["clipped_requests"] == expected > 0
    kept = workloads.load("long-context", num_prompts=2000, max_model_len=8192, seed=5, clip=False)
    assert kept.attrs["clipped_requests"] == 0
    assert kept.attrs["over_length_prompts"] == int((raw["prompt_tokens"] > 8192).sum())


# ---------------------------------------------------------------- sharing


def test_sessions_carry_their_history_as_a_shared_prefix() -> None:
    df = workloads.load("sharegpt", num_prompts=3000, turns_per_session=4, turn_gap_s=10, seed=6)
    assert {"session_id", "turn", "prefix_group", "prefix_tokens"} <= set(df.columns)
    assert df["turn"].max() > 1
    for _, turns in df.groupby("session_id"):
        assert list(turns["turn"]) == list(range(1, len(turns) + 1))  # in arrival order, none missing
        assert turns["prefix_group"].nunique() == 1
        assert turns["prefix_tokens"].iloc[0] == 0
        previous_context = (turns["prompt_tokens"] + turns["output_tokens"]).to_numpy()[:-1]
        np.testing.assert_array_equal(turns["prefix_tokens"].to_numpy()[1:], previous_context)
    assert workloads.describe(df)["mean_rate"] == pytest.approx(1.0 * 2.0, rel=1e-6)


def test_block_hashes_share_system_prompt_and_session_blocks() -> None:
    df = workloads.load(
        "chat-system-prompt", num_prompts=400, turns_per_session=3, block_hash_tokens=16, seed=8
    )
    assert df.attrs["block_hash_tokens"] == 16
    lengths = df["block_hashes"].map(len)
    assert (lengths == np.ceil(df["prompt_tokens"] / 16)).all()
    with_preamble = [
        h for h, p, t in zip(df["block_hashes"], df["prefix_tokens"], df["turn"], strict=True) if t == 1
    ]
    firsts = {tuple(h[: 900 // 16]) for h in with_preamble if len(h) > 900 // 16}
    assert len(firsts) <= 2  # one preamble (and possibly sessions without one: no shared 56-block start)
    for _, turns in df.groupby("session_id"):
        rows = turns.to_dict("records")
        for earlier, later in zip(rows, rows[1:], strict=False):
            full = earlier["prompt_tokens"] // 16
            assert later["block_hashes"][:full] == earlier["block_hashes"][:full]


def test_parallel_samples_column() -> None:
    assert (workloads.load("alpaca", num_prompts=50, n=4)["n"] == 4).all()
    varied = workloads.load("alpaca", num_prompts=2000, n="uniform(1, 3)")
    assert set(varied["n"].unique()) == {1, 2, 3}
    assert "n" not in workloads.load("alpaca", num_prompts=5).columns


# ---------------------------------------------------------------- prefix hit ratios


def _brute_force_hash_hits(prompt: list[int], hashes: list[list[int]], block: int) -> list[int]:
    seen: set[int] = set()
    out = []
    for p, h in zip(prompt, hashes, strict=True):
        hit = 0
        for j, x in enumerate(h):
            if x not in seen:
                break
            hit += min(block, p - j * block)
        out.append(hit)
        seen.update(h)
    return out


@given(st.lists(st.lists(st.integers(0, 6), min_size=0, max_size=5), min_size=1, max_size=12))
def test_hash_hit_tokens_match_a_brute_force_prefix_cache(hashes: list[list[int]]) -> None:
    block = 4
    prompt = [max(len(h) * block - 1, 1) for h in hashes]  # last block partial; [] = no block ids
    got = prefix_hit_tokens_from_hashes(np.array(prompt), np.array(hashes + [None], dtype=object)[:-1], block)
    assert got.tolist() == _brute_force_hash_hits(prompt, hashes, block)


def test_hash_hits_survive_rows_without_block_ids() -> None:
    """Empty hash lists (a hand-built table) hit nothing, even as the last rows (was an IndexError)."""
    hashes = np.empty(4, dtype=object)
    hashes[:] = [[1, 2], [1, 3], [], []]
    got = prefix_hit_tokens_from_hashes(np.array([1000, 1000, 5, 5]), hashes, 512)
    assert got.tolist() == [0, 512, 0, 0]
    df = pd.DataFrame(
        {
            "request_id": np.arange(4),
            "arrival_s": np.arange(4.0),
            "prompt_tokens": [1000, 1000, 5, 5],
            "output_tokens": 1,
            "max_tokens": 1,
            "block_hashes": hashes,
        }
    )
    df.attrs["block_hash_tokens"] = 512
    assert workloads.describe(df)["prefix_hit_ratio"] == pytest.approx(512 / 2010)


def test_group_hits_count_the_prefix_after_the_first_request() -> None:
    hits = prefix_hit_tokens_from_groups(np.array([0, -1, 0, 1, 1, 0]), np.array([9, 0, 9, 5, 5, 9]))
    assert hits.tolist() == [0, 0, 9, 0, 5, 9]


# ---------------------------------------------------------------- properties and bad parameters


@given(
    num=st.integers(1, 60),
    seed=st.integers(0, 2**32),
    rate=st.floats(0.05, 100),
    arrival=st.sampled_from(
        ["poisson", "gamma(cv=2.5)", "constant", "onoff(on_s=3, off_s=7)", "closed(3, 1.0)"]
    ),
    turns=st.sampled_from([1.0, 1.0, 2.5]),
    system=st.sampled_from([(0, 0.0), (100, 0.5), (40, 1.0)]),
    policy=st.sampled_from(["fixed(100)", "exact", "factor(0.5)", "none"]),
    max_model_len=st.sampled_from([None, 128, 4096]),
    hashes=st.sampled_from([None, 16]),
)
def test_generated_tables_always_satisfy_the_contract(
    num, seed, rate, arrival, turns, system, policy, max_model_len, hashes
) -> None:
    if policy == "none" and max_model_len is None:
        max_model_len = 2048
    df = workloads.load(
        "sharegpt",
        num_prompts=num,
        seed=seed,
        request_rate=rate,
        arrival=arrival,
        turns_per_session=turns,
        system_prompt_tokens=system[0],
        system_prompt_fraction=system[1],
        max_tokens_policy=policy,
        max_model_len=max_model_len,
        block_hash_tokens=hashes,
    )
    workloads.validate(df)
    assert len(df) == num
    assert (
        (df["prompt_tokens"] >= 1).all()
        and (df["output_tokens"] >= 1).all()
        and (df["max_tokens"] >= 1).all()
    )
    if max_model_len is not None:
        assert (df["prompt_tokens"] + df["output_tokens"] <= max_model_len).all()
    if "prefix_tokens" in df:
        assert (df["prefix_tokens"] <= df["prompt_tokens"]).all()
    if hashes:
        assert (df["block_hashes"].map(len) <= np.ceil(df["prompt_tokens"] / hashes)).all()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(request_rate=-1), "request_rate"),
        (dict(num_prompts=0), "num_prompts"),
        (dict(arrival="warp(9)"), "arrival"),
        (dict(arrival="gamma(cv=-2)"), "cv"),
        (dict(arrival="gamma(speed=2)"), "arrival"),
        (dict(prompt_len="lognormal(mean=5000, max=100)"), "mean"),
        (dict(prompt_len="lognormal(("), "prompt_len"),
        (dict(max_tokens_policy="fixed(0)"), "tokens"),
        (dict(colour="blue"), "colour"),
        (dict(seed=-3), "seed"),
        (dict(system_prompt_fraction=1.5), "system_prompt_fraction"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(WorkloadError) as info:
        workloads.load("sharegpt", **{"num_prompts": 10, **kwargs})
    message = str(info.value)
    assert f"field {field!r}" in message and "\n" not in message
    assert isinstance(info.value, ValueError)


def test_unknown_source_lists_presets() -> None:
    with pytest.raises(WorkloadError, match="neither a preset .*sharegpt"):
        workloads.load("sharegtp")


def test_validate_reports_the_first_bad_row_and_field() -> None:
    df = workloads.load("sharegpt", num_prompts=10)
    bad = df.copy()
    bad.loc[6, "output_tokens"] = 0
    bad.loc[8, "prompt_tokens"] = -4
    with pytest.raises(WorkloadError, match=r"^row 7, field 'output_tokens': must be a positive length"):
        workloads.validate(bad)
    unsorted = df.copy()
    unsorted.loc[3, "arrival_s"] = 1e9
    with pytest.raises(WorkloadError, match=r"row 5, field 'arrival_s': timestamps not sorted"):
        workloads.validate(unsorted)
    with pytest.raises(WorkloadError, match="field 'max_tokens': missing column"):
        workloads.validate(df.drop(columns=["max_tokens"]))
    loaded = workloads.load(df.assign(arrival_s=df["arrival_s"] + 5.0), request_rate=2.0)
    assert loaded["arrival_s"].iloc[0] == 0.0 and workloads.describe(loaded)["mean_rate"] == pytest.approx(
        2.0
    )
