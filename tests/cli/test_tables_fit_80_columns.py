"""`kvsim compare`, `waste` and `presets` fit 80 columns, never cut a number, and `--wide` shows all.

Issue 20: compare printed 179 columns, waste 120, presets ~115, and rich cut cells it could not fit
("1,033,4…"); presets showed DeepSeek-V3's MLA as "kv heads 128, head dim 192" and Mistral-7B and
-v0.1 as identical rows.
"""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console

from sim.cli import main
from sim.cli.tables import column_chunks, print_column_chunks

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().out


def assert_fits_80(printed: str) -> None:
    """Every table line fits. Two one-sentence lines are prose, not table, and may be longer: the
    closing "... written to PATH" (a path of any length) and the workload's clock line ("generating
    N PRESET requests ..." / "replaying N rows ...", workloads/clock.py), which a terminal wraps."""
    prose = (" written to ", "generating ", "replaying ")
    lines = [
        line
        for line in printed.splitlines()
        if not any(p in line for p in prose[:1]) and not line.startswith(prose[1:])
    ]
    widest = max(len(line.rstrip()) for line in lines)
    assert widest <= 80, f"a line of {widest} characters"
    assert "…" not in printed


def test_compare_fits_80_columns_and_wide_is_one_table(tmp_path: Path, capsys) -> None:
    args = ["compare", "--num-prompts", "12", "--quiet", "--output", str(tmp_path / "c")]
    code, printed = run_cli(args, capsys)
    assert code == 0
    assert_fits_80(printed)
    tables = printed.split("kvsim compare:")[1:]
    assert len(tables) > 1  # the six default allocators do not fit one 80-column table
    for label in ("contiguous", "request_limit:oracle", "request_limit:pow2", "paged", "virtual"):
        assert label in printed
    # every row is labelled in every part
    assert all("mean / p99 TTFT (ms)" in table for table in tables)
    code, wide = run_cli([*args, "--wide"], capsys)
    assert code == 0
    assert wide.count("kvsim compare:") == 1
    assert max(len(line.rstrip()) for line in wide.splitlines()) > 80

    # the same numbers, apart from the wall time (measured anew), in both layouts
    def cells(text: str) -> set[tuple[str, str]]:
        """(row label, cell) pairs of every table part."""
        out = set()
        for line in text.splitlines():
            fields = [field.strip() for field in line.split("│")[1:-1]]
            if fields and fields[0] != "wall time (s)":
                out.update((fields[0], cell) for cell in fields[1:])
        return out

    assert cells(printed) == cells(wide)
    assert any(NUMBER.fullmatch(cell) for _, cell in cells(printed))


def test_column_chunks_never_cut_a_column_wider_than_the_page() -> None:
    assert column_chunks(30, [20, 20, 20], 80) == [range(0, 2), range(2, 3)]
    assert column_chunks(30, [120, 5], 80) == [range(0, 1), range(1, 2)]
    out = Console(width=80, record=True)
    long_number = "1,033,456,789,012,345,678,901,234,567,890,123,456,789,012,345,678,901,234,567,890"
    print_column_chunks(out, "t", "metric", ["request_limit:oracle"], [["x", long_number]], wide=False)
    assert long_number in out.export_text()


def test_waste_fits_80_columns_with_every_number(capsys) -> None:
    lengths = ["180", "240", "95", "1300", "60", "410"]
    code, printed = run_cli(["waste", "--max-model-len", "8192", *lengths], capsys)
    assert code == 0
    assert_fits_80(printed)
    for number in ("49,152", "95.35 %", "12,288", "2,320", "25.62 %"):
        assert number in printed
    code, wide = run_cli(["waste", "--max-model-len", "8192", *lengths, "--wide"], capsys)
    assert "slab = prompt + max_tokens (default client limit 2048), first_fit" in wide


def _row(printed: str, name: str) -> str:
    return next(line for line in printed.splitlines() if line.split()[:1] == [name])


def test_presets_fit_80_columns_and_show_windows_and_mla(capsys) -> None:
    code, printed = run_cli(["presets"], capsys)
    assert code == 0
    assert_fits_80(printed)
    assert "MLA 512+64" in _row(printed, "DeepSeek-V3")
    assert "128" not in _row(printed, "DeepSeek-V3").split("MLA")[0].split()[1:]  # no "kv heads 128"
    assert "4,096 all" in _row(printed, "Mistral-7B-v0.1")
    assert "4,096" not in _row(printed, "Mistral-7B").replace("32,768", "")
    assert "1,024 52/62" in _row(printed, "Gemma-3-27B")
    assert "GQA 32/8×128" in _row(printed, "Llama-3-8B")
    code, wide = run_cli(["presets", "--wide"], capsys)
    assert code == 0
    assert "kv_lora_rank" in wide and "– (MLA)" in _row(wide, "DeepSeek-V3")
