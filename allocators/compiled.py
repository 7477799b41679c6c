"""Which code runs the hot loop: the Cython-compiled extensions or the plain .py sources they come from.

Why: the engine's per-step work (scheduler, allocator growth, the jump integral, the step recorder) is
interpreter overhead on small objects, and compiling the same .py files with Cython removes much of it
(issue 24). There is one source of truth, the .py file; `setup.py` compiles the modules listed in
`COMPILED_MODULES` next to their sources and records each source's sha256 in `MANIFEST_NAME`.

This module installs a `sys.meta_path` finder (on import; `allocators/__init__.py` and `sim/__init__.py`
import it before anything else, so before any listed module is found) that, for each listed module,
loads the extension only when it exists, `KVSIM_PURE` is not `1`, and it was built from the source as it
is now (same sha256). Otherwise the .py runs: a stale extension never silently runs old code, and a
machine without a compiler runs the pure path, with identical results (tests/test_compiled_core.py).

Only the standard library here: `gpu/` imports `allocators.base` on a bare device machine.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

# The hot loop, compiled by setup.py (which reads this tuple with `ast`, without importing the package).
# Measured per module in docs/compiled_core.md; a module leaves the list when compiling it breaks a test or
# gains nothing.
COMPILED_MODULES: tuple[str, ...] = (
    "allocators.block_pool",
    "allocators.paged",
    "allocators.jump_integral",
    "allocators.prefix_keys",
    "allocators.seq_kernels",
    "allocators.radix_tree",
    "allocators.radix",
    "sim.core.engine",
    "sim.core.scheduler",
    "sim.core.metrics",
    "sim.core.policy",
    "sim.engines.sglang",
    "sim.cost.model",
)

# Cython's shared utility module (Cython >= 3.1): the code every compiled module would otherwise carry its
# own copy of (typed memoryviews, the cyfunction type, ...), built once by setup.py as its own extension.
# Each listed extension imports it, so none of them is loaded unless it is the very file the same build
# recorded (docs/compiled_core.md "Build time").
SHARED_MODULE = "allocators._cyutility"

_PACKAGES = frozenset({"allocators", "sim"})  # the packages whose modules may be compiled
MANIFEST_NAME = "_compiled_core.json"  # written by setup.py next to this file
PURE_ENV = "KVSIM_PURE"  # KVSIM_PURE=1: run the .py sources even where extensions are built
REBUILD_HINT = "run `make venv` or `pip install -e .`"


def source_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes (a source or a built extension): what setup.py records and the
    finder compares."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _repo_root() -> Path:
    """The folder that holds the `allocators` and `sim` packages (this file is allocators/compiled.py)."""
    return Path(__file__).resolve().parents[1]


def _module_files(name: str, root: Path | None = None) -> tuple[Path, Path | None]:
    """A listed module's .py source and its built extension (None when there is none)."""
    base = (_repo_root() if root is None else root).joinpath(*name.split("."))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = base.with_name(base.name + suffix)
        if candidate.is_file():
            return base.with_suffix(".py"), candidate
    return base.with_suffix(".py"), None


