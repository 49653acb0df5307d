# Two commands do everything on a fresh machine:
#   make demo   install into .venv and run the main job: train -> evaluate on the local site
#   make test   install into .venv (with the test and docs extras), run every test: the alone ones 2 at a time, then the rest 3 at a time
#   make test-fast   the tests without multi-process jobs (the edit-test loop)
#   make test-times  the last make test per test file: wall time, and how much of it was work
#   make docs   build the manual (docs/) into site/ (CI runs it)
#   make gpu-check   on a GPU machine: doctor, the gpu tests, the main job and bench_gpu, one log each
#   make test-lowest   the fast tests and those marked lowest (a 2-rank workflow, the multi-rank wrap tests ...)
#                      with the lowest versions pyproject.toml allows (.ci/lowest.txt), in .venv-lowest (CI runs it)
# TORCH picks the torch build, from the package index pip uses (TORCH_INDEX: another index).
# On Linux, PyPI's torch==2.13.0 is the CUDA build (GBs); the CPU build is on PyTorch's CPU index:
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
# A change of TORCH or TORCH_INDEX installs that torch into the existing .venv; a request
# without TORCH_INDEX keeps an installed torch that satisfies TORCH.

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
BIN    := $(VENV)/bin
# which torch was asked for: a stamp per request, so that another request installs again
TORCH_STAMP := $(VENV)/.torch-$(shell printf '%s|%s' '$(TORCH)' '$(TORCH_INDEX)' | cksum | cut -d' ' -f1)
# Parsl, mpiexec and torchrun are found by name: the venv's bin goes first
RUN    := PATH="$(CURDIR)/$(BIN):$$PATH"

.PHONY: demo test test-times test-fast test-lowest docs bench gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# pip installs without compiling, then BYTECODE writes every module's bytecode on all cores at once (pip
# compiles one file after another: a third of an install's time); a file another Python's syntax fails
# (torch's py312 test helpers) is left without, as pip leaves it: compileall's status is not the install's
PIP = $(1)/bin/python -m pip install -q --no-compile
BYTECODE = $(1)/bin/python -m compileall -qq -j 0 $(1)/lib > /dev/null || true

# exit 0 when the torch installed satisfies the requirement given (pip's own packaging reads it)
TORCH_KEPT := $(BIN)/python -c "import sys, importlib.metadata as m; from pip._vendor.packaging.requirements import Requirement; r = Requirement(sys.argv[1]); sys.exit(not (r.name == 'torch' and r.specifier.contains(m.version('torch'), prereleases=True)))"

# a request without TORCH_INDEX keeps a torch that satisfies it (one installed from another index:
# make demo TORCH_INDEX=... then make test must not fetch PyPI's build over it)
$(TORCH_STAMP): | $(BIN)/python
	rm -f $(VENV)/.torch-*
	$(if $(TORCH_INDEX),,$(TORCH_KEPT) '$(TORCH)' 2>/dev/null ||) $(call PIP,$(VENV)) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	touch $@

$(VENV)/.installed-demo: pyproject.toml $(TORCH_STAMP) | $(BIN)/python
	$(call PIP,$(VENV)) -e ".[mpi,workflow,history]"
	$(call BYTECODE,$(VENV))
	touch $@

# with the docs extra: one pip run, one bytecode pass, and .ci/run builds the manual beside the tests
$(VENV)/.installed-test: pyproject.toml $(TORCH_STAMP) | $(BIN)/python
	$(call PIP,$(VENV)) -e ".[mpi,workflow,history,test,lint,endpoint,float8,loaders,sweeps,docs]"
	$(call BYTECODE,$(VENV))
	touch $@ $(VENV)/.installed-docs

demo: $(VENV)/.installed-demo
	$(RUN) $(BIN)/parsl-torch run workflows/train_eval.py

# tests at a time: a test alone mostly waits (a process's start, a scheduler's poll, a timeout), so
# more tests than cores overlap until the cores are full (on 2 cores: about 1.7x, docs/testing.md);
# what shares a machine-wide resource runs in one worker (conftest.py)
TEST_JOBS ?= 3
PARALLEL := -n $(TEST_JOBS) --dist loadgroup
# the tests that cannot run beside the whole suite (pyproject.toml's alone marker), before it: two at a time,
# each about half a core's work for two minutes (docs/testing.md), so that one's load is no other's wait
# (three at a time took longer: 147 s against 115 s); first, so that the half of the cores they leave idle
# can do other work (.ci/run installs the lowest versions' venv and builds the manual then)
ALONE := -n 2 --dist loadgroup

