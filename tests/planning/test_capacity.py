"""`sim.capacity` with the real engine: a hand-computed answer, the max_model_len trade-off, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from _capacity_helpers import KNOWN, KV_TOKENS, OUTPUT_TOKENS, PROMPT_TOKENS, SMALL, STEP_S

from sim.cli import main
from sim.planning.capacity import capacity
from sim.planning.sizing import ProbeSizing
from sim.planning.slo import Slo
from sim.scenario.scenario import Scenario, default_scenario

# One sequence at a time (max_num_seqs = 1), each needs one prefill step (its first token) and
# OUTPUT_TOKENS - 1 decode steps: the server completes 1 / (10 x 10 ms) = 10 requests/s. With
# evenly spaced arrivals at or below that rate every request finds the server idle (TTFT = one step,
# 10 ms); above it the queue grows without bound and TTFT with it.
# Just above 10 req/s request i waits i x (0.1 s - 1/rate): with 100 requests the p99 TTFT crosses
# the 15 ms SLO below 10.01 req/s, so every verdict is known outside (10, 10.01).
HAND_MAX_RATE_REQ_S = 1.0 / (OUTPUT_TOKENS * STEP_S)
SLACK_REQ_S = 0.01


@pytest.fixture(scope="module")
def known_plan():
    scenario = Scenario.from_dict(KNOWN)
    return capacity(
        scenario,
        slo=Slo(ttft_p99_s=0.015),
        allocators=["contiguous", "paged"],
        max_model_lens=[1024, 2048],
        tensor_parallel_sizes=[1, 2],
        target_rate_req_s=25.0,
        rel_tol=0.01,
        jobs=2,
        sizing=SMALL,
    )


def row(plan, allocator: str, max_model_len: int, tp: int = 1) -> dict:
    [found] = [
        r
        for r in plan.rows
        if (r["allocator"], r["max_model_len"], r["tensor_parallel_size"]) == (allocator, max_model_len, tp)
    ]
    return found


def test_bisection_finds_the_hand_computed_max_rate(known_plan) -> None:
    assert not known_plan.failures and len(known_plan.rows) == 6
    for r in known_plan.rows:
        # the saturation throughput (every request at t = 0, max_num_seqs 1) is the hand-computed
        # 10 req/s, and it caps the search: evenly spaced arrivals at exactly that rate still find the
        # server idle, so the ceiling itself passes and is the answer, confirmed by a 10x longer run
        assert r["saturation_throughput_req_s"] == pytest.approx(HAND_MAX_RATE_REQ_S)
        assert r["rate_status"] in ("converged", "at_ceiling")
        # the answer is one tolerance step (1 %) below the highest passing rate
        low, high = r["rate_final_bracket"]
        assert r["max_rate_req_s"] == pytest.approx(low / 1.01) and high > HAND_MAX_RATE_REQ_S
        assert HAND_MAX_RATE_REQ_S / 1.01**2 <= r["max_rate_req_s"] <= r["saturation_throughput_req_s"]
        assert r["confirmed"] and r["confirmation_num_prompts"] == 1000
        assert r["confirmation_p99_ttft_ms"] == pytest.approx(STEP_S * 1e3)
        for probe in r["max_rate_runs"]:  # every verdict is the hand-computed one
            if probe["request_rate"] <= HAND_MAX_RATE_REQ_S:
                assert probe["ok"], probe
            elif probe["request_rate"] >= HAND_MAX_RATE_REQ_S + SLACK_REQ_S:
                assert not probe["ok"], probe
            assert probe["seed"] == 0 and probe["num_prompts"] == r["probe_prompts"] == 100
            if probe["request_rate"] <= HAND_MAX_RATE_REQ_S:  # the server is idle at every arrival
                assert probe["p99_ttft_ms"] == pytest.approx(STEP_S * 1e3)


def test_saturation_concurrency_matches_memory_arithmetic(known_plan) -> None:
    # contiguous reserves max_model_len per sequence: KV_TOKENS // max_model_len fit at once
    assert row(known_plan, "contiguous", 1024)["max_concurrency"] == KV_TOKENS // 1024 == 4
    assert row(known_plan, "contiguous", 2048)["max_concurrency"] == 2
    assert row(known_plan, "contiguous", 2048, tp=2)["max_concurrency"] == 2 * KV_TOKENS // 2048
    assert row(known_plan, "contiguous", 2048)["sustained_concurrency"] == pytest.approx(2.0)
    # vLLM's figure: KV tokens / max_model_len, no simulation behind it
    assert row(known_plan, "paged", 1024)["vllm_max_concurrency_x"] == pytest.approx(KV_TOKENS / 1024)
    assert row(known_plan, "paged", 2048)["vllm_max_concurrency_runs"] == []
    # paged admits on the prompt (2 blocks of 16): 4096 / 32 = 128 at the peak, whatever max_model_len
    for mml in (1024, 2048):
        paged = row(known_plan, "paged", mml)
        assert paged["max_concurrency"] == KV_TOKENS // PROMPT_TOKENS == 128
        assert paged["concurrency_limited_by"] == "memory"
        # the first saturation run (100 prompts) hit the prompt count, so a second one doubled it
        assert [run["num_prompts"] for run in paged["max_concurrency_runs"]] == [100, 200]
    # sustained under saturation: at full length a sequence holds 3 blocks (48 slots): about 4096/48
    assert 4096 / 48 <= row(known_plan, "paged", 2048)["sustained_concurrency"] <= 128
    assert (
        row(known_plan, "paged", 2048)["sustained_concurrency"]
        == row(known_plan, "paged", 1024)["sustained_concurrency"]
    )


def test_gpus_needed_for_a_target_rate(known_plan) -> None:
    # 25 req/s at just under 10 req/s per replica: 3 replicas; with TP 2 each replica is 2 GPUs
    assert row(known_plan, "contiguous", 2048)["replicas_needed"] == 3
    assert row(known_plan, "contiguous", 2048)["gpus_needed"] == 3
    assert row(known_plan, "contiguous", 2048, tp=2)["gpus_needed"] == 6
    assert known_plan.gpu_plan()["paged"] == {
        "gpus": 3,
        "replicas": 3,
        "tensor_parallel_size": 1,
        "max_rate_per_replica_req_s": row(known_plan, "paged", 2048)["max_rate_req_s"],
    }


def test_plan_writes_json_and_csv_with_every_simulation(known_plan, tmp_path: Path) -> None:
    data = json.loads(known_plan.write(tmp_path / "plan.json").read_text())
    assert data["slo_text"] == "p99 TTFT <= 15 ms" and len(data["rows"]) == 6
    assert all(r["max_rate_runs"] and r["max_concurrency_runs"] for r in data["rows"])
    frame = pd.read_csv(known_plan.write(tmp_path / "plan.csv"))
    assert len(frame) == 6 and {"max_rate_req_s", "max_concurrency", "gpus_needed"} <= set(frame.columns)
    assert json.loads(frame.loc[0, "max_rate_runs"])[0]["seed"] == 0
    # no temp files left; the marker records both files as kvsim's (sim.files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvsim-output.json", "plan.csv", "plan.json"]


def test_max_model_len_trade_off_contiguous_collapses_paged_barely_moves() -> None:
    scenario = default_scenario().with_overrides(num_prompts=150)  # ShareGPT, OPT-13B, 12 GiB of KV
    plan = capacity(
        scenario,
        slo=Slo(ttft_p99_s=5.0),
        allocators=["contiguous", "paged"],
        max_model_lens=[1024, 2048],
        jobs=2,
        sizing=ProbeSizing(min_prompts=150, batch_turnovers=2.0, confirm_factor=2.0),
    )
    assert not plan.failures
    contiguous = {r["max_model_len"]: r for r in plan.rows if r["allocator"] == "contiguous"}
    paged = {r["max_model_len"]: r for r in plan.rows if r["allocator"] == "paged"}
    capacity_tokens = contiguous[1024]["kv_capacity_tokens"]
    assert contiguous[1024]["max_concurrency"] == capacity_tokens // 1024
    assert contiguous[2048]["max_concurrency"] == capacity_tokens // 2048
    assert contiguous[2048]["max_rate_req_s"] < 0.6 * contiguous[1024]["max_rate_req_s"]
    assert paged[2048]["max_rate_req_s"] >= 0.8 * paged[1024]["max_rate_req_s"]
    assert paged[2048]["sustained_concurrency"] >= 0.9 * paged[1024]["sustained_concurrency"]
    assert paged[2048]["max_rate_req_s"] > 3 * contiguous[2048]["max_rate_req_s"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


@pytest.fixture
def small_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI plans with the default ProbeSizing (1,000-prompt probes, 10,000-prompt confirmations);
    the tests' scenarios are hand-computed with 100 prompts, so they plan with SMALL."""
    monkeypatch.setattr("sim.planning.capacity.ProbeSizing", lambda: SMALL)


