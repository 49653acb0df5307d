"""Stage identity without running a stage: fingerprints of functions and arguments are the
same in every process and under any hash seed, change with what can change a result and
only with that, and the user modules a stage reaches are found through its imports."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from parsl_torch.apps import identity
from parsl_torch.apps.identity import usercode
from parsl_torch.apps.identity.fingerprint import Fingerprinter, Unidentifiable
from parsl_torch.apps.identity.namedfiles import named_files

from .conftest import clean_env

SCRIPT = textwrap.dedent("""
    import json, math, sys
    sys.path.insert(0, sys.argv[1])
    import lib
    from parsl_torch.apps.identity.fingerprint import Fingerprinter

    NAMES = {"alpha", "beta", "gamma"}
    TABLE = {"z": 1, "a": {"q", "r"}}

    def helper(x):
        return x in {"a", "b", "c"}

    def stage(x):
        return json.dumps([lib.twice(x), math.pi, sorted(NAMES), TABLE, helper(x)])

    fp = Fingerprinter(strict=False)
    print(fp.digest(stage, "stage"), sorted(m for _, m in fp.roots))
""")


def _fingerprint(tmp_path: Path, seed: str, body: str = SCRIPT) -> str:
    (tmp_path / "wf.py").write_text(body)
    out = subprocess.run([sys.executable, str(tmp_path / "wf.py"), str(tmp_path)], capture_output=True, text=True,
                         env=clean_env(PYTHONHASHSEED=seed), timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_function_of_the_script_has_one_fingerprint_under_every_hash_seed(tmp_path):
    (tmp_path / "lib.py").write_text("def twice(x):\n    return 2 * x\n")
    prints = {_fingerprint(tmp_path, seed) for seed in ("0", "1", "2", "3", "4")}
    assert len(prints) == 1 and prints.pop().endswith("['lib']")  # the user module it reaches is a root
    moved = SCRIPT.replace("import json, math, sys", "# a comment\n\n\nimport json, math, sys")
    assert _fingerprint(tmp_path, "7", moved) == _fingerprint(tmp_path, "7")
    assert _fingerprint(tmp_path, "7", SCRIPT.replace('"gamma"', '"delta"')) != _fingerprint(tmp_path, "7")
    assert _fingerprint(tmp_path, "7", SCRIPT.replace('"c"}', '"d"}')) != _fingerprint(tmp_path, "7")


@dataclass
class Opts:
    lr: float
    tags: tuple


def test_common_argument_types_have_an_identity_and_others_are_named(tmp_path):
    data = tmp_path / "x.txt"
    data.write_text("1")
    fp = Fingerprinter(strict=True)
    from collections import namedtuple

    point = namedtuple("point", "x y")
    values = [data, np.arange(3), {"b", "a"}, OrderedDict(a=1), Opts(0.1, ("x",)), frozenset({1}), b"raw", None,
              point(1, 2)]
    before = [fp.token(v, "arg") for v in values]
    assert [fp.token(v, "arg") for v in values] == before
    assert fp.token(OrderedDict(b=1, a=2), "a") != fp.token(OrderedDict(a=2, b=1), "a")  # its order is its value
    assert fp.token({"b": 1, "a": 2}, "a") == fp.token({"a": 2, "b": 1}, "a")
    assert fp.token(np.arange(3.0), "a") != fp.token(np.arange(3), "a")
    assert fp.files == {str(data)}  # a Path names an input
    import threading
    import tracemalloc

    big = b"\0" * (100 << 20)  # large values by digest: repr() would copy 100 MB several times
    tracemalloc.start()
    tokens = [fp.digest(big, "a"), fp.digest(bytearray(big), "a"), fp.digest("x" * (100 << 20), "a")]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 350 << 20, f"{peak >> 20} MiB for 100 MB values"  # (the bytearray and str themselves: 200)
    assert len(set(tokens)) == 3 and fp.digest(big[:-1] + b"\1", "a") != tokens[0]

    with pytest.raises(Unidentifiable, match=r"argument 'cfg'\['lock'\] is a _thread.lock"):
        fp.token({"lock": threading.Lock()}, "argument 'cfg'")

    # a library's mapping and sequence (OmegaConf's DictConfig and ListConfig are such): by their items, and a
    # path inside one names an input (it was hashed whole before, and the file was not seen)
    import types
    from collections import UserDict, UserList

    (tmp_path / "tokens.bin").write_text("t")
    fp = Fingerprinter(strict=True)
    cfg = UserDict(data=UserList([str(tmp_path / "tokens.bin")]), lr=0.1)
    assert fp.token(cfg, "a") == fp.token(UserDict(lr=0.1, data=UserList([str(tmp_path / "tokens.bin")])), "a")
    assert fp.token(cfg, "a") != fp.token(UserDict(data=UserList([str(tmp_path / "tokens.bin")]), lr=0.2), "a")
    assert fp.files == {str(tmp_path / "tokens.bin")}
    with pytest.raises(Unidentifiable, match=r"argument 'cfg'\['lock'\] is a _thread.lock"):  # named inside one too
        fp.token(UserDict(lock=threading.Lock()), "argument 'cfg'")
    assert fp.token(types.MappingProxyType({"a": 1}), "a") != fp.token(types.MappingProxyType({"a": 2}), "a")
    import argparse  # train(parser.parse_args()): by its attributes, its paths inputs

    (tmp_path / "val.bin").write_text("v")
    ns = argparse.Namespace(lr=0.1, val=str(tmp_path / "val.bin"))
    assert fp.token(ns, "a") == fp.token(argparse.Namespace(val=str(tmp_path / "val.bin"), lr=0.1), "a")
    assert fp.token(ns, "a") != fp.token(argparse.Namespace(lr=0.2, val=str(tmp_path / "val.bin")), "a")
    assert str(tmp_path / "val.bin") in fp.files


def test_user_modules_are_followed_through_imports_and_packages(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "main.py").write_text("import json\nfrom pkg import tool\n\ndef f():\n    import late\n")
    (tmp_path / "late.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "tool.py").write_text("from .sub import deep\nfrom . import missing_is_fine\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "deep.py").write_text("import numpy\n")
    (tmp_path / "unused.py").write_text("")
    found = usercode.user_modules([(str(tmp_path / "main.py"), "__main__")], [], identity.DigestCache(None))
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in found.digests) == [
        "late.py", "main.py", "pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/deep.py", "pkg/tool.py"]
    assert {"json", "numpy"} <= found.packages and "pkg" not in found.packages  # what is not the user's
    roots = usercode.module_origin("pkg", [str(tmp_path)])
    assert [m for _, m in roots] == ["pkg"]  # no __main__.py: the package itself
    assert not usercode.is_user_file(np.__file__) and not usercode.is_user_file(identity.__file__)


def test_an_extension_module_built_in_place_is_the_users_code_by_its_bytes(tmp_path):
    """``python setup.py build_ext --inplace``: a custom kernel beside the sources (``fastops.<abi>.so``, in a
    package too). It is found without being loaded, and rebuilding it changes the stage's identity."""
    from importlib.machinery import EXTENSION_SUFFIXES

    (tmp_path / "pkg").mkdir()
    (tmp_path / "main.py").write_text("import fastops\nfrom pkg import _C\n")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    ext, inner = tmp_path / f"fastops{EXTENSION_SUFFIXES[0]}", tmp_path / "pkg" / f"_C{EXTENSION_SUFFIXES[0]}"
    ext.write_bytes(b"\x7fELF v1\0")
    inner.write_bytes(b"\x7fELF c1\0")

    def digests() -> dict[str, str]:
        return usercode.user_modules([(str(tmp_path / "main.py"), "__main__")], [], identity.DigestCache(None)).digests

    before = digests()
    assert str(ext) in before and str(inner) in before
    ext.write_bytes(b"\x7fELF v2\0")  # rebuilt
    after = digests()
    assert after[str(ext)] != before[str(ext)] and after[str(inner)] == before[str(inner)]
    import h5py.h5

    assert h5py.h5.__file__.endswith(tuple(EXTENSION_SUFFIXES))
    assert not usercode.is_user_extension(h5py.h5.__file__)  # an installed one is a package's


