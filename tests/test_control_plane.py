"""The control plane with simulated nodes (benchmarks/simnodes.py, small here; bench_control_plane.py
measures it at 2,048 nodes): the real supervisor hears every node of a storm of hellos, names a
silent or vanished node and quarantines it, leaves a slow one alone; the real pool scheduler places
every queued stage once, in order; every rank's device claim goes through one real store."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import simnodes as sim  # noqa: E402 - the harness lives with the benchmarks

N, R, TIMEOUT = 48, 4, 6.0


def quarantined(workdir: Path) -> dict[str, str]:
    path = workdir / "quarantine.json"
    return json.loads(path.read_text()).get(sim.JOB, {}) if path.exists() else {}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["silent", "vanished"])
def test_a_storm_of_hellos_is_heard_and_a_silent_or_vanished_node_is_named_and_quarantined(tmp_path, fault):
    sup = sim.Supervisor(N, R, TIMEOUT, tmp_path)
    nodes = sim.SimNodes(sup.address, N, R)
    try:
        t0 = time.time()
        nodes.start()
        while not (seen := sup.first("all_hellos")) and time.time() < t0 + 30:
            time.sleep(0.05)
        assert seen and not nodes.failed  # every node's hello was heard: none dropped
        nodes.slow("sim00001", TIMEOUT * 0.6)  # late heartbeats, within the timeout: never named
        time.sleep(TIMEOUT)
        assert sup.proc.poll() is None and not quarantined(tmp_path)
        victim = "sim00017"
        if fault == "silent":
            nodes.silence(victim)
        else:
            nodes.vanish(victim)
        assert sup.wait(timeout=TIMEOUT + 30) == 75  # a node lost
        took = sup.first("exit")["t_end"] - nodes.last_beat[victim]
    finally:
        sup.stop()
    said = (tmp_path / "stderr").read_text()
    if fault == "silent":
        assert f"node {victim} (ranks 68-71): no heartbeat for" in said
        assert took < TIMEOUT + 5  # the silence detected within the node timeout and the check
    else:
        assert f"node {victim} (ranks 68-71): its ranks' processes ended without a report" in said
        assert took < 10
    assert list(quarantined(tmp_path)) == [victim]


@pytest.mark.slow
def test_the_pool_scheduler_places_every_queued_stage_once_in_order(tmp_path):
    import queue

    from parsl_torch.launch.pool import scheduler_class

    decisions = sim.place(64, 500, tmp_path)
    assert len(decisions) == 1000  # a put and a result per stage
    # the same scheduler, watched: the first 64 start at once, the rest in the order they came
    tasks, results = queue.Queue(), queue.Queue()
    with sim.in_job(tmp_path / "nodefile"):  # (the 64 nodes place() listed)
        scheduler = scheduler_class(str(tmp_path / "quarantine.json"), 0, (), "CUDA_VISIBLE_DEVICES")(tasks, results)
        placed = placements(scheduler, tasks, results)
    assert placed[:64] == [(tid, f"sim{tid:05d}") for tid in range(64)]
    # three stages end: the next three in the queue start, each on the node just given back
    assert placed[64:] == [(64, "sim00005"), (65, "sim00063"), (66, "sim00000")]


def test_a_spare_claimed_to_go_on_in_place_is_never_given_twice(tmp_path):
    """A block of n1..n4 with two spares (n3, n4 held back): a 2-node stage on n1, n2 is offered both; its
    supervisor, n2 lost, claims n4 (taken: no other stage's claims it); a second stage's lost node claims n3;
    the first stage ends: the pool gives back its claimed n4 (and nothing more: its loss was replaced), and
    the second's end gives back n3. A loss no claim replaced (a warm group's) releases an untaken spare."""
    import pickle
    import queue

    from parsl_torch.launch import quarantine
    from parsl_torch.launch.pool import scheduler_class

    (tmp_path / "nodefile").write_text("n1\nn2\nn3\nn4\n")
    path, tasks, results = tmp_path / "quarantine.json", queue.Queue(), queue.Queue()
    with sim.in_job(tmp_path / "nodefile"):
        scheduler = scheduler_class(str(path), 2, (), "CUDA_VISIBLE_DEVICES")(tasks, results)
        scheduler.put_task({"task_id": 1, "context": {"resource_spec": {"num_nodes": 2, "num_ranks": 4}}})
        given = tasks.get_nowait()["context"]["resource_spec"]
        assert (given["MPI_NODELIST"], given["torch_spares"]) == ("n1,n2", "n3,n4")
        quarantine.add(path, sim.JOB, "n2", "node n2 lost")
        assert quarantine.claim_spare(path, sim.JOB, ["n4", "n3"], "n1,n2") == "n4"
        assert quarantine.claim_spare(path, sim.JOB, ["n4", "n2"], "n5,n6") is None  # taken, lost
        assert quarantine.claim_spare(path, sim.JOB, ["n4", "n3"], "n5,n6") == "n3"
        results.put(pickle.dumps({"type": "result", "task_id": 1}))
        scheduler.get_result(block=False)
        assert [e.split('#')[0] for e in scheduler.spare_nodes] == ["n3"]
    held = quarantine.read(tmp_path / quarantine.SPARES_FILE)[sim.JOB]
    assert held == {"n4": "the block's, after the stage on n1,n2", "n3": "n5,n6"}
    assert quarantine.release_spares(path, sim.JOB, ["n3"], "n5,n6", 1) == ["n3"]
    assert quarantine.release_spares(path, "other", ["n7", "n8"], "n1,n2", 1) == ["n8"]  # a loss, no claim


def placements(scheduler, tasks, results) -> list[tuple[int, str]]:
    """80 one-node stages queued on 64 nodes, then stages 5, 63 and 0 end: (stage, node) as each started."""
    import pickle

    started = []
    for tid in range(80):
        scheduler.put_task({"task_id": tid, "context": {"resource_spec": {"num_nodes": 1, "num_ranks": 4}}})
    for tid in (None, 5, 63, 0):
        if tid is not None:
            results.put(pickle.dumps({"type": "result", "task_id": tid}))
            scheduler.get_result(block=False)
        while not tasks.empty():
            task = tasks.get_nowait()
            started.append((task["task_id"], task["context"]["resource_spec"]["MPI_NODELIST"]))
    return started


@pytest.mark.slow
def test_every_rank_claims_its_device_through_one_store_and_all_are_refused_when_two_share_one():
    assert sim.claim_storm(16, 4)["n_errors"] == 0
    shared = sim.claim_storm(16, 4, shared=True)
    assert shared["n_errors"] == 16 * 4  # every rank, not only the two that share
    assert "2 ranks of node sim00000 would share one cuda device (cuda:0)" in shared["errors"][0]


# --- what holds at thousands of nodes (fast) ---------------------------------------------------

def test_the_supervisor_raises_its_open_files_limit_or_refuses_naming_it(monkeypatch):
    import resource

    from parsl_torch.errors import TopologyError
    from parsl_torch.launch import listener

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        listener.open_files_for(2048)  # one connection per node, and the spare ones
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    monkeypatch.setattr(listener.resource, "getrlimit", lambda _which: (1024, 2048))
    with pytest.raises(TopologyError, match=r"a launch on 2048 nodes .* needs about 2304 open files, but this "
                                            r"process may open at most 2048 \(the hard limit, ulimit -Hn\)"):
        listener.open_files_for(2048)


def test_a_short_kernel_listen_queue_is_said_with_its_fix(tmp_path):
    from parsl_torch.launch.listener import short_queue

    (tmp_path / "somaxconn").write_text("128\n")
    said = short_queue(2048, str(tmp_path / "somaxconn"))
    assert "caps a listen queue at 128 connections (net.core.somaxconn), fewer than this launch's 2048" in said
    assert "sysctl -w net.core.somaxconn=4096" in said
    assert short_queue(64, str(tmp_path / "somaxconn")) is None


def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> Path:
    """A stand-in for the command ``name`` (a shell script), first on PATH (then only the system's)."""
    fake = tmp_path / "bin" / name
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    return fake


def test_the_environment_archive_is_striped_over_every_lustre_target(tmp_path, monkeypatch):
    from parsl_torch.launch import nodepython

    log = tmp_path / "lfs.log"
    on_path(tmp_path, monkeypatch, "lfs", f"echo \"$@\" >> {log}")
    nodepython.stripe_wide(tmp_path / "python-x.tar.tmp")
    assert log.read_text() == f"setstripe -c -1 {tmp_path / 'python-x.tar.tmp'}\n"
    monkeypatch.setenv("PATH", "/nonexistent")
    nodepython.stripe_wide(tmp_path / "other.tar")  # no lfs: nothing, no error


@pytest.mark.parametrize("extractor", ["tar", "tarfile"])
def test_the_environment_archive_unpacks_as_it_was_packed_and_nothing_outside_its_folder(tmp_path, monkeypatch,
                                                                                          extractor):
    """With the node's tar or, where there is none, Python's tarfile: the same files, no set-uid bit; an
    archive with a ``..`` member fails (the ranks then start from the shared environment), nothing outside."""
    import io
    import subprocess
    import tarfile

    from parsl_torch.launch import nodepython

    def archive(name: str, members: tuple[str, ...]) -> Path:
        with tarfile.open(tmp_path / name, "w") as tar:
            for member in members:
                info = tarfile.TarInfo(member)
                info.size, info.mode = 3, 0o6777
                tar.addfile(info, io.BytesIO(b"abc"))
        return tmp_path / name

    if extractor == "tarfile":
        monkeypatch.setenv("PATH", "/nonexistent")
    good, into = archive("good.tar", ("venv/bin/tool", "base/lib/x.py")), tmp_path / "n1" / "into"
    into.mkdir(parents=True)
    nodepython._extract(good, into)
    files = {str(p.relative_to(into)): p.stat().st_mode & 0o7777 for p in into.rglob("*") if p.is_file()}
    assert set(files) == {"venv/bin/tool", "base/lib/x.py"} and not any(mode & 0o6022 for mode in files.values())
    bad, into = archive("bad.tar", ("../outside.txt", "venv/x")), tmp_path / "n2" / "into"
    into.mkdir(parents=True)
    with pytest.raises((subprocess.CalledProcessError, tarfile.TarError)):
        nodepython._extract(bad, into)
    assert not (tmp_path / "n2" / "outside.txt").exists()


def test_a_block_that_cannot_stage_its_python_starts_from_the_shared_one_and_each_stage_says_why(tmp_path):
    """The worker_init line of a site with node_local_python (through bash, a directory with shell
    metacharacters in its name): packing fails (the cache is a file), the block exports why and no
    node-local Python, and a stage's supervisor says it on the stage's stderr."""
    import os
    import subprocess

    from parsl_torch.sites.build import worker_init
    from parsl_torch.sites.schema import parse_site

    local = tmp_path / "local $(touch pwned) 'q\""
    spec = parse_site({"name": "s", "scheduler": "local", "node_local_python": str(local)}, "s.yaml")
    (tmp_path / "cache").write_text("not a directory")
    env = {**os.environ, "PARSL_TORCH_CACHE_DIR": str(tmp_path / "cache")}
    script = worker_init(spec, stage_python=True) + '\nprintf "%s\\n" "[$PARSL_TORCH_NODE_PYTHON]"' \
        '\nexec "$0" -m parsl_torch.launch.supervise -- /bin/true'
    done = subprocess.run(["bash", "-c", script, sys.executable], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]" and not (tmp_path / "pwned").exists()
    said = [line for line in done.stderr.splitlines() if "node_local_python" in line]
    assert len(said) == 2 and all(f"could not stage the Python environment to {local}" in line for line in said), \
        done.stderr  # the block's log, then the stage's
    assert "the ranks start from the shared one" in said[1]


def test_where_sbcast_fails_each_node_reads_the_shared_archive(tmp_path, monkeypatch, capsys):
    from parsl_torch.launch import nodepython

    fake = on_path(tmp_path, monkeypatch, "sbcast", "echo 'sbcast: error: Socket timed out on send/recv operation' >&2\n"
                                                     "exit 1")
    archive = tmp_path / "python-x.tar"
    assert nodepython._broadcast(archive, tmp_path / "node") == archive
    assert "sbcast failed (sbcast: error: Socket timed out" in capsys.readouterr().err
    fake.write_text("#!/bin/sh\nexit 0\n")
    assert nodepython._broadcast(archive, tmp_path / "node") == tmp_path / "node" / "python-x.tar"
