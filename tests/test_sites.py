"""Sites: YAML files -> real parsl.Config objects, rendered batch scripts,
real execution on the local site, a real Slurm and a FAKE PBS."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsl_torch import sites
from parsl_torch.cli import main as cli
from parsl_torch.errors import ConfigError, SiteError
from parsl_torch.sites.schema import parse_site

HERE = Path(__file__).parent
TEST_SITES = HERE / "sites"
GOLDEN = HERE / "golden"
FAKE_PBS = HERE / "fakes" / "pbs"


def build(name, **overrides):
    """The parsl.Config of a shipped site, without the network interface this
    machine lacks (hsn0, bond0)."""
    site = sites.load(name, account="MyProj", **overrides)
    spec = dataclasses.replace(site.spec, address_interface=None)
    return sites.Site(spec, site.path).parsl_config(run_dir="runinfo")


def executors(config):
    return {e.label: e for e in config.executors}


def test_shipped_sites_load_and_auto_picks_local_here():
    assert set(sites.available()) >= {"aurora", "polaris", "frontier", "local"}
    choice = sites.detect(hostname="vm", env={})
    assert choice.name == "local" and "matches no site" in choice.reason
    assert sites.detect(hostname="x4102c5s2b0n0", env={}).name == "aurora"
    assert sites.detect(hostname="x3004c0s7b0n0", env={}).name == "polaris"
    assert sites.detect(hostname="frontier04242", env={}).name == "frontier"
    assert sites.detect(hostname="x", env={"PARSL_TORCH_SITE": "polaris"}).reason == "PARSL_TORCH_SITE=polaris"


def test_local_site_keeps_idle_parsl_processes_quiet(tmp_path):
    # the ranks of a laptop run need the cores: Parsl's processes wake 10x/s, not 100x/s
    local = executors(sites.load("local").parsl_config(run_dir=tmp_path))
    assert local["mpi"].poll_period == local["htex"].poll_period == 100
    assert executors(build("aurora"))["mpi"].poll_period == 10  # Parsl's default where cores are plenty


def test_the_local_sites_workers_connect_back_over_the_loopback_alone(tmp_path):
    """CI, stop 93: a local workflow's pool connected through the test cluster's bridge (one of the host's
    addresses Parsl offers it), which the cluster test deleted: the result was lost, the workflow waited 120 s
    (reproduced: the bridge deleted under a stage, 123 s against 14 s)."""
    local = executors(sites.load("local").parsl_config(run_dir=tmp_path))
    assert {e.address for e in local.values()} == {"127.0.0.1"}
    for e in local.values():  # (the pool's `-a`, nothing else to try: a set, or a comma-joined string in Parsl 2026.01)
        tried = e.all_addresses
        assert set(tried.split(",") if isinstance(tried, str) else tried) == {"127.0.0.1"}
    assert executors(build("frontier"))["mpi"].address is None  # (nodes elsewhere: Parsl's every address)


def test_sites_address_interface_is_checked(monkeypatch):
    with pytest.raises(SiteError, match="network interface 'hsn0' .* does not exist on this host"):
        sites.load("aurora", account="X").parsl_config()


def test_loading_runs_no_scheduler_command(tmp_path, monkeypatch):
    # SlurmProvider runs sacct when constructed: load must not construct it
    marker = tmp_path / "sacct-ran"
    (tmp_path / "sacct").write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    (tmp_path / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    site = sites.load("frontier", account="X")
    assert not marker.exists()
    sites.Site(dataclasses.replace(site.spec, address_interface=None), site.path).parsl_config()
    assert marker.exists()


def test_overrides_from_arguments_env_and_cli(monkeypatch, capsys):
    monkeypatch.setenv("PARSL_TORCH_ACCOUNT", "FromEnv")
    monkeypatch.setenv("PARSL_TORCH_NODES", "3")
    site = sites.load("aurora", queue="prod")
    assert (site.spec.provider.account, site.spec.provider.queue, site.spec.provider.nodes_per_block) == (
        "FromEnv", "prod", 3)
    assert sites.load("aurora", account="FromArg").spec.provider.account == "FromArg"
    assert cli(["sites", "show", "aurora", "--walltime", "00:30:00"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["provider"]["walltime"] == "00:30:00" and shown["provider"]["account"] == "FromEnv"


def test_sites_alone_lists_them_and_show_says_what_the_ranks_get_even_when_nothing(capsys):
    from parsl_torch.cli.commands import main as cli

    assert cli(["sites"]) == 0
    listed = capsys.readouterr().out
    assert "local" in listed and "aurora" in listed and "auto picks" in listed
    assert cli(["sites", "show", "local"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert not shown[-1].endswith(":"), shown[-1]  # no header with nothing under it
    assert any("exported to every rank" in line for line in shown)


def normalized(script: str) -> str:
    script = re.sub(r"parsl\.(mpi|htex)\.block-0\.\d+(\.\d+)?", r"parsl.\1.block-0.<time>", script)
    return script.replace(sys.prefix, "<python_env>")


@pytest.mark.parametrize("name", ["aurora", "polaris", "frontier"])
def test_rendered_batch_scripts_match_golden_files(name, capsys):
    assert cli(["sites", "render", name, "--account", "MyProj"]) == 0
    golden = GOLDEN / f"{name}.mpi.sh"
    rendered = normalized(capsys.readouterr().out)
    if os.environ.get("PARSL_TORCH_UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert rendered == golden.read_text()


def test_aurora_render_shows_account_queue_and_filesystems():
    script = sites.load("aurora", account="MyProj").render()
    assert script.startswith("# Parsl would submit this with: qsub  -q debug -A MyProj <script_dir>/")
    assert "#PBS -l select=2:ncpus=208" in script and "#PBS -l filesystems=home:flare" in script


@pytest.mark.parametrize("args, needle", [
    (["sites", "render", "aurora"], "provider.account is required to render a batch script"),
    (["sites", "show", "nope"], "unknown site 'nope': known sites are aurora, frontier, local, polaris"),
    (["sites", "render", "local"], "submits no batch script of its own (local)"),
    (["sites", "show", "aurora", "--walltime", "1h"], "provider.walltime: '1h' is not HH:MM:SS"),
    (["sites", "show", "aurora", "--nodes", "0"], "nodes: must be at least 1"),
])
def test_cli_site_errors_are_one_line_exit_2(args, needle, capsys):
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


@pytest.mark.parametrize("text, needle", [
    ("name: mine\nscheduler: pbs\nprovider:\n  acount: X\n", "provider.acount: unknown setting; did you mean 'account'?"),
    ("name: mine\nscheduler: pbs\nprovider:\n  nodes_per_block: two\n",
     "provider.nodes_per_block: expected int, got str 'two'"),
    ("name: mine\nscheduler: lsf\n", "scheduler: 'lsf' is not one of pbs, slurm, local"),
    ("name: mine\n", "scheduler: required setting is missing"),
    ("name: mine\nscheduler: pbs\nhtex: [1, 2]\n", "htex: expected a mapping of settings, got list"),
    ("name: mine\nscheduler: pbs\nprovider:\n  walltime: 3600\n", "provider.walltime: expected str, got int 3600 (quote it)"),
    ("name: mine\nscheduler: pbs\npoll_period_ms: 0\n", "poll_period_ms: must be > 0 and at most 60000 milliseconds, got 0"),
    ("name: mine\nscheduler: pbs\nstrategy_period: .inf\n", "strategy_period: must be > 0 and at most 3600 seconds, got inf"),
    ("name: mine\nscheduler: pbs\nstrategy_period: .nan\n", "strategy_period: must be > 0 and at most 3600 seconds, got nan"),
    ("name: mine\nscheduler: pbs\nprovider: {account: 'lab; touch PWNED #'}\n", "provider.account: 'lab; touch PWNED #' is not a valid name here"),
    ("name: mine\nscheduler: slurm\nprovider: {queue: \"debug\\n#SBATCH --x\"}\n", "provider.queue: 'debug\\n#SBATCH --x' is not a valid name here"),
    ("name: mine\nscheduler: pbs\nhostnames: ['x[']\n", "hostnames[0]: 'x[' is not a regular expression"),
    ("name: mine\nscheduler: slurm\nprovider: {nodes_per_block: 3}\nmpi: {spare_nodes: 1}\n",
     "mpi.spare_nodes: a spare takes over from a lost node in the same job, but slurm ends a job that loses a node: "
     "add provider.survive_node_loss: true"),
    ("name: other\nscheduler: pbs\n", "name: 'other' differs from the file name; use name: mine"),
    ("name: mine\nscheduler: pbs\n  bad: indent\n", "is not valid YAML"),
    ("name: mine\nscheduler: pbs\nprovider: {account: A}\nprovider: {queue: debug}\n",
     "line 4: the key 'provider' is given a second time (first on line 3), and only the last would count"),
    ("- just\n- a list\n", "expected a mapping of settings at the top, got list"),
    ("name: mine\nscheduler: pbs\nenvironment:\n  'X=1; touch PWNED; Y': v\n",
     "environment.X=1; touch PWNED; Y: not a variable name"),
    ("name: mine\nscheduler: pbs\nmachine: summit\n", "machine: 'summit' is not one of aurora, sunspot"),
    ("name: mine\nscheduler: globus\nglobus: {endpoint_id: e, remote_run_dir: /r, python: /opt/py/bin/python}\n",
     "globus.python: no longer a setting: stages run under the Python of the endpoint's engine"),
    ("name: mine\nscheduler: globus\nglobus: {endpoint_id: e, remote_run_dir: /r, io_endpoint_id: e}\n",
     "globus.io_endpoint_id: the site's own endpoint, whose MPI engine runs a task only on the nodes the trials hold"),
])
def test_bad_site_files_name_file_and_field(tmp_path, monkeypatch, text, needle):
    (tmp_path / "mine.yaml").write_text(text)
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path))
    with pytest.raises(SiteError) as err:
        sites.load("mine", account="X")
    assert str(err.value).startswith(str(tmp_path / "mine.yaml"))
    assert needle in str(err.value)


@pytest.mark.parametrize("scheduler, line", [("slurm", "#SBATCH --no-kill"),
                                             ("pbs", "#PBS -W tolerate_node_failures=all")])
def test_a_site_whose_jobs_survive_a_lost_node_says_so_to_its_scheduler_and_min_nodes_needs_it(
        tmp_path, monkeypatch, scheduler, line):
    from parsl_torch.apps.session.placement import Placement

    base = f"name: mine\nscheduler: {scheduler}\nprovider: {{account: A, nodes_per_block: 3"
    (tmp_path / "mine.yaml").write_text(base + ", scheduler_options: '# mine'}\n")
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path))
    plain = sites.load("mine")
    assert line not in plain.render() and "# mine" in plain.render()
    with pytest.raises(ConfigError, match=rf"stage 'train': min_nodes=2 goes on with the nodes its block has left, "
                                          rf"but {scheduler} ends a block's job when a node dies: set "
                                          rf"provider.survive_node_loss: true in site 'mine'"):
        Placement(plain, "mpi", pool=True).check_min_nodes("train", 2, 3)
    Placement(plain, "mpi", pool=True).check_min_nodes("train", 3, 3)  # (all its nodes: nothing to go on with)
    (tmp_path / "mine.yaml").write_text(base + ", scheduler_options: '# mine', survive_node_loss: true}\n"
                                        "mpi: {spare_nodes: 1}\n")
    surviving = sites.load("mine")
    assert line in surviving.render() and "# mine" in surviving.render()
    Placement(surviving, "mpi", pool=True).check_min_nodes("train", 2, 3)


def test_user_site_directory_adds_and_overrides(tmp_path, monkeypatch):
    (tmp_path / "local.yaml").write_text("name: local\nscheduler: local\nlocal_slots: 5\n")
    (tmp_path / "mycluster.yaml").write_text(
        "name: mycluster\nscheduler: slurm\nhostnames: ['^mc-login']\nprovider:\n  account: A\n")
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path))
    assert sites.load("local").spec.local_slots == 5  # the user's file wins over the shipped one
    assert sites.detect(hostname="mc-login1").name == "mycluster"
    assert sites.load("auto", env={**os.environ, "PARSL_TORCH_SITE": "mycluster"}).name == "mycluster"


VALID = yaml.safe_load((HERE.parent / "site_configs" / "aurora.yaml").read_text())
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 300), st.floats(allow_nan=True),
                    st.text(max_size=12))
data = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                    max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(data, st.builds(lambda section, key, value: {**VALID, section: {**(VALID.get(section) or {}),
                                                                              key: value}}
                                 if isinstance(VALID.get(section), dict) else {**VALID, section: value},
                                 st.sampled_from(list(VALID)), st.text(max_size=16), data)))
def test_fuzzed_site_data_gives_a_site_or_a_site_error(value):
    try:
        parse_site(value, "fuzz.yaml")
    except SiteError as exc:
        assert str(exc).startswith("fuzz.yaml: ")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_fuzzed_yaml_text_gives_a_site_or_a_site_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "fuzzed.yaml"
    path.write_text(text)
    try:
        sites.read_spec(path)
    except SiteError:
        pass


# -- real execution -------------------------------------------------------------
def run_on_site(site_name, tmp_path):
    """A python app on htex (if the site has it) and a 2-rank MPI bash app.

    Parsl ships these apps by reference to this module: the callers put the
    repository on the workers' PYTHONPATH so they can import it."""
    import platform

    import parsl
    from parsl import bash_app, python_app

    hostname = python_app(platform.node, executors=["htex"])

    @bash_app(executors=["mpi"])
    def two_ranks(parsl_resource_specification=None, stdout=None, stderr=None):
        # one write per line: unbuffered print() writes its pieces separately and ranks' lines merge
        return ('$PARSL_MPI_PREFIX python -c "import os, sys; sys.stdout.write(\'rank %s\\n\' % '
                'os.environ.get(\'PMI_RANK\', os.environ.get(\'SLURM_PROCID\')))"')

    @python_app
    def parsl_variables(parsl_resource_specification=None):  # noqa: ARG001 - Parsl reads it
        import os

        return {k: v for k, v in os.environ.items() if k.startswith("PARSL_") and not k.startswith("PARSL_TORCH")}

    config = sites.load(site_name).parsl_config(run_dir=str(tmp_path / "runinfo"))
    spec = {"num_nodes": 1, "ranks_per_node": 2, "num_ranks": 2}
    out = tmp_path / "mpi.out"
    with parsl.load(config):
        host = hostname().result(timeout=120) if "htex" in executors(config) else None
        assert two_ranks(parsl_resource_specification=spec, stdout=str(out),
                         stderr=str(tmp_path / "mpi.err")).result(timeout=240) == 0
        # Parsl's MPI variables for each way Parsl's guide writes a specification (no executors=: Parsl
        # routes the app to either executor), num_ranks filled in by Parsl where it is left out
        for given in ({"num_nodes": 1, "ranks_per_node": 2}, {"num_ranks": 2, "num_nodes": 1}, dict(spec)):
            seen = parsl_variables(parsl_resource_specification=given).result(timeout=240)
            assert (seen["PARSL_NUM_RANKS"], seen["PARSL_RANKS_PER_NODE"], seen["PARSL_NUM_NODES"]) == \
                ("2", "2", "1"), (given, seen)
            assert "-n 2 " in seen["PARSL_MPIEXEC_PREFIX"] and "--ntasks 2 " in seen["PARSL_SRUN_PREFIX"] and \
                "-n 2 " in seen["PARSL_APRUN_PREFIX"] and "None" not in repr(seen), (given, seen)
    return host, sorted(re.findall(r"rank \d", out.read_text()))