def test_a_package_installed_with_pip_install_e_is_the_users_code(tmp_path, monkeypatch):
    """``pip install -e`` puts an import hook in place of a sys.path entry (setuptools' ``__editable__``
    finder): the package it maps is found through it, as user modules compared file by file, not as an
    installed package (whose files pip's RECORD does not list)."""
    import importlib.util

    src = tmp_path / "src" / "edpkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("from .core import f\n")
    (src / "core.py").write_text("def f():\n    return 1\n")

    class EditableFinder:  # as setuptools' finder: a top-level name -> its sources
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "edpkg":
                return None
            return importlib.util.spec_from_file_location(name, src / "__init__.py",
                                                          submodule_search_locations=[str(src)])

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, EditableFinder])
    assert [m for _, m in usercode.user_files("edpkg.core", [])] == ["edpkg", "edpkg.core"]
    reached = usercode.user_modules([(str(src / "__init__.py"), "edpkg")], [], identity.DigestCache(None))
    assert sorted(Path(p).name for p in reached.digests) == ["__init__.py", "core.py"] and not reached.packages


def test_module_digests_ignore_comments_and_follow_code(tmp_path):
    a = usercode.parse_module(b"x = 1\n", "a.py")
    assert usercode.parse_module(b"# c\n\nx = 1  # one\n", "a.py") == a
    assert usercode.parse_module(b"x = 2\n", "a.py") != a
    assert usercode.parse_module(b"def (:\n", "a.py")[0].startswith("bytes:")


