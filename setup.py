"""Build kvsim's compiled core: Cython compiles the hot-loop modules from their plain .py sources.

Everything else about the package is in pyproject.toml. Why a setup.py at all: setuptools declares C
extensions only here. The list of modules is `COMPILED_MODULES` in allocators/compiled.py, read with
`ast` (importing the package would need its dependencies, which the build environment does not have).

The build never fails for the compiled core's sake: a module Cython cannot translate, a missing C
compiler or a missing Cython (`--no-build-isolation` without it) prints a warning and leaves that module
to its .py, which `allocators.compiled` then loads. After the build, `allocators/_compiled_core.json`
records the sha256 of each source that a built extension came from; at import the finder loads an
extension only when its source still has that hash (docs/compiled_core.md).

Editable installs (`pip install -e .`, what `make venv` runs) build in a fresh temporary folder each
time; an extension whose source, Cython version and directives are unchanged since the last build is
copied from the source tree instead of compiled again, so a rebuild after editing one module compiles
that module only.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SWITCH = ROOT / "allocators" / "compiled.py"
C_DIR = Path("build") / "cython"  # generated .c files (relative: Cython joins it to relative sources)
C_RECORD = C_DIR / "sources.json"  # module -> sha256 of the source each .c file was generated from

# Annotations must not change semantics (a NumPy int64 passed to a parameter annotated `int` must keep
# working), so they are not C types; boundscheck / wraparound keep their safe defaults. No
# infer_types=True: only Cython's default, semantics-preserving inference.
DIRECTIVES: dict[str, object] = {"language_level": 3, "annotation_typing": False, "binding": True}
# -g0 -O1 after Python's own "-g -O3": the generated C is mostly calls into the CPython API, where -O3
# buys nothing measurable (callgrind, engine_v1 300 + engine 2,000 prompts: 3.54 G instructions at -O3,
# 3.57 G at -O1, 3.88 G pure) and costs twice the compile time (allocators/paged.c: 10.3 s vs 4.3 s).
# -ffp-contract=off: the typed float loops (sim/cost/model.py `_line_durations`, seq_kernels `jump_terms`)
# must give the floats NumPy gives, one rounding per multiply and per add; gcc contracts a * b + c into a
# fused multiply-add where the target has one by default (aarch64, or x86-64 with -mfma), which rounds once.
COMPILE_ARGS = ["-g0", "-O1", "-ffp-contract=off"]


def _switch_constant(name: str) -> object:
    """A literal constant of allocators/compiled.py, read without importing it."""
    for node in ast.parse(SWITCH.read_text(), str(SWITCH)).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return ast.literal_eval(node.value)
    raise RuntimeError(f"{SWITCH} defines no literal {name}")


COMPILED_MODULES: tuple[str, ...] = tuple(_switch_constant("COMPILED_MODULES"))  # type: ignore[arg-type]
MANIFEST_NAME = str(_switch_constant("MANIFEST_NAME"))
# Cython's shared utility module: one extension holds the utility code (typed memoryviews, the cyfunction
# type, extension-type and pickling helpers) that each listed module would otherwise carry its own copy of.
# docs/compiled_core.md "Build time": 475,300 -> 376,500 lines of C, 82 -> 62 s of serial gcc CPU.
SHARED_MODULE = str(_switch_constant("SHARED_MODULE"))


def _source(module: str) -> Path:
    return Path(*module.split(".")).with_suffix(".py")


def _sha256(path: Path) -> str:
    return hashlib.sha256((ROOT / path).read_bytes()).hexdigest()


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _warn(message: str) -> None:
    print(f"warning: kvsim compiled core: {message}; the pure-Python path runs instead", file=sys.stderr)


def _largest_first(extensions: list[Extension]) -> list[Extension]:
    """The extensions by the size of their generated C, largest first (ties: the list's order).

    Why: setuptools' parallel build_ext hands the extensions to its threads in list order, and gcc's
    time grows with the C file (0.5 to 2.5 MB here). In COMPILED_MODULES' order the largest modules
    (scheduler, metrics, cost.model) come last, so one thread compiles alone at the end while the
    other core idles; largest first (LPT scheduling) leaves only a small module for that tail.
    """

    def c_bytes(ext: Extension) -> int:
        try:
            return sum((ROOT / source).stat().st_size for source in ext.sources)
        except OSError:
            return 0

    return sorted(extensions, key=c_bytes, reverse=True)


class OptionalBuildExt(build_ext):
    """build_ext that cythonizes the listed modules first and never fails the install for them."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1  # gcc runs in threads, one module each

    def run(self) -> None:
        # setuptools turns `inplace` off while it builds, then copies the results into the tree
        self.in_place = bool(self.inplace or getattr(self, "editable_mode", False))
        self.hashes = {m: _sha256(_source(m)) for m in COMPILED_MODULES}  # hashed before translating
        self.hashes[SHARED_MODULE] = ""  # no source: Cython's version and the directives (build_key) make it
        self.build_key = {
            "cython": "",
            "directives": {k: str(v) for k, v in DIRECTIVES.items()},
            "compile_args": COMPILE_ARGS,
            "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
            "shared_module": SHARED_MODULE,  # C generated without it (or with another) must not be reused
        }
        self.built: list[str] = []
        self.previous = _read_json(self._manifest_path())
        translated = self._cythonize()
        # keep setuptools' own Extension objects (it keeps state on them), with the C sources put in
        for ext in self.extensions:
            if ext.name in translated:
                ext.sources = translated[ext.name].sources
                ext.optional = True
        self.extensions = _largest_first([ext for ext in self.extensions if ext.name in translated])
        if self.extensions:
            super().run()
        self._write_manifest()

    def _cythonize(self) -> dict[str, Extension]:
        """Module -> Extension of the listed modules Cython translated to C (the others: warned about)."""
        try:
            import Cython
            from Cython.Build import cythonize
        except ImportError:
            _warn("Cython is not installed (it is a build requirement; pip install Cython>=3.1)")
            return {}
        self.build_key["cython"] = Cython.__version__
        release = re.match(r"(\d+)\.(\d+)", Cython.__version__)  # "3.2b1" is 3.2
        if release is None or (int(release[1]), int(release[2])) < (3, 1):
            _warn(f"Cython {Cython.__version__} has no shared utility module (pip install Cython>=3.1)")
            return {}
        # A .c file generated from another version of its source, or by another Cython or directives,
        # is removed so that it is generated again: Cython itself only compares modification times.
        record = _read_json(ROOT / C_RECORD)
        generated_from = record.get("modules", {}) if record.get("build_key") == self.build_key else {}
        for module in (*COMPILED_MODULES, SHARED_MODULE):
            c_file = ROOT / C_DIR / _source(module).with_suffix(".c")
            if c_file.exists() and generated_from.get(module) != self.hashes[module]:
                c_file.unlink()
        modules = [Extension(m, [str(_source(m))], extra_compile_args=COMPILE_ARGS) for m in COMPILED_MODULES]
        # no sources: cythonize generates the shared module's C in C_DIR (allocators/_cyutility.c)
        modules.append(Extension(SHARED_MODULE, [], extra_compile_args=COMPILE_ARGS))
        failures: dict[str, str] = {}
        try:
            extensions = self._translate(cythonize, modules, nthreads=os.cpu_count() or 1)
        except Exception:
            # One module Cython cannot translate fails the whole call (with Cython 3.3.1 even with
            # exclude_failures=True, which raises "unhashable type: 'Extension'"), so translate them
            # one at a time: only the failing ones stay pure.
            extensions = []
            for module in modules:
                try:
                    extensions += self._translate(cythonize, [module], nthreads=1)
                except Exception as exc:
                    failures[module.name] = f" ({type(exc).__name__}: {exc})"
        done = {ext.name for ext in extensions}
        if SHARED_MODULE not in done:
            # every module imports it: none of them could run, so none is compiled (~60 s of gcc saved)
            _warn(
                f"Cython could not generate {SHARED_MODULE}{failures.get(SHARED_MODULE, '')}; "
                "every listed module runs as Python"
            )
            extensions, done = [], set()
        else:
            for module in COMPILED_MODULES:
                if module not in done:
                    _warn(f"Cython could not translate {module}{failures.get(module, '')}")
        (ROOT / C_RECORD).write_text(
            json.dumps({"build_key": self.build_key, "modules": {m: self.hashes[m] for m in done}}, indent=1)
        )
        return {ext.name: ext for ext in extensions}

    @staticmethod
    def _translate(cythonize: object, modules: list[Extension], nthreads: int) -> list[Extension]:
        """Cython's translation of `modules` to C in C_DIR; raises when any of them fails."""
        return cythonize(  # type: ignore[operator]
            modules,
            build_dir=str(C_DIR),
            compiler_directives=DIRECTIVES,
            nthreads=nthreads,
            quiet=True,
            shared_utility_qualified_name=SHARED_MODULE,
        )

    def _manifest_path(self) -> Path:
        """allocators/_compiled_core.json where the extensions go: the source tree when in place."""
        base = ROOT if self.in_place else Path(self.build_lib)
        return base / "allocators" / MANIFEST_NAME

    def _unchanged_in_place(self, ext: Extension) -> Path | None:
        """The in-place extension of the last build when its source and build key are unchanged."""
        if not self.in_place or self.force:
            return None
        entry = self.previous.get("modules", {}).get(ext.name)
        if self.previous.get("build_key") != self.build_key or not isinstance(entry, dict):
            return None
        in_place = ROOT / self.get_ext_filename(ext.name)
        return in_place if entry.get("sha256") == self.hashes[ext.name] and in_place.is_file() else None

    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name))
        reuse = self._unchanged_in_place(ext)
        try:
            if reuse is not None and reuse.resolve() != target.resolve():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(reuse, target)
            elif reuse is None:
                super().build_extension(ext)
        except Exception as exc:  # a compiler error, no compiler, a link error: this module stays pure
            _warn(f"could not compile {ext.name} ({exc})")
            return
        self.built.append(ext.name)

    def _write_manifest(self) -> None:
        """Record what was built, from which sources: the finder's staleness check reads it."""
        path = self._manifest_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        modules = {}
        # the listed modules' extensions import the shared module: without it none of them is recorded
        for m in (SHARED_MODULE, *COMPILED_MODULES) if SHARED_MODULE in self.built else ():
            built = Path(self.get_ext_fullpath(m))  # where build_extension put it (copied as is in place)
            if m in self.built and built.is_file():
                modules[m] = {
                    "sha256": self.hashes[m],
                    "extension": built.name,
                    "extension_sha256": _sha256(built),
                }
        manifest = {"cython": self.build_key["cython"], "build_key": self.build_key, "modules": modules}
        path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        if SHARED_MODULE not in self.built:
            _warn(f"{SHARED_MODULE} was not compiled, and every compiled module imports it")
        listed = len(modules) - (SHARED_MODULE in modules)
        print(f"kvsim compiled core: {listed} of {len(COMPILED_MODULES)} modules compiled ({path})")


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it to read the list
    setup(
        # placeholders: OptionalBuildExt.run puts in the C sources that Cython generates
        ext_modules=[
            Extension(m, [str(_source(m))], extra_compile_args=COMPILE_ARGS)
            for m in (*COMPILED_MODULES, SHARED_MODULE)
        ],
        cmdclass={"build_ext": OptionalBuildExt},
    )
