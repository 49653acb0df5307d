"""Reruns from what a stage actually read (``observe.recorder``): the audit's cases that no rule
reading the code can see, each a separate ``python wf.py`` after one edit (other hash seeds).
The edit reruns exactly the stage that read it, the log names the read, the result is new; an
unchanged rerun skips every stage, the one that writes into the folder it reads too."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import pytest

from parsl_torch.observe.recorder import _folded, _source_of

from .conftest import clean_env

HELPERS = '''
import os
from pathlib import Path

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
PDATA = Path(DATA_DIR)


def read(name):
    return open(os.path.join(DATA_DIR, name)).read().strip()  # a name the caller passes


def read_c():
    return (PDATA / "c.txt").read_text().strip()  # a path built inside a module's function


def shards():
    folder = Path(DATA_DIR).parent / "shards"
    return sum(int((folder / f"s{i}.txt").read_text()) for i in range(300))  # a folder of many files
'''

WORKFLOW = '''
import glob, importlib, json, os, time
import parsl_torch as pt
import helpers

ARCH = "archmod"


@pt.distributed_app(ranks_per_node=1)
def reader(name):
    return helpers.read(name) + "+" + helpers.read_c()


@pt.distributed_app(ranks_per_node=1)
def arch():
    return importlib.import_module(ARCH).WIDTH


@pt.distributed_app(ranks_per_node=1)
def envy():
    return sorted((k, v) for k, v in dict(os.environ).items() if k.startswith("MYAPP_"))


@pt.distributed_app(ranks_per_node=1)
def summarize():
    here = os.path.join(os.path.dirname(helpers.DATA_DIR), "inbox")
    total = sum(int(open(p).read()) for p in sorted(glob.glob(os.path.join(here, "*.num"))))
    open(os.path.join(here, "summary.txt"), "w").write(str(total))  # into the folder it reads
    return total


@pt.distributed_app(ranks_per_node=1)
def sharded():
    return helpers.shards()


@pt.distributed_app(ranks_per_node=1)
def during():  # reads d.txt, then waits for the workflow's go (which may rewrite d.txt first)
    text = open(os.path.join(helpers.DATA_DIR, "d.txt")).read()
    open(os.path.join(helpers.DATA_DIR, "d.read"), "w").close()
    go = os.path.join(os.path.dirname(helpers.DATA_DIR), "go")
    for _ in range(2400):
        if os.path.exists(go):
            break
        time.sleep(0.05)
    return text


RUN = os.path.abspath("runs")


@pt.distributed_app(ranks_per_node=1)
def producer():
    text = open(os.path.join(helpers.DATA_DIR, "p.txt")).read()
    open(os.path.join(RUN, "producer", "made.txt"), "w").write(text.upper())


@pt.distributed_app(ranks_per_node=1)
def consumer(_after):  # another stage's output, by a path string: not an argument, not a declared input
    return open(os.path.join(RUN, "producer", "made.txt")).read()


for name in ("go", "data/d.read"):
    if os.path.exists(name):
        os.remove(name)


with pt.workflow(site="local", run_dir="runs", warm=os.environ.get("WARM") == "1"):
    futures = {"reader": reader("b.txt"), "arch": arch(), "envy": envy(), "summarize": summarize(),
               "sharded": sharded()}
    futures["arch2"] = arch(stage="arch2")  # (warm: after arch, in ranks that imported archmod already)
    futures["during"] = during()
    futures["consumer"] = consumer(producer())
    if os.path.exists("edit.flag"):  # the user edits an input while the stage that read it runs
        while not os.path.exists("data/d.read") and not futures["during"].done():
            time.sleep(0.05)
        open("data/d.txt", "w").write("d2")
    open("go", "w").close()
    print("RESULT", json.dumps({k: f.result() for k, f in futures.items()}), flush=True)
'''


def _project(root: Path) -> None:
    (root / "data").mkdir()
    (root / "data" / "b.txt").write_text("one")
    (root / "data" / "c.txt").write_text("c1")
    (root / "data" / "d.txt").write_text("d1")
    (root / "data" / "p.txt").write_text("p1")
    (root / "inbox").mkdir()
    (root / "inbox" / "a.num").write_text("2")
    (root / "shards").mkdir()
    for i in range(300):
        (root / "shards" / f"s{i}.txt").write_text("1")
    (root / "helpers.py").write_text(HELPERS)
    (root / "archmod.py").write_text("WIDTH = 64\n")
    (root / "wf.py").write_text(WORKFLOW)
    _short_tmpdir(root)


def _short_tmpdir(root: Path) -> None:
    """``root/tmp``, a link to a short TMPDIR: Parsl's worker pool starts a multiprocessing manager whose
    socket lives there, and a socket's path has at most 107 bytes (under
    /tmp/pytest-of-root/pytest-105/popen-gw1/<test>/tmp the pool could not start)."""
    (root / "tmp").symlink_to(tempfile.mkdtemp(prefix="ptobs-"))


def _run(root: Path, seed: str, **env: str) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "wf.py"], capture_output=True, text=True, timeout=300, cwd=root,
                         env=clean_env(PYTHONHASHSEED=seed, TMPDIR=os.path.realpath(root / "tmp"), MYAPP_MODE="a", **env))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.split("RESULT ", 1)[1]), out.stderr


def _ran(log: str) -> set[str]:
    stages = ("reader", "arch", "envy", "summarize", "sharded", "arch2", "during", "producer", "consumer")
    return {s for s in stages if f"[{s}] runs" in log}


@pytest.mark.slow
def test_what_a_stage_read_reruns_it_and_only_it(tmp_path):
    _project(tmp_path)
    (tmp_path / "edit.flag").write_text("")  # d.txt is rewritten while the stage that read it runs
    first, log = _run(tmp_path, "1")
    assert first == {"reader": "one+c1", "arch": 64, "envy": [["MYAPP_MODE", "a"]], "summarize": 2, "sharded": 300,
                     "arch2": 64, "during": "d1", "consumer": "P1"}
    d = tmp_path / "data" / "d.txt"
    assert f"[during] input {d} changed while it ran, after it read it" in log, log
    assert f"[consumer] read {tmp_path / 'runs' / 'producer' / 'made.txt'}, an output of stage 'producer', by its " \
           f"path: declare the dependency" in log, log
    (tmp_path / "edit.flag").unlink()
    first, log = _run(tmp_path, "8")  # a result made from d1 is not given back for d2
    assert first["during"] == "d2" and _ran(log) == {"during"}, log
    assert f"[during] runs again: input {d} changed while its last run ran, after it read it" in log, log
    again, log = _run(tmp_path, "2")
    assert again == first and not _ran(log), log  # nothing changed: every stage skipped, summarize too
    (tmp_path / "data" / "b.txt").write_text("two")  # DATA_DIR joined with a name the caller passes
    (tmp_path / "data" / "p.txt").write_text("p2")  # the producer's input: its output, read by the consumer
    result, log = _run(tmp_path, "3")
    assert result["reader"] == "two+c1" and result["consumer"] == "P2", result
    assert _ran(log) == {"reader", "producer", "consumer"}, log
    assert f"[reader] runs again: input {tmp_path / 'data' / 'b.txt'} changed" in log, log
    assert f"[consumer] runs again: input {tmp_path / 'runs' / 'producer' / 'made.txt'} changed" in log, log
    # four changes, each seen by its own stages alone (one run: each stage's reason names its change only)
    (tmp_path / "data" / "c.txt").write_text("c2")  # (PDATA / "c.txt") inside a module's function
    (tmp_path / "archmod.py").write_text("WIDTH = 128\n")  # importlib.import_module(ARCH)
    (tmp_path / "shards" / "s7.txt").write_text("11")  # one shard of many
    result, log = _run(tmp_path, "4", MYAPP_EXTRA="x")  # the whole environment, read through dict(os.environ)
    assert result["reader"] == "two+c2" and result["arch"] == result["arch2"] == 128 and result["sharded"] == 310
    assert result["envy"] == [["MYAPP_EXTRA", "x"], ["MYAPP_MODE", "a"]]
    changes = {"reader": "c.txt", "arch": "archmod.py", "arch2": "archmod.py",
               "sharded": f"input {tmp_path / 'shards'} changed", "envy": "the environment's variables changed"}
    assert _ran(log) == set(changes), log
    for stage, change in changes.items():
        why = next(line for line in log.splitlines() if f"[{stage}] runs again: " in line)
        assert change in why and not any(other in why for other in set(changes.values()) - {change}), why


BELOW_OPEN = '''
import json, os, sqlite3, subprocess, sys
import parsl_torch as pt

HERE = os.path.dirname(os.path.abspath(__file__))


@pt.distributed_app(ranks_per_node=1)
def db():  # SQLite opens its file in C
    return sqlite3.connect(os.path.join(HERE, "data.db")).execute("select v from t").fetchone()[0]


@pt.distributed_app(ranks_per_node=1)
def envb():
    return os.environb.get(b"MYAPP_BYTES", b"unset").decode()


@pt.distributed_app(ranks_per_node=1)
def child():  # a Python child that drops the observer: what it reads is unseen
    tool = os.path.join(HERE, "tool.py")
    return subprocess.run([sys.executable, "-I", tool], capture_output=True, text=True, check=True).stdout.strip()


@pt.distributed_app(ranks_per_node=1)
def looks():  # a file looked for and not there: its appearing is a change
    return os.path.exists(os.path.join(HERE, "override.yaml"))


with pt.workflow(site="local", run_dir="runs"):
    futures = {"db": db(), "envb": envb(), "child": child(), "looks": looks()}
    print("RESULT", json.dumps({k: f.result() for k, f in futures.items()}), flush=True)
'''


def _set_db(path: Path, value: str) -> None:
    with sqlite3.connect(path) as con:
        con.execute("create table if not exists t (v text)")
        con.execute("delete from t")
        con.execute("insert into t values (?)", (value,))


@pytest.mark.slow
def test_sqlite_environb_and_a_python_child_without_the_observer_through_a_workflow(tmp_path):
    """A database SQLite opens in C, a variable read through os.environb and a file looked for that was not
    there rerun their stage when they change (the file appears), and only then; a stage whose Python child
    drops the observer makes no skip promise: it runs every time, and the log names the child."""
    (tmp_path / "wf.py").write_text(BELOW_OPEN)
    (tmp_path / "tool.py").write_text("print(open(__file__.replace('tool.py', 'tool.txt')).read().strip())\n")
    (tmp_path / "tool.txt").write_text("t1")
    _set_db(tmp_path / "data.db", "a")
    _short_tmpdir(tmp_path)
    first, log = _run(tmp_path, "1")
    assert first == {"db": "a", "envb": "unset", "child": "t1", "looks": False}, first
    assert "[child] not all it read was seen (a Python child started with -I, which does not load the observer" in log
    _set_db(tmp_path / "data.db", "b")
    (tmp_path / "tool.txt").write_text("t2")
    (tmp_path / "override.yaml").write_text("lr: 0.1\n")
    result, log = _run(tmp_path, "2", MYAPP_BYTES="x")
    assert result == {"db": "b", "envb": "x", "child": "t2", "looks": True}, log
    assert f"[looks] runs again: {tmp_path / 'override.yaml'}, which it looked for and did not find, exists now" \
        in log, log
    assert f"[db] runs again: input {tmp_path / 'data.db'} changed" in log, log
    assert "[envb] runs again: environment variable MYAPP_BYTES changed" in log, log
    assert "[child] runs again: what its finished run read was not observed" in log, log
    again, log = _run(tmp_path, "3", MYAPP_BYTES="x")
    assert again == result and "[db] skipped" in log and "[envb] skipped" in log and "[looks] skipped" in log, log
    assert "[child] runs again" in log, log


@pytest.mark.slow
def test_warm_ranks_observe_each_call_on_its_own(tmp_path):
    """A warm rank reads the first call's files before the second call: each call's record is its own."""
    _project(tmp_path)
    first, _ = _run(tmp_path, "1", WARM="1")
    assert first["reader"] == "one+c1" and first["sharded"] == 300
    again, log = _run(tmp_path, "2", WARM="1")
    assert again == first and not _ran(log), log
    (tmp_path / "data" / "b.txt").write_text("two")
    result, log = _run(tmp_path, "3", WARM="1")
    assert result["reader"] == "two+c1" and _ran(log) == {"reader"}, log
    assert f"[reader] runs again: input {tmp_path / 'data' / 'b.txt'} changed" in log, log
    (tmp_path / "archmod.py").write_text("WIDTH = 128\n")  # imported by a computed name, maybe by an earlier call
    result, log = _run(tmp_path, "4", WARM="1")
    assert result["arch"] == result["arch2"] == 128 and {"arch", "arch2"} <= _ran(log), log


def test_the_recorder_sees_files_looked_for_and_not_found_by_the_users_code_only(tmp_path):
    """``os.path.exists``/``Path.is_file`` of a missing file by the user's code is a read of it (its appearing
    is a change); the import system's misses, and a file that is there but only looked at, are not; shutil
    still takes the wrapped ``os.stat`` for its fd-based (symlink-safe) rmtree."""
    code = (f"import os, pathlib\n"
            f"os.path.exists({str(tmp_path / 'nope.yaml')!r}); pathlib.Path({str(tmp_path / 'nope.txt')!r}).is_file()\n"
            f"os.path.exists({str(tmp_path)!r})\n"
            f"import shutil, json; assert shutil._use_fd_functions\n"
            f"try:\n    import no_such_module_here\nexcept ImportError:\n    pass\n")
    reads = _observed(tmp_path, code)
    assert {f"f {tmp_path / 'nope.yaml'}", f"f {tmp_path / 'nope.txt'}"} <= reads, reads
    assert f"f {tmp_path}" not in reads and not any("no_such_module_here" in line for line in reads), reads


def test_a_folder_of_many_files_read_is_kept_as_the_folder_and_a_module_cache_as_its_source():
    many = {f"f /d/s{i}.bin" for i in range(300)}
    assert _folded(many | {"f /e/one.txt", "e HOME"}) == {"F /d", "f /e/one.txt", "e HOME"}
    assert _source_of("/p/pkg/__pycache__/mod.cpython-312.pyc") == "/p/pkg/mod.py"
    assert _source_of("/p/data.pyc") == "/p/data.pyc"


def test_a_module_read_through_its_compiled_cache_keeps_its_sources_state(tmp_path):
    """Where Python writes bytecode (its default: not on CI's machine), the first import of a module writes
    its cache and later ones read the cache: both observers must record the source, with the source's
    state, or every stage importing your module would rerun as "mymod.py changed while its last run ran"
    (it did: the observer below Python recorded the cache's state under the source's name)."""
    from parsl_torch.apps.identity.reads import changed_while_running
    from parsl_torch.observe import native as preload
    from parsl_torch.observe.recorder import file_state

    assert preload.library() is not None, preload.why_not()
    (tmp_path / "proj").mkdir()
    source = tmp_path / "proj" / "mymod.py"
    source.write_text("VALUE = 1\n")
    code = ("import os, subprocess, sys\n"
            "env = {k: v for k, v in os.environ.items() if k != 'PYTHONDONTWRITEBYTECODE'}\n"
            "for _ in range(2):  # the first writes the cache, the second reads it\n"
            f"    subprocess.run([sys.executable, '-c', 'import mymod'], env=env, cwd={str(source.parent)!r}, "
            "check=True)\n")
    reads = _observed(tmp_path, code)
    assert list((source.parent / "__pycache__").glob("mymod.*.pyc")), "the cache was not written"
    assert f"f {source}" in reads and f"t {file_state(str(source))} {source}" in reads, reads
    assert not any("__pycache__" in line or line == f"w {source}" for line in reads), reads
    assert changed_while_running(sorted(reads)) == [], reads


def _observed(tmp_path: Path, code: str) -> set[str]:
    """What ``python -c code`` read, observed as a rank's processes are."""
    from parsl_torch.observe.recorder import reads_of
    from parsl_torch.launch.shim import observing_env

    folder = tmp_path / "reads"
    folder.mkdir()
    scratch = {"TMPDIR": str(tmp_path / "tmp")}
    env = clean_env(**scratch, **observing_env(str(folder), {**os.environ, **scratch}, [sys.executable]))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    return reads_of(str(folder))


def test_the_recorder_sees_reads_in_children_and_forked_workers_and_not_the_standard_library(tmp_path):
    data = tmp_path / "in.txt"
    data.write_text("x")
    code = (f"import os, subprocess, sys, multiprocessing as mp\n"
            f"open({str(data)!r}).read(); os.environ.get('MYAPP_KEY'); os.listdir({str(tmp_path)!r})\n"
            f"subprocess.run([sys.executable, '-c', 'import os; os.environ.get(\"CHILD_KEY\")'], check=True)\n"
            f"p = mp.get_context('fork').Process(target=lambda: open({str(data)!r} + '.2', 'w') and "
            f"open({str(data)!r} + '.2').read())\n"
            f"p.start(); p.join()\n")
    reads = _observed(tmp_path, code)
    assert {f"f {data}", "e MYAPP_KEY", f"d {tmp_path}", "e CHILD_KEY", f"f {data}.2"} <= reads, reads
    assert not any("python3" in line or "site-packages" in line for line in reads), reads


def test_the_recorder_sees_sqlite_environb_and_python_children_that_drop_it(tmp_path):
    """Reads Python's open does not see: SQLite's own, ``os.environb``; a Python child started without the
    observer (``-I``, a cleared environment) is told, one started as usual is not; a file changed after its
    first read (not by the stage) is found at the end, one the stage rewrote itself is not."""
    db, data, own, h5 = tmp_path / "t.db", tmp_path / "in.txt", tmp_path / "own.txt", tmp_path / "h.h5"
    data.write_text("x")
    own.write_text("x")
    with h5py.File(h5, "w") as f:
        f["x"] = [1]
    code = (f"import os, sqlite3, subprocess, sys\n"
            f"sqlite3.connect({str(db)!r}).execute('create table t (a)')\n"
            f"os.environb.get(b'MYAPP_BYTES')\n"
            f"open({str(data)!r}).read(); open({str(own)!r}).read(); open({str(own)!r}, 'w').write('y')\n"
            f"import h5py\nwith h5py.File({str(h5)!r}, 'a') as f: f['y'] = [2]\n"  # (read, then changed by itself)
            f"subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
            f"subprocess.run([sys.executable, '-I', '-c', 'pass'], check=True)\n"
            f"subprocess.run([sys.executable, '-c', 'pass'], env={{'PATH': os.environ['PATH']}}, check=True)\n")
    from parsl_torch.apps.identity.reads import changed_while_running

    reads = _observed(tmp_path, code)
    assert {f"f {db}", f"w {db}", "e MYAPP_BYTES", f"f {data}", f"w {own}", f"f {h5}", f"w {h5}"} <= reads, reads
    unseen = sorted(line for line in reads if line.startswith("x "))
    assert len(unseen) == 2 and "started with -I" in unseen[0] and "PYTHONPATH without" in unseen[1], unseen
    assert changed_while_running(sorted(reads)) == []
    data.write_text("changed after the stage read it")
    assert changed_while_running(sorted(reads)) == [str(data)]


def write_loader_file(data: Path, name: str, version: int) -> None:
    """One of the files the ML loaders read in compiled code (its content marks ``version``): safetensors
    weights, a tokenizers tokenizer, a sentencepiece model, a Parquet table, a part of a folder of them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    (data / "parts").mkdir(parents=True, exist_ok=True)
    if name == "w.safetensors":
        from safetensors.numpy import save_file

        save_file({"w": np.full(3, float(version))}, str(data / name))
    elif name == "tok.json":
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        from tokenizers.pre_tokenizers import Whitespace

        tokenizer = Tokenizer(WordLevel({"a": 0, "b": version, "[UNK]": 9}, unk_token="[UNK]"))
        tokenizer.pre_tokenizer = Whitespace()
        tokenizer.save(str(data / name))
    elif name == "sp.model":
        import sentencepiece as spm

        corpus = data / "corpus.txt"
        corpus.write_text("\n".join(f"hello world sentence {i} of version {version}" for i in range(200)))
        spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(data / "sp"), vocab_size=28 + version,
                                       minloglevel=2)
    else:  # t.parquet, parts/*.parquet
        pq.write_table(pa.table({"x": list(range(version + 1))}), data / name)


def _loaders() -> None:
    """The compiled loaders (the ``loaders`` extra: make test installs it, make test-lowest does not)."""
    for name in ("safetensors", "tokenizers", "pyarrow", "sentencepiece"):
        pytest.importorskip(name, reason="the loaders extra (pip install -e '.[loaders]')")


LOADER_FILES = ("w.safetensors", "tok.json", "sp.model", "t.parquet", "parts/a.parquet")


def static_program(path: Path, reads: str) -> None:
    """A static binary (``gcc -static``) that counts the lines of ``reads`` into n.txt."""
    source = path.with_suffix(".c")
    source.write_text(f'#include <stdio.h>\nint main(void) {{ FILE *f = fopen("{reads}", "r"); int c, n = 0;\n'
                      f'while ((c = fgetc(f)) != EOF) n += c == 10;\nfprintf(fopen("n.txt", "w"), "%d\\n", n); '
                      f'return 0; }}\n')
    subprocess.run(["gcc", "-static", "-O1", "-o", str(path), str(source)], check=True, timeout=120)


def test_the_preloaded_observer_sees_what_compiled_code_and_programs_read(tmp_path):
    """Below Python's ``open``: Rust's loaders (safetensors, tokenizers) and C++'s (pyarrow's table and its
    listing of a folder of parts, sentencepiece) in a Python process, in a thread too; a tool (``sort``; one
    started by ``posix_spawn``), a shell script and what it looked for and did not find, each program
    started; a static program, a Go program (its own system calls) and a program given an environment
    without the observer are told (``x``), not taken as observed (the system's static ``ldconfig``, which
    ``ctypes.util.find_library`` runs, is not). Python's own listings and lookups stay the Python observer's (the import
    system's are no input)."""
    from parsl_torch.observe import native as preload

    _loaders()
    assert preload.library() is not None, preload.why_not()
    data = tmp_path / "data"
    for name in LOADER_FILES:
        write_loader_file(data, name, 1)
    (data / "words.txt").write_text("b\na\n")
    (data / "spawned.txt").write_text("s\n")
    shutil.copy(data / "w.safetensors", data / "thread.safetensors")
    script = tmp_path / "count.sh"
    script.write_text(f"#!/bin/bash\ntest -e {tmp_path / 'override.yaml'} || wc -l < {data / 'words.txt'}\n")
    script.chmod(0o755)
    static_program(tmp_path / "static_count", str(data / "words.txt"))
    import wandb  # (its wandb-core is a Go program: copied out of the installed package, it is a tool of yours)

    shutil.copy(Path(wandb.__file__).parent / "bin" / "wandb-core", tmp_path / "gotool")
    code = (f"import os, subprocess, sys\n"
            f"from safetensors.numpy import load_file; load_file({str(data / 'w.safetensors')!r})\n"
            f"from tokenizers import Tokenizer; Tokenizer.from_file({str(data / 'tok.json')!r})\n"
            f"import sentencepiece; sentencepiece.SentencePieceProcessor(model_file={str(data / 'sp.model')!r})\n"
            f"import pyarrow.parquet as pq; pq.read_table({str(data / 't.parquet')!r})\n"
            f"pq.read_table({str(data / 'parts')!r})\n"
            f"subprocess.run(['sort', {str(data / 'words.txt')!r}], check=True, capture_output=True)\n"
            f"subprocess.run([{str(script)!r}], check=True, capture_output=True)\n"
            f"subprocess.run([{str(tmp_path / 'static_count')!r}], check=True, cwd={str(tmp_path)!r})\n"
            f"subprocess.run(['cat', {str(data / 'corpus.txt')!r}], env={{'PATH': os.environ['PATH']}}, "
            f"check=True, capture_output=True)\n"
            f"import threading; t = threading.Thread(target=lambda: open({str(data / 'tok.json')!r}).read() and "
            f"load_file({str(data / 'thread.safetensors')!r})); t.start(); t.join()\n"
            f"os.waitpid(os.posix_spawn('/bin/cat', ['cat', {str(data / 'spawned.txt')!r}], os.environ), 0)\n"
            f"import ctypes.util; ctypes.util.find_library('c')\n"  # (runs the static ldconfig: the system's)
            f"subprocess.run([{str(tmp_path / 'gotool')!r}, '--help'], capture_output=True)\n")
    reads = _observed(tmp_path, code)
    files = {f"f {data / name}" for name in ("w.safetensors", "tok.json", "sp.model", "t.parquet", "parts/a.parquet",
                                              "words.txt", "thread.safetensors", "spawned.txt")}
    assert files | {f"d {data / 'parts'}", f"f {script}", f"f {tmp_path / 'override.yaml'}"} <= reads, reads
    assert any(line.startswith("f ") and line.endswith("/sort") for line in reads), reads  # (the program, read)
    assert all(any(line.startswith("t ") and line.endswith(f[2:]) for line in reads) for f in files), reads
    unseen = sorted(line for line in reads if line.startswith("x "))
    assert unseen == [f"x a Go program, which reads through its own system calls, unseen: {tmp_path / 'gotool'}",
                      f"x a program started with an environment without the observer: {shutil.which('cat')}",
                      f"x a static program, which does not load the observer: {tmp_path / 'static_count'}"], unseen
    assert not any(line.startswith("d ") and "site-packages" in line or "python3" in line for line in reads), reads
    assert f"d {tmp_path}" not in reads  # (the import system lists sys.path's folders: Python's own listing)
    from parsl_torch.observe.recorder import reads_of
    from parsl_torch.launch.shim import observing_env

    for program, unseen in ((tmp_path / "gotool", "a Go program, which reads through its own system calls, unseen"),
                            (tmp_path / "static_count", "a static program, which does not load the observer")):
        folder = tmp_path / f"stage-{program.name}"  # (a stage whose command is the program: its shim says it)
        folder.mkdir()
        observing_env(str(folder), os.environ, [str(program)])
        assert reads_of(str(folder)) == {f"x {unseen}: {program}", "e *"}  # (a program reads its environment)


BELOW_PYTHON = '''
import json, os, subprocess
from pathlib import Path

import parsl_torch as pt
from paths import DATA_DIR


def data(name):
    return os.path.join(DATA_DIR, name)  # a path built at run time from a module's folder


@pt.distributed_app(ranks_per_node=1)
def weights():  # safetensors: Rust
    from safetensors.numpy import load_file
    return float(load_file(data("w.safetensors"))["w"].sum())


@pt.distributed_app(ranks_per_node=1)
def tok():  # tokenizers: Rust
    from tokenizers import Tokenizer
    return Tokenizer.from_file(data("tok.json")).encode("a b").ids


@pt.distributed_app(ranks_per_node=1)
def spm():  # sentencepiece: C++
    import sentencepiece
    return sentencepiece.SentencePieceProcessor(model_file=data("sp.model")).get_piece_size()


@pt.distributed_app(ranks_per_node=1)
def table():  # pyarrow: C++, a file and a folder of parts it lists
    import pyarrow.parquet as pq
    return [pq.read_table(data("t.parquet")).num_rows, pq.read_table(data("parts")).num_rows]


@pt.distributed_app(ranks_per_node=1)
def tool():  # a compiled tool the stage runs
    return subprocess.run(["sort", data("words.txt")], capture_output=True, text=True, check=True).stdout


def output(future):
    future.result()
    return Path(future.outputs[0].result().filepath).read_text().strip()


with pt.workflow(site="local", run_dir="runs"):
    futures = {"weights": weights(), "tok": tok(), "spm": spm(), "table": table(), "tool": tool()}
    shell = pt.script_app("count.sh", ranks_per_node=1)(outputs=["n.txt"])  # a shell script, observed
    static = pt.script_app("static_count", ranks_per_node=1)(outputs=["n.txt"])  # not observable: reruns
    results = {**{k: f.result() for k, f in futures.items()}, "count": output(shell), "static_count": output(static)}
    print("RESULT", json.dumps(results), flush=True)
'''


@pytest.mark.slow
def test_compiled_loaders_tools_and_shell_stages_rerun_when_what_they_read_changes(tmp_path):
    """Separate ``python wf.py`` runs, one set of edits between them, the paths built at run time: a file read
    by safetensors, tokenizers, sentencepiece or pyarrow (or added to the folder pyarrow reads), or by a tool
    or a shell script stage, reruns exactly the stages that read it, with the new value; nothing unchanged
    reruns; a static program's stage reruns every time, and the log says why."""
    _loaders()
    (tmp_path / "wf.py").write_text(BELOW_PYTHON)
    (tmp_path / "paths.py").write_text("import os\nDATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "
                                       "'data')\n")
    data = tmp_path / "data"
    for name in LOADER_FILES:
        write_loader_file(data, name, 1)
    (data / "words.txt").write_text("b\na\n")
    (tmp_path / "count.sh").write_text(f"#!/bin/bash\nwc -l < {data / 'words.txt'} > n.txt\n")
    (tmp_path / "count.sh").chmod(0o755)
    static_program(tmp_path / "static_count", str(data / "words.txt"))
    _short_tmpdir(tmp_path)
    stages = ("weights", "tok", "spm", "table", "tool", "count", "static_count")

    def ran(log):
        return {s for s in stages if f"[{s}] runs" in log}

    first, log = _run(tmp_path, "1")
    assert first == {"weights": 3.0, "tok": [0, 1], "spm": 29, "table": [2, 2], "tool": "a\nb\n", "count": "2",
                     "static_count": "2"}, first
    unseen = f"[static_count] not all it read was seen (a static program, which does not load the observer: " \
             f"{tmp_path / 'static_count'})"
    assert unseen in log, log
    again, log = _run(tmp_path, "2")
    assert again == first and ran(log) == {"static_count"}, log
    assert "[static_count] runs again: what its finished run read was not observed" in log, log
    write_loader_file(data, "w.safetensors", 2)
    write_loader_file(data, "t.parquet", 3)
    write_loader_file(data, "parts/b.parquet", 2)  # a part added: the folder pyarrow listed
    result, log = _run(tmp_path, "3")
    assert ran(log) == {"weights", "table", "static_count"}, log
    assert result == {**first, "weights": 6.0, "table": [4, 5]}, result
    assert f"[weights] runs again: input {data / 'w.safetensors'} changed" in log, log
    assert f"[table] runs again: input {data / 't.parquet'} changed" in log or \
        f"[table] runs again: the folder {data / 'parts'} changed" in log, log
    write_loader_file(data, "tok.json", 5)
    write_loader_file(data, "sp.model", 4)
    (data / "words.txt").write_text("c\nb\na\n")
    # and no compiler where the observer is not built yet (the edits are seen from the last runs' records): said
    # once; the shell stage that runs cannot promise
    final, log = _run(tmp_path, "4", CC="no-such-cc", PARSL_TORCH_CACHE_DIR=str(tmp_path / "empty-cache"))
    assert ran(log) == {"tok", "spm", "tool", "count", "static_count"}, log
    assert final == {**result, "tok": [0, 5], "spm": 32, "tool": "a\nb\nc\n", "count": "3", "static_count": "3"}
    # (CC is new in the environment, which a program other than Python reads whole: said beside the input)
    assert f"input {data / 'words.txt'} changed" in _why(log, "count"), log
    assert f"[tok] runs again: input {data / 'tok.json'} changed" in log, log
    why = "CC=no-such-cc is not a program found on PATH, to build the observer of compiled code"
    assert log.count(f"{why}: what stages read through compiled code is not observed") == 1, log
    assert f"[count] not all it read was seen ({why}: {tmp_path / 'count.sh'})" in log, log


def test_without_a_compiler_python_observation_alone_applies_and_says_so(tmp_path, monkeypatch):
    """No compiler (here: ``CC`` naming none): no library, and ``doctor`` says what is then not observed; a
    Python process asked to load a library that does not load says its reads are not all seen."""
    from parsl_torch.cli.doctor import check_observer
    from parsl_torch.observe import native as preload

    monkeypatch.setenv("CC", "no-such-cc")
    monkeypatch.setenv("PARSL_TORCH_CACHE_DIR", str(tmp_path / "cache"))
    preload._built.cache_clear()
    try:
        why = "CC=no-such-cc is not a program found on PATH, to build the observer of compiled code"
        assert (preload.library(), preload.why_not()) == (None, why)
        check = check_observer()
        assert check.status == "warn" and check.detail.startswith(f"{why}: what compiled loaders"), check
        monkeypatch.delenv("CC")
        monkeypatch.setenv("PARSL_TORCH_CACHE_DIR", str(tmp_path / "my cache"))  # (LD_PRELOAD splits at spaces)
        preload._built.cache_clear()
        assert preload.library() is None and "whose path holds a space or a ':'" in preload.why_not()
    finally:
        preload._built.cache_clear()
    folder = tmp_path / "reads"
    folder.mkdir()
    from parsl_torch.launch.shim import observing_env

    monkeypatch.undo()
    broken = {**observing_env(str(folder), os.environ, [sys.executable]), "LD_PRELOAD": "/gone/parsl-torch-observe.so"}
    subprocess.run([sys.executable, "-c", "pass"], env=clean_env(**broken), check=True, timeout=60,
                   capture_output=True)
    from parsl_torch.observe.recorder import reads_of

    assert [line for line in reads_of(str(folder)) if line.startswith("x ")] == [
        f"x the observer of compiled code did not load in {sys.executable} (LD_PRELOAD=/gone/parsl-torch-observe.so)"]


CONFIG_WORKFLOW = '''
import json, os
from pathlib import Path
import yaml
import parsl_torch as pt

HERE = os.path.dirname(os.path.abspath(__file__))


@pt.distributed_app(ranks_per_node=1)
def chain():
    def load(path):  # an include chain, as research code writes one
        cfg = yaml.safe_load(open(path))
        include = cfg.pop("include", None)
        return {**(load(os.path.join(os.path.dirname(path), include)) if include else {}), **cfg}

    cfg = load(os.path.join(HERE, "conf", "a.yaml"))
    return cfg["scale"] * sum(int(open(os.path.join(HERE, f)).read()) for f in cfg["shards"])


@pt.distributed_app(ranks_per_node=1)
def dirin(folder):
    return sorted((p.name, p.read_text()) for p in Path(folder).iterdir())


@pt.distributed_app(ranks_per_node=1)
def envcopy():
    return os.environ.copy().get("MYAPP_EXTRA", "unset")


def text(future):
    future.result()
    return Path(future.outputs[0].result().filepath).read_text()


with pt.workflow(site="local", run_dir="runs"):
    hydra = pt.script_app("hyd/app.py", ranks_per_node=1)  # (its stage: hyd, its folder)
    futures = {"hyd": hydra("model=large", "data.path=" + os.path.join(HERE, "data", "in.txt"), outputs=["out.txt"]),
               "hyd2": hydra("-cn", "other", stage="hyd2", outputs=["out.txt"]),
               "chain": chain(), "dirin": dirin(Path("dirin")), "envcopy": envcopy()}
    print("RESULT", json.dumps({k: text(f) if k.startswith("hyd") else f.result() for k, f in futures.items()}))
'''

HYDRA_APP = '''
import hydra


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg):
    width = cfg.model.width if "model" in cfg else cfg.width
    data = open(cfg.data.path).read().strip() if "data" in cfg else "-"
    open("out.txt", "w").write(f"{width}|{cfg.extra}|{data}")


main()
'''


def _config_project(root: Path) -> None:
    files = {"wf.py": CONFIG_WORKFLOW, "hyd/app.py": HYDRA_APP, "data/in.txt": "in-v1",
             "hyd/conf/config.yaml": "defaults:\n  - model: small\n  - _self_\ndata:\n  path: /nonexistent\n"
                                     "extra: ${oc.env:MYAPP_EXTRA,none}\n",
             "hyd/conf/model/small.yaml": "width: 8\n", "hyd/conf/model/large.yaml": "width: 64\n",
             "hyd/conf/other.yaml": "width: 3\nextra: ${oc.env:MYAPP_EXTRA,none}\n",
             "conf/a.yaml": "include: b.yaml\n", "conf/b.yaml": "include: c.yaml\n", "conf/c.yaml": "include: d.yaml\n",
             "conf/d.yaml": "scale: 1\nshards:\n" + "".join(f"  - shards2/s{i}.txt\n" for i in range(70)),
             "dirin/x.txt": "aaa"}
    files.update({f"shards2/s{i}.txt": "1" for i in range(70)})
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    _short_tmpdir(root)


def _ran_of(log: str) -> set[str]:
    return {s for s in ("hyd", "hyd2", "chain", "dirin", "envcopy") if f"[{s}] runs" in log}


@pytest.mark.slow
def test_configs_hydra_and_an_include_chain_are_seen_by_what_the_stage_read(tmp_path):
    """The audit's config cases: a Hydra group picked on the command line, ``-cn``, ``${oc.env:X}`` and a data
    file named by an override; a 4-deep include chain listing 70 shards; a file replaced by ``cp -p`` in a
    folder given as a Path; the environment read through ``os.environ.copy()``."""
    _config_project(tmp_path)
    first, _ = _run(tmp_path, "1")
    assert first == {"hyd": "64|none|in-v1", "hyd2": "3|none|-", "chain": 70, "dirin": [["x.txt", "aaa"]],
                     "envcopy": "unset"}
    again, log = _run(tmp_path, "2")
    assert again == first and not _ran_of(log), log
    (tmp_path / "hyd/conf/model/large.yaml").write_text("width: 65\n")  # the group picked by model=large
    (tmp_path / "hyd/conf/other.yaml").write_text("width: 4\nextra: ${oc.env:MYAPP_EXTRA,none}\n")  # -cn other
    (tmp_path / "shards2/s5.txt").write_text("5")  # a shard the last include lists
    old = tmp_path / "dirin/x.txt"
    (tmp_path / "new.txt").write_text("bbb")
    os.utime(tmp_path / "new.txt", ns=(old.stat().st_atime_ns, old.stat().st_mtime_ns))
    subprocess.run(["cp", "-p", str(tmp_path / "new.txt"), str(old)], check=True)  # same size, same mtime
    result, log = _run(tmp_path, "3")
    assert result == {**first, "hyd": "65|none|in-v1", "hyd2": "4|none|-", "chain": 74, "dirin": [["x.txt", "bbb"]]}
    assert _ran_of(log) == {"hyd", "hyd2", "chain", "dirin"}, log
    for said in (f"input {tmp_path}/hyd/conf/model/large.yaml changed", f"input {tmp_path}/hyd/conf/other.yaml changed",
                 f"input {tmp_path}/shards2/s5.txt changed", f"input {tmp_path}/dirin changed"):
        assert said in log, (said, log)
    (tmp_path / "data/in.txt").write_text("in-v2")  # named by an override: data.path=...
    (tmp_path / "conf/d.yaml").write_text((tmp_path / "conf/d.yaml").read_text().replace("scale: 1", "scale: 2"))
    result, log = _run(tmp_path, "4", MYAPP_EXTRA="x")  # ${oc.env:MYAPP_EXTRA}, and the whole environment
    assert result == {**first, "hyd": "65|x|in-v2", "hyd2": "4|x|-", "chain": 148, "dirin": [["x.txt", "bbb"]],
                      "envcopy": "x"}
    assert _ran_of(log) == {"hyd", "hyd2", "chain", "envcopy"}, log
    for said in (f"input {tmp_path}/data/in.txt changed", f"input {tmp_path}/conf/d.yaml changed",
                 "[hyd2] runs again: environment variable MYAPP_EXTRA changed",
                 "[envcopy] runs again: the environment's variables changed"):
        assert said in log, (said, log)


def _why(log: str, stage: str) -> str:
    """Why the log says ``stage`` runs again ("" where it does not)."""
    return next((line.split(" runs again: ", 1)[1] for line in log.splitlines() if f"[{stage}] runs again: " in line), "")


METADATA_AND_LISTINGS = {  # a stage each: what it learns of a file's metadata, or of a folder listed in C
    "sized": '[ -s "$D/flag" ] && echo full || echo empty',
    "exists": '[ -e "$D/marker" ] && echo yes || echo no',
    "statsize": 'stat -c %s "$D/data.bin"',
    "listing": 'ls -l "$D/dir" | grep "^-" | awk \'{print $9, $5}\'',
    "du": 'du -sb "$D/dir/a.txt" | cut -f1',
    "findsize": 'find "$D/dir" -size +3c -type f | sort | xargs -n1 basename | tr "\\n" " "',
    "newer": '[ "$D/a" -nt "$D/b" ] && echo newer || echo older',
    "link": 'readlink "$D/lnk"',
    "upandover": 'cat "$D/dir/lnk/../e.txt"',
    "runparts": 'run-parts --test "$D/parts" | wc -l',
    "walks": '"$D/walk" "$D/tree"',  # nftw, glob(3) and scandir(3), in a program of its own
    "scale": 'echo "scale=$MYAPP_SCALE"',  # a program reads its whole environment, without a call
}

WALK_C = r"""
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <ftw.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int files;
static int one(const char *p, const struct stat *s, int kind, struct FTW *f) { files += kind == FTW_F; return 0; }
int main(int argc, char **argv) {
    char pattern[4096];
    struct dirent **names;
    glob_t g;
    nftw(argv[1], one, 8, FTW_PHYS);
    snprintf(pattern, sizeof pattern, "%s/*.txt", argv[1]);
    int globbed = glob(pattern, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
    int scanned = scandir(argv[1], &names, NULL, alphasort);
    printf("%d %d %d\n", files, globbed, scanned);
    return 0;
}
"""

METADATA_WORKFLOW = """
import os, subprocess, tempfile
import parsl_torch as pt

HERE = os.getcwd()

@pt.distributed_app(ranks_per_node=1)
def sizes() -> str:  # Python's: a size looked at, a file looked for that was there
    d = os.environ["D"]
    return f"{os.path.getsize(os.path.join(d, 'data.bin'))} {os.path.exists(os.path.join(d, 'marker'))}"

@pt.distributed_app(ranks_per_node=1)
def via_shell() -> str:  # a program your code starts reads the whole environment
    return subprocess.run(["bash", "-c", "echo $MYAPP_SCALE"], capture_output=True, text=True).stdout.strip()

@pt.distributed_app(ranks_per_node=1)
def optional() -> str:  # the project is under /tmp, the default TMPDIR: a lookup there is an input
    path = os.path.join(HERE, "extra.yaml")
    return open(path).read().strip() if os.path.exists(path) else "none"

@pt.distributed_app(ranks_per_node=1)
def scratch() -> str:  # its own scratch in TMPDIR, made during the call: no input
    fd, path = tempfile.mkstemp()
    os.write(fd, b"made")
    os.close(fd)
    with tempfile.NamedTemporaryFile("w+") as f:
        f.write("more")
        f.flush()
        more = open(f.name).read()
    made = open(path).read()
    os.unlink(path)
    return made + more

with pt.workflow(site="local", run_dir="runs"):
    futures = {name: pt.script_app(f"{name}.sh", ranks_per_node=1)("out.txt", outputs=["out.txt"])
               for name in NAMES}
    found = {name: open(f.outputs[0].result().filepath).read().strip() for name, f in futures.items()}
    calls = {"sizes": sizes(), "via_shell": via_shell(), "optional": optional(), "scratch": scratch()}
    print("RESULT", json.dumps({**found, **{name: f.result() for name, f in calls.items()}}), flush=True)
"""


@pytest.mark.slow
def test_what_programs_learn_of_files_metadata_and_of_folders_listed_in_the_c_library_reruns_them(tmp_path):
    """Shell stages were skipped with their old answer after the input changed: `[ -s flag ]`, `[ -e f ]` on a
    file since deleted, `stat -c %s`, `ls -l`, `du -sb`, `find -size`, `[ a -nt b ]`, `readlink`, a path through
    a link and `..`, folders listed by scandir(3), glob(3), nftw(3) and run-parts; in Python,
    `os.path.getsize` and `os.path.exists` on a file since deleted. A shell stage, and a shell a stage starts,
    that use $MYAPP_SCALE were skipped when it changed; a project under /tmp (the default TMPDIR): a stage
    that looked for an optional file there was skipped after it appeared. Each reruns now, with its new
    answer; nothing reruns when nothing changed (a terminal's own variables changed: no input), and a
    stage's own scratch in TMPDIR never makes it rerun."""
    assert str(tmp_path).startswith(tempfile.gettempdir())
    d = tmp_path / "data"
    for folder in ("dir/sub", "parts", "tree/deep", "elsewhere/x"):
        (d / folder).mkdir(parents=True)
    (d / "flag").write_text("x")
    (d / "marker").write_text("m")
    (d / "data.bin").write_bytes(b"1234")
    (d / "dir" / "a.txt").write_text("ab")
    (d / "a").write_text("a")
    (d / "b").write_text("b")
    os.utime(d / "b", (1, 1))  # b older than a
    (d / "lnk").symlink_to("dir")
    (d / "dir" / "lnk").symlink_to(d / "elsewhere" / "x")
    (d / "e.txt").write_text("not read")  # (where the path would lead lexically)
    (d / "elsewhere" / "e.txt").write_text("e1")
    (d / "parts" / "one").write_text("#!/bin/sh\n")
    (d / "parts" / "one").chmod(0o755)
    (d / "tree" / "t1.txt").write_text("t")
    (d / "tree" / "deep" / "t2").write_text("t")
    subprocess.run(["cc", "-o", str(d / "walk"), "-x", "c", "-"], input=WALK_C, text=True, check=True)
    for name, line in METADATA_AND_LISTINGS.items():
        (tmp_path / f"{name}.sh").write_text(f'#!/bin/bash\n{{ {line}; }} > "$1"\n')
        (tmp_path / f"{name}.sh").chmod(0o755)
    (tmp_path / "wf.py").write_text("import json\nNAMES = " + repr(list(METADATA_AND_LISTINGS)) + METADATA_WORKFLOW)

    def run(seed: str, scale: str = "1") -> tuple[dict, str]:
        out = subprocess.run([sys.executable, "wf.py"], capture_output=True, text=True, timeout=400, cwd=tmp_path,
                             env=clean_env(D=str(d), PYTHONHASHSEED=seed, MYAPP_SCALE=scale,
                                           SSH_TTY=f"/dev/pts/{seed}"))
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.split("RESULT ", 1)[1]), out.stderr

    first, _ = run("1")
    assert first == {"sized": "full", "exists": "yes", "statsize": "4", "listing": "a.txt 2", "du": "2",
                     "findsize": "", "newer": "newer", "link": "dir", "upandover": "e1", "runparts": "1",
                     "walks": "2 1 4", "scale": "scale=1", "sizes": "4 True", "via_shell": "1", "optional": "none",
                     "scratch": "mademore"}, first
    again, log = run("2")
    assert again == first and " runs again" not in log, log
    (d / "flag").write_text("")
    (d / "marker").unlink()
    (d / "data.bin").write_bytes(b"123456")
    (d / "dir" / "a.txt").write_text("abcdef")
    os.utime(d / "b", None)  # b now newer
    (d / "lnk").unlink()
    (d / "lnk").symlink_to("parts")
    (d / "elsewhere" / "e.txt").write_text("e2")
    (d / "parts" / "two").write_text("#!/bin/sh\n")
    (d / "parts" / "two").chmod(0o755)
    (d / "tree" / "t3.txt").write_text("t")
    (tmp_path / "extra.yaml").write_text("extra\n")
    last, log = run("3", scale="2")
    assert last == {"sized": "empty", "exists": "no", "statsize": "6", "listing": "a.txt 6", "du": "6",
                    "findsize": "a.txt", "newer": "older", "link": "parts", "upandover": "e2", "runparts": "2",
                    "walks": "3 2 5", "scale": "scale=2", "sizes": "6 False", "via_shell": "2", "optional": "extra",
                    "scratch": "mademore"}, last
    assert _why(log, "scale") == _why(log, "via_shell") == "environment variable MYAPP_SCALE changed", log
    assert _why(log, "optional") == f"{tmp_path / 'extra.yaml'}, which it looked for and did not find, exists now"
    assert "[scratch] skipped" in log, log