@pytest.fixture
def workers_import_tests(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))


@pytest.mark.slow
def test_local_site_runs_python_and_two_rank_mpi_apps(tmp_path, workers_import_tests):
    import socket

    host, ranks = run_on_site("local", tmp_path)
    assert host == socket.gethostname()
    assert ranks == ["rank 0", "rank 1"]


@pytest.mark.slow
def test_slurm_site_runs_a_real_batch_job(tmp_path, monkeypatch, slurm, workers_import_tests):
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(TEST_SITES))
    _, ranks = run_on_site("slurmlab", tmp_path)
    assert ranks == ["rank 0", "rank 1"]


@pytest.mark.slow
def test_pbs_site_end_to_end_against_fake_qsub(tmp_path, monkeypatch, workers_import_tests):
    # FAKE: no PBS server can be installed here; tests/fakes/pbs/qsub runs the
    # job script locally and qstat/qdel answer for it. Everything on Parsl's
    # side (PBSProProvider, MPIExecutor, the submit script) is real.
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(TEST_SITES))
    monkeypatch.setenv("PATH", f"{FAKE_PBS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PBS_DIR", str(tmp_path / "pbs"))
    _, ranks = run_on_site("pbslab", tmp_path)
    assert ranks == ["rank 0", "rank 1"]
    submitted = next((tmp_path / "pbs").glob("*.args")).read_text()
    assert submitted.startswith("-q debug -A lab ")


