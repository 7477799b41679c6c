# The README's two commands: `make demo` and `make test`. Each sets up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two install stamps, both named after pyproject.toml's hash: STAMP is what running kvsim needs (its
# dependencies and the compiled core: `make demo` installs no more); DEV_STAMP adds the `dev` and `dask`
# extras that the tests, the linters and the core's offline rebuild need (`make test`, `make lint`).
PYPROJECT_HASH := $(shell cat pyproject.toml | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(PYPROJECT_HASH)
DEV_STAMP := $(VENV)/.installed-dev-$(PYPROJECT_HASH)
# The compiled core (docs/compiled_core.md): the .py modules named in allocators/compiled.py's
# COMPILED_MODULES, and the build record setup.py writes. A listed source edited after the last build
# rebuilds it (only the changed modules compile); a stale extension would not run anyway (the import
# finder checks each source's sha256), this only keeps the fast path built.
CORE_SOURCES := $(shell sed -nE 's/^    "((allocators|sim)\.[a-z0-9_.]*)",$$/\1/p' allocators/compiled.py 2>/dev/null | tr . / | sed 's/$$/.py/')
CORE := allocators/_compiled_core.json
# Cython's shared utility module (allocators/compiled.py SHARED_MODULE): an extension without a .py source
# that every listed extension imports; built and recorded with them.
SHARED_CORE := $(shell sed -nE 's/^SHARED_MODULE = "([a-z0-9_.]*)"$$/\1/p' allocators/compiled.py 2>/dev/null | tr . /)

.PHONY: demo test bench calibrate docs notebooks lint venv clean

# The third-party modules `kvsim compare` (the demo) imports: numpy, pandas, parquet, the report's
# figures, the scenario's pydantic models, the CLI (tests/docs/test_make_targets.py imports each). Importing
# them writes their bytecode (PYTHONDONTWRITEBYTECODE cleared: pip would have written it too, without
# --no-compile), which takes the compile out of the demo's own start (~4 s of CPU where nothing is
# compiled yet), and builds matplotlib's font cache where it is missing. Nothing of kvsim is imported:
# its compiled core is being written at the same time. Not at a lower priority (`nice`): the recipe waits
# for it, and on a busy machine a niced process starved for minutes after the build was done (seen at
# load ~7: 4 s of CPU in 7.5 minutes); at the same priority its work is work the demo would do anyway.
DEMO_IMPORTS := numpy pandas pandas.core.arrays.arrow.extension_types pyarrow.parquet pyarrow.dataset \
  pyarrow.pandas_compat matplotlib.pyplot matplotlib.backends.backend_agg PIL.Image pydantic.main \
  pydantic.type_adapter pydantic.json_schema pydantic.plugin._loader typer.main typer._adapters \
  rich.console rich.table simpy
prewarm = env PYTHONDONTWRITEBYTECODE= MPLBACKEND=Agg $(PY) -P -c \
  "import importlib; [importlib.import_module(m) for m in '$(DEMO_IMPORTS)'.split()]; import PIL.Image; PIL.Image.preinit()" \
  >/dev/null 2>&1

# pip into the venv from ensurepip's own wheel, run from the wheel file as ensurepip itself runs it (the
# wheel on sys.path). 2.5-2.7 s of CPU against 5.0-6.2 s for `python -m venv` with pip and
# setuptools (two pairs back to back, load ~5). Where the Python keeps no such wheel (a distribution
# that stores its wheels elsewhere), this fails and ensurepip installs pip as `python -m venv` would.
bootstrap_pip = $(PY) -P -c "import ensurepip, pathlib, subprocess, sys; \
  wheel = sorted(pathlib.Path(ensurepip.__file__).parent.glob('_bundled/pip-*.whl'))[-1]; \
  sys.exit(subprocess.call([sys.executable, str(wheel / 'pip'), 'install', '-q', '--no-index', \
  '--disable-pip-version-check', str(wheel)]))"

$(STAMP): pyproject.toml
# No `pip install --upgrade pip` (~3 s before anything else can start): the pip that ensurepip bundles
# (23.2 with Python 3.11.7) does everything below, editable installs (PEP 660) with build isolation
# included. The venv is made without it and pip is bootstrapped from that wheel (bootstrap_pip, above):
# Python 3.11's `python -m venv` also installs setuptools 65, which nothing here uses (pip's isolated
# build brings its own setuptools, the `dev` extra and the core's rebuild theirs), and byte-compiles
# both; this step runs alone, before anything else can start.
	test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV)
	$(PY) -c "import pip" 2>/dev/null || $(bootstrap_pip) || $(PY) -m ensurepip --default-pip
