"""Which benchmark script made which Lambda run (../shared/bench/README.md "Server settings").

The replay sets the later script's flags (`--gpu-memory-utilization 0.95 --max-num-seqs 1024`) on
the files that carry the end-to-end latency fields and vLLM 0.5.4's defaults on the others. Two facts
back that split: it is exactly the split by run date (the 2024-08-19 runs vs the 2024-09-07 runs),
and the earlier runs above 32K context cannot have used the later flags: vLLM 0.5.4 turns chunked
prefill on there with a 512-token budget, and its SchedulerConfig._verify_args refuses
max_num_batched_tokens < max_num_seqs (512 < 1024), so such a server would not have started.
Skipped without ../shared/bench.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.bench.lambda_set import (
    EARLIER_TERMS,
    LATER_SCRIPT_FLAGS,
    file_terms,
    fit_earlier,
    lambda_scenario,
    later_script,
    load_set,
)
from sim.bench.setup import scenario_for_file, scenario_from_fields
from sim.cost.server import shipped_terms
from sim.errors import ScenarioError

SHARED_BENCH = Path(__file__).resolve().parents[2].parent / "shared" / "bench" / "vllm_bench"
pytestmark = pytest.mark.skipif(not SHARED_BENCH.is_dir(), reason="shared bench files not found")


def _run_date(path: str) -> str:
    return str(json.loads(Path(path).read_text())["date"])[:8]


def test_later_script_files_are_the_september_runs() -> None:
    files = load_set(SHARED_BENCH)
    assert len(files) == 27
    for bench in files:
        assert later_script(bench) == (_run_date(bench.path) >= "20240907"), bench.name
    assert {_run_date(b.path) for b in files if not later_script(b)} == {"20240819"}


def test_long_context_earlier_runs_could_not_have_used_the_later_flags() -> None:
    long_runs = [b for b in load_set(SHARED_BENCH) if "len64000" in b.name or "len128000" in b.name]
    assert len(long_runs) == 4 and not any(later_script(b) for b in long_runs)
    for bench in long_runs:
        fields = {"engine": "vllm-v0", "config": None, **LATER_SCRIPT_FLAGS}
        with pytest.raises(ScenarioError, match="max_num_batched_tokens.*max_num_seqs=1024"):
            scenario_for_file(bench, fields, lambda f: scenario_from_fields({**f, "config": None}))
        scenario = lambda_scenario(bench)  # the older script: v0.5.4 defaults
        assert (scenario.max_num_seqs, scenario.gpu_memory_utilization) == (256, 0.90)
        assert scenario.enable_chunked_prefill and scenario.max_num_batched_tokens == 512


def test_a_later_script_file_above_32k_replays_under_the_defaults(tmp_path: Path) -> None:
    """A later-script file (latency fields) whose server ran above 32K: the later flags cannot have
    applied there (see the module docstring), so it gets the v0.5.4 defaults instead of an error."""
    from sim.bench.results_file import read_bench_file

    source = next(b for b in load_set(SHARED_BENCH) if later_script(b) and "3.1-8B-FP8_tp1_len2048" in b.name)
    target = tmp_path / "1xH100-80GB-SXM" / "Meta-Llama-3.1-8B-FP8_tp1_len64000.json"
    target.parent.mkdir()
    target.write_text(Path(source.path).read_text())
    bench = read_bench_file(target)
    assert later_script(bench)
    scenario = lambda_scenario(bench)
    assert (scenario.max_num_seqs, scenario.gpu_memory_utilization) == (256, 0.90)
    assert scenario.enable_chunked_prefill and scenario.max_num_batched_tokens == 512


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-80GB"])
def test_the_earlier_runs_front_end_and_stream_terms_are_their_fit(gpu: str) -> None:
    """EARLIER_TERMS[gpu] is the fit on that GPU's earlier-script runs with the shipped GPU-side
    terms fixed; those runs are replayed with them, the later runs with the shipped terms alone."""
    files = load_set(SHARED_BENCH)
    result = fit_earlier(files, gpu)
    fitted = result.terms.values()
    assert {name: fitted[name] for name in EARLIER_TERMS[gpu]} == pytest.approx(EARLIER_TERMS[gpu])
    shipped = shipped_terms("vllm-v0", gpu).values()
    for name in ("flops_efficiency_scale", "overhead_scale"):  # the GPU side is the later runs' fit
        assert fitted[name] == shipped[name]
    earlier = next(b for b in files if not later_script(b) and b.name.startswith(f"1x{gpu[:4]}"))
    terms = file_terms(earlier, lambda_scenario(earlier))
    assert terms.stream_chunk_s == EARLIER_TERMS[gpu]["stream_chunk_s"] > 0.0
    later = next(b for b in files if later_script(b))
    assert file_terms(later, lambda_scenario(later)).stream_chunk_s == 0.0
