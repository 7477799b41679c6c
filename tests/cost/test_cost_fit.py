"""The fit against ../shared/profiles (skipped when absent) and `kvsim cost validate`, bad files included."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from sim.cli import main
from sim.cost.fit import fit_all_reduce, fit_linear, load_profiles, mape_pct, nelder_mead
from sim.cost.gpu_fits import GPU_LINEAR_FITS
from sim.cost.network import ALL_REDUCE_TABLES
from sim.errors import ScenarioError
from sim.scenario.presets import gpu_preset

PROFILES = Path(__file__).resolve().parents[2].parent / "shared" / "profiles"
MLP_FILES = sorted((PROFILES / "vidur_mlp").glob("*.mlp.csv")) if PROFILES.is_dir() else []
needs_profiles = pytest.mark.skipif(not MLP_FILES, reason=f"shared profiles not found at {PROFILES}")


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_nelder_mead_finds_a_known_minimum() -> None:
    best = nelder_mead(lambda x: float((x[0] - 1.5) ** 2 + 3 * (x[1] + 0.5) ** 2), [0.0, 0.0])
    assert best == pytest.approx([1.5, -0.5], abs=1e-4)


def test_mape_by_hand() -> None:
    assert mape_pct(np.array([1.1, 0.9, 2.0]), np.array([1.0, 1.0, 2.0])) == pytest.approx(100 * 0.2 / 3)


# --- the shared measured files ----------


@needs_profiles
@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-80GB"])
def test_stored_constants_are_what_the_fit_produces(gpu: str) -> None:
    prefix = gpu.split("-")[0].lower()
    paths = [p for p in MLP_FILES if p.name.startswith(prefix + "_")]
    spec = gpu_preset(gpu)
    fit = fit_linear(
        list(load_profiles(paths).values()), spec.hbm_bandwidth_bytes_per_s, spec.peak_flops, "x"
    )
    stored = GPU_LINEAR_FITS[gpu]
    for field in ("hbm_fraction", "flops_fraction", "smooth_p", "fixed_s", "mape_pct"):
        assert getattr(fit, field) == pytest.approx(getattr(stored, field), rel=1e-3), field
    assert stored.mape_pct <= 10.0


@needs_profiles
def test_stored_all_reduce_tables_are_what_the_files_give() -> None:
    for network, table in ALL_REDUCE_TABLES.items():
        assert fit_all_reduce(PROFILES / "vidur_network" / f"{network}.all_reduce.csv") == table


@needs_profiles
@pytest.mark.parametrize("path", MLP_FILES, ids=lambda p: p.name)
def test_validate_each_shared_file_is_within_ten_percent(path: Path, capsys) -> None:
    code, out, err = run_cli(["cost", "validate", str(path)], capsys)
    assert code == 0, err
    lines = out.strip().splitlines()
    match = re.fullmatch(r"MAPE (\d+\.\d+) %", lines[-1])
    assert match and float(match.group(1)) <= 10.0
    for bucket in ("1-16", "17-128", "129-1024", "1025+"):
        assert any(re.match(rf"\s+1\s+{re.escape(bucket)}\s", line) for line in lines), bucket
    assert any(re.match(r"\s+8\s+1-16\s", line) for line in lines)  # per TP size


@needs_profiles
@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-80GB"])
def test_leave_one_model_out_generalises(gpu: str) -> None:
    paths = [p for p in MLP_FILES if p.name.startswith(gpu.split("-")[0].lower() + "_")]
    arrays = load_profiles(paths)
    spec = gpu_preset(gpu)
    for held_out, data in arrays.items():
        others = [a for name, a in arrays.items() if name != held_out]
        fit = fit_linear(others, spec.hbm_bandwidth_bytes_per_s, spec.peak_flops, "lomo")
        predicted = data.predict_s(fit, spec.hbm_bandwidth_bytes_per_s, spec.peak_flops)
        assert mape_pct(predicted, data.measured_s) <= 10.0, held_out


@needs_profiles
def test_validate_with_an_explicit_gpu(capsys) -> None:
    path = next(p for p in MLP_FILES if p.name.startswith("a100_"))
    code, out, _ = run_cli(["cost", "validate", str(path), "--gpu", "a100-80g"], capsys)
    assert code == 0 and "on A100-80GB" in out


# --- bad and foreign files: one line, exit 2 ----------

_HEADER = (
    "time_stats.input_layernorm.median,time_stats.attn_pre_proj.median,time_stats.attn_rope.median,"
    "time_stats.attn_post_proj.median,time_stats.post_attention_layernorm.median,"
    "time_stats.mlp_up_proj.median,time_stats.mlp_act.median,time_stats.mlp_down_proj.median,"
    "time_stats.add.median,n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,"
    "num_tokens,num_tensor_parallel_workers"
)
_ROW = "0.005,0.065,0.005,0.02,0.004,0.116,0.007,0.06,0.002,32,32,4096,11008,32000,True,1,1"


def test_a_small_valid_file_validates(tmp_path: Path, capsys) -> None:
    path = tmp_path / "a100_tiny.mlp.csv"
    path.write_text(_HEADER + "\n" + _ROW + "\n" + _ROW.replace(",True,1,1", ",True,2048,1") + "\n")
    code, out, err = run_cli(["cost", "validate", str(path)], capsys)
    assert code == 0, err
    assert re.fullmatch(r"MAPE \d+\.\d+ %", out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("name", "text", "args", "expected"),
    [
        ("a100_foreign.csv", "a,b\n1,2\n", [], "missing column"),
        ("a100_empty.csv", "", [], "not a CSV profile"),
        ("a100_header_only.csv", _HEADER + "\n", [], "no rows"),
        ("a100_text.csv", _HEADER + "\n" + _ROW.replace("0.065", "fast") + "\n", [], "row 2, column"),
        ("a100_gated.csv", _HEADER + "\n" + _ROW.replace("True", "maybe") + "\n", [], "use_gated_mlp"),
        ("a100_negative.csv", _HEADER + "\n" + _ROW.replace("0.065", "-1") + "\n", [], "negative time"),
        ("a100_zero_tp.csv", _HEADER + "\n" + _ROW[:-2] + ",0\n", [], "must be >= 1"),
        ("unknown_gpu.csv", _HEADER + "\n" + _ROW + "\n", [], "pass --gpu"),
        ("a100_ok.csv", _HEADER + "\n" + _ROW + "\n", ["--gpu", "B300"], "unknown gpu preset"),
        ("a100_binary.csv", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe".decode("latin-1"), [], "a100_binary.csv"),
    ],
)
def test_bad_files_are_one_line_and_exit_2(
    tmp_path: Path, capsys, name: str, text: str, args: list[str], expected: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="latin-1")
    code, out, err = run_cli(["cost", "validate", str(path), *args], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    assert expected in err


def test_missing_file_is_one_line(tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(["cost", "validate", str(tmp_path / "a100_nope.mlp.csv")], capsys)
    assert code == 2 and "not found" in err and err.count("\n") == 1


def test_calibration_accepts_a_linear_layer_profile(tmp_path: Path) -> None:
    """A Vidur-format CSV (what gpu/run_device.sh writes) as --calibration refits the linear layers."""
    from sim.cost.fit import ProfileArrays
    from sim.cost.model import CostModel
    from sim.cost.profiles import read_linear_profile
    from sim.scenario import default_scenario

    path = tmp_path / "linear.mlp.csv"
    path.write_text(_HEADER + "\n" + _ROW + "\n" + _ROW.replace(",True,1,1", ",True,2048,1") + "\n")
    base = default_scenario()
    gpu = base.gpu_spec()
    expected = fit_linear(
        [ProfileArrays.of(read_linear_profile(path))], gpu.hbm_bandwidth_bytes_per_s, gpu.peak_flops, "x"
    )
    stored = CostModel.from_scenario(base)
    calibrated = CostModel.from_scenario(base.with_overrides(calibration=str(path)))
    assert calibrated.describe()["linear_fit_source"] == "fitted to linear.mlp.csv"
    assert calibrated.hbm_bytes_per_s == gpu.hbm_bandwidth_bytes_per_s * expected.hbm_fraction
    assert calibrated.flops_per_s == gpu.peak_flops * expected.flops_fraction
    assert calibrated.linear_time_s(2048) != stored.linear_time_s(2048)
    assert calibrated.layout_factor == stored.layout_factor  # the KV-read part is not a CSV's business
    with pytest.raises(ScenarioError, match="field 'calibration'"):
        CostModel.from_scenario(base.with_overrides(calibration=str(tmp_path / "missing.csv")))
