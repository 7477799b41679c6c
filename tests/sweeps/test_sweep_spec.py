"""Sweep specs: grid and zip expansion, stable cell ids, and every bad spec refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.sweeps.spec import SweepSpecError, cell_id, parse_spec

BASE = {
    "model": "OPT-13B",
    "gpu": "A100-40GB",
    "kv_cache_memory": "2GiB",
    "max_model_len": 2048,
    "num_prompts": 20,
}


def test_grid_is_the_cartesian_product_in_order() -> None:
    spec = parse_spec(
        {"name": "g", "base": BASE, "grid": {"allocator": ["paged", "contiguous"], "seed": [1, 2, 3]}}
    )
    assert spec.name == "g" and len(spec.cells) == 6
    assert [c.overrides for c in spec.cells[:3]] == [
        {"allocator": "paged", "seed": 1},
        {"allocator": "paged", "seed": 2},
        {"allocator": "paged", "seed": 3},
    ]
    assert spec.cells[4].scenario.allocator.name == "contiguous" and spec.cells[4].scenario.seed == 2
    assert spec.cells[4].scenario.kv_cache_memory == 2 * 1024**3  # the base is kept


def test_zip_varies_fields_together_and_multiplies_with_the_grid(tmp_path: Path) -> None:
    text = """
name = "z"
[base]
kv_cache_memory = "2GiB"
max_model_len = 2048
[grid]
allocator = ["paged", "contiguous"]
[[zip]]
workload.request_rate = [1.0, 2.0, 4.0]
seed = [10, 20, 40]
"""
    path = tmp_path / "z.toml"
    path.write_text(text)
    spec = parse_spec(path)
    assert len(spec.cells) == 6 and spec.axes == (("allocator",), ("workload.request_rate", "seed"))
    pairs = {(c.scenario.workload.request_rate, c.scenario.seed) for c in spec.cells}
    assert pairs == {(1.0, 10), (2.0, 20), (4.0, 40)}


def test_base_may_be_a_scenario_file_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "base.toml").write_text('kv_cache_memory = "3GiB"\nmax_model_len = 1024\n')
    (tmp_path / "s.toml").write_text('base = "scenarios/base.toml"\n[grid]\nblock_size = [16, 32]\n')
    spec = parse_spec(tmp_path / "s.toml")
    assert spec.name == "s"
    assert [c.scenario.block_size for c in spec.cells] == [16, 32]
    assert all(c.scenario.max_model_len == 1024 for c in spec.cells)


def test_cell_ids_are_stable_and_distinct() -> None:
    assert cell_id({"a": 1, "b": "x"}) == cell_id({"b": "x", "a": 1})
    assert cell_id({"a": 1}) != cell_id({"a": 2})
    spec1 = parse_spec({"base": BASE, "grid": {"allocator": ["paged", "contiguous"]}})
    spec2 = parse_spec({"base": BASE, "grid": {"allocator": ["paged", "contiguous"]}})
    assert [c.cell_id for c in spec1.cells] == [c.cell_id for c in spec2.cells]
    assert len({c.cell_id for c in spec1.cells}) == 2
    assert all(len(c.cell_id) == 12 and int(c.cell_id, 16) >= 0 for c in spec1.cells)


def test_nested_override_survives_a_shallower_one() -> None:
    spec = parse_spec(
        {"base": BASE, "grid": {"allocator.params.placement": ["best_fit"], "allocator": ["contiguous"]}}
    )
    assert spec.cells[0].scenario.allocator.params == {"placement": "best_fit"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"grid": {"alocator": ["paged"]}}, "unknown key 'alocator'; valid keys: name, model"),
        ({"grid": {"allocator": ["pagd"]}}, "cell allocator='pagd': field 'allocator': unknown allocator"),
        ({"grid": {"allocator": "paged"}}, "must be a list of values"),
        ({"grid": {"allocator": []}}, "empty list"),
        ({"grid": {"block_size": [0, 16]}}, "field 'block_size': must be >= 1"),
        ({"zip": {"seed": [1, 2], "block_size": [16]}}, "equal lengths"),
        ({"grid": {"seed": [1]}, "zip": {"seed": [2]}}, "varied twice"),
        ({"grid": {"seed": [1, 1]}}, "appears twice"),
        ({"grids": {}}, "unknown top-level key 'grids'; valid keys: name, description, base, grid, zip"),
        ({"base": {"modle": "x"}}, "field 'modle': unknown field"),
        ({"base": "missing.toml"}, "does not exist"),
        ({"name": "a/b"}, "'name' must be a non-empty folder name"),
        (
            {"grid": {"workload": {"request_rate": [1, "fast"]}}},
            "field 'workload.request_rate': must be a number",
        ),
    ],
)
def test_bad_specs_raise_one_line(spec: dict, message: str) -> None:
    with pytest.raises(SweepSpecError) as info:
        parse_spec({"base": BASE, **spec} if "base" not in spec else spec)
    text = str(info.value)
    assert message in text and "\n" not in text


def test_bad_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[grid\nallocator = 1")
    with pytest.raises(SweepSpecError, match="not valid TOML"):
        parse_spec(path)
    with pytest.raises(SweepSpecError, match="does not exist"):
        parse_spec(tmp_path / "nope.toml")
