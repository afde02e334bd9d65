# Front door for the DTensor strategy-contract change (see tools/build.py).
#
#   make build            .venv (change applied) + .venv-stock (same pins, no change)
#   make refresh          turn in-place edits in .venv's torch into patches/ and torch/
#   make check-refreshed  fail if .venv holds edits the repo lacks
#   make export           dist/dtensor-strategy-contract.patch + dist/PR.md + dist/stack/ (the PR stack)
#   make export BASE=2.14.1  the stack rebased onto that release: dist/stack-2.14.1/
#   make check-stack      apply the stack step by step to stock torch, run each step's tests (STEPS=a,b; QUICK=1: the last
#                         step's tests are left to `make test`, as in CI)
#   make test             build, then run tools/test and test/distributed/tensor
#   make audit            build, then run tools.audit (STRICT=1, OPS=...)
#   make bench            build, then run tools.bench, stock vs built (STRICT=1, BENCH=..., REPEATS=N, QUICK=1)
#   make lint             ruff, flake8 and mypy on what the change touches (tools/lint.py; linters in .venv-lint)
#   make clean            remove both venvs and dist/

PYTHON ?= python3.11
VENV ?= .venv
STOCK_VENV ?= .venv-stock
PIP_ARGS ?=

BUILD_TOOL = $(PYTHON) tools/build.py
VENV_ARGS = --venv $(VENV) --stock-venv $(STOCK_VENV)
TEST_DIRS = tools/test $(wildcard test/distributed/tensor)

.PHONY: build refresh check-refreshed export check-stack test audit bench clean

build:
	$(BUILD_TOOL) build $(VENV_ARGS) $(if $(PIP_ARGS),--pip-args "$(PIP_ARGS)") $(if $(FORCE),--force)

refresh:
	$(BUILD_TOOL) refresh $(VENV_ARGS) $(if $(FORCE),--force)

check-refreshed:
	$(BUILD_TOOL) check-refreshed $(VENV_ARGS)

export:
	$(BUILD_TOOL) export $(VENV_ARGS) $(if $(BASE),--base $(BASE))

check-stack: build
	$(BUILD_TOOL) check-stack $(VENV_ARGS) $(if $(STEPS),--steps "$(STEPS)") $(if $(QUICK),--skip-final-tests)

test: build
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider $(TEST_DIRS)

audit: build
	$(VENV)/bin/python -m tools.audit --parity --stock-python $(STOCK_VENV)/bin/python --built-python $(VENV)/bin/python $(if $(STRICT),--strict) $(if $(OPS),--ops "$(OPS)")

bench: build
	$(VENV)/bin/python -m tools.bench --stock-python $(STOCK_VENV)/bin/python --built-python $(VENV)/bin/python $(if $(STRICT),--strict) $(if $(BENCH),--bench "$(BENCH)") $(if $(REPEATS),--repeats $(REPEATS)) $(if $(QUICK),--quick)

LINT_VENV ?= .venv-lint

.PHONY: lint

# The pinned linters live in their own venv, rebuilt when requirements/lint.txt changes.
$(LINT_VENV)/.installed: requirements/lint.txt
	rm -rf $(LINT_VENV)
	$(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/pip install -q --disable-pip-version-check $(PIP_ARGS) -r requirements/lint.txt
	touch $@

lint: build $(LINT_VENV)/.installed
	$(PYTHON) tools/lint.py --venv $(VENV) --lint-venv $(LINT_VENV)

clean:
	rm -rf $(VENV) $(STOCK_VENV) dist
