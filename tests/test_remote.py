"""Globus Compute: command construction, result handling, credentials, endpoint
configs, and whole workflows through the endpoint's own engine.

The Globus web service cannot be reached from here; everything on the endpoint
side runs for real: the local site's rendered endpoint config is read by the
endpoint's own loader, its GlobusMPIEngine is started (``sites.engine``), tasks
are packed with the SDK's serializer and results unpacked as the SDK does. Only
the service's hop is left out. Client is a Mock where one is needed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

import parsl_torch as pt
from parsl_torch import remote, sites
from parsl_torch.cli import main as cli
from parsl_torch.errors import ConfigError, StageError
from parsl_torch.sites.endpoint import endpoint_config
from parsl_torch.sites.engine import LocalEndpoint
from parsl_torch.stages.evaluate import evaluate
from parsl_torch.stages.train import train

from .conftest import BIN, REPO

SMALL = {"steps": 20, "checkpoint_every": 10, "log_every": 10,
         "model": {"dim": 32, "n_heads": 2, "n_layers": 1, "seq_len": 16}}
SMALL_EVAL = {"model": SMALL["model"], "batches": 2}


#: the Parsl the endpoint's engine needs (globus-compute-endpoint 4.19): older in the lowest-versions run
ENDPOINT_PARSL = (2026, 7, 27)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The endpoint's engine for the local site, started once for this module."""
    import parsl

    if tuple(int(x) for x in parsl.__version__.split(".")[:3]) < ENDPOINT_PARSL:
        pytest.skip(f"globus-compute-endpoint needs parsl >= {'.'.join(map(str, ENDPOINT_PARSL))}")
    with pytest.MonkeyPatch.context() as mp:  # the engine starts its interchange by name
        mp.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
        mp.setenv("PYTHONPATH", str(REPO))  # test functions travel by reference to this module
        with LocalEndpoint(endpoint_config(sites.load("local").spec, sys.prefix),
                           tmp_path_factory.mktemp("engine")) as endpoint:
            yield endpoint


TWO_RANKS = {"num_nodes": 1, "ranks_per_node": 2, "num_ranks": 2}


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    # a ShellFunction writes <hash>.stdout/.stderr into the working directory: not the repository's
    monkeypatch.chdir(tmp_path)


def test_stage_command_carries_only_data_without_braces():
    cmd = remote.stage_command("train", {"steps": 5, "model": {"dim": 8}}, {"history": "/r/t.h5"}, python="py")
    assert cmd.startswith("py -m parsl_torch.launch.supervise --ranks 0 -- $PARSL_MPI_PREFIX py -m "
                          "parsl_torch.launch.shim -- py -m parsl_torch.stages.train --config-b64 "), cmd
    assert "{" not in cmd and "}" not in cmd and cmd.endswith("--history /r/t.h5")
    with pytest.raises(ConfigError, match="stage 'finetune' cannot run remotely"):
        remote.stage_command("finetune", {}, {})


def test_a_remote_stage_is_launched_as_a_local_one_with_the_machines_flags():
    """Polaris's binding after the launcher the engine sets ($PARSL_MPI_PREFIX), the supervisor around
    it (timeout, ranks, the environment file with the machine's rank variables), the shim around each rank."""
    from parsl_torch.launch.machines import get_machine

    flags = get_machine("polaris").binding_args(4)
    cmd = remote.stage_command("train", {"steps": 5}, {"history": "/r/t.h5"}, python="py", launcher_args=flags,
                               num_ranks=8, env_file="/r/.env.json", timeout=600)
    assert cmd.startswith(f"py -m parsl_torch.launch.supervise --env-file /r/.env.json --timeout 600 --ranks 8 -- "
                          f"$PARSL_MPI_PREFIX {' '.join(flags)} py -m parsl_torch.launch.shim -- py -m "
                          f"parsl_torch.stages.train "), cmd
    with pytest.raises(ConfigError, match="contains braces"):
        remote.stage_command("train", {}, {}, launcher_args=("--cpu-bind={0}",))


