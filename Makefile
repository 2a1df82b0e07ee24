# Each target sets itself up: a fresh machine needs only python3, pip and make.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The framework recipes (docs/frameworks.md) get venvs of their own: their heavy installs
# pin openai < 3.4 (instructor) or openai < 3 (crewai, llama-index, mirascope), which the
# main suite and `make demo` should not inherit.
FW_VENV := .venv-frameworks
FW_STAMP := $(FW_VENV)/.installed
FW2_VENV := .venv-frameworks2
FW2_STAMP := $(FW2_VENV)/.installed
# The SDK faces and the native client on openai 2.x (the SDK on plain httpx).
OA2_VENV := .venv-openai2
OA2_STAMP := $(OA2_VENV)/.installed

.PHONY: demo test test-quick test-stress test-openai2 test-frameworks lint typecheck docs bench clean

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

$(FW2_STAMP): pyproject.toml
	$(PY) -m venv $(FW2_VENV)
	$(FW2_VENV)/bin/pip install --quiet --upgrade pip
	$(FW2_VENV)/bin/pip install --quiet -e '.[test,frameworks-openai2]'
	touch $(FW2_STAMP)

$(OA2_STAMP): pyproject.toml
	$(PY) -m venv $(OA2_VENV)
	$(OA2_VENV)/bin/pip install --quiet --upgrade pip
	$(OA2_VENV)/bin/pip install --quiet -e '.[test]' 'openai>=2,<3'
	touch $(OA2_STAMP)

## The proof: many agents, many rounds, random faults, zero hangs.
demo: $(STAMP)
	$(BIN)/python scripts/proof_demo.py

# pytest-xdist workers. Most of the suite's time is real deadlines waiting (~85% of its
# worker-seconds), which overlap, so four per core of a 2-core runner; each worker starts its
# own session fault server. The margins hold with both cores busy besides: with two busy
# loops (scripts/stress_tests.py, or `make test` itself), 8 workers run the suite in 110-125 s,
# 4 in ~210 s.
WORKERS ?= 8

# The suite keeps compiled modules (and pytest's rewritten test modules) in __pycache__,
# even where the environment sets PYTHONDONTWRITEBYTECODE: without them every worker, and
# every process a test starts, compiles and rewrites them all again (~4 s of CPU each).
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest

## The whole test suite (what CI runs), in parallel.
test: $(STAMP)
	$(PYTEST) -n $(WORKERS) --dist worksteal

## The loop for local work (under a minute): everything but the tests marked `slow`.
QUICK_WORKERS ?= 8
test-quick: $(STAMP)
	$(PYTEST) -n $(QUICK_WORKERS) --dist worksteal -m "not slow and not frameworks"

## The suite RUNS times while two busy loops keep both cores loaded (scripts/stress_tests.py).
RUNS ?= 5
test-stress: $(STAMP)
	$(BIN)/python scripts/stress_tests.py --runs $(RUNS) -- -n $(WORKERS) --dist worksteal

## What depends on the openai major, on openai 2.x (the SDK on plain httpx, which crewai,
## llama-index and mirascope pin): the openai faces, sync and async, the stock SDK on our
## clients, and the native client's openai types. The raw transports and anthropic's face
## do not change with openai: `make test` runs them.
OA2_TESTS := $(filter-out tests/integrations/test_transport.py \
	tests/integrations/test_sdk_catalogue_anthropic.py, $(wildcard tests/integrations/test_*.py))
test-openai2: $(OA2_STAMP)
	$(OA2_VENV)/bin/python -m pytest -n $(WORKERS) --dist worksteal $(OA2_TESTS) \
		tests/client/test_client.py

## The recipe per framework (docs/frameworks.md) against the fault server, in two venvs:
## openai 3 (the frameworks extra) and openai 2 (frameworks-openai2).
test-frameworks: $(FW_STAMP) $(FW2_STAMP)
	$(FW_VENV)/bin/python -m pytest -m frameworks tests/frameworks
	$(FW2_VENV)/bin/python -m pytest -m frameworks tests/frameworks

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
	rm -rf $(VENV) $(FW_VENV) $(FW2_VENV) $(OA2_VENV) build dist .pytest_cache .mypy_cache .ruff_cache
