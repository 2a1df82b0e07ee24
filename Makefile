# Each target sets itself up: a fresh machine needs only python3, pip and make.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

## The proof: many agents, many rounds, random faults, zero hangs.
demo: $(STAMP)
	$(BIN)/python scripts/proof_demo.py

## The whole test suite (what CI runs).
test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src fault_server tests benchmarks scripts
	$(BIN)/ruff format --check src fault_server tests benchmarks scripts

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