def test_failed_shell_result_names_stage_and_shows_stderr():
    result = mock.Mock(returncode=3, stdout="", stderr="Traceback...\nValueError: boom\n")
    with pytest.raises(StageError, match=r"(?s)stage 'train' failed on the endpoint with exit code 3.*boom"):
        remote.parse_result("train", result)
    assert remote.parse_result("train", {"returncode": 0, "stdout": 'log\n{"final_loss": 1.5}\n'}) == {
        "final_loss": 1.5}
    from parsl_torch.common.outcome import Cause, Outcome

    killed = Outcome(Cause.RANK_FAILED, 137, "rank 1 on n2 was killed by SIGKILL", rank=1, host="n2")
    with pytest.raises(StageError, match=r"^stage 'train' failed on the endpoint with exit code 3: rank 1 on n2 "
                                         r"was killed by SIGKILL\n"):
        remote.parse_result("train", result, killed)


@pytest.mark.slow
def test_mpifunction_runs_stages_on_two_real_ranks_of_the_endpoints_engine(tmp_path, engine):
    stages = remote.RemoteStages(engine.executor(), str(tmp_path / "remote"), python=sys.executable)
    (tmp_path / "remote" / "train").mkdir(parents=True)
    (tmp_path / "remote" / "evaluate").mkdir(parents=True)
    trained = stages.submit("train", SMALL, {"history": "train.h5", "checkpoint": "model.pt"}, ranks_per_node=2,
                            rank_env={"PARSL_TORCH_GPU_ORDER": "1,0"}).result(timeout=300)
    assert trained["world_size"] == 2 and Path(trained["checkpoint"]).exists()
    assert trained["checkpoint"] == str(tmp_path / "remote" / "train" / "model.pt")
    assert set(trained["history_summary"]["loss"]) == {"last", "min", "max", "mean", "of"}
    assert "PARSL_TORCH_GPU_ORDER" in (tmp_path / "remote" / "train" / ".env.json").read_text()
    evaluated = stages.submit("evaluate", SMALL_EVAL, {"checkpoint": trained["checkpoint"],
                                                       "history": "eval.h5"}, ranks_per_node=2).result(300)
    assert evaluated["trained_steps"] == 20 and 0 <= evaluated["eval_acc"] <= 1


@pytest.mark.slow
def test_probe_runs_on_the_endpoints_mpi_engine(engine):
    """The engine refuses a task without a resource specification: the probe gives one."""
    found, warnings = remote.probe(engine.executor())
    assert found["parsl-torch"] == pt.__version__ and found["python"] == sys.version.split()[0]
    assert warnings == []


def test_version_mismatches_are_warned():
    warnings = remote.compare_versions({"python": "3.11.7", "parsl-torch": "0.1.0", "parsl": "2026.1.1"},
                                       {"python": "3.10.1", "parsl-torch": "0.0.9"})
    assert any("python 3.11.7 here but 3.10.1" in w for w in warnings)
    assert any("parsl-torch 0.1.0 here but 0.0.9" in w for w in warnings)
    assert any("parsl 2026.1.1 here but missing" in w for w in warnings)


def gc_site(tmp_path, monkeypatch):
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "gclab.yaml").write_text(yaml.safe_dump({
        "name": "gclab", "scheduler": "globus", "description": "test endpoint (FAKE executor)",
        "launch": {"ranks_per_node": 2},
        "globus": {"endpoint_id": "6f3a8b52-0000-4000-8000-000000000000",
                   "remote_run_dir": str(tmp_path / "remote"), "python": sys.executable,
                   "user_endpoint_config": {"account": "MyProj", "nodes": 1}}}))
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path / "sites"))
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.slow
def test_workflow_runs_unchanged_on_a_globus_site(tmp_path, monkeypatch, engine):
    gc_site(tmp_path, monkeypatch)
    executor = engine.executor()
    submitted = []
    monkeypatch.setattr(engine, "submit", _recording(engine.submit, submitted))
    with pt.workflow(site="gclab", run_dir=tmp_path / "run", gc_executor=executor):
        t = train(SMALL)
        e = evaluate(SMALL_EVAL, inputs=[t.outputs[1]])
        trained, evaluated = t.result(), e.result()
    remote_train = tmp_path / "remote" / "run" / "train"
    assert trained["checkpoint"] == str(remote_train / "model.pt") and (remote_train / "train.h5").exists()
    assert evaluated["trained_steps"] == 20
    assert t.outputs[1].result().filepath == str(remote_train / "model.pt")
    # each stage's records in its own remote directory (evaluate's are not beside the checkpoint it reads)
    assert (remote_train / ".env.json").exists() and (tmp_path / "remote" / "run" / "evaluate" / ".env.json").exists()
    # multi-rank stages asked the MPI engine for the stage's ranks
    assert submitted[0] == TWO_RANKS
    assert not (tmp_path / "run" / "train").exists()  # nothing of the stage is written locally


