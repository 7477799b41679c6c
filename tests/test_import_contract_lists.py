"""The gpu import contract names every allocators module but `base` (its own comment asks for it).

Why a test: the list is kept by hand, and three modules (hybrid_caching, radix*) were added without
it, so `gpu` could have imported them unnoticed. This fails the day a new allocators module is
missing from the list.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_gpu_contract_forbids_every_allocators_module_but_base() -> None:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    contract = next(
        c for c in config["tool"]["importlinter"]["contracts"] if c["name"].startswith("gpu imports only")
    )
    modules = {
        f"allocators.{path.stem}"
        for path in (REPO_ROOT / "allocators").glob("*.py")
        if path.stem not in ("__init__", "base")
    }
    assert modules - set(contract["forbidden_modules"]) == set()
