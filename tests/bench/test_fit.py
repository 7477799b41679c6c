"""`bench fit`: finds known terms back, reports leave-one-file-out error, writes a profile that
`--calibration` applies; and the CLI's replay table, total and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _bench_helpers import bench_document, simulated_file, small_scenario, write_json

from sim.bench.fit import GRID, fit_members, grid_table
from sim.bench.results_file import read_bench_file
from sim.cli import main
from sim.cost.model import CostModel
from sim.cost.server import PROFILE_KIND, ServerTerms, load_profile_terms
from sim.errors import ScenarioError

KNOWN = ServerTerms(
    frontend_s=0.042, frontend_service_s=0.002, flops_efficiency_scale=0.7, overhead_scale=0.5
)


@pytest.fixture(scope="module")
def known_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two files kvsim 'measured' under KNOWN (a grid point; frontend on the 1 ms grid)."""
    assert KNOWN.flops_efficiency_scale in GRID["flops_efficiency_scale"]
    assert KNOWN.overhead_scale in GRID["overhead_scale"]
    assert KNOWN.frontend_service_s in GRID["frontend_service_s"]
    folder = tmp_path_factory.mktemp("bench")
    return [simulated_file(folder / f"run{seed}.json", small_scenario(), KNOWN, seed=seed) for seed in (1, 2)]


def test_fit_finds_the_known_terms_back(known_files: list[Path]) -> None:
    files = [read_bench_file(path) for path in known_files]
    result = fit_members(grid_table(files, lambda _bench: small_scenario()), range(len(files)))
    assert result.terms.values() == pytest.approx(KNOWN.values())
    table = result.error_table()
    for label in ("in_sample", "leave_one_out"):
        assert table[label]["median_file_mape"] == pytest.approx(0.0, abs=1e-6)
    assert [r.name for r in result.held_out] == [f.name for f in files]


def test_fit_scans_frontend_s_from_zero_whatever_the_stack_holds(known_files: list[Path]) -> None:
    """A stack that carries a front-end delay (sim/bench/lambda_set.py `fit_earlier` starts from the
    shipped terms, 0.161 s on H100) must not be replayed with it under the scan: the fitted
    frontend_s is the scanned value, so the table's losses must be those of that value alone."""
    files = [read_bench_file(path) for path in known_files]
    point = {name: (getattr(KNOWN, name),) for name in GRID}  # the known point only: 2 replays
    stack = ServerTerms(frontend_s=0.2)
    result = fit_members(grid_table(files, lambda _bench: small_scenario(), stack=stack, grid=point), [0, 1])
    assert result.terms.frontend_s == pytest.approx(KNOWN.frontend_s)
    assert result.error_table()["in_sample"]["median_file_mape"] == pytest.approx(0.0, abs=1e-6)


def test_cli_fit_writes_a_profile_that_calibration_applies(
    known_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "server.json"
    flags = ["--model", "Llama-3-8B", "--gpu", "H100-80GB", "--engine", "vllm-v1", "--max-model-len", "2048"]
    main(["bench", "fit", *map(str, known_files), *flags, "--no-ray-workers", "-o", str(profile)])
    out = capsys.readouterr().out
    assert "leave-one-out" in out and f"wrote {profile}" in out
    document = json.loads(profile.read_text())
    assert document["kind"] == PROFILE_KIND
    assert document["stack"] == {
        "custom_all_reduce": None,
        "ray_workers": False,
        "frontend_in_engine_process": None,
    }
    assert [entry["sha256"] for entry in document["fitted_on"]] == [
        read_bench_file(p).sha256 for p in known_files
    ]
    assert load_profile_terms(profile).values() == pytest.approx(KNOWN.values())
    # --calibration applies the profile to any scenario (run, compare, sweep, capacity build cost models so)
    cost = CostModel.from_scenario(small_scenario(calibration=str(profile)))
    assert cost.frontend_s == pytest.approx(KNOWN.frontend_s)
    main(["bench", "replay", str(known_files[0]), *flags, "--calibration", str(profile)])
    assert capsys.readouterr().out.strip().splitlines()[-1] == "MAPE 0.0 %"


def test_cli_replay_several_files_one_row_each_and_a_total(
    known_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = write_json(tmp_path / "failed.json", bench_document([10] * 10, [5] * 10, completed=1))
    flags = ["--model", "Llama-3-8B", "--gpu", "H100-80GB", "--engine", "vllm-v1", "--max-model-len", "2048"]
    main(["bench", "replay", *map(str, known_files), str(failed), *flags])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["file", "TTFT", "TPOT", "E2E", "req/s", "MAPE"]
    assert sum(1 for line in lines if "/run" in line.split()[0]) == 2
    assert any(line.startswith("median |error|") for line in lines)
    assert any(line.startswith("skipped") and "failed.json" in line for line in lines)
    assert lines[-1].startswith("MAPE ") and lines[-1].endswith(" %")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{oops", "not JSON"),
        ('{"num_prompts": 1, "output_lens": [1]}', "field 'input_lens': missing"),
        (
            '{"num_prompts": 2, "input_lens": [5, 5], "output_lens": [1, 1], "completed": 0}',
            "requests completed",
        ),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, expected: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as info:
        main(["bench", "replay", str(path), "--model", "Llama-3-8B", "--gpu", "H100-80GB"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err and "Traceback" not in err


def test_cli_model_that_does_not_fit_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_json(tmp_path / "big.json", bench_document([10, 10], [5, 5]))
    with pytest.raises(SystemExit) as info:
        main(["bench", "replay", str(path), "--model", "Llama-3-70B", "--gpu", "H100-80GB"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "weights need" in err


def test_bad_profiles_are_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    base = {"kind": PROFILE_KIND, "schema": 1, "terms": KNOWN.values()}
    path.write_text(json.dumps({**base, "terms": {**KNOWN.values(), "overhead_scale": 9.0}}))
    with pytest.raises(ScenarioError, match="'overhead_scale': 9.0 is outside its bounds"):
        load_profile_terms(path)
    path.write_text(json.dumps({**base, "schema": 7}))
    with pytest.raises(ScenarioError, match="field 'schema'"):
        load_profile_terms(path)
    path.write_text(json.dumps({**base, "terms": {"frontend_s": "fast"}}))
    with pytest.raises(ScenarioError, match="field 'frontend_s'"):
        load_profile_terms(path)
