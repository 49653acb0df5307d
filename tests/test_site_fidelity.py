"""The facility site files against what the facilities publish.

Each row: a setting, the value its source gives (or ours, where the file says
"differs:" and why), and the source. The rows are checked where a user meets
them: the built parsl.Config, the rendered batch script, the environment of a
stage's ranks and of ``parsl-torch launch``'s ranks, and the Globus Compute
endpoint config. Changing a listed setting in a site file fails a test here.
"""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from parsl_torch import sites
from parsl_torch.cli import main as cli
from parsl_torch.launch.plan import LaunchRequest, plan_launch
from parsl_torch.sites.build import worker_init

ALCF_PARSL_AURORA = "ALCF docs/aurora/workflows/parsl.md"
ALCF_JOBS_AURORA = "ALCF docs/aurora/running-jobs-aurora.md"
ALCF_CCL = "ALCF docs/aurora/data-science/frameworks/oneCCL.md, minimal set"
ALCF_TORCH_AURORA = "ALCF docs/aurora/data-science/frameworks/pytorch.md"
ALCF_PARSL_POLARIS = "ALCF docs/polaris/workflows/parsl.md"
ALCF_GPUS_POLARIS = "ALCF docs/polaris/running-jobs/using-gpus.md, set_affinity_gpu_polaris.sh"
GC_POLARIS = "globus-compute docs/endpoints/configs/polaris.yaml, PR #1780"
OLCF_TORCH = "OLCF software/analytics/pytorch_frontier.rst"
OLCF_GUIDE = "OLCF systems/frontier_user_guide.rst"
OLCF_PARSL = "OLCF software/workflows/parsl.rst"

#: (site, variable, value, source): exported to every rank, on every path
RANK_ENV = [
    ("aurora", "CCL_PROCESS_LAUNCHER", "pmix", ALCF_CCL),
    ("aurora", "CCL_ATL_TRANSPORT", "mpi", ALCF_CCL),
    ("aurora", "CCL_KVS_MODE", "mpi", ALCF_CCL),
    ("aurora", "FI_MR_CACHE_MONITOR", "userfaultfd", ALCF_CCL),
    ("aurora", "ZE_FLAT_DEVICE_HIERARCHY", "FLAT", ALCF_TORCH_AURORA),
    ("aurora", "TMPDIR", "/tmp", ALCF_PARSL_AURORA),
    ("polaris", "TMPDIR", "/tmp", ALCF_PARSL_POLARIS),
    ("frontier", "NCCL_SOCKET_IFNAME", "hsn0", OLCF_TORCH),
    ("frontier", "MIOPEN_USER_DB_PATH", "/tmp/miopen-cache", OLCF_TORCH),
    ("frontier", "MIOPEN_CUSTOM_CACHE_DIR", "/tmp/miopen-cache", OLCF_TORCH),
]

#: (site, executor, attribute path on the built Parsl executor, value, source)
PARSL = [
    ("aurora", "mpi", "provider.queue", "debug", ALCF_JOBS_AURORA),
    ("aurora", "mpi", "provider.scheduler_options", "#PBS -l filesystems=home:flare", ALCF_PARSL_AURORA),
    ("aurora", "mpi", "provider.cpus_per_node", 208, ALCF_PARSL_AURORA),
    ("aurora", "mpi", "address", "address-of-hsn0", ALCF_PARSL_AURORA),
    ("polaris", "mpi", "address", "address-of-hsn0", GC_POLARIS),
    ("polaris", "htex", "address", "address-of-hsn0", GC_POLARIS),
    ("polaris", "htex", "cpu_affinity", "list:24-31,56-63:16-23,48-55:8-15,40-47:0-7,32-39", ALCF_PARSL_POLARIS),
    ("polaris", "htex", "available_accelerators", ["0", "1", "2", "3"], ALCF_PARSL_POLARIS),
    ("polaris", "htex", "provider.launcher.overrides", "--depth=64 --ppn 1", ALCF_PARSL_POLARIS),
    ("polaris", "mpi", "provider.scheduler_options", "#PBS -l filesystems=home:eagle", "ALCF docs/running-jobs"),
    ("polaris", "mpi", "provider.select_options", "ngpus=4", ALCF_PARSL_POLARIS),
    ("frontier", "mpi", "address", "address-of-hsn0", OLCF_PARSL),
    ("frontier", "mpi", "provider.scheduler_options", "#SBATCH --network=disable_rdzv_get", OLCF_TORCH),
    ("frontier", "htex", "cpu_affinity",
     "list:49-55,113-119:57-63,121-127:17-23,81-87:25-31,89-95:1-7,65-71:9-15,73-79:33-39,97-103:41-47,105-111",
     OLCF_GUIDE),
]


