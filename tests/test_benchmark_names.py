"""No benchmark script is named like a package it imports, so plain `python benchmarks/X.py` works.

Why: running a script puts its folder first on `sys.path`, so `benchmarks/workloads.py` once
shadowed the `workloads` package (issue 22 §1): `import workloads` found the script. A name check
catches the next one before anyone runs it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO_ROOT / "benchmarks"
PROJECT_PACKAGES = frozenset({"sim", "allocators", "workloads", "gpu"})  # pyproject's packages


def imported_top_names(script: Path) -> set[str]:
    """Top-level module names a script imports (absolute imports only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(script.read_text(), filename=str(script))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_benchmark_script_shadows_an_imported_package() -> None:
    scripts = sorted(BENCHMARKS.glob("*.py"))
    imported = PROJECT_PACKAGES.union(*(imported_top_names(script) for script in scripts))
    shadowing = sorted(script.name for script in scripts if script.stem in imported)
    assert shadowing == [], f"rename these benchmark scripts, they shadow packages: {shadowing}"


def test_allocator_speed_runs_without_dash_p() -> None:
    """The renamed allocator benchmark starts as a plain script (its --help needs the real package)."""
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "allocator_speed.py"), "--help"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
