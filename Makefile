# mmd: the README's two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint gpu-test bench-text clean install-service

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

## demo: set up, drop a sample job into inbox/, process the inbox once, show the results
demo: $(STAMP)
	@test -e inbox/sample.txt || $(BIN)/mmd gen 64 --seed 1 -o inbox/sample.txt
	$(BIN)/mmd serve --once
	@echo "--- outbox/:"; ls -l outbox/
	@echo "--- outbox/sample.timing.yaml:"; cat outbox/sample.timing.yaml

## test: set up, lint, run the test suite (the command CI runs)
test: $(STAMP)
	$(BIN)/ruff check mmd tests scripts benchmarks
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check mmd tests scripts benchmarks
	$(BIN)/ruff format --check mmd tests scripts benchmarks

## gpu-test: the GPU tests (skip cleanly where there is no GPU or pycuda)
gpu-test: $(STAMP)
	$(BIN)/pip install -q -e '.[cuda]' || echo "pycuda not installable here: GPU tests will skip"
	$(BIN)/pytest -q -m gpu tests/gpu

## bench-text: parse/emit throughput against numpy.loadtxt/savetxt
bench-text: $(STAMP)
	$(BIN)/python benchmarks/bench_textformat.py --sizes 1024 4096

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
