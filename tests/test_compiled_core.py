"""The compiled core (issue 24): the Cython extensions give the same results as the .py sources they are
built from, and the import finder never runs a stale extension.

Why both halves: the compiled path is only worth having if it is invisible in the results, and the
finder is what keeps an edited source from running as its old compiled self. The identity half runs the
results_identity.py workloads (sglang shortened) in two fresh interpreters, KVSIM_PURE=1 and compiled,
and compares every table exactly; it is skipped when the core is not built from the current sources on
this machine (no compiler, or a source edited since the last `make venv`), and fails instead under
KVSIM_REQUIRE_COMPILED=1 (.ci/run sets it: CI builds the core, so a skip there would hide a broken build).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from _docs_helpers import makefile_variable

from allocators import compiled
from sim.cli.app import main

REPO = Path(__file__).resolve().parents[1]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]

# One interpreter's side of the identity check: every results_identity.py run, the two long ones shortened
# (sglang's radix allocator never jumps: 300 prompts are 100k steps; bench20k: 20k requests), written as
# results_identity.py --save writes them, plus which path each listed module was loaded from.
_RUN_SIDE = """
import json, sys
from pathlib import Path
import sim
from allocators import compiled
from benchmarks.results_identity import _comparable_summary, _runs, scenarios
out = Path(sys.argv[1])
shorter = {"sglang": 60, "bench20k": 5000}
for name, (scenario, allocators) in scenarios().items():
    if name in shorter:
        scenario = scenario.with_overrides(num_prompts=shorter[name])
    for label, run in _runs(scenario, allocators).items():
        folder = out / name / label.replace(":", "_")
        folder.mkdir(parents=True)
        run.requests.to_parquet(folder / "requests.parquet")
        run.steps.to_parquet(folder / "steps.parquet")
        (folder / "summary.json").write_text(json.dumps(_comparable_summary(run.summary), sort_keys=True))
(out / "core.json").write_text(json.dumps({"path": sim.core_path(), "loaded": compiled.loaded_paths()}))
"""


def _require_built() -> None:
    """Skip (or fail under KVSIM_REQUIRE_COMPILED=1) unless every listed module is built and fresh."""
    state = compiled.CoreState(environ={})
    if len(state.compiled) == len(compiled.COMPILED_MODULES):
        return
    reason = f"the compiled core is not built from the current sources on this machine: {state.describe()}"
    if os.environ.get("KVSIM_REQUIRE_COMPILED") == "1":
        pytest.fail(f"{reason} (KVSIM_REQUIRE_COMPILED=1)")
    pytest.skip(reason)


def _side_env(pure: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    if pure:
        env[compiled.PURE_ENV] = "1"
    return env


@pytest.mark.slow
def test_compiled_and_pure_paths_give_identical_tables(tmp_path: Path) -> None:
    _require_built()
    sides = {"pure": tmp_path / "pure", "compiled": tmp_path / "compiled"}
    procs = {
        side: subprocess.Popen(
            [sys.executable, "-c", _RUN_SIDE, str(out)],
            cwd=REPO,
            env=_side_env(pure=side == "pure"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for side, out in sides.items()
    }  # both at once: on two cores the check takes the longer side's time, not the sum
    for side, proc in procs.items():
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{side} side failed:\n{output[-3000:]}"
    pure_core = json.loads((sides["pure"] / "core.json").read_text())
    compiled_core = json.loads((sides["compiled"] / "core.json").read_text())
    assert pure_core["path"] == "pure Python (KVSIM_PURE=1)"
    assert set(pure_core["loaded"].values()) == {"pure"}
    assert compiled_core["path"].startswith("compiled (Cython ")
    assert set(compiled_core["loaded"]) == set(compiled.COMPILED_MODULES)  # every listed module ran
    assert set(compiled_core["loaded"].values()) == {"compiled"}

    runs = sorted(p.parent.relative_to(sides["pure"]) for p in sides["pure"].rglob("summary.json"))
    assert runs == sorted(
        p.parent.relative_to(sides["compiled"]) for p in sides["compiled"].rglob("summary.json")
    )
    assert len(runs) >= 15
    for run in runs:
        pure, fast = sides["pure"] / run, sides["compiled"] / run
        for table in ("requests", "steps"):
            pd.testing.assert_frame_equal(
                pd.read_parquet(fast / f"{table}.parquet"),
                pd.read_parquet(pure / f"{table}.parquet"),
                check_exact=True,
                obj=f"{run}/{table}",
            )
        assert json.loads((fast / "summary.json").read_text()) == json.loads(
            (pure / "summary.json").read_text()
        )


# -- the finder, on a fake tree (no build needed) -----------------------------------------------------------

NAME = "allocators.paged"


def _fake_tree(root: Path) -> tuple[Path, Path, dict]:
    """allocators/paged.py, a stand-in extension beside it, and a build record naming the source's hash."""
    source = root / "allocators" / "paged.py"
    source.parent.mkdir(parents=True)
    source.write_text("VALUE = 1\n")
    extension = source.with_name(f"paged{SUFFIX}")
    extension.write_bytes(b"stand-in: never loaded by these tests")
    entry = {
        "sha256": compiled.source_sha256(source),
        "extension": extension.name,
        "extension_sha256": compiled.source_sha256(extension),
    }
    shared = source.with_name(f"{compiled.SHARED_MODULE.rpartition('.')[2]}{SUFFIX}")
    shared.write_bytes(b"stand-in for Cython's shared utility module")
    shared_entry = {
        "sha256": "",
        "extension": shared.name,
        "extension_sha256": compiled.source_sha256(shared),
    }
    manifest = {"cython": "3.test", "modules": {NAME: entry, compiled.SHARED_MODULE: shared_entry}}
    return source, extension, manifest