@pytest.mark.slow
def test_workflow_functions_are_refused_on_a_globus_site(tmp_path, monkeypatch, engine):
    gc_site(tmp_path, monkeypatch)

    @pt.distributed_app
    def mine():
        return 1

    with pt.workflow(site="gclab", run_dir=tmp_path / "run", gc_executor=engine.executor()):
        with pytest.raises(ConfigError, match="only the built-in stages run"):
            mine()


def test_executor_factory_with_a_mock_client():
    client = mock.Mock()
    executor = remote.make_executor("6f3a8b52-0000-4000-8000-000000000000", client=client,
                                    user_endpoint_config={"account": "MyProj"})
    try:
        assert str(executor.endpoint_id) == "6f3a8b52-0000-4000-8000-000000000000"
        assert executor.user_endpoint_config == {"account": "MyProj"}
    finally:
        executor.shutdown(wait=False)


def test_credentials(tmp_path):
    Client = mock.Mock(name="Client")  # never the real one: it would call the web service
    env = {"HOME": str(tmp_path), "GLOBUS_COMPUTE_CLIENT_ID": "id", "GLOBUS_COMPUTE_CLIENT_SECRET": "s3cret"}
    assert remote.make_client(client_class=Client, env=env, interactive=False) is Client.return_value
    with pytest.raises(ConfigError, match="no Globus credentials and no terminal") as err:
        remote.make_client(client_class=Client, env={"HOME": str(tmp_path)}, interactive=False)
    with pytest.raises(ConfigError, match="GLOBUS_COMPUTE_CLIENT_SECRET is not set") as half:
        remote.make_client(client_class=Client, env={"HOME": str(tmp_path), "GLOBUS_COMPUTE_CLIENT_ID": "id"},
                           interactive=False)
    assert "s3cret" not in str(err.value) + str(half.value)
    (tmp_path / ".globus_compute").mkdir()
    (tmp_path / ".globus_compute" / "storage.db").touch()  # an earlier login
    assert remote.make_client(client_class=Client, env={"HOME": str(tmp_path)}, interactive=False)


def test_cli_probe_without_credentials_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("GLOBUS_COMPUTE_CLIENT_ID", raising=False)
    monkeypatch.delenv("GLOBUS_COMPUTE_CLIENT_SECRET", raising=False)
    monkeypatch.setattr(sys, "stdin", open(os.devnull))
    assert cli(["remote", "probe", "--endpoint", "6f3a8b52-0000-4000-8000-000000000000"]) == 2
    assert capsys.readouterr().err.startswith("parsl-torch: error: no Globus credentials")


@pytest.mark.parametrize("name, provider, launcher", [("aurora", "PBSProProvider", "mpiexec"),
                                                      ("polaris", "PBSProProvider", "mpiexec"),
                                                      ("frontier", "SlurmProvider", "srun")])
