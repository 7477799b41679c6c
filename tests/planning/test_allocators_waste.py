"""The static waste calculator (sim/planning/static_waste.py) and `kvsim waste`."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.errors import ScenarioError
from sim.planning.static_waste import SequenceLength, parse_lengths, static_waste

PAPER_LENGTHS = ["180", "240", "95", "1300", "60", "410"]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
        raise SystemExit(0)
    captured = capsys.readouterr()
    return int(stopped.value.code or 0), captured.out, captured.err


def test_paper_example_per_family() -> None:
    rows = {row.allocator: row for row in static_waste(parse_lengths(PAPER_LENGTHS), max_model_len=8192)}
    contiguous = rows["contiguous"]
    assert (contiguous.used_tokens, contiguous.reserved_tokens) == (2285, 49_152)
    assert round(contiguous.waste_pct, 2) == 95.35
    # paged, block 16: ceil(len / 16) blocks each -> 192 + 240 + 96 + 1312 + 64 + 416 slots
    assert (rows["paged"].used_tokens, rows["paged"].reserved_tokens) == (2285, 2320)
    # virtual, 2 MiB pages of 8192 B per token per layer = 256 tokens per page
    assert rows["virtual"].reserved_tokens == 256 * (1 + 1 + 1 + 6 + 1 + 2)
    assert rows["request_limit:oracle"].reserved_tokens == 2285
    # pow2 of the outputs (prompt 0 here): 256 + 256 + 128 + 2048 + 64 + 512
    assert rows["request_limit:pow2"].reserved_tokens == 3264
    # No --max-tokens: the client default 2048 (workloads' default policy), prompt 0 here.
    limit = rows["request_limit:limit"]
    assert (limit.used_tokens, limit.reserved_tokens) == (2285, 6 * 2048)
    assert "default client limit 2048" in limit.note


def test_default_limit_is_clipped_to_the_context_and_stops_long_outputs() -> None:
    rows = {
        row.allocator: row
        for row in static_waste([SequenceLength(1500, 100), SequenceLength(10, 3000)], max_model_len=4096)
    }
    limit = rows["request_limit:limit"]
    # 1500 + min(2048, 4096 - 1500) = 3548 and 10 + 2048; the second stops at 2048 generated tokens
    assert (limit.used_tokens, limit.reserved_tokens) == (1600 + 2058, 3548 + 2058)
    assert rows["request_limit:oracle"].used_tokens == 1600 + 3010  # other rows run to the end
    clipped = {row.allocator: row for row in static_waste([SequenceLength(3000, 100)], max_model_len=4096)}
    assert clipped["request_limit:limit"].reserved_tokens == 4096  # 3000 + (4096 - 3000)
    assert "at most max_model_len - prompt" in clipped["request_limit:limit"].note


def test_max_tokens_adds_the_request_limit_row_and_caps_outputs() -> None:
    rows = static_waste(
        [SequenceLength(100, 80), SequenceLength(50, 700)],
        max_model_len=2048,
        max_tokens=512,
        placement="buddy",
    )
    limit = next(row for row in rows if row.allocator == "request_limit:limit")
    # slabs: 100 + 512 -> 1024 (buddy), 50 + 512 -> 1024; the second stops at 512 generated tokens
    assert (limit.used_tokens, limit.reserved_tokens) == (180 + 562, 2048)


def test_cli_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["waste", "--max-model-len", "8192", *PAPER_LENGTHS], capsys)
    assert code == 0, err
    assert "2,285" in out and "49,152" in out and "95.35 %" in out
    assert "paged" in out and "virtual" in out
    assert "request_limit:limit" in out and "12,288" in out and "default client" in out


def test_cli_says_which_sequences_the_default_limit_stops(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["waste", "--max-model-len", "4096", "10+3000", "100"], capsys)
    assert code == 0, err
    assert "1 sequence(s) stop at the default client limit 2048 in the request_limit:limit row" in out


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        ["waste", "--max-model-len", "8192", "--block-size", "32", "--json", *PAPER_LENGTHS], capsys
    )
    assert code == 0
    rows = {row["allocator"]: row for row in json.loads(out)}
    assert rows["paged"]["reserved_tokens"] == 192 + 256 + 96 + 1312 + 64 + 416


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["waste", "--max-model-len", "8192", "12x"], "argument 1 ('12x') must be TOKENS or PROMPT+OUTPUT"),
        (["waste", "--max-model-len", "8192", "10", "0"], "argument 2 ('0')"),
        (
            ["waste", "--max-model-len", "100", "90+20"],
            "sequence 1 has 110 tokens, more than max_model_len (100)",
        ),
        (
            ["waste", "--max-model-len", "100", "--block-size", "0", "10"],
            "block_size must be an integer >= 1",
        ),
        (
            ["waste", "--max-model-len", "100", "--page-bytes", "1000", "10"],
            "page_bytes (1000) must be a multiple",
        ),
        (
            ["waste", "--max-model-len", "100", "--placement", "worst_fit", "10"],
            "unknown placement 'worst_fit'",
        ),
        (["waste", "--max-model-len", "0", "10"], "max_model_len must be an integer >= 1"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert err.startswith("error: ") and fragment in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_parse_lengths_needs_at_least_one() -> None:
    with pytest.raises(ScenarioError):
        parse_lengths([])
