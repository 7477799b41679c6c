"""What the report layer reads: a run's two tables and its summary (`RunLike`), and one loaded folder.

Why its own module: figures and the diagnosis take any `RunLike` (a `sim.Run` in a notebook, or a
folder loaded by the report), so they import this and nothing else of the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd


class RunLike(Protocol):
    """What figures and diagnosis read from a run: its two tables and its summary dict."""

    @property
    def requests(self) -> pd.DataFrame: ...

    @property
    def steps(self) -> pd.DataFrame: ...

    @property
    def summary(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LoadedRun:
    """One validated results folder: the columns the report needs and summary.json."""

    path: Path
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