@pytest.fixture
def interfaces(monkeypatch):
    """Stand in for the facility's network interface (this machine has no hsn0)."""
    import parsl.addresses

    monkeypatch.setattr(parsl.addresses, "address_by_interface", lambda ifname: f"address-of-{ifname}")


def built(name, **overrides):
    config = sites.load(name, account="MyProj", **overrides).parsl_config(run_dir="runinfo")
    return {e.label: e for e in config.executors}


def attr(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("site, executor, path, value, source", PARSL, ids=lambda v: str(v)[:30])
def test_parsl_config_follows_the_source(interfaces, site, executor, path, value, source):
    got = attr(built(site)[executor], path)
    if isinstance(got, str) and "\n" in got:  # SlurmProvider adds its own #SBATCH lines
        got = next((line for line in got.splitlines() if line == value), got)
    assert got == value, source


@pytest.mark.parametrize("site, var, value, source", RANK_ENV, ids=lambda v: str(v)[:30])
def test_batch_script_and_endpoint_export_the_rank_environment(site, var, value, source, capsys):
    line = f"export {var}={value}"
    spec = sites.load(site, account="MyProj").spec
    assert line in worker_init(spec).splitlines(), source  # the block's workers, and so every stage's ranks
    assert cli(["sites", "render", site, "--account", "MyProj"]) == 0
    assert line in capsys.readouterr().out.splitlines(), source
    assert cli(["sites", "endpoint-config", site, "--account", "MyProj", "--python-env", "/envs/pt"]) == 0
    endpoint = yaml.safe_load(capsys.readouterr().out)["engine"]["provider"]["worker_init"]
    assert line in endpoint.splitlines(), source


JOBS = {  # a job on each machine, as its scheduler describes it to the ranks
    "aurora": ({"PBS_JOBID": "1.aurora-pbs"}, "x4102c5s2b0n0"),
    "polaris": ({"PBS_JOBID": "1.polaris-pbs"}, "x3004c0s7b0n0"),
    "frontier": ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "frontier[00010-00011]"}, "frontier00010"),
}


def launch_env(site, tmp_path, monkeypatch):
    """What `parsl-torch launch` exports to the ranks in a job on ``site`` (as the CLI builds it)."""
    env, hostname = JOBS[site]
    env = {**env, "PATH": os.environ["PATH"]}
    if "PBS_JOBID" in env:
        (tmp_path / "nodes").write_text("n1\nn2\n")
        env["PBS_NODEFILE"] = str(tmp_path / "nodes")
    monkeypatch.setattr(sites, "detect", lambda h=None, e=None, _d=sites.detect: _d(hostname, env))
    plan = plan_launch(LaunchRequest(("python", "train.py")), sites.detect_job(env, hostname), env,
                       python=sys.executable)
    return {**sites.rank_environment(env, hostname), **plan.env}, plan


@pytest.mark.parametrize("site, var, value, source", RANK_ENV, ids=lambda v: str(v)[:30])
def test_launch_exports_the_rank_environment(site, var, value, source, tmp_path, monkeypatch, fake_bin):
    env, _ = launch_env(site, tmp_path, monkeypatch)
    assert env[var] == value, source


def test_a_value_the_user_set_wins_over_the_site_file():
    env = {"NCCL_SOCKET_IFNAME": "hsn0,hsn1", "LMOD_SYSTEM_NAME": "frontier"}
    assert "NCCL_SOCKET_IFNAME" not in sites.rank_environment(env, "frontier00010")
    assert sites.rank_environment({}, "laptop") == {}


def test_polaris_ranks_use_the_gpu_closest_to_their_cores(tmp_path, monkeypatch):
    from parsl_torch.core.device import device_index

    env, plan = launch_env("polaris", tmp_path, monkeypatch)
    assert "--cpu-bind" in plan.argv and plan.argv[plan.argv.index("--depth") + 1] == "8"
    order = env["PARSL_TORCH_GPU_ORDER"]  # ALCF: gpu = num_gpus - 1 - local_rank
    assert [device_index(r, 4, order) for r in range(4)] == [3, 2, 1, 0], ALCF_GPUS_POLARIS
    assert sites.load("polaris", account="X").rank_env() == {"PARSL_TORCH_GPU_ORDER": order}
    assert device_index(1, 2, order) == 1  # a narrowed CUDA_VISIBLE_DEVICES keeps the plain order
    assert device_index(5, 8, None) == 5


