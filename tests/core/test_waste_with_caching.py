"""waste_pct with prefix caching on (issue 20, part 1): cached blocks are free, never allocated.

docs/metrics.md ("The memory taxonomy"): cached-but-evictable blocks are free memory that happens to
hold reusable content, so they are neither allocated nor waste. On bbd53f5 `summarize` counted them
as allocated, and the README's own vllm-v1 example printed 99.2 % waste (2.0 % with caching off).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.api import simulate
from sim.cli import main
from sim.cli.scenario_flags import build_scenario
from sim.core.taxonomy import ALLOCATED_PARTS, SHOWN_PARTS, shown_shares_pct

# A small, memory-bound vllm-v1 scenario: caching keeps released blocks as `cached` free blocks.
_BASE = {"engine": "vllm-v1", "num_prompts": 300, "workload.request_rate": 4.0, "kv_cache_memory": "2GiB"}


def _metrics(workload: str, caching: bool) -> dict:
    scenario = build_scenario(None, {**_BASE, "workload.source": workload, "enable_prefix_caching": caching})
    return simulate(scenario).metrics


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, bool], dict]:
    return {
        (workload, caching): _metrics(workload, caching)
        for workload in ("sharegpt", "chat-system-prompt")
        for caching in (True, False)
    }


def test_no_shared_content_gives_the_same_waste_with_caching_on_and_off(runs) -> None:
    cached, uncached = runs[("sharegpt", True)], runs[("sharegpt", False)]
    assert cached["kv_cached_pct"] > 1.0  # caching really kept blocks: the case that used to break
    assert cached["waste_pct"] == pytest.approx(uncached["waste_pct"], abs=0.1)


def test_shared_prefixes_waste_no_more_with_caching(runs) -> None:
    cached, uncached = runs[("chat-system-prompt", True)], runs[("chat-system-prompt", False)]
    assert uncached["kv_duplicated_pct"] > 0.0 or uncached["waste_pct"] > 0.0
    assert cached["waste_pct"] <= uncached["waste_pct"]


def test_shown_parts_partition_capacity_and_cached_is_part_of_free(runs) -> None:
    for metrics in runs.values():
        shares = shown_shares_pct(metrics)
        assert tuple(shares) == SHOWN_PARTS
        assert sum(shares.values()) == pytest.approx(100.0, abs=1e-6)
        assert metrics["kv_free_pct"] == pytest.approx(
            metrics["kv_cached_pct"] + metrics["kv_empty_pct"], abs=1e-9
        )
        allocated = sum(metrics[f"kv_{part}_pct"] for part in ALLOCATED_PARTS)
        assert metrics["kv_allocated_pct"] == pytest.approx(allocated, abs=1e-9)
        assert metrics["kv_allocated_pct"] + metrics["kv_free_pct"] == pytest.approx(100.0, abs=1e-6)
        expected = 100.0 * (1.0 - metrics["kv_token_states_pct"] / metrics["kv_allocated_pct"])
        assert metrics["waste_pct"] == pytest.approx(expected, rel=1e-9)


def test_readme_vllm_v1_example_prints_a_waste_below_10_pct(tmp_path: Path, capsys) -> None:
    """The README's example, as written (plus an output folder): waste was 99.2 % on bbd53f5."""
    out = tmp_path / "run"
    args = [
        "run",
        "--engine",
        "vllm-v1",
        "--model",
        "Llama-3-8B",
        "--gpu",
        "H100-80GB",
        "--workload",
        "sharegpt",
    ]
    try:
        main([*args, "--output", str(out)])
    except SystemExit as exc:
        assert not exc.code
    printed = capsys.readouterr().out
    waste_line = next(line for line in printed.splitlines() if "waste (% of allocated)" in line)
    printed_waste = float(waste_line.strip(" │|").split()[-1].rstrip("│ "))
    assert printed_waste < 10.0
    metrics = json.loads((out / "summary.json").read_text())["metrics"]
    assert metrics["waste_pct"] < 10.0
    assert metrics["kv_cached_pct"] > 10.0  # the cached blocks are shown, as their own part
    assert "KV cached (free, reusable) (%)" in printed
