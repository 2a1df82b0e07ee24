# Each target sets itself up: a fresh machine needs only python3, pip and make.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The framework recipes (docs/frameworks.md) get a venv of their own: their heavy installs
# pin openai < 3.4 (instructor), which the main suite and `make demo` should not inherit.
FW_VENV := .venv-frameworks
FW_STAMP := $(FW_VENV)/.installed

.PHONY: demo test test-quick test-stress test-frameworks lint typecheck docs bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

$(FW_STAMP): pyproject.toml
	$(PY) -m venv $(FW_VENV)
	$(FW_VENV)/bin/pip install --quiet --upgrade pip
	$(FW_VENV)/bin/pip install --quiet -e '.[test,frameworks]'
	touch $(FW_STAMP)

## The proof: many agents, many rounds, random faults, zero hangs.
demo: $(STAMP)
	$(BIN)/python scripts/proof_demo.py

# pytest-xdist workers. Most of the suite's time is real deadlines waiting, which overlap, so
# two per core of a 2-core runner; each worker starts its own session fault server. The
# margins hold with both cores busy besides (scripts/stress_tests.py).
WORKERS ?= 4

## The whole test suite (what CI runs), in parallel.
test: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS) --dist worksteal

## The loop for local work (under a minute): everything but the tests marked `slow`. Its
## time is mostly deadlines waiting, so more workers than `test` uses.
QUICK_WORKERS ?= 6
test-quick: $(STAMP)
	$(BIN)/python -m pytest -n $(QUICK_WORKERS) --dist worksteal -m "not slow and not frameworks"

## The suite RUNS times while two busy loops keep both cores loaded (scripts/stress_tests.py).
RUNS ?= 5
test-stress: $(STAMP)
	$(BIN)/python scripts/stress_tests.py --runs $(RUNS)

## The recipe per framework (openai-agents, pydantic-ai, langchain, autogen, litellm, dspy,
## instructor, llama-index) against the fault server, in their own venv.
test-frameworks: $(FW_STAMP)
	$(FW_VENV)/bin/python -m pytest -m frameworks tests/frameworks

lint: $(STAMP)
	$(BIN)/ruff check src fault_server tests benchmarks scripts
	$(BIN)/ruff format --check src fault_server tests benchmarks scripts

typecheck: $(STAMP)
	$(BIN)/mypy

DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,docs]'
	touch $(DOCS_STAMP)

## The documentation site from docs/, API reference from the docstrings, into build/site.
## Strict: a broken docstring or a page missing from the nav fails the build.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --quiet -f scripts/mkdocs.yml

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) $(FW_VENV) build dist .pytest_cache .mypy_cache .ruff_cache
