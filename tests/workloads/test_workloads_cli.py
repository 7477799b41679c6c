"""`kvsim workload describe|list` through sim.cli.main: output, figures, and exit code 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cli import main

REPO = Path(__file__).resolve().parents[2]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_describe_a_preset(capsys) -> None:
    code, out, _ = run_cli(
        ["workload", "describe", "sharegpt", "--num-prompts", "2000", "--seed", "3"], capsys
    )
    assert code == 0
    assert "requests          2,000" in out
    assert "inter-arrival CV" in out and "prompt_tokens" in out and "p99" in out
    assert "prefix hit ratio  n/a" in out


def test_describe_with_params_and_json(capsys) -> None:
    args = ["workload", "describe", "chat-system-prompt", "--num-prompts", "3000", "--request-rate", "4"]
    code, out, _ = run_cli(
        [*args, "-p", "max_tokens_policy=exact", "--param", "arrival=gamma(cv=2)", "--json"], capsys
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["count"] == 3000
    assert summary["max_tokens"]["mean"] == pytest.approx(summary["output_tokens"]["mean"])
    assert summary["interarrival_cv"] == pytest.approx(2.0, rel=0.15)
    assert 0.7 < summary["prefix_hit_ratio"] < 0.9


def test_describe_plot_writes_a_png_atomically(tmp_path: Path, capsys) -> None:
    target = tmp_path / "w.png"
    code, out, _ = run_cli(
        ["workload", "describe", "alpaca", "--num-prompts", "300", "--plot", str(target)], capsys
    )
    assert code == 0 and f"figure written to {target}" in out
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # no temp file left behind; the marker records the figure as kvsim's (sim.files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvsim-output.json", "w.png"]


def test_describe_a_trace_with_prefix_information(traces_dir: Path, capsys) -> None:
    path = traces_dir / "mooncake_conversation" / "conversation_trace.jsonl"
    code, out, _ = run_cli(["workload", "describe", str(path)], capsys)
    assert code == 0
    assert "requests          12,031" in out
    assert "prefix hit ratio  37.4 %" in out


def test_bad_row_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,10\n1,ten,10\n")
    code, out, err = run_cli(["workload", "describe", str(path)], capsys)
    assert code == 2 and out == ""
    assert err == f"error: {path}: row 3, field 'prompt_tokens': not a number ('ten')\n"
    code, out, err = run_cli(["workload", "describe", str(path), "--on-bad-row", "skip"], capsys)
    assert code == 0 and "skipped rows      1" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nonsense"], "error: field 'source': 'nonsense' is neither a preset"),
        (["sharegpt", "--request-rate", "-2"], "error: field 'request_rate': must be > 0 (got -2.0)"),
        (["sharegpt", "-p", "oops"], "error: field 'param': expected KEY=VALUE (got 'oops')"),
        (
            ["sharegpt", "--format", "csv"],
            "error: field 'format': is for trace files; 'sharegpt' is a preset",
        ),
        (
            ["sharegpt", "--plot", "/nonexistent-dir/x.png", "--num-prompts", "5"],
            "error: /nonexistent-dir/x.png",
        ),
    ],
)
def test_user_errors_exit_2_without_traceback(args: list[str], expected: str, capsys) -> None:
    code, _, err = run_cli(["workload", "describe", *args], capsys)
    assert code == 2 and err.startswith(expected) and err.count("\n") == 1
    assert "Traceback" not in err


def test_max_model_len_counts_or_clips_a_trace(tmp_path: Path, capsys) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,50,10\n1,150,10\n2,90,30\n")
    code, out, _ = run_cli(["workload", "describe", str(path), "--max-model-len", "100"], capsys)
    assert code == 0 and "over-long prompts 1" in out and "clipped requests  0" in out
    code, out, _ = run_cli(["workload", "describe", str(path), "--max-model-len", "100", "--clip"], capsys)
    assert code == 0 and "clipped requests  2" in out and "clipped limits    3" in out


def test_list_shows_presets_with_sources_and_formats(capsys) -> None:
    code, out, _ = run_cli(["workload", "list"], capsys)
    assert code == 0
    for name in (
        "sharegpt",
        "alpaca",
        "azure-conv",
        "chat-system-prompt",
        "long-context",
        "mooncake",
        "azure",
    ):
        assert name in out
    assert "161.31" in out and "Splitwise" in out


def test_subprocess_entry_point(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "sim.cli", "workload", "describe", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == f"error: {path}: empty file\n"


def test_unwritable_plot_path_fails_before_any_output(tmp_path: Path, capsys) -> None:
    """--plot into a missing or read-only folder: one error line, no summary printed first."""
    missing = tmp_path / "nope" / "w.png"
    code, out, err = run_cli(
        ["workload", "describe", "alpaca", "--num-prompts", "20", "--plot", str(missing)], capsys
    )
    assert code == 2 and out == ""
    assert err == f"error: {missing}: folder {missing.parent} does not exist\n"
    folder = tmp_path / "w.png"
    folder.mkdir()
    code, out, err = run_cli(
        ["workload", "describe", "alpaca", "--num-prompts", "20", "--plot", str(folder)], capsys
    )
    assert code == 2 and out == "" and "is a folder" in err
    code, out, err = run_cli(["workload", "describe", "alpaca", "--plot", str(tmp_path / "w.xyz")], capsys)
    assert code == 2 and out == "" and "unsupported image type 'xyz'" in err
