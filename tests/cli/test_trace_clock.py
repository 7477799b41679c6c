"""Issue 20 §3: a trace replays on its own clock with every row unless told otherwise, on every path.

Each case fails on bbd53f5, where every scenario carried request_rate 2.0 and 1000 prompts: a
1,200-row trace at ~1 req/s was cut to 1,000 rows and replayed at 2 req/s, and `azure-conv` ran at 2.0
instead of its documented 5.5 req/s. The paths: `kvsim run`, `compare`, `--config`, sweeps, the
Python API and `Scenario` itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim
from sim.cli import main
from sim.scenario.scenario import Scenario, default_scenario
from sim.sweeps.runner import sweep

ROWS = 1200
SMALL = ["--kv-cache-memory", "4GiB", "--quiet"]  # OPT-13B's paper default, fewer blocks to track


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """1,200 rows with their own timestamps, ~1 req/s (Poisson), short requests; and those timestamps."""
    rng = np.random.default_rng(20)
    gaps_s = rng.exponential(1.0, ROWS)
    gaps_s[0] = 0.0
    arrival_s = np.round(np.cumsum(gaps_s) + 100.0, 6)  # a trace need not start at 0
    frame = pd.DataFrame(
        {
            "arrival_s": arrival_s,
            "prompt_tokens": rng.integers(20, 120, ROWS),
            "output_tokens": rng.integers(5, 40, ROWS),
        }
    )
    path = tmp_path_factory.mktemp("clock") / "trace.csv"
    frame.to_csv(path, index=False)
    return path, arrival_s - arrival_s[0]


# `main` returns on success and raises SystemExit otherwise, so a failed run fails its test loudly.


def own_mean_rate(arrival_s: np.ndarray) -> float:
    return (len(arrival_s) - 1) / (arrival_s[-1] - arrival_s[0])


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def arrivals_of(folder: Path) -> np.ndarray:
    return np.sort(pd.read_parquet(folder / "requests.parquet")["arrival_s"].to_numpy())


def test_run_replays_every_row_on_the_traces_own_clock_and_says_so(trace, tmp_path: Path, capsys) -> None:
    path, own_s = trace
    out = tmp_path / "r"
    main(["run", "--workload", str(path), *SMALL, "-o", str(out)])
    printed = capsys.readouterr().out.splitlines()
    rate = own_mean_rate(own_s)
    assert printed[0] == f"replaying 1,200 rows at their own timestamps (mean {rate:.2f} req/s)"
    summary = summary_of(out)
    assert summary["metrics"]["num_requests"] == ROWS
    np.testing.assert_allclose(arrivals_of(out), own_s, rtol=0, atol=1e-9)
    clock = summary["workload"]["clock"]
    assert clock["kind"] == "trace-timestamps" and clock["requests"] == ROWS
    assert clock["mean_rate_req_s"] == pytest.approx(rate)
    assert summary["scenario"]["workload"]["request_rate"] is None
    assert summary["scenario"]["num_prompts"] is None


def test_request_rate_rescales_a_trace_to_that_mean_and_keeps_every_row(
    trace, tmp_path: Path, capsys
) -> None:
    path, own_s = trace
    out = tmp_path / "r"
    main(["run", "--workload", str(path), "--request-rate", "3", *SMALL, "-o", str(out)])
    printed = capsys.readouterr().out.splitlines()[0]
    assert printed.startswith("replaying 1,200 rows rescaled to a mean 3.00 req/s")
    arrival_s = arrivals_of(out)
    assert len(arrival_s) == ROWS and own_mean_rate(arrival_s) == pytest.approx(3.0)
    # the shape is kept: the same gaps, scaled by one factor
    np.testing.assert_allclose(arrival_s, own_s * (own_mean_rate(own_s) / 3.0), rtol=1e-9, atol=1e-9)
    assert summary_of(out)["workload"]["clock"]["kind"] == "trace-rescaled"


def test_num_prompts_takes_the_first_rows_on_their_own_clock(trace, tmp_path: Path, capsys) -> None:
    path, own_s = trace
    out = tmp_path / "r"
    main(["run", "--workload", str(path), "--num-prompts", "300", *SMALL, "-o", str(out)])
    printed = capsys.readouterr().out.splitlines()[0]
    rate = own_mean_rate(own_s[:300])
    assert printed == f"replaying the first 300 of 1,200 rows at their own timestamps (mean {rate:.2f} req/s)"
    np.testing.assert_allclose(arrivals_of(out), own_s[:300], rtol=0, atol=1e-9)


def test_a_preset_runs_at_its_documented_rate_unless_a_rate_is_given(tmp_path: Path, capsys) -> None:
    scenario = default_scenario().with_overrides(**{"workload.source": "azure-conv"})
    assert scenario.workload.request_rate == 5.5 and scenario.num_prompts == 1000
    out = tmp_path / "r"
    args = ["run", "--workload", "azure-conv", "--num-prompts", "50", "--max-model-len", "2048", *SMALL]
    main([*args, "-o", str(out)])
    printed = capsys.readouterr().out.splitlines()[0]
    assert printed == (
        "generating 50 azure-conv requests with poisson(rate=5.5) arrivals (the preset's documented rate)"
    )
    clock = summary_of(out)["workload"]["clock"]
    assert clock["kind"] == "preset-rate" and clock["documented_rate_req_s"] == 5.5
    assert summary_of(out)["scenario"]["workload"]["request_rate"] == 5.5
    given = tmp_path / "given"
    main([*args, "--request-rate", "3", "-o", str(given)])
    expected = "poisson(rate=3.0) arrivals (request_rate; the preset documents 5.50 req/s)"
    assert expected in capsys.readouterr().out
    assert summary_of(given)["workload"]["clock"]["kind"] == "given-rate"


def test_the_paper_default_keeps_its_rate_and_size() -> None:
    """`make demo`'s scenario still means sharegpt at 2 req/s, 1000 prompts (now derived, not set)."""
    scenario = default_scenario()
    assert scenario.workload.request_rate == 2.0 and scenario.num_prompts == 1000
    requests = scenario.with_overrides(num_prompts=20).load_workload()
    assert requests.attrs["clock"]["kind"] == "preset-rate"