# kvsim's dependencies (pyproject.toml's list, written out by tomllib) install while pip builds kvsim
# itself, which compiles the core on every core: the two overlap instead of queueing (a fresh clone's
# `make demo`, benchmarks/fresh_demo.py). Both must succeed. --no-compile: pip would byte-compile every
# .py of NumPy, pandas, pyarrow, matplotlib... (~16 s of CPU); Python compiles what the demo imports
# when it first imports it (~3 s), and $(DEV_STAMP) compiles the rest for the tests' many processes.
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
	  > $(VENV)/requirements-run.txt
# When the dependencies are in, and while the core still compiles, the modules of theirs that the demo
# imports are byte-compiled by importing them (prewarm, above), on the CPU time the build leaves idle
# (pip's serial steps, the tail of gcc's parallel build) or shared with it; a failed import is ignored.
	{ $(PY) -m pip install -q --no-compile -r $(VENV)/requirements-run.txt && { $(prewarm) || true; }; } & deps=$$!; \
	  $(PY) -m pip install -q --no-deps -e .; built=$$?; wait $$deps && test $$built -eq 0
	@$(PY) -c "import sim; print('kvsim core:', sim.core_path())"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# The extras on top: pip builds the editable install again, and setup.py copies the extensions it just
# built instead of compiling them again (their sources are unchanged). Then the byte-compile that $(STAMP)
# left out, on every core: the tests start many interpreters, and where bytecode is not written
# (PYTHONDONTWRITEBYTECODE, a read-only venv) each would compile pandas and matplotlib again. Files that
# do not compile are skipped quietly, as pip's own byte-compile does; where worker processes cannot start,
# one process compiles them.
byte_compile = $(PY) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=$(1))"
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,dask]'
	$(call byte_compile,0) || $(call byte_compile,1)
	touch $(DEV_STAMP)

# order-only on the venv: installing it builds the core too, and must not make the record look old.
# The rebuild uses the venv's own setuptools, wheel and Cython (the `dev` extra; a venv made by `make demo`
# alone gets them here, from the package index), so after `make test` it needs no index; if it fails anyway
# the edited modules run as Python (the finder's hash check), never stale code.
$(CORE): setup.py allocators/compiled.py $(CORE_SOURCES) | $(STAMP)
	$(PY) -c "import Cython, wheel, setuptools; import re; assert tuple(map(int, re.match(r'(\d+)\.(\d+)', Cython.__version__).groups())) >= (3, 1)" 2>/dev/null \
	  || $(PY) -m pip install -q 'Cython>=3.1' wheel setuptools \
	  || echo "warning: no Cython to rebuild the compiled core with"
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . \
	  || echo "warning: the compiled core was not rebuilt; edited modules run as Python (run make venv again)"
	@$(PY) -c "import sim; print('kvsim core:', sim.core_path())"

venv: $(DEV_STAMP) $(CORE)

demo: $(STAMP) $(CORE)
	$(VENV)/bin/kvsim compare

test: $(DEV_STAMP) $(CORE)
	$(PY) -m pytest -q

# The speed benchmarks (benchmarks/README.md); results_identity.py and cost_fit.py are tools, not timings.
BENCHMARKS := engine allocator_speed workload_speed sweep calls_per_turn

bench: $(STAMP) $(CORE)
	for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py"; $(PY) benchmarks/$$b.py || exit 1; done

# kvsim calibrate refuses an --output folder that does not exist (a mistyped path is not created), so
# the target makes its own folder; on a machine without a GPU it then exits 2 naming what is missing.
calibrate: $(STAMP)
	mkdir -p results/calibration
	$(VENV)/bin/kvsim calibrate --output results/calibration/profile.json

# Example tables and images in README.md and docs/ (docs/generate.py says which and how); a few minutes.
docs: $(STAMP)
	MPLBACKEND=Agg $(PY) docs/generate.py $(DOCS_ARGS)

# The analysis notebooks in JupyterLab (the `notebook` extra, installed on first use; not in `dev`).
# JUPYTER_ARGS=--no-browser for a remote machine.
notebooks: $(STAMP)
	$(PY) -c "import jupyterlab" 2>/dev/null || $(PY) -m pip install -q -e '.[notebook]'
	$(VENV)/bin/jupyter lab notebooks/ $(JUPYTER_ARGS)

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

clean:
# the compiled core: only the extensions of the listed modules (what setup.py builds), and its record
	rm -rf $(VENV) .pytest_cache .hypothesis build $(CORE) $(foreach src,$(CORE_SOURCES),$(basename $(src)).*.so) $(SHARED_CORE).*.so
