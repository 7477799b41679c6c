"""Shared pytest set-up: hypothesis profiles and the shared-traces location.

Profiles: `dev` (default, quick), `ci` (300 examples per state machine, what CI runs) and `long`
(10,000 examples, run by hand: HYPOTHESIS_PROFILE=long make test).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=50, **_COMMON)
settings.register_profile("ci", max_examples=300, **_COMMON)
settings.register_profile("long", max_examples=10_000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

REPO_ROOT = Path(__file__).resolve().parents[1]
TRACES_DIR = REPO_ROOT.parent / "shared" / "traces"


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The shared real traces (read in place, never copied); skips the test when absent."""
    if not TRACES_DIR.is_dir():
        pytest.skip(f"shared traces not found at {TRACES_DIR}")
    return TRACES_DIR


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked `gpu` unless a CUDA device is usable."""
    try:
        from gpu.backend import has_gpu
    except Exception:  # gpu/ not importable: no device path either

        def has_gpu() -> bool:
            return False

    if has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA device (CuPy absent or cupy.is_available() is False)")
    for item in items:
        # the marker, not `"gpu" in item.keywords`: keywords also hold folder names (tests/gpu/)
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
