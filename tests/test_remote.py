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
import subprocess
import sys
import tempfile
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


def _job(tmp_path, fn, ranks=2, **opts):
    """A function stage packed for the endpoint, as a workflow packs one."""
    from parsl_torch.apps.stage.call import StageCall
    from parsl_torch.apps.stage.options import ShippedFunction, StageOptions
    from parsl_torch.apps.remote.job import RemoteJob

    stage_dir = tmp_path / "remote" / fn.__name__
    env = (("PARSL_TORCH_STAGE_DIR", str(stage_dir)), ("PARSL_TORCH_GPU_ORDER", "1,0"))
    resources = (("num_nodes", 1), ("ranks_per_node", ranks), ("num_ranks", ranks))
    call = StageCall(StageOptions(str(stage_dir), 1, ranks, 120.0, env, (), **opts), "mpi", resources,
                     fn=ShippedFunction.of(fn))
    return RemoteJob(call, code=())


@pytest.mark.slow
def test_a_job_runs_its_function_on_two_real_ranks_of_the_endpoints_engine(tmp_path, engine):
    """The task launches the ranks as a local stage's worker does: the supervisor, the shim, the
    rank variables in the stage's 0600 environment file; rank 0's value comes back."""
    from parsl_torch.apps.remote.job import run_job

    def ranks(scale):  # defined here: it travels by value, as a function of a workflow script does
        import os

        import torch.distributed as dist

        return {"world": dist.get_world_size(), "value": scale * 2, "order": os.environ["PARSL_TORCH_GPU_ORDER"]}

    answer = engine.submit(run_job, _job(tmp_path, ranks), 21, resource_specification=TWO_RANKS).result(120)
    assert answer.result() == {"world": 2, "value": 42, "order": "1,0"} and answer.ran
    env_file = tmp_path / "remote" / "ranks" / ".env.json"
    assert env_file.stat().st_mode & 0o777 == 0o600
    again = engine.submit(run_job, _job(tmp_path, ranks), 21, resource_specification=TWO_RANKS).result(120)
    assert again.ran is None and again.result()["value"] == 42  # the same call: not run again
    other = engine.submit(run_job, _job(tmp_path, ranks), 1, resource_specification=TWO_RANKS).result(120)
    assert other.ran == "arguments changed" and other.result()["value"] == 2


@pytest.mark.slow
def test_a_failing_rank_and_an_oversized_result_come_back_as_the_stages_error(tmp_path, engine):
    from parsl_torch.apps.remote.job import run_job

    def killed():
        import os
        import signal

        import torch.distributed as dist

        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()

    def oversized():
        return b"x" * (11 * 1024 * 1024)

    answer = engine.submit(run_job, _job(tmp_path, killed), resource_specification=TWO_RANKS).result(120)
    with pytest.raises(StageError, match=r"^stage 'killed' failed: rank 1 on \S+ was killed by SIGKILL \(exit code"):
        answer.result()
    answer = engine.submit(run_job, _job(tmp_path, oversized), resource_specification=TWO_RANKS).result(120)
    with pytest.raises(StageError, match=r"stage 'oversized' returned 11.0 MiB, more than Globus Compute carries "
                                         r"back \(10 MiB\): write it to a file in outputs="):
        answer.result()
    assert not (tmp_path / "remote" / "oversized" / ".call.json").exists()  # not a result to skip on


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