def _origin(state: compiled.CoreState, name: str = NAME) -> tuple[str, type]:
    spec = compiled.CompiledCoreFinder(state).find_spec(name)
    assert spec is not None and spec.origin is not None
    return spec.origin, type(spec.loader)


def test_a_fresh_extension_is_loaded(tmp_path: Path) -> None:
    source, extension, manifest = _fake_tree(tmp_path)
    state = compiled.CoreState(environ={}, root=tmp_path, manifest=manifest)
    assert state.compiled == {NAME: extension}
    assert _origin(state) == (str(extension), importlib.machinery.ExtensionFileLoader)
    n = len(compiled.COMPILED_MODULES)
    assert state.describe().startswith(f"compiled (Cython 3.test, 1 of {n} modules; pure for the rest: ")


def test_a_stale_extension_falls_back_to_the_source(tmp_path: Path) -> None:
    source, _, manifest = _fake_tree(tmp_path)
    source.write_text("VALUE = 2  # edited after the build\n")
    state = compiled.CoreState(environ={}, root=tmp_path, manifest=manifest)
    assert state.stale == [NAME] and state.compiled == {}
    assert _origin(state) == (str(source), importlib.machinery.SourceFileLoader)
    assert state.describe() == f"pure Python (compiled core stale for {NAME}: {compiled.REBUILD_HINT})"


def test_an_extension_the_build_did_not_record_is_not_loaded(tmp_path: Path) -> None:
    """Another interpreter's older build beside the recorded one, or a file copied over it: the source
    is current and recorded, but this extension is not the file the build wrote."""
    source, extension, manifest = _fake_tree(tmp_path)
    extension.write_bytes(b"another build of an older source")
    state = compiled.CoreState(environ={}, root=tmp_path, manifest=manifest)
    assert state.stale == [NAME] and state.compiled == {}
    assert _origin(state) == (str(source), importlib.machinery.SourceFileLoader)
    manifest["modules"][NAME]["extension"] = "paged.cpython-399-other.so"
    extension.write_bytes(b"stand-in: never loaded by these tests")
    assert compiled.CoreState(environ={}, root=tmp_path, manifest=manifest).stale == [NAME]


def test_the_shared_utility_module_is_loaded_as_recorded(tmp_path: Path) -> None:
    _, _, manifest = _fake_tree(tmp_path)
    state = compiled.CoreState(environ={}, root=tmp_path, manifest=manifest)
    shared = manifest["modules"][compiled.SHARED_MODULE]["extension"]
    origin = (str(tmp_path / "allocators" / shared), importlib.machinery.ExtensionFileLoader)
    assert _origin(state, compiled.SHARED_MODULE) == origin