def test_strings_that_name_existing_files_or_directories_are_inputs(tmp_path, monkeypatch):
    """The script_app rule, for every string of a call: relative to the working directory or absolute,
    inside containers too; not "/", ".", "..", a device, a dict's key, or a bare word (a folder's name
    without a / is a word: "data", "train")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("1")
    fp = Fingerprinter(strict=True)
    fp.token(["data/x.txt", {"dir": "./data", "sep": "/", "here": ".", "up": "..", "word": "the", "null": "/dev/null",
                             "absolute": str(tmp_path / "data" / "x.txt"), "nul": "a\0b", "long": "x" * 5000,
                             "data": "a word, as is the key", "bare": "data"}], "a")
    assert fp.files == {str(tmp_path / "data" / "x.txt"), str(tmp_path / "data")}
    assert fp.token("data/x.txt", "a") == fp.token("data/x.txt", "a") != fp.token("data/y.txt", "a")

    def reads():
        return open("data/x.txt").read(), "%.3f" % 1, "w"

    fp = Fingerprinter(strict=False)
    fp.function(reads)  # a path literal in a function of the workflow script
    assert fp.files == {str(tmp_path / "data" / "x.txt")}


def test_files_a_user_module_or_script_names_are_inputs_and_scratch_and_system_folders_are_not(tmp_path,
                                                                                               monkeypatch):
    """A module's (or a script's) path literals, and the paths its globals hold once imported, are inputs
    of the stages that reach it; folders, docstrings, f-string pieces, the temporary folders and /proc are not."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for name in ("literal.csv", "global.csv", "listed.csv", "fpiece.csv", "doc.csv", "script.csv", "fstr.csv"):
        (tmp_path / "data" / name).write_text(name)
    source = textwrap.dedent(f'''
        """data/doc.csv"""
        import os
        from pathlib import Path
        LITERAL = "data/literal.csv"
        GLOBAL = Path(__file__).parent / "data" / ("glo" + "bal.csv")
        LISTED = {{"a": [str(Path(__file__).parent / "data" / "list" "ed.csv")]}}
        SCRATCH = os.environ.get("TMPDIR", "{tempfile.gettempdir()}")
        LOGS = "data/"  # a folder a module names is a place, not an input
        def f(name):
            return open(f"{{name}}data/fstr.csv"), open("data/fpiece" + ".csv"), open("/proc/cpuinfo")
    ''')
    (tmp_path / "projmod.py").write_text(source)
    (tmp_path / "job.py").write_text("print(open('data/script.csv').read())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "projmod", None)  # (gone again after the test)
    del sys.modules["projmod"]
    import projmod  # noqa: F401 - imported, as the workflow imports it: its globals are seen

    cache = identity.DigestCache(None)
    reached = usercode.user_modules([(str(tmp_path / "projmod.py"), "projmod")], [], cache)
    assert {Path(p).name for p in named_files(reached)} == {"literal.csv", "global.csv", "listed.csv"}
    reached = usercode.user_modules([(str(tmp_path / "job.py"), "__main__")], [], cache)
    assert {Path(p).name for p in named_files(reached)} == {"script.csv"}  # not imported: its literals
    # a literal that names a file beside its module, not where the workflow runs (os.path.join(HERE, ...))
    (tmp_path / "lib" / "assets").mkdir(parents=True)
    (tmp_path / "lib" / "assets" / "vocab.json").write_text("{}")
    (tmp_path / "lib" / "libmod.py").write_text(
        "import os\nHERE = os.path.dirname(__file__)\ndef f():\n    return open(os.path.join(HERE, 'assets/vocab.json'))\n")
    reached = usercode.user_modules([(str(tmp_path / "lib" / "libmod.py"), "libmod")], [], cache)
    assert named_files(reached) == {str(tmp_path / "lib" / "assets" / "vocab.json")}


def test_files_a_yaml_json_or_toml_input_names_are_inputs_too(tmp_path, monkeypatch):
    """A config file given to a stage names the data it reads: those files (relative to the working
    directory or to the config's folder, a config named by a config too, once) are inputs; folders, words,
    a config that does not parse, one over the size limit, a manifest of many files and a YAML list that holds
    itself add nothing."""
    from parsl_torch.apps.identity import configfiles

    monkeypatch.chdir(tmp_path)
    for name in ("data/a.bin", "data/b.bin", "conf/near.txt", "data/deep.bin", "data/toml.bin", "data/big.bin"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    (tmp_path / "conf" / "exp.yaml").write_text(textwrap.dedent("""
        data: {train: data/a.bin, files: [/nowhere/x.bin, near.txt, data/]}
        name: data
        include: inc.json
        loop: &l [1, *l]
    """))
    (tmp_path / "conf" / "inc.json").write_text('{"more": ["../data/b.bin", "deeper.toml"]}')
    (tmp_path / "conf" / "deeper.toml").write_text('x = "data/deep.bin"\ny = "deepest.json"\n')  # a third level
    (tmp_path / "conf" / "deepest.json").write_text('{"x": "data/fourth.bin"}')  # a fourth: named, not followed
    (tmp_path / "data" / "fourth.bin").write_text("4")
    (tmp_path / "conf" / "bad.yaml").write_text("data: [data/a.bin\n")
    (tmp_path / "conf" / "other.toml").write_text('[paths]\ntrain = "data/toml.bin"\n')
    (tmp_path / "conf" / "big.json").write_text(json.dumps({"d": "data/big.bin", "pad": "x" * (1 << 20)}))
    for i in range(configfiles.MAX_FILES + 1):  # a manifest: it stands for its files
        (tmp_path / "data" / f"img{i}.png").write_text(str(i))
    (tmp_path / "conf" / "list.json").write_text(json.dumps([f"data/img{i}.png" for i in range(configfiles.MAX_FILES + 1)]))
    found = configfiles.files_named_by_configs(["conf/exp.yaml", "conf/bad.yaml", str(tmp_path / "conf/other.toml"),
                                                "conf/big.json", "conf/list.json", "data/a.bin"])
    assert {str(Path(p).relative_to(tmp_path)) for p in found} == {
        "data/a.bin", "conf/near.txt", "conf/inc.json", "data/b.bin", "conf/deeper.toml", "data/toml.bin",
        "data/deep.bin", "conf/deepest.json"}
    assert configfiles.files_named_by_configs(["conf/inc.json"]) == {  # three levels from the one given
        str(tmp_path / p) for p in ("data/b.bin", "conf/deeper.toml", "data/deep.bin", "conf/deepest.json",
                                    "data/fourth.bin")}


def test_the_config_files_a_hydra_application_reads_are_inputs(tmp_path, monkeypatch):
    """``@hydra.main(config_path="conf", config_name="config")`` names conf/config.yaml, and its defaults list
    ``model: gpt`` names conf/model/gpt.yaml (a group in a group: relative to its config; ``/group``: from a
    folder above): an edit of a learning rate there reruns the script's stage."""
    from parsl_torch.apps.identity import configfiles

    monkeypatch.chdir(tmp_path)
    app, conf = tmp_path / "app", tmp_path / "app" / "conf"
    files = {"config.yaml": "defaults:\n  - model: gpt\n  - optional db: mysql\n  - /trainer@t: fast\n"
                            "  - override hydra/launcher: basic\n  - _self_\nseed: 1\n",
             "model/gpt.yaml": "defaults: [enc: big]\nlr: 0.1\n", "model/enc/big.yaml": "layers: 12\n",
             "db/mysql.yaml": "host: x\n", "trainer/fast.yaml": "steps: 10\n", "other.yaml": "x: 1\n"}
    for name, text in files.items():
        (conf / name).parent.mkdir(parents=True, exist_ok=True)
        (conf / name).write_text(text)
    script = app / "train.py"
    script.write_text('import hydra\n\n@hydra.main(version_base=None, config_path="conf", config_name="config")\n'
                      'def main(cfg):\n    print(cfg.model.lr)\n\nmain()\n')
    reached = usercode.user_modules([(str(script), "__main__")], [], identity.DigestCache(None))
    assert named_files(reached) == {str(conf / "config.yaml")}
    found = configfiles.files_named_by_configs([str(conf / "config.yaml")])
    assert {str(Path(p).relative_to(conf)) for p in found} == {"model/gpt.yaml", "db/mysql.yaml", "trainer/fast.yaml",
                                                                "model/enc/big.yaml"}
    # the compose API names it too
    (app / "nb.py").write_text('from hydra import compose, initialize\nwith initialize(config_path="conf"):\n'
                               '    cfg = compose(config_name="other")\n')
    reached = usercode.user_modules([(str(app / "nb.py"), "nb")], [], identity.DigestCache(None))
    assert named_files(reached) == {str(conf / "other.yaml")}
    (app / "nb2.py").write_text(f'from hydra import compose, initialize_config_dir\n'
                                f'with initialize_config_dir(config_dir="{conf}"):\n'
                                f'    cfg = compose(config_name="other")\n')
    reached = usercode.user_modules([(str(app / "nb2.py"), "nb2")], [], identity.DigestCache(None))
    assert named_files(reached) == {str(conf / "other.yaml")}


def test_a_glob_pattern_that_matches_files_is_an_input_wherever_a_path_would_be(tmp_path, monkeypatch):
    """``data/shard_*.bin`` in an argument, a script's arguments, a module's code, a config or a variable: its
    matches, each by size and mtime (as a directory's files), so a shard added, removed or rewritten reruns
    the stage; a pattern that matches nothing, a bare ``*.bin`` (its first part is no entry here) and a
    file whose name holds a ``*`` are not patterns."""
    from parsl_torch.apps.identity import configfiles
    from parsl_torch.apps.scriptargs import caller_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "deep").mkdir(parents=True)
    for name in ("shard_1.bin", "shard_2.bin", "deep/shard_3.bin"):
        (tmp_path / "data" / name).write_text(name)
    (tmp_path / "data" / "odd*.txt").write_text("a file with a star in its name")
    fp = Fingerprinter(strict=True)
    fp.token(["data/shard_*.bin", "data/**/*.bin", "data/none_*.bin", "*.bin", "data/odd*.txt"], "a")
    pattern, deep = str(tmp_path / "data" / "shard_*.bin"), str(tmp_path / "data" / "**" / "*.bin")
    assert fp.files == {pattern, deep, str(tmp_path / "data" / "odd*.txt")}
    # the ranks start in the stage's directory: a script's pattern is made absolute, as a path is
    assert caller_path("--data=data/shard_*.bin") == f"--data={pattern}" and caller_path("x_*.bin") == "x_*.bin"

    cache = identity.DigestCache(None)
    first, first_deep = cache.file_digest(pattern), cache.file_digest(deep)
    assert first.startswith("glob:") and first != first_deep
    (tmp_path / "data" / "shard_4.bin").write_text("new")
    assert cache.file_digest(pattern) != first
    (tmp_path / "data" / "shard_4.bin").unlink()
    assert cache.file_digest(pattern) == first
    (tmp_path / "data" / "deep" / "shard_3.bin").write_text("regenerated")
    assert cache.file_digest(deep) != first_deep and cache.file_digest(pattern) == first
    # matches in the run directory are left out, as a directory's are ("runs/*/metrics.json": its own outputs)
    in_run = identity.DigestCache(None, tmp_path / "data" / "deep")
    assert in_run.file_digest(deep) == in_run.file_digest(pattern.replace("shard_*", "*")) != cache.file_digest(deep)

    (tmp_path / "mod.py").write_text("import glob\ndef load():\n    return glob.glob('data/shard_*.bin')\n")
    reached = usercode.user_modules([(str(tmp_path / "mod.py"), "mod")], [], cache)
    assert named_files(reached) == {pattern}
    (tmp_path / "exp.yaml").write_text("train: data/shard_*.bin\n")
    assert configfiles.files_named_by_configs(["exp.yaml"]) == {pattern}
    assert identity.env_files(["SHARDS"], {"SHARDS": "data/shard_*.bin"}, {}) == {pattern: None}


def test_an_installed_package_joins_by_its_version_and_files(tmp_path, monkeypatch):
    """``package <name>``: a reinstall with other files or another version changes it, the same files do
    not; the standard library and torch (the runtime's) are no packages."""
    from parsl_torch.apps.identity import packages

    site = tmp_path / "site"
    (site / "fakepkg").mkdir(parents=True)
    (site / "fakepkg" / "__init__.py").write_text("X = 1\n")

    def install(version: str, record: str) -> None:
        for old in site.glob("fakepkg-*.dist-info"):
            shutil.rmtree(old)
        info = site / f"fakepkg-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakepkg\nVersion: {version}\n")
        (info / "top_level.txt").write_text("fakepkg\n")
        (info / "RECORD").write_text(record)

    monkeypatch.syspath_prepend(str(site))
    packages._distributions.cache_clear()
    install("1.0", "fakepkg/__init__.py,sha256=aaa,6\n")
    first = packages.package_components(["fakepkg", "os", "json", "torch"])
    assert list(first) == ["package fakepkg"] and first["package fakepkg"].startswith("1.0 ")
    install("1.0", "fakepkg/__init__.py,sha256=aaa,6\n")
    assert packages.package_components(["fakepkg"]) == first  # the same files again
    install("1.0", "fakepkg/__init__.py,sha256=bbb,6\n")
    again = packages.package_components(["fakepkg"])["package fakepkg"]
    assert packages.package_change(first["package fakepkg"], again) == "reinstalled with other files (1.0)"
    install("1.1", "fakepkg/__init__.py,sha256=bbb,6\n")
    newer = packages.package_components(["fakepkg"])["package fakepkg"]
    assert packages.package_change(again, newer) == "changed (1.0 -> 1.1)"
    packages._distributions.cache_clear()


