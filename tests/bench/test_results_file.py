"""Reading `vllm bench serve` result files: the fields used, and one line naming file and field when bad."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
from _bench_helpers import bench_document, write_json

from sim.bench.replay import measured_metrics, request_table, streamed_mask
from sim.bench.results_file import BenchFileError, read_bench_file

SHARED_BENCH = Path(__file__).resolve().parents[2].parent / "shared" / "bench" / "vllm_bench"


def test_reads_lengths_rate_and_aggregates(tmp_path: Path) -> None:
    doc = bench_document(
        [10, 20, 30], [5, 0, 7], mean_ttft_ms=12.0, mean_latency_ms=99.0, ttfts=[0.1, 0.0, 0.3]
    )
    bench = read_bench_file(write_json(tmp_path / "r.json", doc))
    assert bench.num_prompts == 3 and math.isinf(bench.request_rate)
    assert bench.input_lens.tolist() == [10, 20, 30] and bench.output_lens.tolist() == [5, 0, 7]
    assert bench.measured["mean_ttft_ms"] == 12.0
    assert bench.measured["mean_e2el_ms"] == 99.0  # older *_latency_ms name
    assert math.isnan(bench.measured["p99_itl_ms"])
    # the empty answer (0.0 TTFT, 0 tokens) is left out of the measured TTFT
    assert streamed_mask(bench).tolist() == [True, False, True]
    assert measured_metrics(bench)["mean_ttft_ms"] == pytest.approx(200.0)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"num_prompts": 2, "output_lens": [1, 2]}', "field 'input_lens': missing"),
        (
            '{"num_prompts": 3, "input_lens": [1, 2], "output_lens": [1, 2]}',
            "field 'input_lens': expected a list of 3",
        ),
        ('{"num_prompts": 2, "input_lens": [1, -2], "output_lens": [1, 2]}', "field 'input_lens' row 1"),
        ('{"num_prompts": 2, "input_lens": [1, 2], "output_lens": [1, "x"]}', "field 'output_lens' row 1"),
        (
            '{"num_prompts": 1, "input_lens": [1], "output_lens": [1], "request_rate": -1}',
            "field 'request_rate'",
        ),
        (
            '{"num_prompts": 1, "input_lens": [1], "output_lens": [1], "max_concurrency": 0}',
            "field 'max_concurrency'",
        ),
        ('{"num_prompts": 1, "input_lens": [1], "output_lens": [1], "ttfts": [-1]}', "field 'ttfts' row 0"),
    ],
)
def test_bad_files_are_one_line_naming_the_field(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(BenchFileError) as info:
        read_bench_file(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and expected in message


@pytest.mark.parametrize("field", ["num_prompts", "completed"])
@pytest.mark.parametrize("value", ['"inf"', "2.5"])
def test_a_request_count_must_be_whole(tmp_path: Path, field: str, value: str) -> None:
    """A count of "inf" used to raise OverflowError (a traceback) from int(math.inf)."""
    path = tmp_path / "bad.json"
    path.write_text(f'{{"input_lens": [1, 2], "output_lens": [1, 2], "{field}": {value}}}')
    with pytest.raises(BenchFileError, match=f"field '{field}': expected a whole number"):
        read_bench_file(path)


def test_input_lens_not_a_list_is_one_line(tmp_path: Path) -> None:
    """`len(5)` used to raise TypeError (a traceback)."""
    path = tmp_path / "bad.json"
    path.write_text('{"input_lens": 5, "output_lens": [1]}')
    with pytest.raises(BenchFileError, match="field 'num_prompts': missing"):
        read_bench_file(path)


def test_a_fifo_or_device_is_refused_unread(tmp_path: Path) -> None:
    """`path.read_bytes()` blocked on a FIFO forever and read /dev/zero until memory ran out."""
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(BenchFileError, match="must be a regular file"):
            read_bench_file(path)


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(BenchFileError, match="cannot read"):
        read_bench_file(tmp_path / "absent.json")


def test_rate_inf_sends_all_at_zero(tmp_path: Path) -> None:
    bench = read_bench_file(write_json(tmp_path / "r.json", bench_document([10] * 5, [3] * 5)))
    table = request_table(bench, np.random.default_rng(0))
    assert table["arrival_s"].tolist() == [0.0] * 5
    assert table["output_tokens"].tolist() == [3] * 5 and "closed_loop" not in table.attrs


def test_finite_rate_is_gamma_with_the_files_burstiness_and_deterministic(tmp_path: Path) -> None:
    doc = bench_document([10] * 4000, [3] * 4000, request_rate=4.0, burstiness=0.5)
    bench = read_bench_file(write_json(tmp_path / "r.json", doc))
    first = request_table(bench, np.random.default_rng(7))["arrival_s"].to_numpy()
    again = request_table(bench, np.random.default_rng(7))["arrival_s"].to_numpy()
    assert np.array_equal(first, again)
    gaps = np.diff(first)
    assert gaps.mean() == pytest.approx(0.25, rel=0.06)
    # gamma with shape 0.5: coefficient of variation 1/sqrt(0.5) = 1.41
    assert gaps.std() / gaps.mean() == pytest.approx(2**0.5, rel=0.1)


def test_max_concurrency_is_a_closed_loop_with_the_front_end_as_think_time(tmp_path: Path) -> None:
    bench = read_bench_file(
        write_json(tmp_path / "r.json", bench_document([10] * 6, [3] * 6, max_concurrency=2))
    )
    table = request_table(bench, np.random.default_rng(0), frontend_s=0.05)
    assert table.attrs["closed_loop"] == {"users": 2, "think_s": 0.05}


def test_finite_rate_with_max_concurrency_is_refused(tmp_path: Path) -> None:
    doc = bench_document([10] * 3, [3] * 3, request_rate=2.0, max_concurrency=2)
    bench = read_bench_file(write_json(tmp_path / "r.json", doc))
    with pytest.raises(BenchFileError, match="max_concurrency"):
        request_table(bench, np.random.default_rng(0))


@pytest.mark.skipif(not SHARED_BENCH.is_dir(), reason="shared bench files not found")
def test_every_shared_file_reads_and_reproduces_its_stored_ttft() -> None:
    """The reader's lists reproduce vLLM's stored aggregates (the zeros included, as vLLM computed them)."""
    for path in sorted(SHARED_BENCH.glob("*/*.json")):
        bench = read_bench_file(path)
        assert bench.ttfts_s is not None
        if bench.failed_run:  # their errors lists were not copied (../shared/bench/README.md)
            continue
        assert np.mean(bench.ttfts_s[bench.ok]) * 1e3 == pytest.approx(
            bench.measured["mean_ttft_ms"], rel=1e-9
        )