@pytest.mark.parametrize("damage", ["unrecorded", "replaced", "missing"])
def test_without_the_recorded_shared_module_no_extension_is_loaded(tmp_path: Path, damage: str) -> None:
    """Every extension imports Cython's shared utility module, which has no source to fall back to: when
    it is not the file the build recorded, every listed module runs as its source, and it is not loaded."""
    source, _, manifest = _fake_tree(tmp_path)
    entry = manifest["modules"][compiled.SHARED_MODULE]
    shared = source.with_name(entry["extension"])
    if damage == "unrecorded":
        del manifest["modules"][compiled.SHARED_MODULE]
    elif damage == "replaced":
        shared.write_bytes(b"another build's shared module")
    else:
        shared.unlink()
    state = compiled.CoreState(environ={}, root=tmp_path, manifest=manifest)
    assert state.compiled == {} and state.stale == [compiled.SHARED_MODULE]
    assert _origin(state) == (str(source), importlib.machinery.SourceFileLoader)
    assert state.describe() == (
        f"pure Python (compiled core stale for {compiled.SHARED_MODULE}: {compiled.REBUILD_HINT})"
    )
    with pytest.raises(ModuleNotFoundError):
        compiled.CompiledCoreFinder(state).find_spec(compiled.SHARED_MODULE)


def test_kvsim_pure_forces_the_source(tmp_path: Path) -> None:
    source, _, manifest = _fake_tree(tmp_path)
    state = compiled.CoreState(environ={compiled.PURE_ENV: "1"}, root=tmp_path, manifest=manifest)
    assert state.compiled == {}
    assert _origin(state) == (str(source), importlib.machinery.SourceFileLoader)
    assert state.describe() == "pure Python (KVSIM_PURE=1)"


def test_an_extension_without_a_build_record_is_not_trusted(tmp_path: Path) -> None:
    source, _, _ = _fake_tree(tmp_path)
    state = compiled.CoreState(environ={}, root=tmp_path, manifest={})
    assert state.compiled == {} and NAME in state.not_built
    assert _origin(state) == (str(source), importlib.machinery.SourceFileLoader)
    assert state.describe() == "pure Python (compiled core not built)"


def test_the_finder_leaves_other_modules_to_the_usual_finders(tmp_path: Path) -> None:
    state = compiled.CoreState(environ={}, root=tmp_path, manifest={})
    assert compiled.CompiledCoreFinder(state).find_spec("allocators.base") is None
    assert compiled.CompiledCoreFinder(state).find_spec("numpy") is None


def test_an_extension_of_an_unlisted_module_is_never_loaded(tmp_path: Path) -> None:
    """A module that left the list may leave its extension behind: Python would prefer it, the finder not."""
    source = tmp_path / "allocators" / "base.py"
    source.parent.mkdir(parents=True)
    source.write_text("VALUE = 1\n")
    source.with_name(f"base{SUFFIX}").write_bytes(b"stand-in: a leftover extension")
    state = compiled.CoreState(environ={}, root=tmp_path, manifest={})
    assert _origin(state, "allocators.base") == (str(source), importlib.machinery.SourceFileLoader)


def test_the_finder_is_installed_before_the_path_finder_and_decided_every_loaded_module() -> None:
    finder = compiled.install()
    assert sys.meta_path.index(finder) < sys.meta_path.index(importlib.machinery.PathFinder)
    for name, path in compiled.loaded_paths().items():
        assert path == ("compiled" if name in finder.state.compiled else "pure"), name


def test_kvsim_pure_in_a_fresh_interpreter_runs_the_sources() -> None:
    code = "import sim.core.engine, sim; print(sim.core_path()); print(sim.core.engine.__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=_side_env(pure=True),
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.splitlines() == [
        "pure Python (KVSIM_PURE=1)",
        str(REPO / "sim" / "core" / "engine.py"),
    ]


def test_kvsim_version_names_the_active_path(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--version"])
    out = capsys.readouterr().out
    assert out.startswith("kvsim ") and f"core: {compiled.core_path()}" in out


def test_kvsim_version_under_kvsim_pure() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sim.cli", "--version"],
        cwd=REPO,
        env=_side_env(pure=True),
        capture_output=True,
        text=True,
        check=True,
    )
    assert "core: pure Python (KVSIM_PURE=1)" in proc.stdout


