"""Money from a capacity plan: what KV memory does to the price of a token (issue 14).

Why here and not in the planner: the planner measures rates; turning them into dollars is one
multiplication per figure, but the figures must say exactly what they assume. Every number is per
row of the plan (allocator, max_model_len, TP), at the max sustainable rate under the SLO:

- USD per million output tokens = price per GPU-hour x TP / 3600 / (max rate x output tokens per
  request) x 10^6, with output tokens per request measured in the run at the max rate;
- USD per thousand requests = price per GPU-hour x TP / 3600 / max rate x 1000;
- USD per month for `--target-rate` = GPUs needed x price per GPU-hour x 730 (hours per month,
  8760 / 12).

There is no built-in price: `--gpu-hour-cost` is the user's (docs/capacity.md cites an example).
"""

from __future__ import annotations

import math
from typing import Any

from sim.errors import KvsimError

HOURS_PER_MONTH = 8760 / 12  # 730


# Highest accepted price: 1,000 times an on-demand H100 (about 10 USD per GPU-hour, docs/capacity.md's
# example); `--gpu-hour-cost 1e308` printed a 300-digit dollar figure (issue 23).
MAX_GPU_HOUR_COST_USD = 10_000.0


def check_gpu_hour_cost(value: float | None) -> float | None:
    """None, or a price in (0, MAX_GPU_HOUR_COST_USD] USD per GPU-hour; KvsimError naming the flag."""
    if value is None:
        return None
    if not (isinstance(value, int | float) and math.isfinite(value) and 0 < value <= MAX_GPU_HOUR_COST_USD):
        raise KvsimError(
            f"argument 'gpu_hour_cost': must be a finite number > 0 and at most {MAX_GPU_HOUR_COST_USD:,.0f} "
            f"USD per GPU-hour (got {value!r})"
        )
    return float(value)


def output_tokens_per_request(row: dict[str, Any]) -> float | None:
    """Mean output tokens per completed request in the run at the row's max rate (its confirmation)."""
    rate = row.get("max_rate_req_s")
    runs = [*(row.get("max_rate_runs") or []), *(row.get("confirmation_runs") or [])]
    for record in reversed(runs):
        if record.get("request_rate") == rate and record.get("request_throughput"):
            return float(record["output_throughput"]) / float(record["request_throughput"])
    return None


def row_costs(row: dict[str, Any], gpu_hour_cost: float) -> dict[str, float | None]:
    """The row's USD figures (None where the plan has no max rate, or no GPU count for the target)."""
    rate = row.get("max_rate_req_s") or 0.0
    usd_per_s = gpu_hour_cost * int(row["tensor_parallel_size"]) / 3600.0
    tokens = output_tokens_per_request(row)
    per_million = usd_per_s / (rate * tokens) * 1e6 if rate > 0 and tokens else None
    per_thousand = usd_per_s / rate * 1000 if rate > 0 else None
    gpus = row.get("gpus_needed")
    monthly = gpus * gpu_hour_cost * HOURS_PER_MONTH if gpus is not None and gpus >= 0 else None
    return {
        "usd_per_million_output_tokens": per_million,
        "usd_per_thousand_requests": per_thousand,
        "usd_per_month_at_target": monthly,
    }


def add_costs(rows: list[dict[str, Any]], gpu_hour_cost: float | None) -> None:
    """Write each row's USD figures into it (nothing when no price is given)."""
    if gpu_hour_cost is None:
        return
    for row in rows:
        row.update(row_costs(row, gpu_hour_cost))


def cost_lines(
    rows: list[dict[str, Any]], gpu_hour_cost: float | None, target_rate: float | None
) -> list[str]:
    """One line per row: `paged 32768/TP1: $0.412 per 1M output tokens, $0.123 per 1k requests, ...`."""
    if gpu_hour_cost is None:
        return []
    lines = []
    for row in rows:
        costs = row_costs(row, gpu_hour_cost)
        where = f"{row['allocator']} {row['max_model_len']}/TP{row['tensor_parallel_size']}"
        if costs["usd_per_million_output_tokens"] is None:
            lines.append(f"{where}: no sustainable rate under the SLO, no cost per token")
            continue
        text = (
            f"{where}: ${costs['usd_per_million_output_tokens']:.3f} per 1M output tokens, "
            f"${costs['usd_per_thousand_requests']:.3f} per 1k requests "
            f"at {row['max_rate_req_s']:.3g} req/s (${gpu_hour_cost:g}/GPU-hour)"
        )
        if target_rate is not None and costs["usd_per_month_at_target"] is not None:
            text += (
                f"; ${costs['usd_per_month_at_target']:,.0f}/month for {target_rate:g} req/s "
                f"({row['gpus_needed']} GPUs)"
            )
        lines.append(text)
    return lines