def read_manifest(root: Path | None = None) -> dict:
    """The build record ({} when the core was never built or the record is unreadable)."""
    root = _repo_root() if root is None else root
    try:
        manifest = json.loads((root / "allocators" / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _is_recorded_extension(extension: Path, entry: Mapping[str, object]) -> bool:
    """Whether `extension` is the very file the build recorded (name and sha256).

    Why both: two interpreters sharing a checkout (a 3.11 and a 3.12 venv) each build their own
    `paged.cpython-3XX-....so`; after an edit and a rebuild under one of them, the record matches the
    edited source while the other interpreter's extension still holds the old code. The name ties the
    record to one interpreter's file, the hash to one build of it (~10 ms for all, once per process).
    """
    return entry.get("extension") == extension.name and entry.get("extension_sha256") == source_sha256(
        extension
    )


def _shared_extension(root: Path, recorded: Mapping[str, object]) -> Path | None:
    """The shared utility module's extension when it is the file the build recorded, else None.

    It has no .py source: the record's name and sha256 of the extension are what ties it to the build
    that compiled the listed modules against it (same Cython, same directives).
    """
    _, extension = _module_files(SHARED_MODULE, root)
    entry = recorded.get(SHARED_MODULE)
    if extension is None or not isinstance(entry, dict) or not _is_recorded_extension(extension, entry):
        return None
    return extension


class CoreState:
    """Which listed modules load compiled, and why the others do not: decided once per process.

    Why once: a module's path must not change between imports in one process (the extension and the
    source define distinct classes), and hashing the sources costs ~1 ms, not to be paid per import.
    """

    def __init__(
        self, environ: Mapping[str, str] | None = None, root: Path | None = None, manifest: dict | None = None
    ) -> None:
        """`environ`, `root` (the folder holding allocators/ and sim/) and `manifest`: tests set them."""
        environ = os.environ if environ is None else environ
        self.root = _repo_root() if root is None else root
        manifest = read_manifest(self.root) if manifest is None else manifest
        recorded = manifest.get("modules", {}) if isinstance(manifest.get("modules"), dict) else {}
        self.cython_version: str = str(manifest.get("cython", "?"))
        self.pure_forced: bool = environ.get(PURE_ENV, "") == "1"
        self.compiled: dict[str, Path] = {}  # module -> extension file to load
        self.not_built: list[str] = []  # no extension, or built without a record (compile failed)
        self.stale: list[str] = []  # an extension built from another version of the source
        self.shared: Path | None = _shared_extension(self.root, recorded)
        for name in COMPILED_MODULES:
            source, extension = _module_files(name, self.root)
            entry = recorded.get(name)
            if extension is None or not isinstance(entry, dict):
                self.not_built.append(name)
            elif not source.is_file() or entry.get("sha256") != source_sha256(source):
                self.stale.append(name)
            elif not _is_recorded_extension(extension, entry):
                self.stale.append(name)  # built by another interpreter or copied in: not this build's
            elif not self.pure_forced:
                self.compiled[name] = extension
        if self.compiled and self.shared is None:
            # every extension imports the shared module: without a trusted one none of them can load
            self.stale.append(SHARED_MODULE)
            self.compiled = {}

    def describe(self) -> str:
        """One line for `kvsim --version`: the active path and, for any pure module, why."""
        total = len(COMPILED_MODULES)
        if self.pure_forced:
            return f"pure Python ({PURE_ENV}=1)"
        why = []
        if self.stale:
            why.append(f"compiled core stale for {', '.join(self.stale)}: {REBUILD_HINT}")
        if self.not_built and self.compiled:
            why.append(f"not compiled: {', '.join(self.not_built)}")
        if not self.compiled:
            if not self.stale:
                return "pure Python (compiled core not built)"
            return f"pure Python ({'; '.join(why)})"
        done = len(self.compiled)
        noun = "module" if total == 1 else "modules"
        count = f"{total} {noun}" if done == total else f"{done} of {total} {noun}"
        tail = f"; pure for the rest: {'; '.join(why)}" if why else ""
        return f"compiled (Cython {self.cython_version}, {count}{tail})"


class CompiledCoreFinder(importlib.abc.MetaPathFinder):
    """Finds each listed module as its extension or its .py source, as `CoreState` decided.

    Why a finder: Python's own path finder prefers an extension over a .py of the same name, whatever
    its age; this one is asked first and decides for the listed modules. An extension of a module of
    `allocators` or `sim` that is not listed (left behind when a module left the list, or by another
    branch's build) is never loaded: its .py is. Other modules: None, the usual finders go on.
    """

    def __init__(self, state: CoreState) -> None:
        self.state = state

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in _PACKAGES:
            return None
        if fullname == SHARED_MODULE:
            return self._shared_spec()
        source, extension = _module_files(fullname, self.state.root)
        if fullname in COMPILED_MODULES and fullname in self.state.compiled:
            extension = self.state.compiled[fullname]
            loader: importlib.abc.Loader = importlib.machinery.ExtensionFileLoader(fullname, str(extension))
            return importlib.util.spec_from_file_location(fullname, str(extension), loader=loader)
        if fullname not in COMPILED_MODULES and extension is None:
            return None  # nothing compiled to avoid: the usual finders decide
        if not source.is_file():
            return None  # not in this tree (an unusual layout): the usual finders decide
        loader = importlib.machinery.SourceFileLoader(fullname, str(source))
        return importlib.util.spec_from_file_location(fullname, str(source), loader=loader)

    def _shared_spec(self) -> importlib.machinery.ModuleSpec:
        """The recorded shared utility extension, never another (it has no source to fall back on)."""
        extension = self.state.shared
        if extension is None or not self.state.compiled:
            raise ModuleNotFoundError(
                f"{SHARED_MODULE}: no compiled module of this build uses it", name=SHARED_MODULE
            )
        loader = importlib.machinery.ExtensionFileLoader(SHARED_MODULE, str(extension))
        spec = importlib.util.spec_from_file_location(SHARED_MODULE, str(extension), loader=loader)
        assert spec is not None
        return spec


def _installed() -> CompiledCoreFinder | None:
    return next((f for f in sys.meta_path if isinstance(f, CompiledCoreFinder)), None)


def install() -> CompiledCoreFinder:
    """Put the finder first on `sys.meta_path` (once per process) and return it."""
    finder = _installed()
    if finder is None:
        finder = CompiledCoreFinder(CoreState())
        sys.meta_path.insert(0, finder)
    return finder


def core_path() -> str:
    """The active path, e.g. "compiled (Cython 3.3.1, 12 modules)" or "pure Python (KVSIM_PURE=1)"."""
    return install().state.describe()


def loaded_paths() -> dict[str, str]:
    """Module -> "compiled" / "pure" for each listed module imported so far (what actually runs)."""
    found = {}
    for name in COMPILED_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            origin = str(getattr(module, "__file__", "") or "")
            found[name] = "pure" if origin.endswith(".py") else "compiled"
    return found


install()
