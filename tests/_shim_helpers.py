"""Load one of kvsim's modules as plain Python with `import cython` failing.

Why: the compiled core's modules import Cython's pure-Python `cython` module where it is installed and
`allocators/cython_shim.py` where it is not. Tests that check the no-Cython path execute the module's
source again under another name with the import blocked, so the shim stands in; the module already
loaded (compiled where the core is built) is left as it is.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_with_shim(relative_path: str, module_name: str) -> ModuleType:
    """The module at `relative_path` (from the repository root) executed as `module_name`, shim in."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / relative_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("cython")
    sys.modules["cython"] = None  # type: ignore[assignment]  # makes `import cython` raise ImportError
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["cython"]
        else:
            sys.modules["cython"] = saved
    assert module.cython.__name__ == "allocators.cython_shim"
    return module
