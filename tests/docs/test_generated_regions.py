"""The `<!-- generated: ... -->` regions of the docs are well formed, and those that embed a shipped
file are current (issue 20 §4: the sweep example named `scenarios/opt13b.toml`, which did not exist).

Regions that run simulations (`output`, `capacity-table`) are rewritten by `make docs`; their commands
run here only through the structure check (the command must be a kvsim command of a known kind).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from _docs_helpers import load_docs_module

REPO_ROOT = Path(__file__).resolve().parents[2]


generate = load_docs_module("generate")


def test_every_marker_opens_and_closes_a_known_region() -> None:
    for path in generate.doc_files():
        text = path.read_text(encoding="utf-8")
        found = generate.regions(path)
        assert text.count("<!-- generated: ") == len(found), f"{path}: a marker without its close"
        assert text.count("<!-- /generated -->") == len(found), f"{path}: a close without its marker"
        for region in found:
            assert region.kind in generate.GENERATORS, region.where
            if region.kind != "file":
                assert region.args.startswith("kvsim "), region.where


def test_embedded_files_are_current(tmp_path: Path) -> None:
    stale = [
        where for path in generate.doc_files() for where in generate.stale_regions(path, tmp_path, {"file"})
    ]
    assert not stale, f"run `make docs`: {stale}"


def test_the_sweep_example_and_its_base_are_shipped() -> None:
    """The documented sweep spec names a base that exists, relative to the spec, and both load."""
    from sim.scenario.scenario import Scenario, default_scenario
    from sim.sweeps.spec import parse_spec

    spec_path = REPO_ROOT / "scenarios" / "alloc-vs-rate.toml"
    base = tomllib.loads(spec_path.read_text())["base"]
    assert (spec_path.parent / base).is_file()
    spec = parse_spec(spec_path)
    assert len(spec.cells) == 18
    paper = Scenario.from_toml(REPO_ROOT / "scenarios" / "opt13b.toml").to_dict()
    assert paper | {"name": "default"} == default_scenario().to_dict()


def test_check_mode_reports_a_stale_file_region(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- generated: file scenarios/opt13b.toml -->\nold\n<!-- /generated -->\n")
    assert generate.stale_regions(page, tmp_path, {"file"}) == [
        f"{page}: <!-- generated: file scenarios/opt13b.toml -->"
    ]
    generate.regenerate(page, tmp_path, {"file"})
    assert generate.stale_regions(page, tmp_path, {"file"}) == []
    assert 'name = "opt13b"' in page.read_text()
