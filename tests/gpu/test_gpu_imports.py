"""gpu/ must run on the bare device machine: Python 3.12, NumPy, CuPy, and nothing else (issue 15).

Two guards: a static one over every `import` in gpu/*.py (function-level ones included), and a dynamic
one that imports the device path in a fresh interpreter and lists what got loaded.
"""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys
from pathlib import Path

from gpu.profile import write_text_atomic

REPO = Path(__file__).resolve().parents[2]
THIRD_PARTY = {"numpy", "cupy"}
PROJECT_ALLOWED = {"gpu", "allocators.base"}  # allocators.base: only for the type of a snapshot
DEVICE_PATH = (
    "gpu.device_run", "gpu.calibrate", "gpu.linear", "gpu.check", "gpu.timing", "gpu.replicas", "gpu.replay",
    "gpu.profile",
)  # fmt: skip


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_gpu_imports_only_numpy_cupy_the_stdlib_and_itself() -> None:
    bad = {}
    for path in sorted((REPO / "gpu").glob("*.py")):
        for name in _imports(path):
            root = name.split(".")[0]
            if root in sys.stdlib_module_names or root in THIRD_PARTY or root == "__future__":
                continue
            if root == "gpu" or name in PROJECT_ALLOWED:
                continue
            bad.setdefault(path.name, []).append(name)
    assert not bad, f"gpu/ must not import these (device machine: numpy, cupy, stdlib only): {bad}"


def test_the_device_path_loads_nothing_beyond_numpy_and_the_stdlib() -> None:
    code = (
        "import sys\n"
        f"for m in {DEVICE_PATH!r}: __import__(m)\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    loaded = set(proc.stdout.split())
    extra = {m for m in loaded - sys.stdlib_module_names - THIRD_PARTY - {"gpu"} if not m.startswith("_")}
    assert not extra, f"the device path imported {sorted(extra)}"


def test_written_files_are_0644_not_mkstemps_0600(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "profile.json", "{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "profile.json").stat().st_mode) == 0o644
