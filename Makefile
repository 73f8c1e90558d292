# mmd: the README's two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LINTED := mmd tests scripts benchmarks

.PHONY: demo test quick lint docs gpu-test bench-text clean install-service

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

## demo: set up, drop a sample job into inbox/, process the inbox once, show the job it just ran
demo: $(STAMP)
	@MMD=$(BIN)/mmd sh scripts/demo.sh

## test: set up, lint, type-check, run the whole test suite (the command CI runs)
test: lint
	$(BIN)/pytest -q

## quick: the edit loop (under a minute on two cores): no real processes, daemons or nvcc
quick: $(STAMP)
	$(BIN)/pytest -q -x -m "not slow and not process" --ignore=tests/gpu

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

## docs: regenerate docs/sidecar.md and docs/sidecar.schema.json from mmd/record.py
docs: $(STAMP)
	$(BIN)/python -m mmd.record docs

## gpu-test: the GPU tests (skip cleanly where there is no GPU or pycuda)
gpu-test: $(STAMP)
	$(BIN)/pip install -q -e '.[cuda]' || echo "pycuda not installable here: GPU tests will skip"
	$(BIN)/pytest -q -m gpu tests

## bench-text: parse/emit throughput against numpy.loadtxt/savetxt
bench-text: $(STAMP)
	$(BIN)/python benchmarks/bench_textformat.py --sizes 1024 4096

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache

## install-service: (root) mmd in /opt/mmd/venv (not editable), its user, folders and unit: docs/operations.md
install-service:
	sh systemd/install.sh
