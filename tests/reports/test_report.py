"""Report unit tests on fabricated results folders: files, table == summary.json, sweeps, bad folders."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _report_helpers import (
    CORE_FIGURES,
    PNG_MAGIC,
    assert_shown_equals,
    markdown_summary_rows,
    parse_html,
    write_fake_run,
)

from sim.cli import main
from sim.errors import ResultsError
from sim.files import MARKER_FILE, OutputPathError
from sim.reports import diagnosis
from sim.reports.figures import PART_COLORS, resample_steps
from sim.reports.publish import report
from sim.reports.render import FIGURE_FILES, TABLE_COLUMNS, format_value

SHAPE_LIMITED = {"token_states": 20.0, "reservation": 10.0, "internal": 45.0, "external": 15.0}


@pytest.fixture()
def compare_dir(tmp_path: Path) -> Path:
    base = tmp_path / "compare"
    write_fake_run(
        base / "contiguous", allocator="contiguous", share_pct=SHAPE_LIMITED, queue_peak=80, running_mean=5
    )
    write_fake_run(base / "paged", allocator="paged", seed=1)
    write_fake_run(base / "request_limit", allocator="request_limit", seed=2, num_steps=1500)
    return base


def test_report_writes_html_markdown_and_nonempty_figures(compare_dir: Path) -> None:
    path = report([compare_dir / "contiguous", compare_dir / "paged", compare_dir / "request_limit"])
    assert path == compare_dir.resolve() / "report.html"
    for name in CORE_FIGURES:
        png = (compare_dir / "figures" / name).read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5_000
    assert not (compare_dir / "figures" / FIGURE_FILES["rate_sweep"]).exists()
    parsed = parse_html(path)
    assert len(parsed.images) == len(CORE_FIGURES)
    assert all(src.startswith("data:image/png;base64,") for src in parsed.images)
    assert parsed.external_refs == []
    assert "<script" not in path.read_text(encoding="utf-8")
    markdown = (compare_dir / "report.md").read_text(encoding="utf-8")
    for name in CORE_FIGURES:
        assert f"](figures/{name})" in markdown
    assert not list(compare_dir.glob(".kvsim-report-*")), "staging folder left behind"


def test_summary_table_numbers_equal_summary_json(compare_dir: Path) -> None:
    path = report([compare_dir])  # a compare folder stands for its run folders
    summary_files = compare_dir.glob("*/summary.json")
    summaries = {s["allocator"]: s["metrics"] for s in (json.loads(f.read_text()) for f in summary_files)}
    parsed = parse_html(path)
    assert sorted(label for label, _ in parsed.rows) == sorted(summaries)
    for label, cells in parsed.rows:
        assert [metric for metric, _, _ in cells] == [key for key, _, _ in TABLE_COLUMNS]
        for (metric, raw, shown), (_, _, kind) in zip(cells, TABLE_COLUMNS, strict=True):
            value = summaries[label][metric]
            assert json.loads(raw) == value
            assert shown == format_value(value, kind)
            assert_shown_equals(shown, value)
    md_rows = markdown_summary_rows(compare_dir / "report.md")
    assert sorted(row[0] for row in md_rows) == sorted(summaries)
    for row in md_rows:
        assert len(row) == len(TABLE_COLUMNS) + 1
        for shown, (key, _, _) in zip(row[1:], TABLE_COLUMNS, strict=True):
            assert_shown_equals(shown, summaries[row[0]][key])


def test_missing_values_show_as_dash(tmp_path: Path) -> None:
    run_dir = write_fake_run(tmp_path / "run")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["metrics"]["p99_ttft_ms"] = None
    (run_dir / "summary.json").write_text(json.dumps(summary))
    parsed = parse_html(report([run_dir]))
    shown = {metric: text for metric, _, text in parsed.rows[0][1]}
    assert shown["p99_ttft_ms"] == "–"


def test_same_allocator_twice_gets_distinct_labels(tmp_path: Path) -> None:
    a = write_fake_run(tmp_path / "a", allocator="paged", max_model_len=2048)
    b = write_fake_run(tmp_path / "b", allocator="paged", max_model_len=4096)
    c = write_fake_run(tmp_path / "c", allocator="contiguous")
    parsed = parse_html(report([a, b, c], output_dir=tmp_path / "out"))
    labels = [label for label, _ in parsed.rows]
    assert labels == ["paged (max_model_len=2048)", "paged (max_model_len=4096)", "contiguous"]
    twice = parse_html(report([c, c], output_dir=tmp_path / "twice"))
    assert [label for label, _ in twice.rows] == ["contiguous (c) #1", "contiguous (c) #2"]


def test_rate_sweep_adds_figure_5_and_later_report_removes_it(tmp_path: Path) -> None:
    runs = []
    for rate in (1.0, 2.0, 4.0):
        for allocator in ("paged", "contiguous"):
            runs.append(
                write_fake_run(
                    tmp_path / "sweep" / f"{allocator}-{rate}",
                    allocator=allocator,
                    request_rate=rate,
                    num_steps=60,
                    num_requests=20,
                )
            )
    out = tmp_path / "sweep"
    html_path = report(runs, output_dir=out)
    assert (out / "figures" / FIGURE_FILES["rate_sweep"]).read_bytes().startswith(PNG_MAGIC)
    assert not (out / "figures" / FIGURE_FILES["block_size_sweep"]).exists()
    parsed = parse_html(html_path)
    assert len(parsed.images) == len(CORE_FIGURES) + 1
    assert len(parsed.rows) == 6
    assert "paged (request_rate=1.0)" in [label for label, _ in parsed.rows]
    report(runs[:2], output_dir=out)  # not a sweep: the stale sweep figure must go
    assert not (out / "figures" / FIGURE_FILES["rate_sweep"]).exists()


def test_block_size_sweep_adds_waste_and_throughput_figure(tmp_path: Path) -> None:
    runs = [write_fake_run(tmp_path / f"bs{b}", block_size=b, seed=b, num_steps=60) for b in (8, 16, 32)]
    report(runs, output_dir=tmp_path)
    assert (tmp_path / "figures" / FIGURE_FILES["block_size_sweep"]).read_bytes().startswith(PNG_MAGIC)
    assert not (tmp_path / "figures" / FIGURE_FILES["rate_sweep"]).exists()


def _drop_metric(run_dir: Path, key: str) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    del summary["metrics"][key]
    (run_dir / "summary.json").write_text(json.dumps(summary))


def _drop_step_column(run_dir: Path, column: str) -> None:
    steps = pd.read_parquet(run_dir / "steps.parquet").drop(columns=[column])
    steps.to_parquet(run_dir / "steps.parquet")


BAD_FOLDERS = {
    "missing_steps": (lambda d: (d / "steps.parquet").unlink(), "missing steps.parquet"),
    "missing_summary": (lambda d: (d / "summary.json").unlink(), "missing summary.json"),
    "old_summary": (lambda d: _drop_metric(d, "kv_external_pct"), "missing metrics kv_external_pct"),
    "missing_column": (lambda d: _drop_step_column(d, "external"), "missing column(s) external"),
    "corrupt_json": (lambda d: (d / "summary.json").write_text("{"), "cannot read JSON"),
    "corrupt_parquet": (lambda d: (d / "requests.parquet").write_bytes(b"nope"), "cannot read Parquet"),
}


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_bad_folder_gives_one_line_exit_2_and_no_report(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_fake_run(tmp_path / "good", allocator="paged")
    bad = write_fake_run(tmp_path / "bad", allocator="contiguous")
    damage, expected = BAD_FOLDERS[case]
    damage(bad)
    (tmp_path / "report.html").write_text("previous report")
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(good), str(bad)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert expected in err and "bad" in err
    assert (tmp_path / "report.html").read_text() == "previous report"
    assert not (tmp_path / "report.md").exists() and not (tmp_path / "figures").exists()


def test_compare_folder_with_a_partial_run_is_refused(
    compare_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (compare_dir / "paged" / "summary.json").unlink()
    (compare_dir / ".virtual.tmp-1234").mkdir()  # a crashed write: hidden, ignored
    (compare_dir / ".virtual.tmp-1234" / "steps.parquet").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(compare_dir)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "paged: missing summary.json" in err and ".virtual" not in err
    assert not (compare_dir / "report.html").exists()


def test_missing_folder_and_empty_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    assert "nowhere: results folder not found" in capsys.readouterr().err
    with pytest.raises(ResultsError, match="no results folders"):
        report([])


def test_cli_report_success(compare_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = compare_dir / "custom"
    try:
        main(["report", str(compare_dir), "--output", str(out)])
    except SystemExit as exc:  # main returns on success, or exits 0
        assert exc.code in (0, None)
    assert "report written to" in capsys.readouterr().out
    assert (out / "report.html").is_file() and (out / "report.md").is_file()


def test_fabricated_diagnosis_shows_only_what_data_shows(compare_dir: Path) -> None:
    html_text = report([compare_dir]).read_text(encoding="utf-8")
    assert 'data-kind="shape_not_capacity"><strong>contiguous</strong>' in html_text
    assert (
        '<strong>The limit was allocation shape, not capacity</strong> — contiguous <span class="threshold">'
        in html_text
    )
    assert "<strong>paged</strong>" not in html_text.split('id="diagnosis"')[1].split("</ul>")[0]


def test_diagnosis_opens_with_one_headline_per_finding_naming_its_allocators(compare_dir: Path) -> None:
    """Issue 11: one headline per kind of finding, the allocators it applies to, details under it."""
    statements = [
        diagnosis.Statement("high_waste", "contiguous", "long claim a", "waste ≥ 50 %", detail="waste 82 %"),
        diagnosis.Statement("rejections", "paged", "long claim b", "at least 1", detail="3 rejected"),
        diagnosis.Statement(
            "high_waste", "request_limit", "long claim c", "waste ≥ 50 %", detail="waste 73 %"
        ),
    ]
    found = diagnosis.findings(statements)
    assert [(f.kind, f.labels) for f in found] == [
        ("high_waste", ("contiguous", "request_limit")),
        ("rejections", ("paged",)),
    ]
    assert found[0].headline == diagnosis.HEADLINES["high_waste"] and found[0].threshold == "waste ≥ 50 %"
    assert [s.detail for s in found[0].details] == ["waste 82 %", "waste 73 %"]
    assert set(diagnosis.HEADLINES) >= {rule.__name__ for rule in diagnosis.RUN_RULES}

    report([compare_dir])
    markdown = (compare_dir / "report.md").read_text(encoding="utf-8")
    section = markdown.split("## Diagnosis")[1].split("## Figures")[0]
    headlines = [line for line in section.splitlines() if line.startswith("- **")]
    kinds = {s.kind for s in diagnosis.diagnose(dict(zip(*_labels_and_runs(compare_dir), strict=True)))}
    assert len(headlines) == len(kinds) >= 1
    for line in headlines:  # each threshold is printed once, on its headline
        threshold = line.split("(threshold: ")[1]
        assert section.count(threshold) == 1


def _labels_and_runs(folder: Path):
    from sim.reports.load import expand_results_dirs, load_results
    from sim.reports.render import run_labels

    runs = [load_results(path) for path in expand_results_dirs([folder])]
    return run_labels(runs), runs


def test_no_diagnosis_says_so(tmp_path: Path) -> None:
    run_dir = write_fake_run(tmp_path / "calm", allocator="paged")
    html_text = report([run_dir]).read_text(encoding="utf-8")
    assert diagnosis.NOTHING_TO_REPORT in html_text


def test_resample_steps_keeps_short_tables_and_time_weighted_means() -> None:
    rng = np.random.default_rng(3)
    durations = rng.uniform(0.001, 0.1, 5000)
    steps = pd.DataFrame(
        {
            "time_s": np.concatenate([[0.0], np.cumsum(durations)[:-1]]),
            "duration_s": durations,
            "flat": np.full(5000, 7.0),
            "ramp": np.arange(5000, dtype=float),
        }
    )
    short = resample_steps(steps.head(100), ["flat"])
    assert len(short) == 100 and list(short.columns) == ["time_s", "flat"]
    binned = resample_steps(steps, ["flat", "ramp"], max_points=50)
    assert len(binned) <= 50
    assert np.allclose(binned["flat"], 7.0)
    assert binned["ramp"].is_monotonic_increasing
    assert binned["time_s"].between(steps["time_s"].min(), steps["time_s"].max() + durations[-1]).all()


def test_one_colour_per_part() -> None:
    """Every shown part (free split into cached and empty, issue 20) has its own colour."""
    from sim.core.taxonomy import SHOWN_PARTS

    assert tuple(PART_COLORS) == SHOWN_PARTS
    assert len(set(PART_COLORS.values())) == len(SHOWN_PARTS)


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_unwritable_report_folder_is_one_line_exit_2_before_rendering(
    compare_dir: Path, where: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = compare_dir.parent / "a-file"
    blocker.write_text("not a folder")
    output = blocker if where == "file" else blocker / "report"

    def no_rendering(*args: object, **kwargs: object) -> None:
        raise AssertionError("figures rendered before the output folder was checked")

    monkeypatch.setattr("sim.reports.publish.render_figures", no_rendering)
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(compare_dir), "-o", str(output)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    in_the_way = "" if where == "file" else f"{blocker} "
    assert err == f"error: report folder {output}: {in_the_way}is a file, not a folder\n"
    assert blocker.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any folder")
def test_read_only_report_folder_is_refused(compare_dir: Path) -> None:
    locked = compare_dir.parent / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(OutputPathError, match="no permission to write"):
            report([compare_dir], output_dir=locked / "report")
    finally:
        locked.chmod(0o755)


def _rate_sweep_runs(root: Path) -> list[Path]:
    return [
        write_fake_run(root / f"{allocator}-{rate}", allocator=allocator, request_rate=rate, num_steps=60)
        for rate in (1.0, 4.0)
        for allocator in ("paged", "contiguous")
    ]


def test_publish_moves_figures_then_markdown_then_html_then_drops_stale_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _rate_sweep_runs(tmp_path / "runs")
    out = tmp_path / "out"
    report(runs, output_dir=out)
    stale = out / "figures" / FIGURE_FILES["rate_sweep"]
    assert stale.is_file()
    moves: list[tuple[str, bool]] = []  # (target name, stale figure still there at that moment)
    real_replace = os.replace

    def recording_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        moves.append((Path(dst).name, stale.exists()))
        real_replace(src, dst)

    monkeypatch.setattr("sim.files.os.replace", recording_replace)
    report(runs[:2], output_dir=out)  # one rate: no figure 5 any more
    moves = [(name, stale_there) for name, stale_there in moves if name != MARKER_FILE]  # marker: around
    names = [name for name, _ in moves]
    assert names[-2:] == ["report.md", "report.html"]
    assert sorted(names[:-2]) == sorted(CORE_FIGURES)
    assert all(stale_there for _, stale_there in moves)  # removed only after report.html is in place
    assert not stale.exists()


def test_crash_while_publishing_keeps_the_previous_report_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _rate_sweep_runs(tmp_path / "runs")
    out = tmp_path / "out"
    report(runs, output_dir=out)
    before = {name: (out / name).read_bytes() for name in ("report.md", "report.html")}
    real_replace = os.replace

    def failing_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst).name == "report.md":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr("sim.files.os.replace", failing_replace)
    with pytest.raises(
        OutputPathError, match=r"report folder .*out: cannot write \(No space left on device\)"
    ):
        report(runs[:2], output_dir=out)
    assert {name: (out / name).read_bytes() for name in before} == before
    # the old report.md links figure 5: it must still be there; no staging folder is left behind
    assert (out / "figures" / FIGURE_FILES["rate_sweep"]).is_file()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("value_ms", "shown"),
    [(287858.72, "288 s"), (31164.6, "31.2 s"), (2880.0, "2.88 s"), (45.67, "45.7 ms"), (0.1234, "0.123 ms"),
     (3.6e6 * 2.5, "2.5 h"), (999.4, "999 ms"), (999.6, "1 s"), (99_960.0, "100 s"), (5e9, "1,389 h")],
)  # fmt: skip
def test_long_durations_are_shown_in_sensible_units(value_ms: float, shown: str) -> None:
    """Issue 11: TTFT 287858.72 ms reads as 288 s; the cell's data-value keeps the raw ms."""
    assert format_value(value_ms, "ms") == shown
