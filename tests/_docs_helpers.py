"""Loading the scripts of docs/ (doc_commands.py, generate.py) in tests: docs/ is not a package.

Why a helper: the docs tests read the commands and regions through the same code `make docs` uses.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS_DIR = REPO_ROOT / "docs"


def load_docs_module(name: str) -> ModuleType:
    """docs/<name>.py as a module (registered, so that its dataclasses and imports resolve)."""
    if str(DOCS_DIR) not in sys.path:
        sys.path.insert(0, str(DOCS_DIR))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DOCS_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def makefile_variable(name: str) -> list[str]:
    """The words of the Makefile's variable `name` as make expands it (a rule added with --eval)."""
    show = f"print-variable: ; @echo $({name})"
    return subprocess.run(
        ["make", "-s", "--no-print-directory", f"--eval={show}", "print-variable"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