def test_compare_replays_the_whole_trace_for_every_allocator(trace, tmp_path: Path, capsys) -> None:
    path, own_s = trace
    out = tmp_path / "cmp"
    args = ["compare", "--workload", str(path), "--allocators", "paged,request_limit:oracle", *SMALL]
    main([*args, "-o", str(out)])
    assert capsys.readouterr().out.splitlines()[0].startswith("replaying 1,200 rows at their own timestamps")
    for label in ("paged", "request_limit-oracle"):
        np.testing.assert_allclose(arrivals_of(out / label), own_s, rtol=0, atol=1e-9)


def test_a_config_file_naming_a_trace_replays_it_on_its_own_clock(trace, tmp_path: Path) -> None:
    path, own_s = trace
    config = tmp_path / "s.toml"
    config.write_text(f'name = "cfg"\nkv_cache_memory = "4GiB"\n[workload]\nsource = "{path}"\n')
    out = tmp_path / "r"
    main(["run", "--config", str(config), "--quiet", "-o", str(out)])
    np.testing.assert_allclose(arrivals_of(out), own_s, rtol=0, atol=1e-9)
    config.write_text(config.read_text() + "request_rate = 4.0\n")
    out4 = tmp_path / "r4"
    main(["run", "--config", str(config), "--quiet", "-o", str(out4)])
    assert own_mean_rate(arrivals_of(out4)) == pytest.approx(4.0)


def test_the_python_api_replays_a_trace_on_its_own_clock(trace) -> None:
    path, own_s = trace
    for scenario in (
        default_scenario().with_overrides(**{"workload.source": str(path), "kv_cache_memory": "4GiB"}),
        Scenario(workload=str(path), kv_cache_memory="4GiB", max_model_len=2048),
    ):
        run = sim.simulate(scenario)
        assert run.summary["workload"]["clock"]["kind"] == "trace-timestamps"
        np.testing.assert_allclose(np.sort(run.requests["arrival_s"].to_numpy()), own_s, rtol=0, atol=1e-9)


def test_a_sweep_over_a_trace_replays_it_on_its_own_clock_unless_the_grid_sets_a_rate(
    trace, tmp_path: Path
) -> None:
    path, own_s = trace
    spec = {
        "name": "clock",
        "base": {"kv_cache_memory": "4GiB", "max_model_len": 2048, "workload": {"source": str(path)}},
        "grid": {"allocator": ["paged"], "workload.time_scale": [1.0, 2.0]},
    }
    table = sweep(spec, jobs=1, output_dir=tmp_path / "sw", progress=False).sort_values("workload.time_scale")
    assert list(table["num_requests"]) == [ROWS, ROWS]
    assert list(table["workload.clock"]) == ["trace-timestamps", "trace-time-scaled"]
    rate = own_mean_rate(own_s)
    np.testing.assert_allclose(table["workload.mean_rate_req_s"], [rate, rate / 2], rtol=1e-9)


def test_a_lengths_only_file_without_a_rate_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n20,6\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--workload", str(path), "--quiet", "-o", str(tmp_path / "r")])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert len(lines) == 1 and "has no timestamps: give a request_rate" in lines[0]
    args = ["run", "--workload", str(path), "--request-rate", "1", *SMALL, "-o", str(tmp_path / "ok")]
    main(args)
    assert "replaying the lengths of 2 rows (no timestamps) with poisson(rate=1.0) arrivals" in (
        capsys.readouterr().out
    )
