# Two commands do everything on a fresh machine:
#   make demo   install into .venv and run the main job
#   make test   install into .venv (with test extras) and run the tests
# TORCH picks the torch build: the default is the CPU wheel used here; on a GPU
# machine use e.g. `make demo TORCH=torch` or preinstall your site's torch.

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
# Parsl, mpiexec and torchrun are found by name: the venv's bin goes first
RUN    := PATH="$(CURDIR)/$(BIN):$$PATH"

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[mpi,workflow,history,test]"
	touch $@

demo: $(VENV)/.installed
	$(RUN) $(BIN)/mpiexec -n 2 $(BIN)/python -m parsl_torch.demo

test: $(VENV)/.installed
	$(RUN) $(BIN)/python -m pytest

bench: $(VENV)/.installed
	$(RUN) $(BIN)/python benchmarks/bench_core.py
	$(RUN) $(BIN)/python benchmarks/bench_history.py
	$(RUN) $(BIN)/python benchmarks/bench_launch.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
