"""The report and the diagnosis on real tiny simulations (engine → results folders → report).

Why separate from test_report.py: these depend on the engine's numbers, so they assert what the data
must show (a pattern appears or does not), not exact values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _report_helpers import CORE_FIGURES, PNG_MAGIC, assert_shown_equals, markdown_summary_rows, parse_html

import sim
from sim.api import run_label
from sim.reports import diagnosis
from sim.reports.publish import report
from sim.reports.render import TABLE_COLUMNS
from sim.results import write_run
from sim.scenario.scenario import default_scenario

TINY_REQUESTS = 60


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny `compare` of contiguous vs paged under load, written as results folders."""
    base = default_scenario().with_overrides(num_prompts=TINY_REQUESTS, **{"workload.request_rate": 8.0})
    out = tmp_path_factory.mktemp("compare")
    for label, run in sim.compare(base, allocators=["contiguous", "paged"]).items():
        write_run(run, out / run_label(label))
    return out


def test_figures_from_a_tiny_simulation_are_nonempty(compared: Path) -> None:
    html_path = report([compared])
    for name in CORE_FIGURES:
        png = (compared / "figures" / name).read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5_000
    parsed = parse_html(html_path)
    assert len(parsed.images) == len(CORE_FIGURES)
    summaries = [json.loads(p.read_text()) for p in sorted(compared.glob("*/summary.json"))]
    by_label = {s["allocator"]: s["metrics"] for s in summaries}
    assert sorted(label for label, _ in parsed.rows) == sorted(by_label)
    for label, cells in parsed.rows:
        for (metric, raw, shown), (key, _, _) in zip(cells, TABLE_COLUMNS, strict=True):
            assert metric == key
            value = by_label[label][key]
            if value == value:  # NaN is shown as a dash and stored as NaN
                assert json.loads(raw) == value
            assert_shown_equals(shown, value)
    for row in markdown_summary_rows(compared / "report.md"):
        for shown, (key, _, _) in zip(row[1:], TABLE_COLUMNS, strict=True):
            assert_shown_equals(shown, by_label[row[0]][key])


def test_diagnosis_names_max_model_len_reservations_for_contiguous_under_load() -> None:
    """max_model_len (2048) far above actual lengths, arrivals faster than 7 slabs can serve."""
    scenario = default_scenario().with_overrides(
        num_prompts=TINY_REQUESTS, allocator="contiguous", **{"workload.request_rate": 8.0}
    )
    run = sim.simulate(scenario)
    kinds = {s.kind for s in diagnosis.diagnose({"contiguous": run})}
    assert {"reserved_but_unused", "concurrency_tracked_max_model_len"} <= kinds


def test_no_diagnosis_for_paged_under_light_load() -> None:
    scenario = default_scenario().with_overrides(
        num_prompts=30, allocator="paged", **{"workload.request_rate": 0.5}
    )
    run = sim.simulate(scenario)
    assert diagnosis.diagnose({"paged": run}) == []