def test_a_site_file_that_is_not_utf8_is_one_clear_error(tmp_path, monkeypatch):
    (tmp_path / "latin.yaml").write_bytes("name: latin\nscheduler: local\ndescription: caf\xe9\n".encode("latin-1"))
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path))
    with pytest.raises(SiteError, match=r"latin.yaml: is not UTF-8 text \(byte \d+\): save it as UTF-8"):
        sites.load("latin")


def test_a_queue_s_limits_are_checked_when_the_config_is_built(tmp_path):
    """Polaris's debug queue takes 1-2 nodes for up to 1 h: 10 nodes for 3 h there is refused naming
    the queue that fits, instead of `qsub -q debug` rendered silently."""
    with pytest.raises(SiteError, match=r"provider.queue: queue 'debug' takes 1-2 nodes and at most 01:00:00 "
                                        r"\(queues.debug\), the blocks ask for 10 node\(s\), walltime 03:00:00: "
                                        r"use queue prod \(--queue\)"):
        sites.load("polaris", account="X", nodes=10, walltime="03:00:00")
    assert sites.load("polaris", account="X", nodes=10, walltime="03:00:00", queue="prod").spec.provider.queue == "prod"
    assert sites.load("polaris", account="X").spec.provider.queue == "debug"  # the file's own: 2 nodes, 1 h
    with pytest.raises(SiteError, match=r"queues.small: min_nodes \(4\) must be at least 1 and max_nodes \(2\)"):
        parse_site({"name": "x", "scheduler": "local", "queues": {"small": {"min_nodes": 4, "max_nodes": 2}}}, "x.yaml")
    with pytest.raises(SiteError, match=r"queues.small.max_nodes: expected int"):
        parse_site({"name": "x", "scheduler": "local", "queues": {"small": {"max_nodes": "two"}}}, "x.yaml")
