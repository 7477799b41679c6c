"""The capacity plan as a rich table: key columns in 80 terminal columns, every column with `--wide`.

Why its own module: what a planner reads first (the answer, the latency it was confirmed at, the
GPUs) must fit a default terminal without truncating a single digit (issue 20 §4: `requ…`,
`1,033,4…`); the remaining evidence columns are one flag away.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

RATE_FLAGS = {
    "below_bracket": " (<)",
    "above_bracket": " (>=)",
    "at_ceiling": " (sat)",
    "unconfirmed": " (unconf.)",  # every long confirmation run failed: no rate is reported
}
# The run lists of a plan row (what `sims (seeds)` and the simulation count add up).
RUN_LISTS = ("max_concurrency_runs", "throughput_runs", "max_rate_runs", "confirmation_runs")


def row_key(row: dict[str, Any]) -> str:
    """'paged 2048/TP1': how a row is named in captions and messages."""
    return f"{row['allocator']} {row['max_model_len']}/TP{row['tensor_parallel_size']}"


def _number(value: Any, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _rate(row: dict[str, Any]) -> str:
    rate = row.get("max_rate_req_s")
    return "—" if rate is None else f"{rate:.3g}" + RATE_FLAGS.get(row.get("rate_status") or "", "")


def _gpus(row: dict[str, Any]) -> str:
    gpus = row.get("gpus_needed")
    return "—" if gpus is None else ("∞" if gpus < 0 else str(gpus))


def _peak(row: dict[str, Any]) -> str:
    return f"{row['max_concurrency']:,}" + ("+" if row.get("concurrency_limited_by") == "num_prompts" else "")


def _sims(row: dict[str, Any]) -> str:
    runs = [run for key in RUN_LISTS for run in row.get(key, [])]
    seeds = sorted({run["seed"] for run in runs})
    return f"{len(runs)} ({', '.join(map(str, seeds))})"


# (header, cell, shown without --wide)
COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str], bool], ...] = (
    ("allocator", lambda row: str(row["allocator"]), True),
    ("max len", lambda row: str(row["max_model_len"]), True),
    ("TP", lambda row: str(row["tensor_parallel_size"]), True),
    ("KV tokens", lambda row: f"{row['kv_capacity_tokens']:,}", False),
    ("vLLM max conc.", lambda row: f"{row['vllm_max_concurrency_x']:.2f}x", False),
    ("conc. peak", _peak, False),
    ("conc.", lambda row: f"{row['sustained_concurrency']:,.1f}", True),
    ("sat. req/s", lambda row: _number(row.get("saturation_throughput_req_s"), ".3g"), False),
    ("max rate req/s", _rate, True),
    ("p99 TTFT ms", lambda row: _number(row.get("confirmation_p99_ttft_ms"), ",.0f"), True),
    ("p99 TPOT ms", lambda row: _number(row.get("confirmation_p99_tpot_ms"), ",.1f"), True),
    ("probe prompts", lambda row: _number(row.get("probe_prompts"), ","), False),
    ("confirm prompts", lambda row: _number(row.get("confirmation_num_prompts"), ","), False),
    ("GPUs", _gpus, True),
    ("sims (seeds)", _sims, False),
)


def shown_columns(wide: bool) -> list[tuple[str, Callable[[dict[str, Any]], str], bool]]:
    return [column for column in COLUMNS if wide or column[2]]


def needed_width(rows: list[dict[str, Any]], *, wide: bool = False) -> int:
    """Characters the table needs so that no cell is cut (headers wrap at spaces), as rich measures it.

    Why: rich squeezes or crops a table wider than its console; the CLI widens the console to this
    instead, so a figure too long for 80 columns is wrapped by the terminal, never cut.
    """
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(width=100_000, file=io.StringIO())
    table = plan_table(rows, "", "", wide=wide)
    return Measurement.get(console, console.options, table).maximum


def plan_table(rows: list[dict[str, Any]], title: str, caption: str, *, wide: bool = False) -> Any:
    """A rich Table of the rows; each column is at least as wide as its widest cell, so no number
    is cut: without `wide` only the key columns are shown, which fit 80 columns for every allocator
    name and any realistic figure (headers wrap instead)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    shown = shown_columns(wide)
    cells = [[cell(row) for _, cell, _ in shown] for row in rows]
    table = Table(
        title=title,
        title_justify="left",
        caption=Text(caption),  # Text: brackets are not rich markup
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    for index, (header, _, _) in enumerate(shown):
        longest_word = max(len(word) for word in header.split())
        table.add_column(
            header,
            justify="left" if index == 0 else "right",
            width=max([longest_word, *(len(values[index]) for values in cells)]),
            overflow="fold",
        )
    for values in cells:
        table.add_row(*values)
    return table