def gc_site(tmp_path, monkeypatch, name="gclab", **globus):
    """A Globus Compute site whose endpoint writes under tmp_path/remote (its engine: the ``engine`` fixture)."""
    (tmp_path / "sites").mkdir(exist_ok=True)
    (tmp_path / "sites" / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "scheduler": "globus", "description": "test endpoint (the endpoint's engine, here)",
        "launch": {"ranks_per_node": 2},
        "globus": {"endpoint_id": "6f3a8b52-0000-4000-8000-000000000000",
                   "remote_run_dir": str(tmp_path / "remote"),
                   "user_endpoint_config": {"account": "MyProj", "nodes": 1}, **globus}}))
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path / "sites"))
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.slow
def test_a_sweep_through_an_endpoint_with_files_of_its_own_cuts_its_poor_trials(tmp_path, monkeypatch, engine):
    """``asha`` on a Globus Compute site whose files this machine cannot read: each look at the trials and
    each ruling is a task on the site's I/O endpoint (``globus.io_endpoint_id``: a ThreadPoolEngine, its
    config rendered by ``endpoint-config --io``); a cut trial stops at its rung, its files kept there;
    ``asha-promote`` pauses one there and promotes it, resumed from its checkpoint. A site without an I/O
    endpoint is refused before any trial starts."""
    from parsl_torch.apps.sweeps import trialfiles
    from parsl_torch.apps.sweeps.space import trial_name
    from parsl_torch.history.h5file import read_history
    from parsl_torch.sites import globus
    from parsl_torch.sites.endpoint import io_endpoint_config
    from parsl_torch.stages import checkpoint
    from parsl_torch.stages.sweep import _trial_files

    io_id = "0c1d2e3f-0000-4000-8000-000000000000"
    gc_site(tmp_path, monkeypatch, name="gcbare")
    gc_site(tmp_path, monkeypatch, name="gcnear", file_system="local")  # (on this machine's files: read here)
    gc_site(tmp_path, monkeypatch, io_endpoint_id=io_id)
    base = {"model": {"kind": "mlp", "vocab_size": 32, "dim": 32, "seq_len": 16}, "data": {"batch_size": 16},
            "checkpoint_every": 5, "log_every": 50}

    def here(*_args):  # what this machine cannot do: read the endpoint's files
        raise AssertionError("the workflow read a trial's directory itself")

    monkeypatch.setattr(trialfiles, "histories", here)
    monkeypatch.setattr(trialfiles.EndpointFiles, "poll_s", 0.5)  # (4 s through the service's rate limit)
    with LocalEndpoint(io_endpoint_config(sites.load("local").spec), tmp_path / "io") as io:
        looks = []

        def executor(endpoint_id, **_kwargs):
            assert endpoint_id == io_id
            inner = io.executor()
            submit = inner.submit
            inner.submit = lambda fn, *args: looks.append(fn.__name__) or submit(fn, *args)
            return inner

        monkeypatch.setattr(globus, "make_executor", executor)
        with pt.workflow(sites=["gclab", "gcbare", "gcnear"], run_dir=tmp_path / "run",
                         gc_executor=engine.executor()) as wf:
            assert isinstance(_trial_files(wf, "near", "gcnear"), trialfiles.LocalFiles)
            for scheduler in ("asha", "none"):  # (a grid too ranks its trials by their histories)
                with pytest.raises(ConfigError, match=r"pt.sweep: site 'gcbare' runs stages on a Globus Compute "
                                                      r"endpoint whose files this process cannot read .* give its "
                                                      r"site file globus.io_endpoint_id .*endpoint-config gcbare --io"):
                    pt.sweep({"lr": [5e-3]}, base=base, steps=15, min_steps=5, site="gcbare", ranks_per_node=1,
                             name="bare", scheduler=scheduler)
            assert not (tmp_path / "remote").exists() and not list(wf.run_dir.glob(".sweep.bare*"))
            # (the order trials start in: 5e-3 and 2e-5 first, then the two poor ones, which are cut at step 5)
            trials = pt.sweep({"lr": [5e-3, 1e-5, 2e-5, 3e-5]}, base=base, steps=15, min_steps=5, eta=3, window=2,
                              site="gclab", ranks_per_node=1)
            # asha-promote there: the middling trial (started second) pauses at step 5, the two worse ones
            # promote it, and the same call goes on from its checkpoint on the endpoint
            lrs, shift = [5e-3, 1e-4, 1e-5, 2e-6], 0
            while [c["lr"] for c in sorted(({"lr": lr, "log_every": 50 + i + shift} for i, lr in enumerate(lrs)),
                                             key=lambda c: trial_name("promote", c))][:2] != lrs[:2]:
                shift += 4
            promoted = pt.sweep([{"lr": lr, "log_every": 50 + i + shift} for i, lr in enumerate(lrs)], base=base,
                                steps=10, min_steps=5, eta=2, window=2, scheduler="asha-promote", slots=1,
                                name="promote", site="gclab", ranks_per_node=1)
    middling = next(t for t in promoted if t.config["lr"] == 1e-4)
    assert (middling.state, middling.step, middling.result["resumed_from"]) == ("finished", 10, 5), middling.why
    assert list(read_history(tmp_path / "remote" / wf.run_dir.name / middling.name / "train.h5").steps) == \
        list(range(10))
    assert all(t.state == "stopped" and "not promoted" in t.why for t in promoted if t.config["lr"] < 1e-4)
    assert trials[0].config["lr"] == 5e-3 and trials[0].state == "finished"
    stopped = [t for t in trials if t.state == "stopped"]
    assert stopped, [(t.name, t.state, t.why) for t in trials]
    for t in stopped:
        stage_dir = tmp_path / "remote" / wf.run_dir.name / t.name
        assert t.step == 5 and "stopped at step 5 (rung 0 at step 5: loss " in t.why and " > cut " in t.why, t.why
        assert checkpoint.read(stage_dir / "model.pt")["step"] == 5
    assert looks[0] == "put_many" and "peek_many" in looks, looks  # (the rungs first, in one task for all)
    assert (wf.run_dir / "sweep-sweep.png").exists()  # (drawn from the trials' directories, which are here too)


