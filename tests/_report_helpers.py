"""Fabricated results folders for the report tests, following docs/architecture.md's results contract.

Why fabricate: the report's unit tests must not depend on the engine's timing or numbers, and some
cases (a queue that grows while memory is free-but-unusable, a partial run) are easiest to state
directly as tables. Real tiny simulations are tested separately in tests/test_report_sim.py.
"""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

PARTS = ("token_states", "reservation", "internal", "external", "duplicated", "free")


def fake_steps(
    rng: np.random.Generator,
    *,
    num_steps: int,
    capacity_tokens: int,
    share_pct: dict[str, float],
    queue_peak: int,
    running_mean: float,
) -> pd.DataFrame:
    """Steps whose taxonomy hovers around `share_pct` (exact integer parts summing to capacity)."""
    duration_s = rng.uniform(0.01, 0.03, num_steps)
    time_s = np.concatenate([[0.0], np.cumsum(duration_s)[:-1]])
    parts = {}
    remaining = np.full(num_steps, capacity_tokens, dtype=np.int64)
    for part in PARTS[:-1]:
        jitter = rng.uniform(0.9, 1.1, num_steps)
        amount = np.minimum(
            (capacity_tokens * share_pct.get(part, 0.0) / 100.0 * jitter).astype(np.int64), remaining
        )
        parts[part] = amount
        remaining = remaining - amount
    parts["free"] = remaining
    queue_length = np.round(np.linspace(0, queue_peak, num_steps)).astype(np.int64)
    num_running = np.maximum(1, rng.poisson(running_mean, num_steps)).astype(np.int64)
    return pd.DataFrame(
        {
            "step": np.arange(num_steps, dtype=np.int64),
            "time_s": time_s,
            "duration_s": duration_s,
            "batch_size": num_running,
            "num_running": num_running,
            "queue_length": queue_length,
            "prefill_tokens": rng.integers(0, 512, num_steps),
            "decode_tokens": num_running,
            "capacity": np.full(num_steps, capacity_tokens, dtype=np.int64),
            **parts,
            "cached": np.zeros(num_steps, dtype=np.int64),
            "iterations": np.ones(num_steps, dtype=np.int64),
        }
    )


def fake_requests(rng: np.random.Generator, *, num_requests: int, request_rate: float) -> pd.DataFrame:
    """Requests with plausible latencies; every request completes."""
    arrival_s = np.cumsum(rng.exponential(1.0 / request_rate, num_requests))
    prompt_tokens = rng.integers(20, 400, num_requests)
    output_tokens = rng.integers(5, 300, num_requests)
    ttft_ms = rng.lognormal(4.0, 0.5, num_requests)
    tpot_ms = rng.lognormal(3.0, 0.2, num_requests)
    e2el_ms = ttft_ms + tpot_ms * (output_tokens - 1)
    return pd.DataFrame(
        {
            "request_id": np.arange(num_requests, dtype=np.int64),
            "arrival_s": arrival_s,
            "admitted_s": arrival_s,
            "first_token_s": arrival_s + ttft_ms / 1e3,
            "finish_s": arrival_s + e2el_ms / 1e3,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "generated_tokens": output_tokens,
            "max_tokens": np.full(num_requests, 1024, dtype=np.int64),
            "preemptions": np.zeros(num_requests, dtype=np.int64),
            "prefix_hit_tokens": np.zeros(num_requests, dtype=np.int64),
            "rejected": np.zeros(num_requests, dtype=bool),
            "rejection_reason": [""] * num_requests,
            "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms,
            "itl_ms": tpot_ms,
            "e2el_ms": e2el_ms,
            "normalized_latency_s_per_token": e2el_ms / 1e3 / (prompt_tokens + output_tokens),
        }
    )


def _weighted_pct(steps: pd.DataFrame, part: str) -> float:
    return float(100.0 * np.average(steps[part] / steps["capacity"], weights=steps["duration_s"]))