def test_cli_capacity_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], small_probes: None
) -> None:
    scenario_file = tmp_path / "known.toml"
    scenario_file.write_text(Scenario.from_dict(KNOWN).to_toml())
    output = tmp_path / "out" / "plan.json"
    output.parent.mkdir()  # --output's folder must exist: a mistyped one is refused, not created
    args = [
        "capacity",
        "--config",
        str(scenario_file),
        "--allocators",
        "contiguous",
        "--max-model-lens",
        "1K",
    ]
    args += ["--slo-ttft-p99", "15ms", "--target-rate", "25", "--rate-min", "2", "--rate-max", "40"]
    args += ["--rate-tol", "0.02", "--jobs", "1", "--output", str(output)]
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr().out
    assert code == 0
    assert "contiguous" in out and "3 GPU(s) = 3 replica(s) x TP 1" in out
    assert re.search(r"^wall time: \d+\.\d\d s$", out.splitlines()[-1])  # its own cost, last line
    # under the table: what the max rate was searched over and judged by (the caption may wrap)
    caption = " ".join(out.split())
    # the bracket asked for, [2, 40], is capped at the measured saturation throughput (10 req/s)
    assert "max rate: geometric bisection, bracket [2, 10] req/s" in caption
    assert "stopped at hi/lo - 1 <= 0.02" in caption
    assert (
        "sustainable = served in steady state: a long run at that rate keeps the waiting queue and the "
        "running batch from growing with p99 TTFT <= 15 ms, and never above the measured saturation "
        "throughput" in caption
    )
    assert (
        "probe rule = slopes of the waiting queue and of everything in the system over the second half "
        "of the arrivals <= 0.05 x rate, no request is rejected, and the SLO holds" in caption
    )
    data = json.loads(output.read_text())
    assert {r["max_model_len"] for r in data["rows"]} == {1024, 2048}
    assert all(r["rate_bracket"] == [2.0, pytest.approx(10.0)] for r in data["rows"])
    assert all(10 / 1.02**2 <= r["max_rate_req_s"] <= 10 / 1.02 + SLACK_REQ_S for r in data["rows"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give an SLO"),
        (["--slo-ttft-p99", "2 parsecs"], "--slo-ttft-p99: expected seconds or a number with a unit"),
        (["--slo-tpot-p99", "-1s"], "must be a finite duration >= 0 s"),
        (["--slo-ttft-p99", "2s", "--output", "plan.txt"], "suffix must be .json or .csv"),
        (["--slo-ttft-p99", "2s", "--max-model-lens", "2K,abc"], "--max-model-lens: 'abc' is not an integer"),
        (["--slo-ttft-p99", "2s", "--rate-min", "1"], "--rate-min and --rate-max go together"),
        (["--slo-ttft-p99", "2s", "--rate-min", "5", "--rate-max", "1"], "0 < min < max"),
        (
            ["--slo-ttft-p99", "2s", "--target-rate", "0"],
            "--target-rate: must be a finite number > 0",
        ),
        (["--slo-ttft-p99", "2s", "--allocators", "paged,nope"], "unknown allocator 'nope'"),
        (["--slo-ttft-p99", "2s", "--jobs", "0"], "--jobs: must be an integer >= 1"),
        (["--slo-ttft-p99", "2s", "--workload", "/nonexistent/trace.csv"], "/nonexistent/trace.csv: "),
    ],
)
def test_cli_capacity_bad_input_gives_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_workers(**kwargs: object) -> None:
        raise AssertionError("workers were started for a plan that had to be refused")

    monkeypatch.setattr("sim.sweeps.executors.make_executor", no_workers)
    code, out, err = run_cli(["capacity", *args], capsys)
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_slo_on_normalized_latency_is_judged_on_the_mean() -> None:
    scenario = Scenario.from_dict(KNOWN)
    plan = capacity(
        scenario,
        slo=Slo(normalized_latency_s_per_token=0.0105),  # 10 steps of 10 ms over 10 tokens: 0.01 s/token idle
        allocators=["paged"],
        max_model_lens=[2048],
        rate_bracket=(1.0, 20.0),
        rel_tol=0.02,
        jobs=1,
        sizing=SMALL,
    )
    assert not plan.failures, plan.failures
    [r] = plan.rows
    # below 10 req/s the mean is exactly 0.01 s/token; above, waits add up quickly across 100 requests
    # (the answer is one 2 % tolerance step below the highest passing rate)
    assert HAND_MAX_RATE_REQ_S / 1.02**2 <= r["max_rate_req_s"] <= HAND_MAX_RATE_REQ_S / 1.02 + SLACK_REQ_S
    for probe in r["max_rate_runs"]:
        assert probe["ok"] == (probe["mean_normalized_latency_s_per_token"] <= 0.0105)
        if probe["request_rate"] <= HAND_MAX_RATE_REQ_S:
            assert probe["mean_normalized_latency_s_per_token"] == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("under_file", "{blocker} is a file, not a folder"),
        ("missing_folder", "folder {missing} does not exist (create it first)"),
        ("a_folder", "is a folder, expected a file name"),
    ],
)
def test_cli_capacity_unwritable_output_is_refused_before_any_simulation(
    tmp_path: Path,
    where: str,
    problem: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    missing = tmp_path / "no-such-folder"
    output = {
        "under_file": blocker / "plan.json",
        "missing_folder": missing / "plan.json",
        "a_folder": tmp_path / "plan.json",
    }[where]
    if where == "a_folder":
        output.mkdir()

    def no_plan(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulations started before --output was checked")

    monkeypatch.setattr("sim.planning.capacity.capacity", no_plan)
    code, out, err = run_cli(["capacity", "--slo-ttft-p99", "2s", "--output", str(output)], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err == f"error: --output {output}: {problem.format(blocker=blocker, missing=missing)}\n"
    assert not missing.exists()  # refused, not created


def test_plan_write_refuses_a_missing_folder(known_plan, tmp_path: Path) -> None:
    from sim.files import OutputPathError

    with pytest.raises(OutputPathError, match="does not exist"):
        known_plan.write(tmp_path / "new" / "plan.json")
    assert list(tmp_path.iterdir()) == []


def test_caption_gives_each_rows_bracket_tolerance_and_rule(known_plan) -> None:
    lines = known_plan.caption_lines()
    assert len(lines) == 5
    assert lines[0] == known_plan.sustainable_line()
    # every row's bracket comes from its own saturation throughput; here all are the same 10 req/s
    low, high = known_plan.rows[0]["rate_bracket"]
    assert f"bracket [{low:.3g}, {high:.3g}] req/s" in lines[1] and high == pytest.approx(10.0)
    assert "hi/lo - 1 <= 0.01" in lines[1]
    assert lines[2].startswith(f"probe rule = {known_plan.stability_rule()}")
    assert "prompts per probe: contiguous 1024/TP1 100;" in lines[3]


def test_max_stable_rate_is_the_bisection_kvsim_capacity_runs(known_plan) -> None:
    from sim.planning.jobs import max_stable_rate

    planned = row(known_plan, "paged", 2048)
    scenario = Scenario.from_dict(KNOWN).with_overrides(
        allocator="paged", max_model_len=2048, num_prompts=planned["probe_prompts"]
    )
    search = max_stable_rate(
        scenario,
        low=planned["rate_bracket"][0],
        high=planned["rate_bracket"][1],
        slo=Slo(ttft_p99_s=0.015),
        rel_tol=0.01,
        ceiling=planned["saturation_throughput_req_s"],
    )
    # confirmed at once (no search below): the answer is one tolerance step below the bisection's
    assert search.max_rate_req_s / 1.01 == planned["max_rate_req_s"]
    assert [record for probe in search.probes for record in probe.evidence] == planned["max_rate_runs"]
    # without an SLO: stability alone. Past 10 req/s the queue grows by (rate - 10) req/s, which the
    # rule tolerates up to 0.05 x rate: the queue starts to grow (by the rule) near 10 / 0.95 req/s
    stable = max_stable_rate(scenario, low=2.0, high=40.0, rel_tol=0.02)
    assert stable.status == "converged"
    assert HAND_MAX_RATE_REQ_S / 1.02 <= stable.max_rate_req_s <= HAND_MAX_RATE_REQ_S / 0.95 + SLACK_REQ_S
    assert all(
        record["reason"] == "queue and batch stable"
        for probe in stable.probes
        if probe.ok
        for record in probe.evidence[-1:]
    )


def test_default_allocators_skip_a_family_that_refuses_the_model_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, small_probes: None
) -> None:
    """OPT-13B has no sliding-window layers: with the default allocators, hybrid (which refuses such a
    model) is left out with one line instead of failing every row and exiting 1; named with
    --allocators, it keeps failing with its own one-line error."""
    # two families stand for "every registered one": only paged is simulated, so the test stays fast
    monkeypatch.setattr("sim.planning.capacity._default_allocators", lambda: ["paged", "hybrid"])
    scenario_file = tmp_path / "known.toml"
    scenario_file.write_text(Scenario.from_dict({**KNOWN, "num_prompts": 20}).to_toml())
    args = ["capacity", "--config", str(scenario_file), "--slo-ttft-p99", "15ms", "--max-model-lens", "2K"]
    args += ["--rate-min", "2", "--rate-max", "40", "--rate-tol", "0.2", "--jobs", "1"]
    refusal = "the model has no sliding-window layers (num_window_layers 0); use paged"

    def run(extra: list[str]) -> tuple[int, str]:
        try:
            main(args + extra)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        return code, capsys.readouterr().out

    code, out = run([])
    assert code == 0, out
    assert [line for line in out.splitlines() if "hybrid" in line] == [f"skipped hybrid: {refusal}"]
    assert not [line for line in out.splitlines() if line.startswith("failed")] and "paged" in out

    code, out = run(["--allocators", "hybrid"])
    assert code == 1
    assert f"failed hybrid|2048|1: AllocatorConfigError: hybrid: {refusal}" in out
    assert "skipped" not in out