def test_environment_reads_and_literal_imports_are_found_in_functions_and_modules():
    import importlib
    import os

    def stage():
        a = os.environ.get("SCALE", "1")
        b = os.environ["MODE"] + os.getenv("LEVEL", "")
        c = "FLAG" in os.environ
        d = os.environ.setdefault("KEPT", "x")
        name = "NOT_" + "LITERAL"
        mod = importlib.import_module("helpermod")
        return a, b, c, d, os.environ.get(name), mod, {"dict_key": os.sep}

    fp = Fingerprinter(strict=False)
    fp.function(stage)  # as for a function of the workflow script (this module's are read as modules)
    assert fp.env_names == {"SCALE", "MODE", "LEVEL", "FLAG", "KEPT"}
    from parsl_torch.apps.identity.fingerprint import _imported_names

    assert "helpermod" in _imported_names(stage.__code__)
    source = (b"import os, importlib\nfrom os import environ, getenv\nX = os.environ['A'] + environ.get('B')\n"
              b"def f():\n    return getenv('C'), 'D' in os.environ, importlib.import_module('pkg.mod'), "
              b"os.environ.get(name)\n")
    parsed = usercode.parse_module(source, "m.py")
    assert parsed.env == ["A", "B", "C", "D"] and [0, "pkg.mod", []] in parsed.imports


