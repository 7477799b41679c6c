"""Prove that a refactor or speed-up kept every result: save the tables once, then compare exactly.

Why: a restructure (or an optimisation of the engine) must leave the requests and steps tables and
the summary metrics identical, not "close". This script runs a fixed set of scenarios through
`sim.compare` and either writes their outputs (`--save DIR`, run on the code *before* the change)
or compares them with what the current code produces (`--check DIR`): `requests` and `steps` with
`pandas.testing.assert_frame_equal(check_exact=True)`, and `summary.json`'s metrics and scenario
with `==`, apart from wall times.

The scenarios:
- `default`: the embedded default (`kvsim compare`), every default allocator, 400 requests;
- `stress`: chat-system-prompt with prefix caching, n=2 parallel samples, swap preemption and a
  cache small enough to preempt often (paged, request_limit:oracle:buddy, virtual);
- `v1-chunked-cached`: benchmarks/engine_v1.py's workload (vLLM v1, chunked prefill, prefix caching)
  at 1,500 requests; `sglang`: the stress case under `--engine sglang` with the radix allocator;
  `cpu-tier`: stress-v1 with a 1 GiB CPU KV tier (`--kv-offloading-size 1`);
- `bench20k`: the benchmark workload of benchmarks/engine.py (benchmarks/bench_workload.py) at 20k
  requests: Azure conversation lengths, Poisson 4 req/s, LLaMA-2-7B on an A100-80GB, paged/16,
  max_num_seqs 128. Skipped, with a note, when /work/shared/traces/azure_conv_2023/ is absent.

Run:
    .venv/bin/python benchmarks/results_identity.py --save /tmp/kvsim-before    # on the old code
    .venv/bin/python benchmarks/results_identity.py --check /tmp/kvsim-before   # on the new code
Exit status 0 when identical, 1 with the first difference otherwise. `--renamed workload.source`
accepts a scenario that differs only in that field (a preset renamed, its numbers kept), and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import sim  # noqa: E402  (after the sys.path fix above)
from benchmarks.bench_workload import AZURE_CONV, bench_scenario  # noqa: E402

WALL_KEYS = ("wall_s",)


def _default_scenario():  # returns sim.Scenario
    """The embedded default scenario, wherever the running layout keeps it."""
    try:
        from sim.scenario import default_scenario
    except ImportError:  # the flat layout before the restructure
        from sim.scenario.scenario import default_scenario  # type: ignore[no-redef]
    return default_scenario()


def scenarios() -> dict[str, tuple[object, list[str] | None]]:
    """Name -> (scenario, allocators or None for compare's defaults)."""
    base = _default_scenario()
    default = base.with_overrides(num_prompts=400)
    stress = base.with_overrides(
        name="stress",
        num_prompts=300,
        kv_cache_memory="2GiB",
        enable_prefix_caching=True,
        preemption_mode="swap",
        **{
            "workload.source": "chat-system-prompt",
            "workload.request_rate": 6.0,
            "workload.params": {"n": 2},
        },
    )
    # today's engine (mixed steps, chunked prefill with per-chunk allocation, prefix caching) and a
    # sliding-window model through the hybrid allocator
    default_v1 = default.with_overrides(name="default-v1", engine="vllm-v1")
    stress_v1 = stress.with_overrides(name="stress-v1", engine="vllm-v1", preemption_mode="recompute")
    window = base.with_overrides(
        name="window",
        model="Gemma-3-27B",
        gpu="H200-141GB",
        kv_cache_memory="4GiB",
        max_model_len=8192,
        num_prompts=150,
        engine="vllm-v1",
        enable_prefix_caching=False,  # the hybrid allocator does not model caching under windows yet
    )
    # issue 24's v1 workload (chunked prefill + prefix caching, every iteration a turn), shortened
    from benchmarks.engine_v1 import v1_scenario

    v1_cc = v1_scenario(1500).with_overrides(name="v1-chunked-cached")
    # the engines and tiers issue 22 added: SGLang with its radix cache, and vLLM v1 with a CPU KV tier
    sglang = stress.with_overrides(name="sglang", engine="sglang", preemption_mode="recompute")
    cpu_tier = stress_v1.with_overrides(name="cpu-tier", kv_offloading_size=1.0)
    found: dict[str, tuple[object, list[str] | None]] = {
        "default": (default, None),
        "stress": (stress, ["paged", "request_limit:oracle:buddy", "virtual"]),
        "default-v1": (default_v1, ["paged", "request_limit:oracle", "virtual"]),
        "stress-v1": (stress_v1, ["paged", "virtual"]),
        "window": (window, ["paged", "hybrid", "contiguous"]),
        "v1-chunked-cached": (v1_cc, ["paged"]),
        "sglang": (sglang, ["radix"]),
        "cpu-tier": (cpu_tier, ["paged"]),
    }
    bench = bench_scenario(20_000, require_trace=True)
    if bench is None:
        print(f"note: skipping bench20k, the Azure conversation trace is not at {AZURE_CONV}")
    else:
        found["bench20k"] = (bench, ["paged"])
    return found


def _runs(scenario: object, allocators: list[str] | None) -> dict[str, object]:
    if allocators is None:
        return sim.compare(scenario)
    return sim.compare(scenario, allocators=allocators)


def _comparable_summary(summary: dict) -> dict:
    """The parts of summary.json that must not change: scenario and metrics without wall times."""
    metrics = {k: v for k, v in summary["metrics"].items() if k not in WALL_KEYS}
    return {"scenario": summary["scenario"], "metrics": metrics, "allocator": summary.get("allocator")}


def save(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (scenario, allocators) in scenarios().items():
        for label, run in _runs(scenario, allocators).items():
            out = folder / name / label.replace(":", "_")
            out.mkdir(parents=True, exist_ok=True)
            run.requests.to_parquet(out / "requests.parquet")
            run.steps.to_parquet(out / "steps.parquet")
            (out / "summary.json").write_text(json.dumps(_comparable_summary(run.summary), sort_keys=True))
            print(f"saved {name}/{label}: {len(run.requests)} requests, {len(run.steps)} steps")


def check(
    folder: Path,
    renamed: tuple[str, ...] = (),
    corrected: tuple[str, ...] = (),
    new_metrics_ok: bool = False,
) -> int:
    """0 when tables and metrics are identical and the scenario differs only in the `renamed` keys.

    `corrected`: metrics whose definition a fix changed on purpose (issue 20: `waste_pct` no longer
    counts cached blocks); their differences are printed, before -> after, never hidden. With
    `new_metrics_ok`, metrics the saved run did not have yet are listed, not counted as differences.
    The requests and steps tables must be identical in every case.
    """
    for name, (scenario, allocators) in scenarios().items():
        for label, run in _runs(scenario, allocators).items():
            out = folder / name / label.replace(":", "_")
            if not out.is_dir():
                print(f"DIFFERENT {name}/{label}: not in the saved set {folder}")
                return 1
            try:
                pd.testing.assert_frame_equal(
                    run.requests, pd.read_parquet(out / "requests.parquet"), check_exact=True
                )
                pd.testing.assert_frame_equal(
                    run.steps, pd.read_parquet(out / "steps.parquet"), check_exact=True
                )
            except AssertionError as exc:
                print(f"DIFFERENT {name}/{label}: {str(exc).splitlines()[0]}")
                return 1
            saved = json.loads((out / "summary.json").read_text())
            now = json.loads(json.dumps(_comparable_summary(run.summary), sort_keys=True))
            changed = _changed_keys(saved["scenario"], now["scenario"])
            added = sorted(set(now["metrics"]) - set(saved["metrics"])) if new_metrics_ok else []
            fixed = [
                k for k in corrected if k in saved["metrics"] and now["metrics"].get(k) != saved["metrics"][k]
            ]
            ignored = set(added) | set(fixed)
            kept_now = {k: v for k, v in now["metrics"].items() if k not in ignored}
            kept_saved = {k: v for k, v in saved["metrics"].items() if k not in ignored}
            if kept_saved != kept_now or saved.get("allocator") != now.get("allocator"):
                keys = sorted(k for k in kept_now if kept_now[k] != kept_saved.get(k))
                print(f"DIFFERENT {name}/{label}: summary metrics differ ({keys[:5]})")
                return 1
            if set(changed) - set(renamed):
                print(f"DIFFERENT {name}/{label}: scenario fields differ: {changed}")
                return 1
            note = f" (scenario fields renamed as stated: {changed})" if changed else ""
            if added:
                note += f" (new metrics: {', '.join(added)})"
            for key in fixed:
                note += f" ({key} corrected: {saved['metrics'][key]:.4g} -> {now['metrics'][key]:.4g})"
            print(f"identical {name}/{label}: {len(run.requests)} requests, {len(run.steps)} steps{note}")
    return 0


def _changed_keys(saved: object, now: object, prefix: str = "") -> list[str]:
    """Dotted scenario keys whose values differ between two summaries."""
    if isinstance(saved, dict) and isinstance(now, dict):
        keys = sorted(set(saved) | set(now))
        return [k for key in keys for k in _changed_keys(saved.get(key), now.get(key), f"{prefix}{key}.")]
    return [] if saved == now else [prefix.rstrip(".")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", type=Path, help="write the current code's outputs here")
    group.add_argument("--check", type=Path, help="compare the current code's outputs with these")
    parser.add_argument(
        "--renamed",
        action="append",
        default=[],
        metavar="KEY",
        help="a scenario field (dotted) whose value a rename changed, e.g. workload.source when a preset "
        "was renamed; tables and metrics must still be identical (repeatable)",
    )
    parser.add_argument(
        "--corrected",
        action="append",
        default=[],
        metavar="METRIC",
        help="a summary metric whose definition a fix changed on purpose (e.g. waste_pct, issue 20); its "
        "differences are printed before -> after; tables must still be identical (repeatable)",
    )
    parser.add_argument(
        "--new-metrics-ok",
        action="store_true",
        help="list metrics the saved runs do not have yet instead of failing on them",
    )
    args = parser.parse_args()
    if args.save:
        save(args.save)
        return 0
    return check(args.check, tuple(args.renamed), tuple(args.corrected), args.new_metrics_ok)


if __name__ == "__main__":
    raise SystemExit(main())
