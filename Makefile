# mmd: the README's two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Two set-ups in one venv: the demo's (mmd and what it imports) and the developer's (also the test extra:
# pytest, linters, type checker), so that `make demo` downloads and installs only what it runs.
RUNTIME := $(VENV)/.installed-runtime
STAMP   := $(VENV)/.installed
# The version of every package any install here takes (mmd's, its extras', the tests'), made by `make lock`
# from pyproject.toml: a constraint, not a requirement, so an extra left out stays out.
LOCK    := constraints.txt
LINTED  := mmd tests scripts benchmarks
# The suite's two tiers (pyproject.toml's `serial` marker says which tier a test is in): the fast tier in
# one pytest worker per core, then the tests that cannot share the machine, alone.
FAST   := $(BIN)/pytest -q -n auto -m "not serial"
SERIAL := $(BIN)/pytest -q -m serial

.PHONY: demo test test-fast test-serial quick check docs gpu-test bench-text clean install-service lock

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# --no-compile: pip would byte-compile every module of numpy, matplotlib and the rest (a third of the
# install's time); Python compiles the few that mmd imports when it first imports them.
$(RUNTIME): pyproject.toml setup.py $(LOCK) | $(BIN)/python
	$(BIN)/pip install -q --no-compile -c $(LOCK) -e .
	touch $@

$(STAMP): pyproject.toml setup.py $(LOCK) | $(BIN)/python
	$(BIN)/pip install -q -c $(LOCK) -e '.[test]'
	touch $@ $(RUNTIME)  # the developer's set-up holds the demo's

## demo: set up (mmd alone), drop a sample job into inbox/, process the inbox once, show the job it just ran
demo: $(RUNTIME)
	@MMD=$(BIN)/mmd sh scripts/demo.sh

## test: set up, lint and type-check (`make check`), then both tiers of the test suite (the command CI runs)
test: check
	$(FAST)
	$(SERIAL)

## test-fast, test-serial: one tier of the suite each (`make test` runs both)
test-fast: $(STAMP)
	$(FAST)

test-serial: $(STAMP)
	$(SERIAL)

## quick: the edit loop, in parallel: no real processes, daemons or nvcc, nothing slow, nothing serial
quick: $(STAMP)
	$(BIN)/pytest -q -x -n auto -m "not integration and not serial" --ignore=tests/gpu

## check: lint (ruff check, ruff format --check) and type-check (mypy); `make test` runs it first
check: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

## docs: regenerate docs/sidecar.md and docs/sidecar.schema.json from mmd/record/
docs: $(STAMP)
	$(BIN)/python -m mmd.record.published docs

## gpu-test: the GPU tests (skip cleanly where there is no GPU or pycuda)
gpu-test: $(STAMP)
	$(BIN)/pip install -q -c $(LOCK) -e '.[cuda]' || echo "pycuda not installable here: GPU tests will skip"
	$(BIN)/pytest -q -m gpu tests

## bench-text: parse/emit throughput against numpy.loadtxt/savetxt
bench-text: $(STAMP)
	$(BIN)/python benchmarks/bench_textformat.py --sizes 1024 4096

## lock: pin anew what pyproject.toml asks for (uv, every extra, for every Python it allows); pins that
## still fit are kept: `rm constraints.txt && make lock` takes the newest of everything
# Versions only, no hashes: pip checks hashes in requirements, never in constraints, and a hashed
# requirements file would install every extra.
lock: | $(BIN)/python
	$(BIN)/pip install -q uv
	$(BIN)/uv pip compile pyproject.toml --all-extras --universal --custom-compile-command 'make lock' -q -o $(LOCK)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache

## install-service: (root) mmd in /opt/mmd/venv (not editable), its user, folders and unit: docs/operations.md
install-service:
	PYTHON='$(PYTHON)' sh systemd/install.sh
