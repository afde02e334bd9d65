# The DTensor change on torch 2.14.1 (tools/build.py, tools/lint.py).
#
#   make build        .venv-stock (pip, stock torch) and .venv (an overlay of it with the change)
#   make export       dist/stack/NNNN-<slug>.{patch,md} and dist/stack.md; fails on the stack rules
#   make check-stack  per step: steps 1..k on stock torch, that step's tests (STEPS=a,b to pick)
#   make test         build, check-stack, then the tooling tests (tools/test)
#   make lint         ruff format, ruff, flake8 and mypy on what the change adds (linters in .venv-lint)
#   make format       ruff format's rewrites of what the change adds, into the new files and patches/
#   make audit        tools.audit, stock vs built, into reports/ (STRICT=1; OPS=... audits those
#                     OpInfos only, into .build/audit; PER_OP=N calls per op, SAMPLES=N per OpInfo)
#   make fuzz         the planner property test with 1,000 examples per op family (CI runs 50),
#                     its log in .build/fuzz.log
#   make bench        tools.bench, stock vs built, into .build/bench (RECORD=1: reports/bench.json;
#                     STRICT=1, BENCH=..., REPEATS=N, QUICK=1)
#   make results      the README's Results section from reports/*.json (tools/results.py)
#   make downstream   autoparallel's CPU acceptance tests: as it is on stock torch, and with
#                     downstream/autoparallel/ on torch with the stack, side by side; reproducers,
#                     the attention check and strategy-building time (AUTOPARALLEL=<checkout or git
#                     dir>, REV=<rev>, CHECKS=tests,reproducers,attention,timing, STRICT=1)
#   make clean        remove the venvs, .build, dist and the Python and linter caches

PYTHON ?= python3.11
VENV ?= .venv
STOCK_VENV ?= .venv-stock
LINT_VENV ?= .venv-lint
PIP_ARGS ?=

BUILD_TOOL = $(PYTHON) tools/build.py
VENV_ARGS = --venv $(VENV) --stock-venv $(STOCK_VENV)

.PHONY: build export check-stack test lint format fuzz audit bench results clean downstream

build:
	$(BUILD_TOOL) build $(VENV_ARGS) $(if $(PIP_ARGS),--pip-args "$(PIP_ARGS)") $(if $(FORCE),--force)

export: build
	$(BUILD_TOOL) export $(VENV_ARGS)

check-stack: build
	$(BUILD_TOOL) check-stack $(VENV_ARGS) $(if $(STEPS),--steps "$(STEPS)")

test: build
	$(BUILD_TOOL) check-stack $(VENV_ARGS)
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider tools/test

PROPERTY_TEST = test/distributed/tensor/test_strategy_planner_placements.py

fuzz: build
	@mkdir -p .build
	PYTORCH_HYPOTHESIS_PROFILE=debug $(VENV)/bin/python -m pytest -q -p no:cacheprovider \
		--hypothesis-show-statistics $(PROPERTY_TEST) > .build/fuzz.log 2>&1; status=$$?; \
		grep -E "::test_family| passing,|refused| passed| failed" .build/fuzz.log; exit $$status

audit: build
	$(VENV)/bin/python -m tools.audit --stock-python $(STOCK_VENV)/bin/python --built-python $(VENV)/bin/python \
		$(if $(STRICT),--strict) $(if $(OPS),--ops "$(OPS)") $(if $(PER_OP),--per-op $(PER_OP)) \
		$(if $(SAMPLES),--samples $(SAMPLES))

bench: build
	$(VENV)/bin/python -m tools.bench --stock-python $(STOCK_VENV)/bin/python --built-python $(VENV)/bin/python \
		--out $(if $(RECORD),reports/bench.json,.build/bench/bench.json) --work-dir .build/bench \
		$(if $(STRICT),--strict) $(if $(BENCH),--bench "$(BENCH)") $(if $(REPEATS),--repeats $(REPEATS)) $(if $(QUICK),--quick)

# The pinned linters live in their own venv, rebuilt when requirements/lint.txt changes.
$(LINT_VENV)/.installed: requirements/lint.txt
	rm -rf $(LINT_VENV)
	$(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/pip install -q --disable-pip-version-check $(PIP_ARGS) -r requirements/lint.txt
	touch $@

LINT_ARGS = --venv $(VENV) --stock-venv $(STOCK_VENV) --lint-venv $(LINT_VENV)

lint: build $(LINT_VENV)/.installed
	$(PYTHON) tools/lint.py $(LINT_ARGS)

# Not after `build`: a rebuild (patches/ or torch/ changed) would drop an edit in
# .venv not yet written back, which tools/lint.py --fix refuses to run over; the
# rebuild comes after it, to put the rewritten patches in .venv.
format: $(LINT_VENV)/.installed
	$(PYTHON) tools/lint.py --fix $(LINT_ARGS)
	$(BUILD_TOOL) build $(VENV_ARGS) $(if $(PIP_ARGS),--pip-args "$(PIP_ARGS)")

results: build
	$(VENV)/bin/python tools/results.py --stock-venv $(STOCK_VENV)

# Without AUTOPARALLEL the tool says how to get the snapshot and exits 2 (no build first).
downstream: $(if $(AUTOPARALLEL),build)
	$(PYTHON) tools/downstream.py run $(if $(AUTOPARALLEL),--autoparallel "$(AUTOPARALLEL)") $(VENV_ARGS) \
		$(if $(REV),--rev "$(REV)") $(if $(CHECKS),--checks "$(CHECKS)") $(if $(STRICT),--strict)

clean:
	rm -rf $(VENV) $(STOCK_VENV) $(LINT_VENV) .build dist .pytest_cache .mypy_cache .ruff_cache
	find tools test torch -name __pycache__ -prune -exec rm -rf {} +