# the package's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (as on CI's machine) every
# rank, shim and pool would compile it again (compileall skips what is up to date)
COMPILE := $(BIN)/python -m compileall -q src

# make test runs as a Python does by default, writing the bytecode of what it imports (a stage's own modules:
# a module read through its cache is another path of the observer's); where PYTHONDONTWRITEBYTECODE is set
# (as on CI's machine), make test-fast and make test-lowest keep it, so CI runs both
AS_BY_DEFAULT := env -u PYTHONDONTWRITEBYTECODE

# pyflakes' rules over the whole tree (pyproject.toml's tool.ruff): seconds, before any test
LINT := $(BIN)/ruff check --quiet .

test: $(VENV)/.installed-test
	$(LINT)
	$(COMPILE)
	$(RUN) $(AS_BY_DEFAULT) $(BIN)/python -m pytest $(ALONE) -m alone --timings-json=test-times-alone.json
	$(RUN) $(AS_BY_DEFAULT) $(BIN)/python -m pytest $(PARALLEL) -m "not alone" --timings-json=test-times.json

# the per-file table of the last make test: wall time, and how much of it the cores worked
# (the tests run side by side, and those that need the machine alone, run before them)
test-times:
	$(BIN)/python tests/timings.py test-times.json test-times-alone.json

# the edit-test loop: no multi-process jobs, no cluster (a few minutes)
test-fast: $(VENV)/.installed-test
	$(LINT)
	$(COMPILE)
	$(RUN) $(BIN)/python -m pytest $(PARALLEL) -m "not slow and not multinode and not gpu"

$(VENV)/.installed-docs: pyproject.toml $(TORCH_STAMP) | $(BIN)/python
	$(call PIP,$(VENV)) -e ".[docs]"
	$(call BYTECODE,$(VENV))
	touch $@

# the manual (docs/, mkdocs.yml) into site/; --strict: a broken link or a missing page fails
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(RUN) $(BIN)/mkdocs build --strict --site-dir site

LOWEST := .venv-lowest
# its own target: .ci/run installs it while make test runs
$(LOWEST)/.installed: pyproject.toml .ci/lowest.txt
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install -q --upgrade pip
	$(call PIP,$(LOWEST)) -c .ci/lowest.txt torch
	$(call PIP,$(LOWEST)) -c .ci/lowest.txt -e ".[mpi,workflow,history,globus,wandb,test]"
	touch $@

# its bytecode, apart (pip installs without compiling): .ci/run writes it beside the alone tests, after the install
$(LOWEST)/.compiled: $(LOWEST)/.installed
	$(call BYTECODE,$(LOWEST))
	touch $@

test-lowest: $(LOWEST)/.compiled
	PATH="$(CURDIR)/$(LOWEST)/bin:$$PATH" $(LOWEST)/bin/python -m pytest -p no:cacheprovider $(PARALLEL) \
		-m "(not slow and not multinode) or lowest" tests/

bench: $(VENV)/.installed-test
	$(RUN) $(BIN)/python benchmarks/bench_core.py
	$(RUN) $(BIN)/python benchmarks/bench_history.py
	$(RUN) $(BIN)/python benchmarks/bench_launch.py
	$(RUN) $(BIN)/python benchmarks/bench_workflow.py
	$(RUN) $(BIN)/python benchmarks/bench_checkpoint.py
	$(RUN) $(BIN)/python benchmarks/bench_continuation.py
	$(RUN) $(BIN)/python benchmarks/bench_identity.py
	$(RUN) $(BIN)/python benchmarks/bench_remote.py
	$(RUN) $(BIN)/python benchmarks/bench_warm.py
	$(RUN) $(BIN)/python benchmarks/bench_packing.py
	$(RUN) $(BIN)/python benchmarks/bench_start.py
	@if $(BIN)/python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then \
		$(RUN) $(BIN)/python benchmarks/bench_gpu.py; else echo "bench_gpu skipped: no CUDA GPU here"; fi
	@if [ "$$(id -u)" = 0 ]; then for b in multinode node_loss preflight node_python; do \
		$(RUN) $(BIN)/python benchmarks/bench_$$b.py || exit 1; done; \
	else echo "bench_multinode, bench_node_loss, bench_preflight, bench_node_python skipped: the test cluster needs root"; fi

gpu-check: $(VENV)/.installed-test
	$(RUN) bash benchmarks/gpu_check.sh

clean:
	rm -rf $(VENV) $(LOWEST) build src/*.egg-info .pytest_cache runs
