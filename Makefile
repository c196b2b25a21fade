# flowstat: the two commands a new machine needs are `make demo` and `make test`.
# Everything they need is installed here, cached under .venv/ and .cache/, and re-done only
# when its inputs change.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help demo test bench install clean

help:
	@echo "make demo   run the demo (installs what it needs first)"
	@echo "make test   run the tests"
	@echo "make bench  run the benchmarks (long; JSON in benchmarks/results/)"
	@echo "make clean  remove the venv, caches and runs"

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "flowstat needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV) || { echo "python venv missing: installing python3-venv"; \
		apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }

$(STAMP): $(BIN)/python pyproject.toml requirements.lock
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[test]'
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/flowstat run benchmark-harness/topologies/demo.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra

bench: $(STAMP)
	$(BIN)/python benchmarks/run_benchmarks.py --full

clean:
	rm -rf $(VENV) .cache runs .pytest_cache
