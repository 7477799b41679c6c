"""`kvsim run`, `kvsim compare`, `kvsim presets` through sim.cli.main: outputs, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main


def run_cli(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_run_writes_results_and_prints_summary(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r"
    code = run_cli(
        ["run", "--num-prompts", "40", "--allocator", "request_limit:oracle", "--output", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert "TTFT" in printed and "request_limit:oracle" in printed
    assert printed.strip().splitlines()[-1] == f"results written to {out}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario"]["num_prompts"] == 40
    assert summary["allocator"] == "request_limit:oracle"


def test_run_reads_a_config_and_flags_override_it(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text(
        'name = "cfg"\nmodel = "OPT-13B"\ngpu = "A100-40GB"\nkv_cache_memory = "4GiB"\n'
        "max_model_len = 2048\nnum_prompts = 25\nseed = 5\n"
    )
    out = tmp_path / "r"
    assert run_cli(["run", "--config", str(config), "--seed", "6", "--quiet", "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == 6 and summary["scenario"]["name"] == "cfg"
    assert summary["metrics"]["kv_capacity_tokens"] == 4 * 1024**3 // (800 * 1024)


def test_compare_writes_one_folder_per_allocator_and_ends_with_where(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cmp"
    code = run_cli(
        ["compare", "--num-prompts", "30", "--allocators", "paged,contiguous", "--output", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert (out / "paged" / "summary.json").is_file() and (out / "contiguous" / "summary.json").is_file()
    assert printed.strip().splitlines()[-1].startswith(f"results written to {out}")


def test_presets_lists_models_and_gpus(capsys) -> None:
    assert run_cli(["presets"]) == 0
    printed = capsys.readouterr().out
    for name in ("OPT-13B", "LLaMA-2-7B", "A100-40GB", "H100-80GB"):
        assert name in printed


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--block-size", "0"], "block_size"),
        (["run", "--allocator", "bogus"], "bogus"),
        (["run", "--config", "/nonexistent/s.toml"], "not found"),
        (["run", "--preemption-mode", "teleport"], "preemption_mode"),
        (["run", "--max-num-seqs", "-3"], "max_num_seqs"),
        (["compare", "--allocators", ","], "allocators"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str, capsys, tmp_path: Path) -> None:
    code = run_cli([*args, "--output", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and needle in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x").exists()