def test_the_folders_a_module_adds_to_sys_path_are_read_without_running_it():
    from parsl_torch.apps.identity import syspath

    source = """
import os, site, sys
from pathlib import Path
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = Path(__file__).resolve().parents[1]
sys.path.append(os.path.join(HERE, "lib"))
sys.path.insert(0, str(ROOT / "src"))
sys.path.extend([os.path.join(HERE, "a"), "rel/b"])
sys.path += [HERE + "/c"]
sys.path[:0] = [Path(__file__).parent / "d", f"{HERE}/g"]
site.addsitedir(os.path.join(os.path.dirname(__file__), "e"))
sys.path.append(str(Path(HERE, "h")))
def f(x, name):
    sys.path.append(x)  # computed at run time: not seen
    sys.path.insert(0, os.path.join(os.getcwd(), name))
    sys.path.append(f"{HERE:>9}")
    sys.path.append(os.path.join(HERE, "lib2", x))
"""
    folders = syspath.additions(ast.parse(source), "/proj/scripts/train.py")
    assert folders == sorted(["/proj/scripts/lib", "/proj/src", "/proj/scripts/a", "rel/b", "/proj/scripts/c",
                              "/proj/scripts/d", "/proj/scripts/g", "/proj/scripts/e", "/proj/scripts/h"])
    # a name assigned again with a value computed at run time no longer names the first folder
    assert syspath.additions(ast.parse("import sys\nX = '/a'\nX = f()\nsys.path.append(X)\n"), "/m.py") == []


