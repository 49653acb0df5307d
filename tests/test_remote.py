"""Globus Compute: command construction, result handling, credentials, endpoint
configs, and whole workflows against injected executors.

FAKES, and why: the Globus web service cannot be reached from here, so no real
endpoint or Client is ever used. The executor is either a ProcessPoolExecutor
(real pickling, real MPIFunction, real mpiexec ranks) or
tests/fakes/globus.FakeGlobusExecutor (globus-compute's own serializer and a
fresh subprocess per task). Client is a Mock wherever one is needed.
"""

from __future__ import annotations

import concurrent.futures
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
from parsl_torch.stages.evaluate import evaluate
from parsl_torch.stages.train import train

from .conftest import BIN
from .fakes.globus import FakeGlobusExecutor

SMALL = {"steps": 20, "checkpoint_every": 10, "log_every": 10,
         "model": {"dim": 32, "n_heads": 2, "n_layers": 1, "seq_len": 16}}
SMALL_EVAL = {"model": SMALL["model"], "batches": 2}


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    # a ShellFunction writes <hash>.stdout/.stderr into the working directory: not the repository's
    monkeypatch.chdir(tmp_path)


def test_stage_command_carries_only_data_without_braces():
    cmd = remote.stage_command("train", {"steps": 5, "model": {"dim": 8}}, {"history": "/r/t.h5"}, python="py")
    assert cmd.startswith("py -m parsl_torch.stages.train --config-b64 ")
    assert "{" not in cmd and "}" not in cmd and cmd.endswith("--history /r/t.h5")
    with pytest.raises(ConfigError, match="stage 'finetune' cannot run remotely"):
        remote.stage_command("finetune", {}, {})


def test_failed_shell_result_names_stage_and_shows_stderr():
    result = mock.Mock(returncode=3, stdout="", stderr="Traceback...\nValueError: boom\n")
    with pytest.raises(StageError, match=r"(?s)stage 'train' failed on the endpoint with exit code 3.*boom"):
        remote.parse_result("train", result)
    assert remote.parse_result("train", {"returncode": 0, "stdout": 'log\n{"final_loss": 1.5}\n'}) == {
        "final_loss": 1.5}


@pytest.mark.slow
def test_mpifunction_runs_stages_on_two_real_ranks(tmp_path, monkeypatch):
    # ProcessPoolExecutor: the MPIFunction is pickled and run in another
    # process, where $PARSL_MPI_PREFIX (as an MPI engine sets it) is the venv's mpiexec
    monkeypatch.setenv("PARSL_MPI_PREFIX", f"{BIN / 'mpiexec'} -n 2")
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        stages = remote.RemoteStages(pool, str(tmp_path / "remote"), python=sys.executable)
        (tmp_path / "remote" / "train").mkdir(parents=True)
        (tmp_path / "remote" / "evaluate").mkdir(parents=True)
        trained = stages.submit("train", SMALL, {"history": "train.h5", "checkpoint": "model.pt"},
                                ranks_per_node=2).result(timeout=300)
        assert trained["world_size"] == 2 and Path(trained["checkpoint"]).exists()
        assert trained["checkpoint"] == str(tmp_path / "remote" / "train" / "model.pt")
        assert set(trained["history_summary"]["loss"]) == {"last", "min", "max", "mean", "of"}
        evaluated = stages.submit("evaluate", SMALL_EVAL, {"checkpoint": trained["checkpoint"],
                                                           "history": "eval.h5"}, ranks_per_node=2).result(300)
        assert evaluated["trained_steps"] == 20 and 0 <= evaluated["eval_acc"] <= 1


@pytest.mark.slow
def test_probe_through_the_globus_serializer_in_a_fresh_process():
    executor = FakeGlobusExecutor()
    try:
        found, warnings = remote.probe(executor)
    finally:
        executor.shutdown()
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
def test_workflow_runs_unchanged_on_a_globus_site(tmp_path, monkeypatch):
    gc_site(tmp_path, monkeypatch)
    executor = FakeGlobusExecutor()
    with pt.workflow(site="gclab", run_dir=tmp_path / "run", gc_executor=executor):
        t = train(SMALL)
        e = evaluate(SMALL_EVAL, inputs=[t.outputs[1]])
        trained, evaluated = t.result(), e.result()
    remote_train = tmp_path / "remote" / "run" / "train"
    assert trained["checkpoint"] == str(remote_train / "model.pt") and (remote_train / "train.h5").exists()
    assert evaluated["trained_steps"] == 20
    assert t.outputs[1].result().filepath == str(remote_train / "model.pt")
    # multi-rank stages asked the MPI engine for the stage's ranks
    assert executor.submitted[0]["resource_specification"] == {"num_nodes": 1, "ranks_per_node": 2, "num_ranks": 2}
    assert not (tmp_path / "run" / "train").exists()  # nothing of the stage is written locally


def test_workflow_functions_are_refused_on_a_globus_site(tmp_path, monkeypatch):
    gc_site(tmp_path, monkeypatch)

    @pt.distributed_app
    def mine():
        return 1

    with pt.workflow(site="gclab", run_dir=tmp_path / "run", gc_executor=FakeGlobusExecutor()):
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
