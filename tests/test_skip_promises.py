"""What a skip promises, beyond the user's own code and files: the same parsl-torch (an edit of
an editable install reruns every stage), a return value that rank 0 really returned (ranks
that leave without one fail the stage, cold and warm, and nothing is cached), outputs that
stay in the stage's directory, and arguments of the workflow's own classes reaching a cold
stage as they reach a warm one. Each workflow runs as ``python wf.py`` in its own process."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import parsl_torch

from .conftest import clean_env

pytestmark = pytest.mark.slow


def run(project: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    (project / "wf.py").write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, "wf.py"], cwd=project, capture_output=True, text=True, timeout=300,
                          env=clean_env(**env))


def why(stderr: str, stage: str) -> str:
    if f"[{stage}] skipped" in stderr:
        return "skipped"
    found = re.search(rf"\[{stage}\] runs(?: again)?: (.*)", stderr)
    return found.group(1) if found else "?"


def test_an_edit_of_parsl_torch_itself_reruns_every_stage(tmp_path):
    """An editable install (here: a copy of the package first on PYTHONPATH) edited between runs."""
    copy = tmp_path / "site"
    shutil.copytree(Path(parsl_torch.__file__).parent, copy / "parsl_torch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    project = tmp_path / "proj"
    project.mkdir()
    script = """
        import json
        import parsl_torch as pt

        @pt.distributed_app(ranks_per_node=1)
        def one():
            return pt.__file__

        with pt.workflow(site="local", run_dir="runs"):
            print("result", json.dumps(one().result()))
    """
    env = {"PYTHONPATH": str(copy)}
    first = run(project, script, **env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert str(copy) in first.stdout  # the ranks ran the copy
    assert why(run(project, script, **env).stderr, "one") == "skipped"
    train = copy / "parsl_torch" / "stages" / "train.py"
    train.write_text(train.read_text() + "\nEDITED = True\n")
    again = run(project, script, **env)
    assert again.returncode == 0 and why(again.stderr, "one") == "parsl-torch or torch changed", again.stderr[-2000:]
    assert why(run(project, script, **env).stderr, "one") == "skipped"


VANISH = """
    import os, sys
    import parsl_torch as pt

    @pt.distributed_app(ranks_per_node=2)
    def vanish():
        sys.stdout.flush()
        os._exit(0)  # every rank leaves inside the function, with exit code 0

    with pt.workflow(site="local", run_dir="runs", warm=os.environ.get("WARM") == "1"):
        try:
            vanish().result()
        except pt.StageError as exc:
            print("error", str(exc).splitlines()[0])
