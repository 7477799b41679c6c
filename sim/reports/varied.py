"""What varies across the runs of a report: their order, their labels and figure 5's lines.

Why one module: a sweep's report names each run by every scenario field the sweep varied, lists the
runs in the order of those values, and draws figure 5 with one line per combination of everything
but the x axis; all three read the same list of varied fields, so a label, a table row and a curve
always agree. Before issue 20 the label showed the first two differing fields alphabetically (a
varied `workload.request_rate` was left out), rows came in cell-hash order, and figure 5 joined the
runs of different models into one saw-tooth line per allocator.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from sim.reports.types import LoadedRun

# Fields that tell runs apart without describing what was simulated.
NOT_VARIED: frozenset[str] = frozenset({"name"})
# The allocator is always shown by its name (allocator_name), never as allocator.* fields.
ALLOCATOR_PREFIX = "allocator"


def allocator_name(summary: Mapping[str, Any]) -> str:
    """The allocator as summary.json names it (a string, or {name, params} rendered as name:k=v)."""
    allocator = summary["allocator"]
    if isinstance(allocator, Mapping):
        params = allocator.get("params") or {}
        suffix = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
        return f"{allocator.get('name', '?')}:{suffix}" if suffix else str(allocator.get("name", "?"))
    return str(allocator)


def scenario_leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """Scenario dict -> {dotted.key: value} over its leaves (lists stay whole: one value)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(scenario_leaves(sub, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def _comparable(value: Any) -> tuple[int, float, str]:
    """A sort key that orders numbers by value and puts them before text (None first of all)."""
    if value is None:
        return (0, 0.0, "")
    if isinstance(value, bool):
        return (1, float(value), "")
    if isinstance(value, int | float):
        return (1, float(value) if not math.isnan(value) else math.inf, "")
    return (2, 0.0, json.dumps(value, sort_keys=True) if not isinstance(value, str) else value)


def _differing(leaves: Sequence[Mapping[str, Any]]) -> list[str]:
    keys = sorted(set().union(*leaves)) if leaves else []
    return [
        key
        for key in keys
        if key not in NOT_VARIED
        and key.split(".", 1)[0] != ALLOCATOR_PREFIX
        and len({json.dumps(leaf.get(key), sort_keys=True) for leaf in leaves}) > 1
    ]


def _groups(runs: Sequence[LoadedRun]) -> dict[str, list[int]]:
    """Run indices per allocator name, in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for index, run in enumerate(runs):
        groups.setdefault(allocator_name(run.summary), []).append(index)
    return groups


def group_fields(runs: Sequence[LoadedRun]) -> list[list[str]]:
    """Per run: the scenario fields (other than the allocator's) that differ among the runs sharing
    its allocator. Empty for a run whose allocator no other run has (a `kvsim compare`): the
    allocator alone tells it apart, whatever else differs (e.g. a seed per allocator)."""
    leaves = [scenario_leaves(run.summary.get("scenario", {})) for run in runs]
    fields: list[list[str]] = [[] for _ in runs]
    for members in _groups(runs).values():
        differing = _differing([leaves[i] for i in members]) if len(members) > 1 else []
        for i in members:
            fields[i] = differing
    return fields


def varied_fields(runs: Sequence[LoadedRun]) -> list[str]:
    """Every field that varies among runs of one allocator (a sweep's axes), sorted."""
    return sorted(set().union(*group_fields(runs))) if runs else []


def order_runs(runs: Sequence[LoadedRun]) -> list[LoadedRun]:
    """Allocators in order of first appearance; each allocator's runs by their varied fields' values
    (numbers numerically), so a sweep's rows read 1, 2, 4 req/s rather than in cell-hash order."""
    fields = group_fields(runs)
    ordered: list[LoadedRun] = []
    for members in _groups(runs).values():

        def key(i: int) -> tuple[Any, ...]:
            leaves = scenario_leaves(runs[i].summary.get("scenario", {}))
            return tuple(_comparable(leaves.get(field)) for field in fields[i])

        ordered.extend(runs[i] for i in sorted(members, key=key))
    return ordered


def _short_names(fields: Sequence[str]) -> dict[str, str]:
    """Each field by its last dotted part, or whole where two fields share that part."""
    last = Counter(field.rsplit(".", 1)[-1] for field in fields)
    return {
        field: field if last[field.rsplit(".", 1)[-1]] > 1 else field.rsplit(".", 1)[-1] for field in fields
    }


def _shown(value: Any) -> str:
    if isinstance(value, Mapping):
        return str(value.get("name", json.dumps(value, sort_keys=True)))
    return str(value)  # 1.0 stays "1.0": the value as summary.json and the spec write it


def describe(run: LoadedRun, fields: Sequence[str], names: Mapping[str, str] | None = None) -> str:
    """'request_rate=2, model=LLaMA-2-7B': the run's values of `fields` ('' for none)."""
    names = names or _short_names(fields)
    leaves = scenario_leaves(run.summary.get("scenario", {}))
    return ", ".join(f"{names[field]}={_shown(leaves.get(field))}" for field in fields)


def run_labels(runs: Sequence[LoadedRun]) -> list[str]:
    """One unique label per run: the allocator name plus every field varied among that allocator's
    runs (`paged (model=LLaMA-2-7B, request_rate=2)`); a run whose allocator is unique is its name.

    Runs that still share a label (same allocator and scenario) are told apart by folder name, then
    by position (`#2`).
    """
    labels = []
    for run, fields in zip(runs, group_fields(runs), strict=True):
        detail = describe(run, fields)
        labels.append(f"{allocator_name(run.summary)} ({detail})" if detail else allocator_name(run.summary))
    counts = Counter(labels)
    labels = [
        f"{label} ({run.path.name})" if counts[label] > 1 else label
        for label, run in zip(labels, runs, strict=True)
    ]
    counts, seen = Counter(labels), Counter[str]()
    for i, label in enumerate(labels):
        if counts[label] > 1:
            seen[label] += 1
            labels[i] = f"{label} #{seen[label]}"
    return labels


def line_labels(runs: Sequence[LoadedRun], x_fields: frozenset[str]) -> list[str]:
    """Figure 5's line of each run: its allocator and every field varied among that allocator's
    runs except the x axis's (a sweep over models and rates: one rate curve per model)."""
    out = []
    for run, fields in zip(runs, group_fields(runs), strict=True):
        detail = describe(run, [field for field in fields if field not in x_fields])
        name = allocator_name(run.summary)
        out.append(f"{name} ({detail})" if detail else name)
    return out