# -- one list: setup.py and the Makefile read COMPILED_MODULES, never a copy --------------------------------


def test_every_listed_module_is_a_source_file() -> None:
    for name in compiled.COMPILED_MODULES:
        assert REPO.joinpath(*name.split(".")).with_suffix(".py").is_file(), name


def test_setup_py_reads_the_list_and_keeps_annotations_untyped() -> None:
    spec = importlib.util.spec_from_file_location("kvsim_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)  # not __main__: setup() does not run
    assert setup_py.COMPILED_MODULES == compiled.COMPILED_MODULES
    assert setup_py.MANIFEST_NAME == compiled.MANIFEST_NAME
    assert setup_py.DIRECTIVES["annotation_typing"] is False  # a NumPy int64 stays valid for an `int`
    assert "infer_types" not in setup_py.DIRECTIVES


def test_setup_py_compiles_the_largest_c_first(tmp_path: Path) -> None:
    """setuptools' parallel build_ext takes the extensions in list order: largest first keeps one thread
    from compiling a large module alone at the end; equal sizes keep the list's order."""
    spec = importlib.util.spec_from_file_location("kvsim_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)
    sizes = {"small": 10, "large": 300, "mid_a": 50, "mid_b": 50}
    extensions = []
    for name, size in sizes.items():
        (tmp_path / f"{name}.c").write_bytes(b"x" * size)
        extensions.append(setup_py.Extension(name, [str(tmp_path / f"{name}.c")]))
    missing = setup_py.Extension("missing", [str(tmp_path / "missing.c")])
    ordered = setup_py._largest_first([*extensions, missing])
    assert [ext.name for ext in ordered] == ["large", "mid_a", "mid_b", "small", "missing"]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_makefile_rebuilds_on_every_listed_source() -> None:
    expected = [str(Path(*name.split(".")).with_suffix(".py")) for name in compiled.COMPILED_MODULES]
    assert makefile_variable("CORE_SOURCES") == expected


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_makefile_names_the_shared_utility_module() -> None:
    """`make clean` removes its extension too; setup.py reads the same constant."""
    assert makefile_variable("SHARED_CORE") == [compiled.SHARED_MODULE.replace(".", "/")]
    spec = importlib.util.spec_from_file_location("kvsim_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)
    assert setup_py.SHARED_MODULE == compiled.SHARED_MODULE


def _manifest_after_build(tmp_path: Path, built: list[str]) -> dict:
    """The build record setup.py writes when `built` are the extensions that compiled (stand-in files)."""
    from setuptools import Distribution

    spec = importlib.util.spec_from_file_location("kvsim_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)
    names = (*setup_py.COMPILED_MODULES, setup_py.SHARED_MODULE)
    dist = Distribution({"ext_modules": [setup_py.Extension(m, ["stand-in.c"]) for m in names]})
    cmd = setup_py.OptionalBuildExt(dist)
    cmd.initialize_options()
    cmd.build_lib = str(tmp_path)
    cmd.finalize_options()
    cmd.in_place = False
    cmd.hashes = {m: "sha" for m in names}
    cmd.build_key = {"cython": "3.test"}
    cmd.built = list(built)
    for name in built:
        extension = Path(cmd.get_ext_fullpath(name))
        extension.parent.mkdir(parents=True, exist_ok=True)
        extension.write_bytes(name.encode())
    cmd._write_manifest()
    return json.loads((tmp_path / "allocators" / compiled.MANIFEST_NAME).read_text())


def test_setup_py_records_no_module_when_the_shared_utility_module_did_not_compile(tmp_path: Path) -> None:
    """Each extension imports the shared module: recorded without it, none could load."""
    with_shared = _manifest_after_build(tmp_path / "a", [NAME, compiled.SHARED_MODULE])
    assert sorted(with_shared["modules"]) == sorted([NAME, compiled.SHARED_MODULE])
    assert _manifest_after_build(tmp_path / "b", [NAME])["modules"] == {}
