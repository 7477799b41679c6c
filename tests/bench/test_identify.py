"""What a held-out LambdaLabsML/vllm-benchmark file says about its server (issue 21).

The model ids and the `<N>x<GPU>/<model>_tp<N>_len<L>.json` layout are those of the source's
results/prompt_320 runs that ../shared/bench leaves out (4x/8x, Mistral-Nemo, Mistral-Large, Mixtral,
Hermes-405B): each must name a preset (FP8 from the id, a `-Instruct-2407` date kept) and replay at TP 4
and 8 like the shared files; a model that does not fit its GPUs is one line, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _bench_helpers import bench_document, write_json

from sim.bench.identify import model_from_id, server_from_path
from sim.bench.lambda_set import replay_set
from sim.bench.results_file import read_bench_file
from sim.cli import main


@pytest.mark.parametrize(
    ("model_id", "expected"),
    [
        ("mistralai/Mistral-Nemo-Instruct-2407", ("Mistral-Nemo", None)),
        ("mistralai/Mistral-Large-Instruct-2407", ("Mistral-Large-2", None)),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", ("Mixtral-8x7B", None)),
        ("mistralai/Mixtral-8x22B-Instruct-v0.1", ("Mixtral-8x22B", None)),
        ("NousResearch/Hermes-3-Llama-3.1-405B-FP8", ("Llama-3.1-405B", "fp8")),
        ("NousResearch/Hermes-3-Llama-3.1-405B", ("Llama-3.1-405B", None)),
        ("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8", ("Llama-3.1-70B", "fp8")),
        ("neuralmagic/Meta-Llama-3.1-8B-FP8", ("Llama-3.1-8B", "fp8")),
        ("meta-llama/Meta-Llama-3-8B-Instruct", ("Llama-3-8B", None)),
        ("meta-llama/Meta-Llama-3-70B-Instruct", ("Llama-3-70B", None)),
        ("mistralai/Mistral-7B-Instruct-v0.3", ("Mistral-7B", None)),
        ("mistralai/Mistral-Nemo-Base-2407", ("Mistral-Nemo", None)),
        ("mistralai/Mistral-Large-Instruct-2411", (None, None)),  # another release: not guessed
    ],
)
def test_every_lambda_model_id_names_a_preset(model_id: str, expected: tuple) -> None:
    assert model_from_id(model_id) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("4xA100-80GB-SXM/Mixtral-8x7B-Instruct-v0.1_tp4_len2000.json", ("A100-80GB", 4, 2000)),
        ("8xH100-80GB-SXM/Hermes-3-Llama-3.1-405B-FP8_tp8_len64000.json", ("H100-80GB", 8, 64000)),
    ],
)
def test_tp4_and_tp8_paths_give_gpu_tp_and_length(path: str, expected: tuple) -> None:
    found = server_from_path(Path(path))
    assert (found["gpu"], found["tensor_parallel_size"], found["max_model_len"]) == expected


def _burst_file(folder: Path, name: str, model_id: str, count: int = 24) -> Path:
    """A small later-script burst (end-to-end latency fields present) at a held-out path."""
    rng = np.random.default_rng(0)
    inputs = [int(x) for x in rng.integers(20, 400, count)]
    outputs = [int(x) for x in rng.integers(2, 200, count)]
    measured = {"mean_ttft_ms": 500.0, "median_ttft_ms": 500.0, "p99_ttft_ms": 900.0,
                "mean_tpot_ms": 30.0, "median_tpot_ms": 30.0, "p99_tpot_ms": 60.0,
                "mean_e2el_ms": 4000.0, "median_e2el_ms": 4000.0, "p99_e2el_ms": 8000.0,
                "request_throughput": 5.0, "output_throughput": 500.0}  # fmt: skip
    document = bench_document(inputs, outputs, **measured)
    document.update(model_id=model_id, tokenizer_id=model_id, mean_latency_ms=4000.0)
    folder.mkdir(parents=True, exist_ok=True)
    return write_json(folder / name, document)


def test_a_tp4_mixtral_file_replays_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _burst_file(
        tmp_path / "4xA100-80GB-SXM",
        "Mixtral-8x7B-Instruct-v0.1_tp4_len2000.json",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
    )
    main(["bench", "replay", str(path)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].endswith("Mixtral-8x7B-Instruct-v0.1_tp4_len2000.json")
    assert lines[-1].startswith("MAPE ") and lines[-1].endswith(" %")
    # the shared set's rules (engine vllm-v0, the later script's flags, its terms) take it as well
    (result,) = replay_set([read_bench_file(path)])
    assert result.simulated["request_throughput"] > 0 and result.simulated["mean_tpot_ms"] > 0


def test_a_model_that_does_not_fit_its_gpus_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _burst_file(
        tmp_path / "2xA100-80GB-SXM",
        "Mistral-Large-Instruct-2407_tp2_len2000.json",
        "mistralai/Mistral-Large-Instruct-2407",
        count=4,
    )
    with pytest.raises(SystemExit) as info:
        main(["bench", "replay", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tensor_parallel_size" in err and "Traceback" not in err
