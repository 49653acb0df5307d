"""Parsl's own MPI-mode tests (``parsl/tests/test_htex/mpi/test_mpi_mode_enabled.py``, shipped with
Parsl) run against a parsl-torch site config instead of the config they load themselves: Parsl's
apps, unpinned, with the resource specifications Parsl's guide writes, on 4 nodes the block reads
from a node file (as Parsl's tests mock a PBS job's), through parsl-torch's executors and worker pool."""

from __future__ import annotations

import pytest

from parsl_torch import sites

from .conftest import REPO

parsl_mpi = pytest.importorskip("parsl.tests.test_htex.mpi.test_mpi_mode_enabled")

pytestmark = pytest.mark.slow

#: Parsl's tests that differ on purpose: a site config runs an app without a resource specification as
#: an ordinary one-process app (an MPIExecutor alone refuses it), so Parsl's code runs on it unchanged
DIFFERS = {"test_missing_resource_spec": "an app without a resource specification runs as one process here"}


@pytest.fixture(scope="module")
def site_config(tmp_path_factory):
    import parsl

    tmp = tmp_path_factory.mktemp("parsl-mpi")
    nodefile = tmp / "nodefile"
    nodefile.write_text("".join(f"node-{i}\n" for i in range(4)))  # echoed, never reached: no app runs mpiexec
    (tmp / "parslmpi.yaml").write_text(f"name: parslmpi\nscheduler: local\nstrategy_period: 0.5\n"
                                       f"provider:\n  worker_init: 'export PBS_NODEFILE={nodefile}'\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARSL_TORCH_SITE_PATH", str(tmp))
        mp.setenv("PYTHONPATH", str(REPO))
        mp.chdir(tmp)
        with parsl.load(sites.load("parslmpi").parsl_config(run_dir=str(tmp / "runinfo"))):
            assert parsl_mpi.get_env_vars(parsl_resource_specification={"num_nodes": 1, "ranks_per_node": 1}) \
                .result(timeout=120)  # the block is up before Parsl's tests time their results
            yield


@pytest.mark.parametrize("name", sorted(n for n in vars(parsl_mpi) if n.startswith("test_") and n not in DIFFERS))
def test_parsls_own_mpi_mode_tests_on_a_site_config(name, site_config):
    getattr(parsl_mpi, name)()
