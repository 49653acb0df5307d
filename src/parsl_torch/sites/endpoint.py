"""Globus Compute endpoint configs made from a batch site's file, so the
endpoint asks for the same nodes, with the same worker_init, as the site.

Install on the machine (login node)::

    python -m venv ~/parsl-torch-env && . ~/parsl-torch-env/bin/activate
    pip install parsl-torch[workflow,globus] globus-compute-endpoint   (and your site's torch)
    globus-compute-endpoint configure parsl-torch
    parsl-torch sites endpoint-config aurora --account MyProj > ~/.globus_compute/parsl-torch/config.yaml
    globus-compute-endpoint start parsl-torch
"""

from __future__ import annotations

from typing import Any

from ..errors import SiteError
from ..launch.schedulers import get_scheduler
from .build import worker_address, worker_init
from .capacity import stages_at_once
from .schema import SiteSpec


def endpoint_config(spec: SiteSpec, python_env: str) -> dict[str, Any]:
    """The endpoint's config.yaml as data: a GlobusMPIEngine over the site's provider."""
    scheduler = get_scheduler(spec.scheduler)
    if not scheduler.endpoint_provider:
        raise SiteError(f"site {spec.name!r} ({spec.scheduler}) has no scheduler to put behind an endpoint: "
                        f"use aurora, polaris, frontier, local, or a site of your own with pbs or slurm")
    p = spec.provider
    raw = scheduler.provider_options(p)
    options = {k: v for k, v in raw.items() if v is not None}
    provider: dict[str, Any] = {
        "type": scheduler.endpoint_provider,
        **options,
        **({"account": p.account or "YOUR_ACCOUNT"} if "account" in raw else {}),
        "nodes_per_block": p.nodes_per_block,
        "init_blocks": 0,  # no job until a stage arrives
        "min_blocks": 0,
        "max_blocks": p.max_blocks,
        "worker_init": worker_init(spec, python_env, stage_python=True),
        "launcher": {"type": "SimpleLauncher"},  # the MPI engine launches ranks itself
    }
    engine: dict[str, Any] = {"type": "GlobusMPIEngine", "mpi_launcher": spec.mpi.launcher,
                              "max_workers_per_block": stages_at_once(spec, shared=False),
                              "provider": provider}
    how = worker_address(spec)
    if how is not None:
        engine["address"] = {"type": "address_by_interface", "ifname": how[1]} if how[0] == "interface" else how[1]
    return {"display_name": f"parsl-torch-{spec.name}", "engine": engine}


def io_endpoint_config(spec: SiteSpec) -> dict[str, Any]:
    """The config of the endpoint beside a site's (``globus.io_endpoint_id``): threads of the endpoint's own
    process, on the machine's login node, where a sweep's looks at its trials' files run at once (on the MPI
    engine they would wait for a node, held by the trials)."""
    return {"display_name": f"parsl-torch-{spec.name}-io", "engine": {"type": "ThreadPoolEngine", "max_workers": 2}}


def render_endpoint_config(spec: SiteSpec, python_env: str, io: bool = False) -> str:
    import yaml

    if io:
        header = (f"# Globus Compute endpoint for the files of parsl-torch's stages on {spec.name}: a sweep's\n"
                  f"# looks at its trials run here (globus.io_endpoint_id in the remote site's file).\n"
                  f"# Start it on a login node from {python_env} (it runs in the endpoint's own process:\n"
                  f"# parsl-torch must be installed there).\n")
        return header + yaml.safe_dump(io_endpoint_config(spec), sort_keys=False)
    header = (f"# Globus Compute endpoint for parsl-torch on {spec.name}, made from its site file.\n"
              f"# worker_init activates {python_env}: it must hold parsl-torch, parsl, torch and\n"
              f"# globus-compute-endpoint of the same versions as the submitting side\n"
              f"# (check with: parsl-torch remote probe --endpoint <id>).\n")
    return header + yaml.safe_dump(endpoint_config(spec, python_env), sort_keys=False)
