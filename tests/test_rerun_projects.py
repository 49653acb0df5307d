"""Reruns of a multi-file project, as a user runs one: a workflow script beside its own
modules, a script stage importing a sibling, a package run with ``-m``, data files named in
arguments (as Paths and as strings), in a global, in a built-in stage's config and in a YAML file
a script is given, an environment variable and a module imported by name, a data file a module's
global names, objects of the project's own classes as arguments, outputs changed and deleted,
return values deleted, a module in a folder a script adds to ``sys.path`` or on a ``PYTHONPATH``
given with ``env=``, a file added where a glob pattern looks. Each row (two at a time, on two
stages) edits the project and runs ``python wf.py`` again in a new process; exactly the stages that
can see the edit run again, the log names the file, and every other stage is skipped with its old
result."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from .conftest import clean_env

pytestmark = pytest.mark.slow

WORKFLOW = '''
import importlib, json, math, os, sys, uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import parsl_torch as pt
import helpers
import mymod
import projconf
from parsl_torch.stages.train import train

SETTINGS = {"b": 2, "a": 1, "c": {3, 1, 2}}  # a dict and a set: their order follows the hash seed
WALLTIME = float(os.environ.get("WALLTIME", "600"))
HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "data", "table.csv")  # a string global that names a file the stage reads


@dataclass
class Opts:
    scale: int
    names: tuple


@pt.distributed_app(ranks_per_node=2, walltime=WALLTIME)
def helper(x):
    return {"value": mymod.helper(x), "ranks": pt.get_world_size(),
            "globals": json.dumps(sorted(SETTINGS["c"])) + str(math.floor(2.5))}


@pt.distributed_app(ranks_per_node=1)
def flavor(path, array, ordered, names, opts):
    return [os.environ.get("FLAVOR"), Path(path).read_text(), float(array.sum()), list(ordered), sorted(names),
            opts.scale]


@pt.distributed_app(ranks_per_node=1)
def inner(x):
    import innermod  # imported where it runs: the workflow process never imports it
    return innermod.value(x)


@pt.distributed_app(ranks_per_node=1)
def extras(path, cfg, fn, outputs=()):
    Path(outputs[0]).write_text("written")
    return {"path": open(path).read(), "table": open(TABLE).read(), "scale": os.environ.get("SCALE", "1"),
            "loaded": importlib.import_module("helpermod").value(), "cfg": fn(cfg.n), "run": uuid.uuid4().hex,
            "conf": projconf.DATA.read_text()}


def text(future):
    future.result()
    return (Path(future.outputs[0].result().filepath)).read_text()


with pt.workflow(site="local", run_dir=os.environ.get("RUN_DIR", "runs"), warm=os.environ.get("WARM") == "1"):
    stages = {
        "extras": extras(str(Path("data/path.txt").resolve()), helpers.Cfg(3), helpers.triple,
                         outputs=["extras.txt"]),
        "helper": helper(3),
        "inner": inner(3),
        "flavor": flavor(Path("data/note.txt"), np.arange(4.0), OrderedDict(z=1, a=2), {"x", "y"},
                         Opts(2, ("p",)), env={"FLAVOR": os.environ.get("FLAVOR", "plain")}),
        "app": pt.script_app("app/main.py", args=["--config", "app/app.yaml"], ranks_per_node=1,
                             env={"PYTHONPATH": str(Path("vendor").resolve())})(outputs=["out.txt"]),
        "reader": pt.script_app("reader.py", args=["--data", "data/tokens.txt", "--shards", "data/shards/*.txt",
                                                   os.environ.get("MODE", "m1")], ranks_per_node=1)(outputs=["out.txt"]),
        "mypkg": pt.script_app("mypkg", module=True, ranks_per_node=1)(outputs=["out.txt"]),
        "train": train({"steps": 2, "checkpoint_every": 1, "log_every": 1,
                        "model": {"kind": "mlp", "vocab_size": 16, "dim": 8, "seq_len": 8},
                        "data": {"kind": "file", "path": "data/tokens.npy", "batch_size": 4}},
                       ranks_per_node=1),
    }
    results = {name: text(f) if name in ("app", "reader", "mypkg") else f.result() for name, f in stages.items()}
    results["train"] = results["train"]["final_loss"]
    print("results", json.dumps(results))
'''

FILES = {
    "mymod.py": "def helper(x):\n    return x * 2\n",
    "helpers.py": "from dataclasses import dataclass\n\n\n@dataclass\nclass Cfg:\n    n: int\n\n\n"
                  "def triple(n):\n    return n * 3\n",
    "helpermod.py": "def value():\n    return 'loaded-v1'\n",
    "projconf.py": "from pathlib import Path\n\nDATA = Path(__file__).parent / 'data' / 'conf.txt'\n",
    "data/conf.txt": "conf-v1\n",
    "data/path.txt": "path-v1\n",
    "data/table.csv": "a,b\n",
    "innermod.py": "def value(x):\n    return x + 1\n",
    "app/main.py": textwrap.dedent("""
        import os, sys
        import yaml
        from util import factor
        from vendored import MARK  # on the PYTHONPATH the stage is given
        config = sys.argv[sys.argv.index("--config") + 1]
        data = yaml.safe_load(open(config))["data"]  # a path relative to the config's folder
        text = open(os.path.join(os.path.dirname(config), data)).read().strip()
        open("out.txt", "w").write(f"{factor(5)}:{text}{MARK}")
    """),
    "vendor/vendored.py": "MARK = ''\n",
    "app/app.yaml": "name: demo\ndata: ../data/app.txt\n",
    "data/app.txt": "app-v1\n",
    "app/util.py": "def factor(x):\n    return x * 10\n",
    "reader.py": textwrap.dedent("""
        import glob, os, sys
        sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # research code's way
        import readlib
        data = sys.argv[sys.argv.index("--data") + 1]
        shards = glob.glob(sys.argv[sys.argv.index("--shards") + 1])  # a glob pattern: its files
        more = "" if len(shards) == 1 else f"+{len(shards)}"
        open("out.txt", "w").write(open(data).read().strip() + readlib.SEP + sys.argv[-1] + more)
    """),
    "data/shards/a.txt": "a\n",
    "lib/readlib.py": "SEP = ':'\n",
    "mypkg/__init__.py": "",
    "mypkg/__main__.py": "from .core import name\nopen('out.txt', 'w').write(name())\n",
    "mypkg/core.py": "def name():\n    return 'pkg-v1'\n",
    "data/tokens.txt": "tokens-v1\n",
    "data/note.txt": "note\n",
    "wf.py": WORKFLOW,
}
STAGES = ("helper", "inner", "flavor", "app", "reader", "mypkg", "train", "extras")


def write_tokens(path: Path, seed: int) -> None:
    np.save(path, np.random.default_rng(seed).integers(0, 16, size=4000).astype(np.int64))


def run(project: Path, seed: str = "0", **env: str) -> tuple[dict, dict[str, str]]:
    out = subprocess.run([sys.executable, "wf.py"], cwd=project, capture_output=True, text=True, timeout=300,
                         env=clean_env(PYTHONHASHSEED=seed, **env))
    assert out.returncode == 0, out.stderr[-4000:]
    results = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("results "))[8:])
    states = {}
    for stage in STAGES:
        if f"[{stage}] skipped" in out.stderr:
            states[stage] = "skipped"
        else:
            why = re.search(rf"\[{stage}\] runs(?: again)?: (.*)", out.stderr)
            states[stage] = why.group(1) if why else "?"
    return results, states


def edit(project: Path, name: str, old: str, new: str) -> None:
    path = project / name
    text = path.read_text()
    assert old in text, f"{name} lost {old!r}"
    path.write_text(text.replace(old, new))


# (what the user does, the stage that must run again, the reason the log gives, (result key, new value))
EDITS = [
    ("helper x*2 -> x*3 in mymod.py", lambda p, env: edit(p, "mymod.py", "x * 2", "x * 3"),
     "helper", "mymod.py changed", ("helper", {"value": 9, "ranks": 2, "globals": "[1, 2, 3]2"})),
    ("innermod.py, imported inside a stage's function", lambda p, env: edit(p, "innermod.py", "x + 1", "x + 2"),
     "inner", "innermod.py changed", ("inner", 5)),
    ("app/util.py, imported by the script", lambda p, env: edit(p, "app/util.py", "x * 10", "x * 100"),
     "app", "app/util.py changed", ("app", "500:app-v1")),
    ("a data file named in args", lambda p, env: (p / "data/tokens.txt").write_text("tokens-v2\n"),
     "reader", "input {p}/data/tokens.txt changed", ("reader", "tokens-v2:m1")),
    ("a script's argument", lambda p, env: env.update(MODE="m2"), "reader", "arguments changed",
     ("reader", "tokens-v2:m2")),
    ("a module of the package run with -m", lambda p, env: edit(p, "mypkg/core.py", "pkg-v1", "pkg-v2"),
     "mypkg", "mypkg/core.py changed", ("mypkg", "pkg-v2")),
    ("the token file of the built-in train", lambda p, env: write_tokens(p / "data/tokens.npy", 1),
     "train", "input {p}/data/tokens.npy changed", None),
    ("a Path argument's file", lambda p, env: (p / "data/note.txt").write_text("note-v2\n"),
     "flavor", "input {p}/data/note.txt changed", None),
    ("a per-call env value", lambda p, env: env.update(FLAVOR="spicy"), "flavor",
     "stage options changed, environment variable FLAVOR changed", None),
    ("a file named by a string argument", lambda p, env: (p / "data/path.txt").write_text("path-v2\n"),
     "extras", "input {p}/data/path.txt changed", ("extras", "path-v2\n", "path")),
    ("a file named by a string global", lambda p, env: (p / "data/table.csv").write_text("a,b\n1,2\n"),
     "extras", "input {p}/data/table.csv changed", ("extras", "a,b\n1,2\n", "table")),
    ("an environment variable the stage reads", lambda p, env: env.update(SCALE="2"), "extras",
     "environment variable SCALE changed", ("extras", "2", "scale")),
    ("a module imported by importlib.import_module", lambda p, env: edit(p, "helpermod.py", "-v1", "-v2"),
     "extras", "helpermod.py changed", ("extras", "loaded-v2", "loaded")),
    ("the module of an argument's class and function", lambda p, env: edit(p, "helpers.py", "n * 3", "n * 4"),
     "extras", "helpers.py changed", ("extras", 12, "cfg")),
    ("a data file a user module's global names", lambda p, env: (p / "data/conf.txt").write_text("conf-v2\n"),
     "extras", "input {p}/data/conf.txt changed", ("extras", "conf-v2\n", "conf")),
    ("a declared output changed by hand", lambda p, env: (p / "runs/extras/extras.txt").write_text("mine"),
     "extras", "the output extras.txt of its finished run was changed since that run wrote it", None),
    ("a declared output deleted", lambda p, env: (p / "runs/extras/extras.txt").unlink(), "extras",
     "the output extras.txt of its finished run is missing", None),
    ("a function stage's return value deleted", lambda p, env: (p / "runs/extras/result.pkl").unlink(), "extras",
     "the return value (result.pkl) of its finished run is missing", None),
    ("a data file that a config file in a script's args names", lambda p, env: (p / "data/app.txt").write_text(
        "app-v2\n"), "app", "input {p}/data/app.txt changed", ("app", "500:app-v2")),
    ("a module in a folder the script adds to sys.path", lambda p, env: edit(p, "lib/readlib.py", ":", "|"),
     "reader", "lib/readlib.py changed", ("reader", "tokens-v2|m2")),
    ("a module on the PYTHONPATH a stage is given with env=", lambda p, env: edit(p, "vendor/vendored.py", "''", "'!'"),
     "app", "vendor/vendored.py changed", ("app", "500:app-v2!")),
    ("a file added where a glob pattern in a script's args looks", lambda p, env: (p / "data/shards/b.txt").write_text(
        "b\n"), "reader", "the folder {p}/data/shards changed (its names)", ("reader", "tokens-v2|m2+2")),
]


#: in warm ranks (function stages only: scripts run cold), under one other seed, the rows where what a warm
#: process has seen could differ from a fresh one's: code it imported, env, modules, the files left (input
#: files are digested in the workflow, the same warm or cold: their rows run cold only, for CI's time)
WARM_RUNS = ((11, 0), (12, 1), (13, 8), (16,), (17,))
#: cold, all rows, up to three at a time on as many stages (each must rerun exactly its own stage, with its
#: own reason; the 9 rows of extras set the number of runs), in an order that keeps each stage's rows in
#: theirs: their results build on the rows before
COLD_RUNS = ((9, 0, 2), (10, 1, 3), (11, 5, 18), (12, 6, 4), (13, 7, 19), (14, 8, 20), (15, 21), (16,), (17,))


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_each_edit_reruns_exactly_the_stages_that_can_see_it(tmp_path, warm):
    project = tmp_path / "proj"
    for name, content in FILES.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(content)
    write_tokens(project / "data/tokens.npy", 0)

    mode = {"WARM": "1"} if warm else {}
    first, states = run(project, **mode)
    assert set(states.values()) == {"no finished run of it in this run directory"}, states
    assert first["helper"] == {"value": 6, "ranks": 2, "globals": "[1, 2, 3]2"} and first["inner"] == 4
    assert first["flavor"] == ["plain", "note\n", 6.0, ["z", "a"], ["x", "y"], 2]  # env= per call reached it
    assert (first["app"], first["reader"], first["mypkg"]) == ("50:app-v1", "tokens-v1:m1", "pkg-v1")
    assert isinstance(first["train"], float)
    assert {k: v for k, v in first["extras"].items() if k != "run"} == {
        "path": "path-v1\n", "table": "a,b\n", "scale": "1", "loaded": "loaded-v1", "cfg": 9, "conf": "conf-v1\n"}

    # the same project under another hash seed, with a comment and blank lines moving every function down,
    # a comment in a module, another walltime and the run directory through a link: nothing can change,
    # nothing runs (the log would say what did; a run under another seed alone checked a part of this)
    edit(project, "wf.py", "import importlib, json", "# a comment\n\n\nimport importlib, json")
    edit(project, "mymod.py", "def helper", "# helpers\n\ndef helper")
    (project / "link").symlink_to("runs")
    again, states = run(project, seed="2", WALLTIME="900", RUN_DIR="link", **mode)
    assert set(states.values()) == {"skipped"} and again == first, states

    assert sorted(i for rows in COLD_RUNS for i in rows) == list(range(len(EDITS)))
    results, env = first, dict(mode)
    for rows in WARM_RUNS if warm else COLD_RUNS:
        edits = [EDITS[i] for i in rows]
        assert len({stage for _, _, stage, _, _ in edits}) == len(edits)
        for _, change, _, _, _ in edits:
            change(project, env)
        now, states = run(project, seed="1", **env)  # a third hash seed: no row may rerun another stage
        what, ran = [e[0] for e in edits], {stage for _, _, stage, _, _ in edits}
        for _, _, stage, reason, _ in edits:
            assert states[stage] == reason.format(p=project), (what, states)
        assert all(s == "skipped" for name, s in states.items() if name not in ran), (what, states)
        assert {k: v for k, v in now.items() if k not in ran} == {k: v for k, v in results.items() if k not in ran}
        for desc, _, stage, _, expected in edits:
            assert now[stage] != results[stage], f"{desc}: the stage ran again and returned the same"
            if expected is not None:
                got = now[expected[0]][expected[2]] if len(expected) > 2 else now[expected[0]]
                assert got == expected[1], (desc, now)
        results = now
    assert results["flavor"][:2] == ["spicy", "note\n" if warm else "note-v2\n"]


def test_a_train_resumed_at_its_final_checkpoint_reports_its_true_loss(tmp_path):
    """Killed after its last save, before its record was written: the rerun resumes at the end
    (nothing left to train) and reports the loss the first run reached, not nan."""
    wf = tmp_path / "wf.py"
    wf.write_text(textwrap.dedent("""
        import json, sys
        import parsl_torch as pt
        from parsl_torch.stages.train import train
        cfg = {"steps": 3, "checkpoint_every": 1, "log_every": 1,
               "model": {"kind": "mlp", "vocab_size": 16, "dim": 8, "seq_len": 8}, "data": {"batch_size": 4}}
        with pt.workflow(site="local", run_dir="runs"):
            print("result", json.dumps(train(cfg, ranks_per_node=2).result()))
    """))

    def go() -> dict:
        out = subprocess.run([sys.executable, str(wf)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300, env=clean_env())
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(next(x for x in out.stdout.splitlines() if x.startswith("result "))[7:])

    first = go()
    # the state such a kill leaves: the final checkpoint, no record of the finished call
    (tmp_path / "runs" / "train" / ".call.json").unlink()
    for record in (tmp_path / "runs" / "parsl").glob("*/checkpoint"):
        shutil.rmtree(record)
    second = go()
    assert second["resumed_from"] == 3 and second["final_loss"] == pytest.approx(first["final_loss"])


def test_the_ranks_import_the_workflow_scripts_own_modules_also_under_parsl_torch_run(tmp_path):
    from .conftest import BIN

    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "localmod.py").write_text("VALUE = 41\n")
    (tmp_path / "proj" / "wf.py").write_text(textwrap.dedent("""
        import parsl_torch as pt
        import localmod

        @pt.distributed_app(ranks_per_node=1)
        def plus_one():
            return localmod.VALUE + 1

        with pt.workflow(site="local", run_dir="runs"):
            print("result", plus_one().result())
    """))
    out = subprocess.run([str(BIN / "parsl-torch"), "run", "proj/wf.py", "--run-dir", str(tmp_path / "runs")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=clean_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "result 42" in out.stdout
