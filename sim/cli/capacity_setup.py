"""What `kvsim capacity` settles before planning: the SLO, the base scenario (TP and engine), progress.

Why its own module: the capacity command's flags differ from `run`'s in three ways that each need a
rule: `--slo none` asks for the saturation rate; `--tensor-parallel-size` is a list, and the base
scenario must be one that fits (a 70B model does not fit one GPU, so TP 1 cannot be the base); and a
model or GPU other than the paper's is planned on today's engine (vllm-v1) unless `--engine` says
otherwise, because a plan for a Llama-3 on an H100 on the 2023 paper's engine would mislead.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from sim.cli.scenario_flags import scenario_from_flags

MODERN_ENGINE = "vllm-v1"


def slo_from_flags(
    slo: str | None, ttft_p99: str | None, tpot_p99: str | None, normalized_latency: str | None
) -> Any:
    """The Slo the flags ask for, or None for `--slo none` (the saturation rate)."""
    from sim.errors import CapacityError
    from sim.planning.slo import Slo
    from sim.scenario.units import parse_duration_s

    bounds = (ttft_p99, tpot_p99, normalized_latency)
    if slo is not None:
        if slo.strip().lower() != "none":
            raise CapacityError(
                f"--slo: only 'none' is accepted (got {slo!r}); bounds are --slo-ttft-p99, --slo-tpot-p99, "
                "--slo-normalized-latency"
            )
        if any(bound is not None for bound in bounds):
            raise CapacityError("--slo none: give either --slo none or latency bounds, not both")
        return None
    if all(bound is None for bound in bounds):
        raise CapacityError(
            "give an SLO: --slo-ttft-p99 and/or --slo-tpot-p99, or --slo-normalized-latency "
            "(or --slo none for the saturation rate)"
        )
    return Slo(
        ttft_p99_s=None if ttft_p99 is None else parse_duration_s(ttft_p99, field="--slo-ttft-p99"),
        tpot_p99_s=None if tpot_p99 is None else parse_duration_s(tpot_p99, field="--slo-tpot-p99"),
        normalized_latency_s_per_token=(
            None
            if normalized_latency is None
            else parse_duration_s(normalized_latency, field="--slo-normalized-latency")
        ),
    )


def _engine_given(flags: dict[str, Any]) -> bool:
    """Whether the user chose the engine: --engine, --set engine=..., or `engine` in --config."""
    if flags.get("engine") is not None:
        return True
    if any(pair.partition("=")[0].strip() == "engine" for pair in flags.get("set_pairs") or []):
        return True
    config = flags.get("config")
    if config is not None:
        from sim.scenario.scenario import Scenario

        return "engine" in Scenario.from_toml(config).model_fields_set
    return False


def _build(flags: dict[str, Any], tp_sizes: list[int] | None) -> Any:
    """The base scenario at the first TP size (in the order given) whose scenario can be built."""
    if not tp_sizes:
        return scenario_from_flags(flags, name="capacity")
    first_error: Exception | None = None
    for tp in tp_sizes:
        try:
            return scenario_from_flags({**flags, "tensor_parallel_size": tp}, name="capacity")
        except ValueError as exc:  # ScenarioError: e.g. the weights do not fit at this TP
            first_error = first_error or exc
    assert first_error is not None
    raise first_error


def capacity_base_scenario(flags: dict[str, Any], tp_sizes: list[int] | None) -> tuple[Any, list[str]]:
    """(base scenario, lines to print): the TP and engine decisions, each said in one line."""
    from sim.scenario.scenario import default_scenario

    base = _build(flags, tp_sizes)
    notes: list[str] = []
    paper = default_scenario()
    if not _engine_given(flags) and (base.model != paper.model or base.gpu != paper.gpu):
        base = _build({**flags, "engine": MODERN_ENGINE}, tp_sizes)
        notes.append(
            f"engine: {MODERN_ENGINE} (today's vLLM) for {base.model} on {base.gpu}: the default vllm-v0 "
            f"models the vLLM paper's engine, for its {paper.model} on {paper.gpu}; --engine vllm-v0 for it"
        )
    if tp_sizes and int(base.tensor_parallel_size) != int(tp_sizes[0]):
        notes.append(
            f"base scenario at TP {base.tensor_parallel_size}: the first --tensor-parallel-size that fits; "
            "rows that do not fit are listed as skipped"
        )
    return base, notes


class CapacityProgress:
    """A rich progress display on stderr: rows done of all rows, and simulations done so far.

    A context manager whose instance is the `progress` callback of `sim.planning.capacity.capacity`
    and whose `tally_path` (a temporary file every simulation appends a byte to, removed on exit)
    counts simulations while rows still run in worker processes. Silent when disabled or when stderr
    is not a terminal (a log file gets no bar lines).
    """

    def __init__(self, enabled: bool) -> None:
        import sys

        self._enabled = enabled and sys.stderr.isatty()
        self._bar: Any = None
        self._task: Any = None
        self.tally_path: str | None = None
        self._finished_rows_simulations = 0

    def simulations(self) -> int:
        """Simulations done: the tally's count, or (remote Dask workers cannot write it) at least
        those of the finished rows."""
        import os

        try:
            tallied = os.path.getsize(self.tally_path) if self.tally_path else 0
        except OSError:
            tallied = 0
        return max(tallied, self._finished_rows_simulations)

    def __enter__(self) -> CapacityProgress:
        if self._enabled:
            import os
            import tempfile

            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            handle, self.tally_path = tempfile.mkstemp(prefix="kvsim-capacity-", suffix=".tally")
            os.close(handle)
            self._bar = Progress(
                TextColumn("[bold]capacity rows"),
                BarColumn(),
                MofNCompleteColumn(),
                _simulations_column(self),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._task = self._bar.add_task("rows", total=None)
            self._bar.start()
        return self

    def __call__(self, rows_done: int, rows_total: int, simulations: int) -> None:
        self._finished_rows_simulations = simulations
        if self._bar is not None:
            self._bar.update(self._task, completed=rows_done, total=rows_total)

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self.tally_path is not None:
            import os

            try:
                os.unlink(self.tally_path)
            except OSError:
                pass
            self.tally_path = None


def _simulations_column(display: CapacityProgress) -> Any:
    from rich.progress import ProgressColumn
    from rich.text import Text

    class SimulationsColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"· {display.simulations():,} simulations done")

    return SimulationsColumn()
