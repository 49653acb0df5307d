# Two commands do everything on a fresh machine:
#   make demo   install into .venv and run the main job: train -> evaluate on the local site
#   make test   install into .venv (with the test extras) and run every test (3 at a time, then the alone ones)
#   make test-fast   the tests without multi-process jobs (the edit-test loop)
#   make test-times  the last make test per test file: wall time, and how much of it was work
#   make docs   build the manual (docs/) into site/ (CI runs it)
#   make gpu-check   on a GPU machine: doctor, the gpu tests, the main job and bench_gpu, one log each
#   make test-lowest   the fast tests, a 2-rank workflow and the multi-rank wrap tests with the lowest versions
#                      pyproject.toml allows (.ci/lowest.txt), in .venv-lowest (CI runs it)
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

# exit 0 when the torch installed satisfies the requirement given (pip's own packaging reads it)
TORCH_KEPT := $(BIN)/python -c "import sys, importlib.metadata as m; from pip._vendor.packaging.requirements import Requirement; r = Requirement(sys.argv[1]); sys.exit(not (r.name == 'torch' and r.specifier.contains(m.version('torch'), prereleases=True)))"

# a request without TORCH_INDEX keeps a torch that satisfies it (one installed from another index:
# make demo TORCH_INDEX=... then make test must not fetch PyPI's build over it)
$(TORCH_STAMP): | $(BIN)/python
	rm -f $(VENV)/.torch-*
	$(if $(TORCH_INDEX),,$(TORCH_KEPT) '$(TORCH)' 2>/dev/null ||) $(BIN)/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	touch $@

$(VENV)/.installed-demo: pyproject.toml $(TORCH_STAMP) | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[mpi,workflow,history]"
	touch $@

$(VENV)/.installed-test: pyproject.toml $(TORCH_STAMP) | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[mpi,workflow,history,test,endpoint,float8,loaders,sweeps]"
	touch $@

demo: $(VENV)/.installed-demo
	$(RUN) $(BIN)/parsl-torch run workflows/train_eval.py

# tests at a time: a test alone mostly waits (a process's start, a scheduler's poll, a timeout), so
# more tests than cores overlap until the cores are full (on 2 cores: about 1.7x, docs/testing.md);
# what shares a machine-wide resource runs in one worker (conftest.py)
TEST_JOBS ?= 3
PARALLEL := -n $(TEST_JOBS) --dist loadgroup

# the package's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (as on CI's machine) every
# rank, shim and pool would compile it again (compileall skips what is up to date)
COMPILE := $(BIN)/python -m compileall -q src

test: $(VENV)/.installed-test
	$(COMPILE)
	$(RUN) $(BIN)/python -m pytest $(PARALLEL) -m "not alone" --timings-json=test-times.json
	$(RUN) $(BIN)/python -m pytest -m alone --timings-json=test-times-alone.json

# the per-file table of the last make test: wall time, and how much of it the cores worked
# (the tests run side by side, then those that need the machine alone)
test-times:
	$(BIN)/python tests/timings.py test-times.json test-times-alone.json

# the edit-test loop: no multi-process jobs, no cluster (a few minutes)
test-fast: $(VENV)/.installed-test
	$(COMPILE)
	$(RUN) $(BIN)/python -m pytest $(PARALLEL) -m "not slow and not multinode and not gpu"

$(VENV)/.installed-docs: pyproject.toml $(TORCH_STAMP) | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[docs]"
	touch $@

# the manual (docs/, mkdocs.yml) into site/; --strict: a broken link or a missing page fails
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(RUN) $(BIN)/mkdocs build --strict --site-dir site

LOWEST := .venv-lowest
# its own target: .ci/run installs it while make test runs
$(LOWEST)/.installed: pyproject.toml .ci/lowest.txt
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install -q --upgrade pip
	$(LOWEST)/bin/python -m pip install -q -c .ci/lowest.txt torch
	$(LOWEST)/bin/python -m pip install -q -c .ci/lowest.txt -e ".[mpi,workflow,history,globus,wandb,test]"
	touch $@

test-lowest: $(LOWEST)/.installed
	PATH="$(CURDIR)/$(LOWEST)/bin:$$PATH" $(LOWEST)/bin/python -m pytest -p no:cacheprovider $(PARALLEL) \
		-m "not slow and not multinode" tests/
	PATH="$(CURDIR)/$(LOWEST)/bin:$$PATH" $(LOWEST)/bin/python -m pytest -p no:cacheprovider $(PARALLEL) \
		"tests/test_workflow.py::test_train_eval_workflow_then_rerun_does_no_training" \
		"tests/test_multirank.py::test_two_ranks_topology_ddp_fsdp_tp[mpiexec]" \
		"tests/test_layouts.py::test_pipeline_schedules_on_two_ranks_follow_one_process" \
		"tests/test_checkpoints.py::test_resumed_on_fewer_ranks_the_global_batch_and_the_losses_stay_those_of_the_planned_ranks" \
		"tests/test_history.py::test_wandb_offline_writes_its_run_directory" \
		"tests/test_ezpz_compat.py::test_setup_wandb_as_ezpz_offline" \
		"tests/test_accelerators.py::test_ranks_that_claim_one_device_are_all_refused_and_ranks_with_their_own_pass"

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