def test_a_remote_stage_gets_the_machines_launch_flags_and_gpu_order(tmp_path, monkeypatch):
    """On Polaris through an endpoint the ranks are bound and ordered as a local launch there binds them."""
    from types import SimpleNamespace

    from parsl_torch.apps.stage import app as distributed
    from parsl_torch.launch.machines import get_machine
    from parsl_torch.sites.engine import _engine_executor_class

    gc_site(tmp_path, monkeypatch, name="polaris-gc")
    site_file = tmp_path / "sites" / "polaris-gc.yaml"
    site_file.write_text(site_file.read_text() + "machine: polaris\n")
    jobs = []

    def packed(call, *args):
        jobs.append(call.opts)
        raise KeyboardInterrupt  # nothing to submit: the job is what is checked

    monkeypatch.setattr(distributed, "remote_job", packed)
    executor = _engine_executor_class()(SimpleNamespace(endpoint_id="6f3a8b52-0000-4000-8000-000000000000"))
    with pytest.raises(KeyboardInterrupt):
        with pt.workflow(site="polaris-gc", run_dir=tmp_path / "run", gc_executor=executor):
            with pytest.raises(pt.ConfigError, match="min_nodes=1 needs blocks that pt.workflow starts, and site "
                                                     "'polaris-gc' runs through Globus Compute"):
                train(SMALL, min_nodes=1)
            train(SMALL, ranks_per_node=4)
    polaris = get_machine("polaris")
    assert jobs[0].launcher_args == tuple(polaris.binding_args(4)) and "--cpu-bind" in jobs[0].launcher_args
    assert dict(jobs[0].env)["PARSL_TORCH_GPU_ORDER"] == polaris.rank_env()["PARSL_TORCH_GPU_ORDER"] == "3,2,1,0"