def summary_for(
    requests: pd.DataFrame, steps: pd.DataFrame, *, allocator: str, scenario: dict, seed: int
) -> dict:
    """summary.json computed from the fabricated tables (the metric keys of the contract)."""
    duration_s = float(steps["time_s"].iloc[-1] + steps["duration_s"].iloc[-1])
    metrics: dict[str, float | int | None] = {
        "num_requests": len(requests),
        "completed": int((~requests["rejected"]).sum()),
        "rejected": int(requests["rejected"].sum()),
        "preemptions": int(requests["preemptions"].sum()),
        "duration_s": duration_s,
        "wall_s": 0.01,
        "request_throughput": len(requests) / duration_s,
        "output_throughput": float(requests["generated_tokens"].sum()) / duration_s,
        "total_token_throughput": float((requests["generated_tokens"] + requests["prompt_tokens"]).sum())
        / duration_s,
    }
    for column in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "normalized_latency_s_per_token"):
        values = requests[column].to_numpy()
        metrics[f"mean_{column}"] = float(values.mean())
        metrics[f"median_{column}"] = float(np.median(values))
        metrics[f"p90_{column}"] = float(np.percentile(values, 90))
        metrics[f"p99_{column}"] = float(np.percentile(values, 99))
    for part in PARTS:
        metrics[f"kv_{part}_pct"] = _weighted_pct(steps, part)
    metrics["kv_out_of_window_pct"] = 0.0  # issue 14's part: no sliding window in these fabricated runs
    # No prefix cache in these fabricated runs: nothing free holds reusable content (issue 20's split).
    metrics["kv_cached_pct"] = 0.0
    metrics["kv_empty_pct"] = metrics["kv_free_pct"]
    allocated = 100.0 - metrics["kv_free_pct"]
    metrics["kv_allocated_pct"] = allocated
    metrics["waste_pct"] = (
        0.0 if allocated <= 0 else 100.0 * (1.0 - metrics["kv_token_states_pct"] / allocated)
    )
    metrics.update(
        mean_concurrency=float(np.average(steps["num_running"], weights=steps["duration_s"])),
        max_concurrency=int(steps["num_running"].max()),
        mean_queue_length=float(np.average(steps["queue_length"], weights=steps["duration_s"])),
        max_queue_length=int(steps["queue_length"].max()),
        kv_capacity_tokens=int(steps["capacity"].iloc[0]),
        kv_bytes_per_token=819200,
        queue_growth=float(
            np.polyfit(steps["time_s"][len(steps) // 2 :], steps["queue_length"][len(steps) // 2 :], 1)[0]
        ),
    )
    return {
        "kvsim_version": "0.1.0",
        "versions": {"python": "3.11"},
        "scenario": scenario,
        "seed": seed,
        "allocator": allocator,
        "metrics": metrics,
    }


def write_fake_run(
    results_dir: Path,
    *,
    allocator: str = "paged",
    seed: int = 0,
    num_requests: int = 60,
    num_steps: int = 300,
    request_rate: float = 2.0,
    block_size: int = 16,
    max_model_len: int = 2048,
    capacity_tokens: int = 40_000,
    share_pct: dict[str, float] | None = None,
    queue_peak: int = 0,
    running_mean: float = 12.0,
) -> Path:
    """Write requests.parquet, steps.parquet and summary.json for one fabricated run; returns the folder."""
    rng = np.random.default_rng(seed)
    share_pct = share_pct or {"token_states": 60.0, "reservation": 5.0, "internal": 3.0, "external": 0.0}
    steps = fake_steps(
        rng,
        num_steps=num_steps,
        capacity_tokens=capacity_tokens,
        share_pct=share_pct,
        queue_peak=queue_peak,
        running_mean=running_mean,
    )
    requests = fake_requests(rng, num_requests=num_requests, request_rate=request_rate)
    scenario = {
        "name": "run",
        "model": "opt-13b",
        "gpu": "a100-40gb",
        "max_model_len": max_model_len,
        "block_size": block_size,
        "seed": seed,
        "num_prompts": num_requests,
        "allocator": {"name": allocator.split(":")[0], "params": {}},
        "workload": {"source": "sharegpt", "request_rate": request_rate},
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    requests.to_parquet(results_dir / "requests.parquet", index=False)
    steps.to_parquet(results_dir / "steps.parquet", index=False)
    summary = summary_for(requests, steps, allocator=allocator, scenario=scenario, seed=seed)
    (results_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return results_dir


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CORE_FIGURES = (
    "fig1_taxonomy.png",
    "fig2_taxonomy_over_time.png",
    "fig3_concurrency_queue.png",
    "fig4_latency_cdf.png",
)


class SummaryTableParser(HTMLParser):
    """Collects the rows of <table id="summary">: (label, [(metric, data-value, shown text)])."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, list[tuple[str, str, str]]]] = []
        self.images: list[str] = []
        self.external_refs: list[str] = []
        self._in_table = False
        self._in_body = False
        self._cell: dict[str, str] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        for key in ("src", "href"):
            if key in attributes and not attributes[key].startswith("data:"):
                self.external_refs.append(attributes[key])
        if tag == "img":
            self.images.append(attributes.get("src", ""))
        if tag == "table" and attributes.get("id") == "summary":
            self._in_table = True
        elif self._in_table and tag == "tbody":
            self._in_body = True
        elif self._in_body and tag == "tr":
            self.rows.append(("", []))
        elif self._in_body and tag == "td":
            self._cell, self._text = attributes, ""

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            label, cells = self.rows[-1]
            if "label" in self._cell.get("class", ""):
                self.rows[-1] = (self._text, cells)
            else:
                cells.append((self._cell["data-metric"], self._cell["data-value"], self._text))
            self._cell = None
        elif tag == "table" and self._in_table:
            self._in_table = self._in_body = False


def parse_html(path: Path) -> SummaryTableParser:
    parser = SummaryTableParser()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def markdown_summary_rows(path: Path) -> list[list[str]]:
    """Body rows of the first Markdown table (the summary), split into cells."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| allocator"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def assert_shown_equals(shown: str, value: float | int | None) -> None:
    """The displayed text is the value, rounded as displayed: within half a unit of its last digit."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        assert shown == "–"
        return
    # latencies carry their unit: "45.7 ms", "288 s", "3.2 h"
    number, _, unit = shown.replace(",", "").partition(" ")
    to_ms = {"": 1.0, "ms": 1.0, "s": 1e3, "h": 3.6e6}[unit]
    decimals = len(number.split(".")[1]) if "." in number else 0
    if "e" in number:
        assert float(number) * to_ms == pytest.approx(value, rel=1e-3)
    else:
        assert abs(float(number) * to_ms - value) <= (0.5 * 10.0**-decimals + 1e-12) * to_ms