def test_a_script_reaches_the_modules_of_the_folders_it_adds_to_sys_path(tmp_path):
    """``sys.path.append(os.path.join(HERE, "lib"))`` then ``import mymod``: an edit of lib/mymod.py reruns
    the script's stage (mymod was taken for an installed package without a distribution, and skipped)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "lib" / "mymod.py").write_text("def f():\n    return 1\n")
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "src" / "pkg" / "core.py").write_text("import helper\nK = 1\n")
    (tmp_path / "src" / "helper.py").write_text("H = 1\n")  # found on the added folder, from another module
    script = tmp_path / "train.py"
    script.write_text("import os, sys\nHERE = os.path.dirname(os.path.abspath(__file__))\n"
                      "sys.path.append(os.path.join(HERE, 'lib'))\n"
                      "import mymod\nimport setup_paths\nfrom pkg import core\nprint(mymod.f(), core.K)\n")
    (tmp_path / "setup_paths.py").write_text("import sys\nfrom pathlib import Path\n"
                                             "sys.path.insert(0, str(Path(__file__).parent / 'src'))\n")
    reached = usercode.user_modules([(str(script), "__main__")], [], identity.DigestCache(None))
    names = {usercode.display_name(p).replace(str(tmp_path) + "/", "") for p in reached.digests}
    assert names == {"train.py", "setup_paths.py", "lib/mymod.py", "src/pkg/__init__.py", "src/pkg/core.py",
                     "src/helper.py"}
    assert "mymod" not in reached.packages and "pkg" not in reached.packages


def test_env_components_take_the_stages_env_over_the_shell_and_leave_launch_variables_out():
    parts = identity.env_components(["SCALE", "RANK", "SLURM_PROCID", "UNSET_ONE", "MODE"], {"MODE": "b"},
                                    {"SCALE": "hunter2-secret", "RANK": "0", "SLURM_PROCID": "3", "MODE": "a"})
    assert set(parts) == {"env SCALE", "env UNSET_ONE", "env MODE"} and parts["env UNSET_ONE"] == "unset"
    assert parts["env MODE"] == identity.env_components(["MODE"], {}, {"MODE": "b"})["env MODE"]
    assert "hunter2" not in repr(parts) and parts["env SCALE"] != identity.env_components(["SCALE"], {}, {})["env SCALE"]


def test_a_file_rewritten_within_its_mtime_is_hashed_again_not_taken_from_the_cache(tmp_path):
    """Lustre and NFS keep whole-second mtimes: a file regenerated with the same size within the second of its
    last hash keeps its size, mtime and inode. A digest taken so soon after a write is not remembered."""
    import os

    data = tmp_path / "tokens.bin"
    data.write_bytes(b"\x00" * 64)
    stamp = os.stat(data).st_mtime_ns
    cache = identity.DigestCache(tmp_path / "digests.json")
    first = cache.file_digest(data)
    with open(data, "r+b") as f:  # in place: the same inode and size
        f.write(b"\x01" * 64)
    os.utime(data, ns=(stamp, stamp))  # and the same (coarse) mtime
    assert cache.file_digest(data) != first
    old = time.time_ns() - 60 * 10**9  # a file last written a minute ago is remembered
    os.utime(data, ns=(old, old))
    cache.file_digest(data)
    assert str(data) in cache._dirty
    # a module too (a script that writes a module and runs the workflow, twice in one second)
    module = tmp_path / "gen.py"
    module.write_text("X = 2\n")
    stamp = os.stat(module).st_mtime_ns
    first = cache.module(str(module))[0]
    module.write_text("X = 3\n")
    os.utime(module, ns=(stamp, stamp))
    assert cache.module(str(module))[0] != first


def test_directory_digests_leave_out_hidden_folders_caches_and_the_run_directory(tmp_path):
    (tmp_path / "runs" / "parsl").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "a.txt").write_text("a")
    cache = identity.DigestCache.of_run_dir(tmp_path / "runs")
    before = cache.file_digest(tmp_path)
    for noise in (tmp_path / "runs" / "status.json", tmp_path / ".git" / "x", tmp_path / "__pycache__" / "m.pyc"):
        noise.write_text("changed")
        assert cache.file_digest(tmp_path) == before, noise
    (tmp_path / "a.txt").write_text("longer")
    assert cache.file_digest(tmp_path) != before
    assert cache.file_digest("/dev/null").startswith("special:")  # never read


def test_the_package_itself_is_the_runtime_of_every_stage_and_never_user_code(tmp_path):
    """Every source of parsl-torch (not only the identity code's own folder) is in the runtime digest,
    and none is a user module: an edit anywhere in the package reruns stages, and a remote stage never
    ships the package as a user module (which would shadow the endpoint's own)."""
    import parsl_torch

    root = Path(parsl_torch.__file__).resolve().parent
    assert not usercode.is_user_file(root / "launch" / "shim.py") and not usercode.is_user_dir(str(root / "core"))
    cache = identity.DigestCache(None)
    before = identity.runtime_digest(cache)
    shim = root / "launch" / "shim.py"
    text = shim.read_text()
    try:
        shim.write_text(text + "\n# an edit outside apps/\n")
        assert identity.runtime_digest(identity.DigestCache(None)) != before
    finally:
        shim.write_text(text)


def test_a_warm_rank_sees_a_module_rewritten_within_its_mtime_since_it_was_imported(tmp_path, monkeypatch):
    """A warm group's import watch (``apps.warm.imports``): a helper regenerated with the same size within the
    same whole-second mtime as when it was imported still counts as changed (its content is compared)."""
    import importlib
    import os

    from parsl_torch.apps.warm.imports import ImportWatch

    module, old = tmp_path / "genhelper.py", tmp_path / "oldhelper.py"
    module.write_text("X = 2\n")
    stamp = os.stat(module).st_mtime_ns
    old.write_text("Y = 2\n")
    os.utime(old, (time.time() - 60, time.time() - 60))  # written long before: no content kept, its stat is
    monkeypatch.syspath_prepend(str(tmp_path))
    watch = ImportWatch()
    try:
        importlib.import_module("oldhelper")
        importlib.import_module("genhelper")
    finally:
        sys.meta_path.remove(watch)
        sys.modules.pop("genhelper", None)
        sys.modules.pop("oldhelper", None)
    assert watch.changed() is None
    module.write_text("X = 3\n")
    os.utime(module, ns=(stamp, stamp))
    assert watch.changed() == str(module.resolve())
    del watch.imported[str(module.resolve())]
    before = os.stat(old)
    time.sleep(0.01)
    old.write_text("Y = 3\n")  # copied over with its old mtime kept (cp -p, rsync -t): the ctime tells
    os.utime(old, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert watch.changed() == str(old.resolve())