@pytest.mark.slow
def test_one_workflow_trains_on_one_site_and_evaluates_on_another(tmp_path, monkeypatch, engine):
    """Sites that share a file system pass files; a stage whose inputs its site cannot see is refused
    when it is called, before anything is submitted."""
    from parsl.data_provider.files import File

    gc_site(tmp_path, monkeypatch, file_system="local")  # this endpoint sees the workflow's files
    gc_site(tmp_path, monkeypatch, name="gcfar")  # this one sees only its own
    local_file = tmp_path / "model.pt"
    local_file.write_bytes(b"not a checkpoint")
    with pt.workflow(sites=["local", "gclab", "gcfar"], run_dir=tmp_path / "run", gc_executor=engine.executor()):
        t = train(SMALL, site="gclab")
        e = evaluate(SMALL_EVAL, inputs=[t.outputs[1]])  # on the default site, reading what gclab wrote
        with pytest.raises(ConfigError, match=r"stage 'evaluate' on site 'gcfar' cannot read the output of stage "
                                              r"'train' on site 'gclab': it is on file system 'local', and site "
                                              r"'gcfar' sees 'endpoint 6f3a8b52-"):
            evaluate(SMALL_EVAL, inputs=[t.outputs[1]], site="gcfar")
        with pytest.raises(ConfigError, match=rf"cannot read input file {local_file} \(a file where the workflow runs"):
            evaluate(SMALL_EVAL, inputs=[File(str(local_file))], site="gcfar")
        with pytest.raises(ConfigError, match="site='nowhere' is not one of this workflow's sites"):
            train(SMALL, site="nowhere")
        assert e.result()["trained_steps"] == 20
    assert t.result()["checkpoint"] == str(tmp_path / "remote" / "run" / "train" / "model.pt")
    assert (tmp_path / "run" / "evaluate" / "eval.h5").is_file() and not (tmp_path / "run" / "train").exists()
    assert not (tmp_path / "remote" / "run" / "evaluate").exists()  # nothing was submitted to gcfar
    with pytest.raises(ConfigError, match="give one of them"):
        with pt.workflow(site="local", sites=["local", "gclab"], run_dir=tmp_path / "run2"):
            pass


@pytest.mark.slow
def test_workflow_runs_unchanged_on_a_globus_site(tmp_path, monkeypatch, engine):
    gc_site(tmp_path, monkeypatch)
    submitted = []
    monkeypatch.setattr(engine, "submit", _recording(engine.submit, submitted))

    def run(config=SMALL):
        with pt.workflow(site="gclab", run_dir=tmp_path / "run", gc_executor=engine.executor()):
            t = train(config)
            e = evaluate(SMALL_EVAL, inputs=[t.outputs[1]])
            return t, e, t.result(), e.result()

    t, e, trained, evaluated = run()
    remote_train = tmp_path / "remote" / "run" / "train"
    assert trained["checkpoint"] == str(remote_train / "model.pt") and (remote_train / "train.h5").exists()
    assert evaluated["trained_steps"] == 20
    assert t.outputs[1].result().filepath == str(remote_train / "model.pt")
    # each stage's records in its own remote directory (evaluate's are not beside the checkpoint it reads)
    assert (remote_train / ".env.json").exists() and (tmp_path / "remote" / "run" / "evaluate" / ".env.json").exists()
    # multi-rank stages asked the MPI engine for the stage's ranks
    assert submitted[0] == TWO_RANKS
    assert not (tmp_path / "run" / "train").exists()  # nothing of the stage is written locally
    assert not t.from_cache and not e.from_cache

    t, e, _, again = run()  # a rerun: the endpoint finds both calls' files
    assert t.from_cache and e.from_cache and again == evaluated
    t, e, _, evaluated = run({**SMALL, "steps": 30})  # evaluate's own call is the same; the checkpoint it
    assert not t.from_cache and not e.from_cache and evaluated["trained_steps"] == 30  # reads changed there


#: a workflow script of a multi-file project, its stage's code in a module beside it
PROJECT_SCRIPT = """
import sys
import tempfile
import parsl_torch as pt
from parsl_torch.sites.endpoint import endpoint_config
from parsl_torch.sites.engine import LocalEndpoint
import helpers

@pt.distributed_app
def scaled(x, out=None):
    import torch.distributed as dist
    import helpers  # the ranks import it from the shipped copy: it is not on the endpoint
    return {"value": helpers.scale(x), "ranks": dist.get_world_size(), "helpers": helpers.__file__}

endpoint = LocalEndpoint(endpoint_config(pt.sites.load("local").spec, sys.prefix), sys.argv[1])
with endpoint, pt.workflow(site="gclab", run_dir=sys.argv[2], gc_executor=endpoint.executor()):
    f = scaled(2)
    print("RESULT", f.result(), "CACHED", f.from_cache, flush=True)
"""


