"""benchmarks/sweep.py gates on its target: exit 1 when 2 jobs are not >= 1.6x faster on >= 2 cores."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_sweep", REPO_ROOT / "benchmarks" / "sweep.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_verdict_fails_below_target_only_with_two_cores(bench: ModuleType) -> None:
    ok, line = bench.speedup_verdict(10.0, 10.0 / 1.2, cores=4)
    assert not ok and "1.20x" in line and "FAILED on 4 usable cores" in line
    ok, line = bench.speedup_verdict(10.0, 10.0 / 1.7, cores=2)
    assert ok and line.endswith(": ok")
    ok, line = bench.speedup_verdict(10.0, 10.0, cores=1)  # nothing to gain on one core: reported only
    assert ok and "not judged, only 1 usable core" in line


@pytest.mark.parametrize(("two_jobs_s", "code"), [(8.0, 1), (5.5, 0)])
def test_main_exits_non_zero_when_the_speed_up_misses_the_target(
    bench: ModuleType,
    two_jobs_s: float,
    code: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = pd.DataFrame({"cell_id": ["a"], "status": ["ok"], "cell_wall_s": [1.0], "p99_ttft_ms": [3.0]})

    def fake_timed(label: str, root: Path, num_prompts: int, **kwargs: object) -> tuple[float, pd.DataFrame]:
        return (10.0 if kwargs.get("jobs") == 1 else two_jobs_s), table.copy()

    monkeypatch.setattr(bench, "timed", fake_timed)
    monkeypatch.setattr(bench, "usable_cores", lambda: 2)
    assert bench.main(["--num-prompts", "10", "--skip-dask"]) == code
    out = capsys.readouterr().out
    assert ("FAILED on 2 usable cores" in out) == (code == 1)
    assert f"speed-up with 2 jobs: {10.0 / two_jobs_s:.2f}x (target >= 1.6x)" in out