def test_endpoint_configs_follow_the_site_files(name, provider, launcher, capsys):
    assert cli(["sites", "endpoint-config", name, "--account", "MyProj", "--python-env", "/envs/pt"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    engine = config["engine"]
    site = sites.load(name, account="MyProj").spec
    assert engine["type"] == "GlobusMPIEngine" and engine["mpi_launcher"] == launcher
    assert engine["provider"]["type"] == provider and engine["provider"]["account"] == "MyProj"
    assert engine["provider"]["launcher"] == {"type": "SimpleLauncher"}
    assert engine["provider"]["nodes_per_block"] == site.provider.nodes_per_block
    assert "source /envs/pt/bin/activate" in engine["provider"]["worker_init"]
    assert engine["address"]["ifname"] == site.address_interface


def test_endpoint_and_parsl_configs_share_one_worker_init(tmp_path, monkeypatch, capsys):
    """Environment values are quoted the same way in both (one builder)."""
    from parsl_torch.sites.build import worker_init

    (tmp_path / "mine.yaml").write_text("name: mine\nscheduler: pbs\nprovider: {account: A, worker_init: 'cd $HOME'}\n"
                                        "environment: {TMPDIR: '/tmp/my dir; touch PWNED'}\n")
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path))
    assert cli(["sites", "endpoint-config", "mine", "--python-env", "/envs/pt"]) == 0
    engine_init = yaml.safe_load(capsys.readouterr().out)["engine"]["provider"]["worker_init"]
    assert engine_init == worker_init(sites.load("mine").spec, "/envs/pt")
    assert engine_init.splitlines() == ['export PARSL_TORCH_BLOCK_END="$(( $(date +%s) + 3600 ))" PARSL_TORCH_GRACE=180',
                                        "cd $HOME", "export TMPDIR='/tmp/my dir; touch PWNED'"]


def _recording(submit, into: list):
    def record(fn, *args, resource_specification=None, **kwargs):
        into.append(dict(resource_specification or {}))
        return submit(fn, *args, resource_specification=resource_specification, **kwargs)

    return record


@pytest.mark.slow
def test_failures_come_back_from_the_engine_as_the_sdk_raises_them(engine):
    """An exception in the task, a result over the service's 10 MB limit, a task without ranks:
    each an error Result from the endpoint, raised as the SDK's TaskExecutionFailed."""
    from globus_compute_sdk.errors import TaskExecutionFailed

    def boom():  # defined here: it travels by value, as a function of a user's script does
        raise ValueError("boom on the endpoint")

    def too_big():
        return "x" * (11 * 1024 * 1024)

    for fn, spec, says in ((boom, TWO_RANKS, "ValueError: boom on the endpoint"),
                           (too_big, TWO_RANKS, "MaxResultSizeExceeded"),
                           (remote.versions, {}, "MPI mode requires")):
        with pytest.raises(TaskExecutionFailed, match=says):
            engine.submit(fn, resource_specification=spec).result(timeout=120)


@pytest.mark.slow
def test_a_rank_killed_on_the_endpoint_is_named_in_the_stage_error(tmp_path, monkeypatch):
    """The ranks run under the shim on the endpoint too: the failed rank and how it ended reach the error."""
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PARSL_TORCH_FAULT", "kill@1:5")  # the engine's block inherits it, as a worker_init would
    with LocalEndpoint(endpoint_config(sites.load("local").spec, sys.prefix), tmp_path / "engine") as endpoint:
        stages = remote.RemoteStages(endpoint.executor(), str(tmp_path / "remote"), python=sys.executable)
        (tmp_path / "remote" / "train").mkdir(parents=True)
        with pytest.raises(StageError, match=r"^stage 'train' failed on the endpoint with exit code \d+: rank 1 on \S+ "
                                             r"was killed by SIGKILL"):
            stages.submit("train", SMALL, {"history": "t.h5", "checkpoint": "m.pt"}, ranks_per_node=2).result(300)


@pytest.mark.slow
def test_endpoint_test_starts_the_sites_engine_and_runs_a_two_rank_smoke_stage(engine, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    assert cli(["endpoint", "test", "local", "--run-dir", str(tmp_path / "et")]) == 0
    out = capsys.readouterr().out
    assert "ok: site local: the endpoint's loader built GlobusMPIEngine over LocalProvider (mpi_launcher mpiexec)" \
        in out, out
    assert "ok: 2-rank smoke stage" in out and "all_reduce sum 3.0 (expected 3) over 2 ranks (gloo)" in out, out
    assert (tmp_path / "et" / "smoke.h5").is_file()


def test_endpoint_test_of_a_site_without_a_scheduler_is_one_line(tmp_path, monkeypatch, capsys):
    gc_site(tmp_path, monkeypatch)
    assert cli(["endpoint", "test", "gclab"]) == 2
    assert capsys.readouterr().err.startswith("parsl-torch: error: site 'gclab' (globus) has no scheduler")