@pytest.mark.slow
def test_workflow_functions_and_their_modules_run_on_a_globus_site(tmp_path, monkeypatch):
    """A function of the workflow script travels by value, the user module it uses travels with it (the
    endpoint's ranks cannot see the project), and the endpoint skips it only when nothing changed."""
    gc_site(tmp_path, monkeypatch)
    project = tmp_path / "project"
    project.mkdir()
    (project / "wf.py").write_text(PROJECT_SCRIPT)
    (project / "helpers.py").write_text("def scale(x):\n    return x * 10\n")
    env = {**os.environ, "PYTHONPATH": ""}  # the engine's workers see neither the project nor the tests

    def run(seed):  # each run in its own process, under its own hash seed
        out = subprocess.run([sys.executable, "wf.py", str(tmp_path / "engine"), str(tmp_path / "run")], cwd=project,
                             env={**env, "PYTHONHASHSEED": seed}, capture_output=True, text=True, timeout=360)
        assert out.returncode == 0, out.stderr[-3000:]
        return next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))

    first = run("0")
    shipped = tmp_path / "remote" / "run" / "scaled" / ".sources" / "helpers.py"
    assert f"'value': 20, 'ranks': 2, 'helpers': '{shipped}'" in first and first.endswith("CACHED False")
    assert run("1").endswith("CACHED True")  # nothing changed: skipped on the endpoint
    (project / "helpers.py").write_text("def scale(x):\n    return x * 100\n")
    assert "'value': 200" in (rerun := run("2")) and rerun.endswith("CACHED False")  # a module edited here


@pytest.mark.slow
def test_a_script_on_the_endpoints_file_system_runs_there(tmp_path, monkeypatch, engine):
    gc_site(tmp_path, monkeypatch)
    script = tmp_path / "remote_fs" / "hello.py"  # named by its path on the endpoint
    script.parent.mkdir()
    script.write_text("import os\nopen(f\"out.{os.environ['RANK']}\", 'w').write('hi')\n")
    stage_dir = tmp_path / "remote" / "run" / "hello"
    hello = pt.script_app(script, ranks_per_node=2)
    for edit, cached in ((None, False), (None, True), ("# edited\nprint('changed')\n", False)):
        if edit:
            script.write_text(script.read_text() + edit)
        with pt.workflow(site="gclab", run_dir=tmp_path / "run", gc_executor=engine.executor()):
            f = hello()
            assert f.result() is None and f.from_cache is cached
        assert (stage_dir / "out.0").exists() and (stage_dir / "out.1").exists()


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
    assert cli(["sites", "endpoint-config", name, "--io"]) == 0  # (the endpoint beside it: globus.io_endpoint_id)
    io = yaml.safe_load(capsys.readouterr().out)
    assert io == {"display_name": f"parsl-torch-{name}-io", "engine": {"type": "ThreadPoolEngine", "max_workers": 2}}


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
def test_endpoint_test_starts_the_sites_engine_and_runs_a_two_rank_smoke_stage(engine, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    assert cli(["endpoint", "test", "local", "--run-dir", str(tmp_path / "et")]) == 0
    out = capsys.readouterr().out
    assert "ok: site local: the endpoint's loader built GlobusMPIEngine over LocalProvider (mpi_launcher mpiexec)" \
        in out, out
    assert "ok: 2-rank smoke stage" in out and "all_reduce sum 3.0 (expected 3) over 2 ranks (gloo)" in out, out
    assert (tmp_path / "et" / "smoke" / "smoke.h5").is_file()


def test_endpoint_test_of_a_site_without_a_scheduler_is_one_line(tmp_path, monkeypatch, capsys):
    """... and leaves no run directory behind (it made an empty one in /tmp)."""
    gc_site(tmp_path, monkeypatch)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert cli(["endpoint", "test", "gclab"]) == 2
    assert capsys.readouterr().err.startswith("parsl-torch: error: site 'gclab' (globus) has no scheduler")
    assert list((tmp_path / "tmp").iterdir()) == []


def test_endpoint_test_off_the_machine_says_so_in_one_line(capsys):
    """`parsl-torch endpoint test polaris` here: the site's interface is not on this host (was: a
    60-line traceback ending in `ClickException: [Errno 19] No such device`)."""
    assert cli(["endpoint", "test", "polaris", "--account", "X"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "network interface 'hsn0' (address_interface) does not exist on this host" in err
