"""An engine registered from a test file alone runs through `kvsim run --engine` (issue 22 §1).

Why: adding an engine must be one class and one `register_engine` call; nothing in `sim/` may list
engines. The toy below is request-level (static) batching, the baseline Orca (OSDI 2022) improves
on: a new batch is admitted only when the previous one has finished, with its own preset defaults
(7 sequences, a 4096-token budget) so the test can see that the defaults come from the policy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import pandas as pd
import pytest
from _cli_helpers import run_cli

from sim.core.policy import ContinuousBatchingPolicy, StepPlan
from sim.core.scheduler import Scheduler
from sim.engines import available_engines, engine_policy, register_engine, unregister_engine

TOY = "toy-static"


class StaticBatchingPolicy(ContinuousBatchingPolicy):
    """Admit waiting requests only into an empty batch; otherwise run the batch as it is."""

    name = TOY
    preemption_modes = ("recompute",)
    preset_flags: Mapping[str, object] = {
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
        "preemption_mode": "recompute",
    }
    compare_placement = None
    framework_overhead = "vllm-v1"
    serving_stack = {"custom_all_reduce": True, "ray_workers": False, "frontend_in_engine_process": False}

    def admit(self, batch: Scheduler, plan: StepPlan, budget: int, now_s: float) -> None:
        if batch.num_seqs == 0:
            super().admit(batch, plan, budget, now_s)

    def default_budgets(
        self, *, max_model_len: int, chunked: bool, gpu_name: str, gpu_memory_bytes: int
    ) -> tuple[int, int]:
        return max(4096, max_model_len), 7

    def preemption_mode_problem(self, mode: str) -> str | None:
        return None if mode == "recompute" else f"{TOY} only recomputes (got {mode!r})"


@pytest.fixture
def toy_registered() -> Iterator[StaticBatchingPolicy]:
    policy = register_engine(StaticBatchingPolicy())
    yield policy
    unregister_engine(TOY)


def _batches_overlap(requests: pd.DataFrame) -> bool:
    """Whether some request was admitted while another, admitted earlier, was still running."""
    done = requests.dropna(subset=["admitted_s"]).sort_values("admitted_s")
    running_until = -1.0
    for admitted_s, group in done.groupby("admitted_s", sort=True):
        if admitted_s < running_until:
            return True
        running_until = max(running_until, float(group["finish_s"].max()))
    return False


def test_a_registered_toy_engine_runs_through_kvsim_run(toy_registered, tmp_path: Path) -> None:
    out = tmp_path / "toy"
    assert run_cli(["run", "--engine", TOY, "--num-prompts", "40", "-o", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario"]["engine"] == TOY
    assert summary["scenario"]["max_num_seqs"] == 7  # the toy's own preset default
    assert summary["scenario"]["max_num_batched_tokens"] == 4096
    assert summary["cost_model"]["engine"] == "vllm-v1"  # the framework overhead it declares
    assert summary["metrics"]["completed"] == 40
    requests = pd.read_parquet(out / "requests.parquet")
    assert not _batches_overlap(requests)  # the toy's rule: no admission into a running batch
    # the same workload under a registered vLLM engine does admit into running batches
    other = tmp_path / "v0"
    assert run_cli(["run", "--engine", "vllm-v0", "--num-prompts", "40", "-o", str(other)]) == 0
    assert _batches_overlap(pd.read_parquet(other / "requests.parquet"))


def test_the_toy_preset_refuses_what_it_cannot_do(toy_registered, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad"
    assert run_cli(["run", "--engine", TOY, "--preemption-mode", "swap", "-o", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{TOY} only recomputes" in err[0]
    assert not bad.exists()


def test_unregistered_engines_are_refused_with_the_known_ones(tmp_path: Path, capsys) -> None:
    assert TOY not in available_engines()
    with pytest.raises(ValueError, match=f"unknown engine '{TOY}'; known: vllm-v0, vllm-v1"):
        engine_policy(TOY)
    assert run_cli(["run", "--engine", TOY, "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vllm-v0, vllm-v1" in err[0] and "Traceback" not in err[0]


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_engine(engine_policy("vllm-v1"))
