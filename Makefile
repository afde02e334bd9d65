# Front door for the DTensor strategy-contract change (see tools/build.py).
#
# Every target works on each release in RELEASES (default both: 2.14.1, the PR's base,
# and 2.13.0, the release patches/ is written against); RELEASES=2.14.1 for one.
#
#   make build            per release: a stock venv and a built one (2.13.0: .venv-stock, .venv;
#                         2.14.1: .venv-2.14.1-stock, and .venv-2.14.1, an overlay of it)
#   make refresh          turn in-place edits in .venv's torch into patches/ and torch/
#   make check-refreshed  fail if a built venv holds edits the repo lacks
#   make export           dist/dtensor-strategy-contract.patch + dist/PR.md + dist/stack/ (the 2.13.0 stack)
#   make export BASE=2.14.1  the stack rebased onto that release: dist/stack-2.14.1/
#   make check-stack      apply the stack step by step to each release's stock torch, run each step's tests
#                         (STEPS=a,b; QUICK=1: the last step's tests are left out)
#   make test             build, then per release the full check-stack (every contract test file once,
#                         at the step that adds it), then tools/test once
#   make audit            build, then run tools.audit per release (STRICT=1, OPS=...)
#   make bench            build, then run tools.bench per release, stock vs built (STRICT=1, BENCH=..., REPEATS=N, QUICK=1,
#                         CLOCK=wall: check wall time instead of each worker's CPU time; both are printed)
#   make bench-scaling    build, then per release the planner walk on meshes of 1-4 dims and 2/8 blocks,
#                         stock+repair, stock bare and built (tools.bench.scaling; REPEATS=N, CONFIGS=..., CAP=N, QUICK=1)
#   make lint             ruff, flake8 and mypy on what the change touches (tools/lint.py; linters in .venv-lint)
#   make clean            remove the venvs and dist/

PYTHON ?= python3.11
VENV ?= .venv
STOCK_VENV ?= .venv-stock
PIP_ARGS ?=
RELEASES ?= 2.14.1,2.13.0
PRIMARY = 2.13.0

BUILD_TOOL = $(PYTHON) tools/build.py
VENV_ARGS = --venv $(VENV) --stock-venv $(STOCK_VENV) --releases $(RELEASES)
RELEASE_LIST = $(subst $(comma), ,$(RELEASES))
comma = ,
# Per release: the built and stock interpreters, and the report-name suffix (none for 2.13.0).
built_python = $(if $(filter $(PRIMARY),$(1)),$(VENV),.venv-$(1))/bin/python
stock_python = $(if $(filter $(PRIMARY),$(1)),$(STOCK_VENV),.venv-$(1)-stock)/bin/python
rel_suffix = $(if $(filter $(PRIMARY),$(1)),,-$(1))

.PHONY: build refresh check-refreshed export check-stack test audit bench bench-scaling clean

build:
	$(BUILD_TOOL) build $(VENV_ARGS) $(if $(PIP_ARGS),--pip-args "$(PIP_ARGS)") $(if $(FORCE),--force)

refresh:
	$(BUILD_TOOL) refresh --venv $(VENV) --stock-venv $(STOCK_VENV) $(if $(FORCE),--force)

check-refreshed:
	$(BUILD_TOOL) check-refreshed $(VENV_ARGS)

export:
	$(BUILD_TOOL) export --venv $(VENV) --stock-venv $(STOCK_VENV) $(if $(BASE),--base $(BASE))

check-stack: build
	$(BUILD_TOOL) check-stack $(VENV_ARGS) $(if $(STEPS),--steps "$(STEPS)") $(if $(QUICK),--skip-final-tests)

test: build
	$(BUILD_TOOL) check-stack $(VENV_ARGS)
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider tools/test

audit: build
	$(foreach r,$(RELEASE_LIST),$(VENV)/bin/python -m tools.audit --stock-python $(call stock_python,$(r)) --built-python $(call built_python,$(r)) --report-name audit$(call rel_suffix,$(r)) --build-dir .build/audit$(call rel_suffix,$(r)) $(if $(STRICT),--strict) $(if $(OPS),--ops "$(OPS)") &&) true

bench: build
	$(foreach r,$(RELEASE_LIST),$(VENV)/bin/python -m tools.bench --stock-python $(call stock_python,$(r)) --built-python $(call built_python,$(r)) --out reports/bench$(call rel_suffix,$(r)).json --work-dir .build/bench$(call rel_suffix,$(r)) $(if $(STRICT),--strict) $(if $(BENCH),--bench "$(BENCH)") $(if $(REPEATS),--repeats $(REPEATS)) $(if $(QUICK),--quick) $(if $(CLOCK),--clock $(CLOCK)) &&) true

bench-scaling: build
	$(foreach r,$(RELEASE_LIST),$(VENV)/bin/python -m tools.bench.scaling --stock-python $(call stock_python,$(r)) --built-python $(call built_python,$(r)) --out reports/scaling$(call rel_suffix,$(r)).json --work-dir .build/scaling$(call rel_suffix,$(r)) $(if $(REPEATS),--repeats $(REPEATS)) $(if $(CONFIGS),--configs "$(CONFIGS)") $(if $(CAP),--cap $(CAP)) $(if $(QUICK),--quick) &&) true

LINT_VENV ?= .venv-lint

.PHONY: lint

# The pinned linters live in their own venv, rebuilt when requirements/lint.txt changes.
$(LINT_VENV)/.installed: requirements/lint.txt
	rm -rf $(LINT_VENV)
	$(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/pip install -q --disable-pip-version-check $(PIP_ARGS) -r requirements/lint.txt
	touch $@

# Per release: mypy resolves imports against that release's built torch, and the patched
# upstream files are judged on the lines its diffs add (2.14.1: the rebased change).
lint: build $(LINT_VENV)/.installed
	$(foreach r,$(RELEASE_LIST),$(PYTHON) tools/lint.py --venv $(if $(filter $(PRIMARY),$(r)),$(VENV),.venv-$(r)) $(if $(filter $(PRIMARY),$(r)),,--patches .venv-$(r)/.rebased-patches) --lint-venv $(LINT_VENV) &&) true

clean:
	rm -rf $(VENV) $(STOCK_VENV) .venv-2.14.1 .venv-2.14.1-stock dist
