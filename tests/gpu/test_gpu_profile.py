"""Profile schema v1: round trip, the analytic default, bad files, and the summary table."""

from __future__ import annotations

import json

import pytest

from gpu.calibrate import RAW_COLUMNS, rows_to_csv, summary_table
from gpu.errors import GpuError
from gpu.grid import grid_points
from gpu.profile import default_profile, find_fit, load_profile, predict_s, save_profile, validate_profile


def measured_like_profile() -> dict:
    """The default profile dressed as a measured one, with two raw rows."""
    profile = default_profile()
    rows = []
    for point in grid_points(batches=(8,), contexts_tokens=(2048,), block_sizes=(16,), heads=("gqa8",))[:2]:
        row = point.as_row()
        row.update(median_s=1e-4, p10_s=9e-5, p90_s=1.2e-4, repeats=20, launches_per_sample=1)
        rows.append(row)
    profile.update(measured=True, rows=rows)
    return profile


def test_round_trip_is_lossless_and_atomic(tmp_path) -> None:
    profile = measured_like_profile()
    path = tmp_path / "sub" / "profile.json"
    save_profile(profile, path)
    assert load_profile(path) == json.loads(json.dumps(profile))
    assert [p.name for p in path.parent.iterdir()] == ["profile.json"]  # no temp file left behind


def test_default_profile_is_valid_analytic_and_sensible() -> None:
    profile = default_profile()
    validate_profile(profile)
    assert profile["measured"] is False and profile["schema_version"] == 1
    contiguous = find_fit(profile, "attention", "contiguous", 16)  # contiguous fits are stored with block 0
    assert contiguous is not None and contiguous["block_size"] == 0
    assert 0.8 * 4.8e12 < contiguous["bytes_per_s"] < 4.8e12
    ratios = profile["ratios"]["attention"]
    assert set(ratios) == {"1", "8", "16", "32", "128"}
    assert ratios["1"] > ratios["16"] > ratios["128"] >= 1.0  # per-block cost shrinks with block size
    paged = find_fit(profile, "attention", "paged_shuffled", 16)
    assert predict_s(paged, 1e9, 1000) > predict_s(contiguous, 1e9, 0)
    slower = default_profile(hbm_bytes_per_s=2.0e12)
    assert find_fit(slower, "gather", "contiguous", 0)["bytes_per_s"] < contiguous["bytes_per_s"]
    profile["fits"].clear()  # callers get a copy
    assert default_profile()["fits"]


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda p: p.update(schema_version=2), "schema_version"),
        (lambda p: p.pop("measured"), "measured"),
        (lambda p: p["device"].pop("name"), "device.name"),
        (lambda p: p["ceilings"].update(copy_bytes_per_s=-1.0), "ceilings.copy_bytes_per_s"),
        (lambda p: p["rows"][1].pop("median_s"), "rows[1].median_s"),
        (lambda p: p["rows"][0].update(layout="tiled"), "rows[0].layout"),
        (lambda p: p["fits"][3].update(bytes_per_s=0), "fits[3].bytes_per_s"),
        (lambda p: p["fits"][2].update(num_points=True), "fits[2].num_points"),
        (lambda p: p["ratios"]["attention"].update({"x": 1.0}), "ratios.attention.x"),
        (lambda p: p["ratios"].pop("gather"), "ratios.gather"),
    ],
)
def test_bad_profile_file_names_the_file_and_the_key(tmp_path, mutate, key: str) -> None:
    profile = measured_like_profile()
    mutate(profile)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(GpuError) as info:
        load_profile(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and f"'{key}'" in message


def test_unreadable_and_invalid_json_files(tmp_path) -> None:
    with pytest.raises(GpuError, match="cannot read calibration profile"):
        load_profile(tmp_path / "missing.json")
    path = tmp_path / "broken.json"
    path.write_text('{"schema_version": 1,')
    with pytest.raises(GpuError, match=r"broken.json: not valid JSON \(line 1"):
        load_profile(path)


def test_save_refuses_an_invalid_profile_and_leaves_nothing(tmp_path) -> None:
    profile = default_profile()
    profile["ceilings"]["read_bytes_per_s"] = float("nan")
    with pytest.raises(GpuError, match="ceilings.read_bytes_per_s"):
        save_profile(profile, tmp_path / "p.json")
    assert list(tmp_path.iterdir()) == []


def test_summary_table_and_raw_csv() -> None:
    profile = measured_like_profile()
    table = summary_table(profile)
    assert "paged_shuffled/contiguous attention" in table and "BW_eff" in table
    assert len(table.splitlines()) == 3 + len(profile["fits"]) + 2
    csv_text = rows_to_csv(profile["rows"])
    header, first, *_ = csv_text.splitlines()
    assert header.split(",") == list(RAW_COLUMNS)
    assert first.startswith("gather,contiguous,0,8,2048,gqa8,32,8,128,bf16,")


def _required_key_paths() -> list[tuple[str, ...]]:
    top = ["schema_version", "measured", "device", "ceilings", "rows", "fits", "ratios"]
    row = ["kernel", "layout", "block_size", "batch", "context_tokens", "num_q_heads", "num_kv_heads",
           "head_dim", "bytes", "flops", "blocks_touched", "median_s", "p10_s", "p90_s", "dtype"]  # fmt: skip
    fit = ["kernel", "layout", "block_size", "a_s", "bytes_per_s", "c_s_per_block", "mape_pct", "num_points"]
    return (
        [(k,) for k in top]
        + [("device", "name"), ("ceilings", "copy_bytes_per_s"), ("ceilings", "read_bytes_per_s")]
        + [("rows", 0, k) for k in row]
        + [("fits", 1, k) for k in fit]
        + [("ratios", "gather"), ("ratios", "attention")]
    )


@pytest.mark.parametrize("path", _required_key_paths(), ids=lambda p: ".".join(map(str, p)))
def test_every_missing_required_key_is_named_as_missing(tmp_path, path: tuple) -> None:
    profile = measured_like_profile()
    parent = profile
    for step in path[:-1]:
        parent = parent[step]
    del parent[path[-1]]
    target = tmp_path / "bad.json"
    target.write_text(json.dumps(profile))
    with pytest.raises(GpuError) as info:
        load_profile(target)
    dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    assert str(info.value) == f"{target}: missing key '{dotted}'"