def test_aurora_binds_ranks_per_socket_and_uses_pmix(tmp_path, monkeypatch):
    from parsl_torch.launch.machines import aurora_cpu_list

    _, plan = launch_env("aurora", tmp_path, monkeypatch)
    assert "--pmi=pmix" in plan.argv, ALCF_TORCH_AURORA  # "mpiexec --pmi=pmix --envall"
    assert aurora_cpu_list(12) == "list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100"
    assert aurora_cpu_list(6) == "list:1-16:17-32:33-48:53-68:69-84:85-100", ALCF_JOBS_AURORA
    for ppn in range(1, 13):  # never a block across the sockets (cores 0 and 52 are the system's)
        blocks = [tuple(map(int, b.split("-"))) for b in aurora_cpu_list(ppn)[5:].split(":")]
        assert len(blocks) == ppn and all(lo <= hi and (hi <= 51 or lo >= 53) and lo >= 1 for lo, hi in blocks)
        assert "--depth" not in plan.argv


def test_aurora_submits_one_job_to_debug_by_default(interfaces):
    # ALCF: debug takes "Max 1 job running/accruing/queued per-user": a second executor's qsub is refused
    assert set(built("aurora")) == {"mpi"}
    spec = sites.load("aurora", account="X").spec
    assert spec.htex.accelerators == tuple(str(i) for i in range(12))  # FLAT: 12 devices, 0..11
    mine = sites.Site(spec.__class__(**{**spec.__dict__, "htex": spec.htex.__class__(
        **{**spec.htex.__dict__, "enabled": True, "queue": "capacity"})}), sites.load("aurora").path)
    executors = {e.label: e for e in mine.parsl_config(run_dir="runinfo").executors}
    assert (executors["mpi"].provider.queue, executors["htex"].provider.queue) == ("debug", "capacity")


def test_every_facility_setting_names_its_source():
    # each file lists its sources; a setting with a value (not null) carries a comment or sits under one
    for name in ("aurora", "polaris", "frontier"):
        text = sites.load(name).path.read_text()
        assert "Every setting names its source" in text
        for key in ("address_interface", "queue", "scheduler_options", "worker_init", "cpu_affinity"):
            line = next(line for line in text.splitlines() if line.strip().startswith(f"{key}:"))
            above = text.splitlines()[text.splitlines().index(line) - 1]
            assert "#" in line or above.strip().startswith("#"), f"{name}: {key} has no source"


def test_sites_show_says_where_each_setting_comes_from(monkeypatch, capsys):
    monkeypatch.setenv("PARSL_TORCH_ACCOUNT", "FromEnv")
    assert cli(["sites", "show", "aurora", "--queue", "debug-scaling"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if not line.startswith("#")}
    assert lines["account"].endswith("# environment PARSL_TORCH_ACCOUNT")
    assert "  queue: debug-scaling  # argument" in out
    assert lines["cpus_per_node"].endswith("# file aurora.yaml")
    assert lines["strategy_period"].endswith("# default")
    assert lines["CCL_KVS_MODE"].endswith("# file aurora.yaml")
    assert "#   CCL_PROCESS_LAUNCHER=pmix  (file aurora.yaml)" in out  # what the ranks get
    assert "(machine aurora): --pmi=pmix --cpu-bind list:1-8:9-16" in out
    assert yaml.safe_load(out)["provider"]["queue"] == "debug-scaling"  # still YAML


@pytest.mark.slow
def test_a_stage_rank_gets_the_site_environment_and_the_machine_variables(tmp_path, monkeypatch):
    import parsl_torch as pt

    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "polarislike.yaml").write_text(
        "name: polarislike\nscheduler: local\nmachine: polaris\nstrategy_period: 0.5\n"
        "environment: {NCCL_NET: 'AWS Libfabric', TMPDIR: /tmp}\n"
        "launch: {ranks_per_node: 2, extra_args: []}\n")  # no --depth: this mpiexec is hydra
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path / "sites"))
    monkeypatch.chdir(tmp_path)

    @pt.distributed_app
    def rank_env():
        import os

        return {k: os.environ.get(k) for k in ("NCCL_NET", "TMPDIR", "PARSL_TORCH_GPU_ORDER")}

    with pt.workflow(site="polarislike", run_dir="runs/env"):
        got = rank_env().result(timeout=180)
    assert got == {"NCCL_NET": "AWS Libfabric", "TMPDIR": "/tmp", "PARSL_TORCH_GPU_ORDER": "3,2,1,0"}
