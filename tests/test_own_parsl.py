"""parsl-torch around the user's own Parsl: Config settings through pt.workflow,
a site's executors in the user's own config, ordinary apps on our configs."""

from __future__ import annotations

import pytest

import parsl_torch as pt
from parsl_torch.errors import ConfigError

from .conftest import REPO

pytestmark = pytest.mark.slow


@pt.distributed_app(ranks_per_node=2)
def world():
    import torch.distributed as dist

    return dist.get_world_size()


def test_parsl_config_settings_pass_through_and_monitoring_sees_the_stage(tmp_path, monkeypatch):
    import sqlite3

    from parsl.monitoring import MonitoringHub

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "monitoring.db"
    hub = MonitoringHub(hub_address="127.0.0.1", logging_endpoint=f"sqlite:///{db}",
                        resource_monitoring_enabled=False)
    with pt.workflow(site="local", run_dir="runs/mon", monitoring=hub, max_idletime=60):
        assert world().result(timeout=180) == 2
    with sqlite3.connect(db) as con:
        names = [row[0] for row in con.execute("select task_func_name from task")]
    assert "stage_command" in names  # parsl-visualize shows the stage


def test_bad_keywords_fail_before_anything_is_made(tmp_path):
    for kwargs, message in (({"monitorin": 1}, "unknown keyword\\(s\\) monitorin"),
                            ({"executors": []}, "the workflow sets this parsl.Config setting itself")):
        with pytest.raises(ConfigError, match=message):
            with pt.workflow(site="local", run_dir=tmp_path / "runs", **kwargs):
                pass
        assert not (tmp_path / "runs").exists()


def test_ordinary_apps_work_on_our_configs_every_time(tmp_path, monkeypatch):
    from parsl import python_app

    @python_app
    def square(x):
        return x * x

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # Parsl ships test functions by reference to this module
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "nohtex.yaml").write_text("name: nohtex\nscheduler: local\nstrategy_period: 0.5\n"
                                                    "htex: {enabled: false}\n")
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path / "sites"))
    for site in ("local", "nohtex"):  # with a single-process executor, and without one
        with pt.workflow(site=site, run_dir=f"runs/{site}"):
            futures = [square(i) for i in range(50)]  # Parsl picks an executor at random for each
            assert [f.result(timeout=120) for f in futures] == [i * i for i in range(50)]


def test_stages_under_the_users_own_parsl_config(tmp_path, monkeypatch):
    import parsl
    from parsl import python_app
    from parsl.config import Config
    from parsl.executors import ThreadPoolExecutor

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    site = pt.sites.load("local")

    @python_app(executors=["mine"])
    def mine():
        return "mine"

    config = Config(executors=[ThreadPoolExecutor(label="mine"), *site.executors()], strategy_period=0.5,
                    run_dir=str(tmp_path / "runinfo"))
    with parsl.load(config):
        with pt.workflow(site="local", run_dir="runs/own") as wf:
            assert wf.home.mpi_label == "local.mpi"
            assert world().result(timeout=180) == 2 and mine().result() == "mine"
            with pytest.raises(ConfigError, match="min_nodes=1 needs blocks that pt.workflow starts, and site "
                                                  "'local' is in a Parsl config of your own"):
                world(min_nodes=1)
    with parsl.load(Config(executors=[ThreadPoolExecutor(label="mine")], run_dir=str(tmp_path / "ri2"))):
        with pytest.raises(ConfigError, match="already loaded without site 'local'"):
            with pt.workflow(site="local", run_dir="runs/other"):
                pass
        with pytest.raises(ConfigError, match="set retries in your own parsl.Config"):
            with pt.workflow(site="local", run_dir="runs/other", retries=2):
                pass
    assert not (tmp_path / "runs" / "other").exists()


def test_parsl_mpi_apps_as_parsls_docs_write_them_run_on_a_site_config(tmp_path, monkeypatch):
    """Parsl's MPI-apps documentation: a bash app running ``$PARSL_MPI_PREFIX`` and a python app,
    each given ``parsl_resource_specification``, no ``executors=``, beside ordinary apps. Parsl picks
    an executor at random for each: every call runs, as on Parsl's own MPI config."""
    import parsl
    from parsl import bash_app, python_app

    @bash_app
    def ranks_report(out: str, stdout: str | None = None, parsl_resource_specification: dict = {}):  # noqa: B006
        return (f'$PARSL_MPI_PREFIX python -c "import os; open(\'{out}.\' + os.environ[\'PMI_RANK\'], \'w\')'
                f'.write(os.environ[\'PMI_SIZE\'])"')

    @python_app
    def prefix(parsl_resource_specification: dict = {}):  # noqa: B006
        import os

        return os.environ["PARSL_MPI_PREFIX"]

    @python_app
    def square(x):
        return x * x

    @python_app(executors=["mpi"])
    def pinned_mpi(parsl_resource_specification: dict = {}):  # noqa: B006
        import os

        return os.environ["PARSL_NUM_RANKS"]

    @python_app(executors=["htex"])
    def pinned_htex(x):
        return -x

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # Parsl ships test functions by reference to this module
    spec = {"num_nodes": 1, "ranks_per_node": 2, "num_ranks": 2}
    with parsl.load(pt.sites.load("local").parsl_config(run_dir=str(tmp_path / "runinfo"))):
        reports = [ranks_report(str(tmp_path / f"ranks-{i}"), stdout=str(tmp_path / f"ranks-{i}.txt"),
                                parsl_resource_specification=spec)
                   for i in range(20)]
        prefixes = [prefix(parsl_resource_specification=spec) for _ in range(10)]
        squares = [square(i) for i in range(20)]
        mpi, htex = pinned_mpi(parsl_resource_specification=spec), pinned_htex(3)
        assert [f.result(timeout=300) for f in reports] == [0] * 20
        assert all("-n 2" in p.result(timeout=120) or "-np 2" in p.result(timeout=120) for p in prefixes), \
            prefixes[0].result()
        assert [f.result(timeout=120) for f in squares] == [i * i for i in range(20)]
        assert (mpi.result(timeout=120), htex.result(timeout=120)) == ("2", -3)
    for i in range(20):  # each call ran 2 ranks
        assert [(tmp_path / f"ranks-{i}.{r}").read_text() for r in (0, 1)] == ["2", "2"]
