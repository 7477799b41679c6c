# The README's two commands: `make demo` and `make test`. Each sets up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: demo test bench calibrate lint venv clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,dask]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kvsim compare

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) -P $$b || exit 1; done

calibrate: $(STAMP)
	$(VENV)/bin/kvsim calibrate --output results/calibration/profile.json

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