"""


@pytest.mark.parametrize("warm", ["0", "1"], ids=["cold", "warm"])
def test_ranks_that_leave_without_a_return_value_fail_the_stage_and_nothing_is_cached(tmp_path, warm):
    for attempt in range(2):  # failed, so the rerun runs it again (and fails again)
        out = run(tmp_path, VANISH, WARM=warm)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "error stage 'vanish' failed: every rank exited with code 0, but rank 0 never returned a value" \
            in out.stdout, (attempt, out.stdout, out.stderr[-3000:])
        assert why(out.stderr, "vanish") != "skipped"
    assert not (tmp_path / "runs" / "vanish" / ".call.json").exists()


def test_outputs_stay_inside_the_stages_directory(tmp_path, monkeypatch):
    import parsl_torch as pt
    from parsl_torch.errors import ConfigError

    monkeypatch.chdir(tmp_path)

    @pt.distributed_app(ranks_per_node=1)
    def writer(outputs=()):
        for output in outputs:
            with open(output, "w") as f:
                f.write("x")
        return 1

    with pt.workflow(site="local", run_dir="runs"):
        for name in ("../x", "sub/../../x", str(tmp_path / "runs" / "other" / "x"), str(tmp_path / "runs" / "x"),
                     "."):
            with pytest.raises(ConfigError, match="is not inside the stage's directory"):
                writer(outputs=[name])
        future = writer(outputs=["ok/x.txt", str(tmp_path / "elsewhere.txt")])
        assert [Path(o.filepath) for o in future.outputs] == [tmp_path / "runs" / future.stage / "ok" / "x.txt",
                                                              tmp_path / "elsewhere.txt"]
        assert future.result() == 1
    assert not (tmp_path / "runs" / "x").exists()


def test_arguments_of_the_workflows_own_classes_reach_a_cold_stage(tmp_path):
    """Parsl's worker unpickles a stage's arguments: it imports from the workflow's folders too."""
    (tmp_path / "helpers.py").write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass Cfg:\n"
                                         "    n: int\n\n\ndef triple(n):\n    return 3 * n\n")
    out = run(tmp_path, """
        import json
        import parsl_torch as pt
        import helpers

        @pt.distributed_app(ranks_per_node=1)
        def use(cfg, fn):
            return fn(cfg.n)

        with pt.workflow(site="local", run_dir="runs"):
            print("result", json.dumps(use(helpers.Cfg(4), helpers.triple).result()))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.split("result ", 1)[1]) == 12


SET_AT_RUN_TIME = """
    import sys
    import parsl_torch as pt
    import config

    config.SCALE = int(sys.argv[1])  # a command-line option reaching the code, as cfg.lr = args.lr does

    @pt.distributed_app(ranks_per_node=1)
    def scaled():
        return config.scaled(10)  # a function of the module reads it (config.SCALE read here: test_fingerprints)

    with pt.workflow(site="local", run_dir="runs"):
        print("result", scaled().result())
"""


@pytest.mark.slow
def test_what_the_workflow_sets_in_a_module_at_run_time_reruns_the_stages_that_read_it(tmp_path):
    """config.py says SCALE = 1; the workflow sets it from its command line. Its file is unchanged, yet
    `python wf.py 3` after `python wf.py 2` must not return 20 (it did: modules were compared by their
    code alone); the same value again skips, under another hash seed too."""
    (tmp_path / "config.py").write_text("SCALE = 1\n\n\ndef scaled(x):\n    return x * SCALE\n")
    (tmp_path / "wf.py").write_text(textwrap.dedent(SET_AT_RUN_TIME))
    seen = []
    for scale, seed in (("2", "1"), ("3", "2"), ("3", "3")):
        out = subprocess.run([sys.executable, "wf.py", scale], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300, env=clean_env(PYTHONHASHSEED=seed))
        assert out.returncode == 0, out.stderr[-3000:]
        seen.append((out.stdout.split("result ", 1)[1].strip(), why(out.stderr, "scaled")))
    assert [s[0] for s in seen] == ["20", "30", "30"], seen
    assert seen[1][1] == "config.SCALE changed (a value its code reads, set at run time)", seen
    assert seen[2][1] == "skipped", seen


WRITER_AND_READER = """
import json, os
import parsl_torch as pt

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@pt.distributed_app(ranks_per_node=1)
def writer():
    version = open(os.path.join(DATA, "version.txt")).read()
    open(os.path.join(DATA, "shared.txt"), "w").write(version)


@pt.distributed_app(ranks_per_node=1)
def peeker():
    return open(os.path.join(DATA, "shared.txt")).read()


with pt.workflow(site="local", run_dir="runs"):
    w, p = writer(), peeker()  # called together: no dependency between them
    w.result()
    print("result " + json.dumps(p.result()))
"""


def test_a_reader_called_beside_the_writer_of_its_file_does_not_skip_while_the_writer_runs(tmp_path):
    """The writer's input changes: it runs and rewrites shared.txt, which the reader read. The reader's
    own reads are unchanged when it is checked, but which of the two comes first is chance: it must not
    skip with the old content (it did, and kept returning it). Its reason: the writer running now, or
    (where the writer rewrote the file while the reader ran, as it may in the first run) that change."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "version.txt").write_text("v1")
    (tmp_path / "data" / "shared.txt").write_text("v1")
    scratch = tempfile.mkdtemp(prefix="ptsp-")  # (the project is under /tmp: a TMPDIR apart, or its files are scratch)
    seen = []
    for seed, version in (("1", "v1"), ("2", "v2"), ("3", "v2")):
        (tmp_path / "data" / "version.txt").write_text(version)
        out = run(tmp_path, WRITER_AND_READER, PYTHONHASHSEED=seed, TMPDIR=scratch)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.split("result ", 1)[1])
        seen.append((result, why(out.stderr, "writer"), why(out.stderr, "peeker")))
    assert seen[0][0] == "v1", seen
    assert seen[1][1] == f"input {tmp_path / 'data' / 'version.txt'} changed", seen
    shared = tmp_path / "data" / "shared.txt"
    assert seen[1][2] in (f"input {shared} is written by stage 'writer', which runs now with no dependency between "
                          f"them (pass 'writer''s future to it)",
                          f"input {shared} changed while its last run ran, after it read it"), seen
    assert seen[2][0] == "v2" and seen[2][1] == "skipped", seen  # (the reader: skipped, or rerun if it came first)
