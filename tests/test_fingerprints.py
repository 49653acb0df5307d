"""Stage identity without running a stage: fingerprints of functions and arguments are the
same in every process and under any hash seed, change with what can change a result and
only with that, and the user modules a stage reaches are found through its imports."""

from __future__ import annotations

import shutil
import subprocess
import sys
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
    # Path inside one names an input
    import types
    from collections import UserDict, UserList

    (tmp_path / "tokens.bin").write_text("t")
    fp = Fingerprinter(strict=True)
    cfg = UserDict(data=UserList([tmp_path / "tokens.bin"]), lr=0.1)
    assert fp.token(cfg, "a") == fp.token(UserDict(lr=0.1, data=UserList([tmp_path / "tokens.bin"])), "a")
    assert fp.token(cfg, "a") != fp.token(UserDict(data=UserList([tmp_path / "tokens.bin"]), lr=0.2), "a")
    assert fp.files == {str(tmp_path / "tokens.bin")}
    with pytest.raises(Unidentifiable, match=r"argument 'cfg'\['lock'\] is a _thread.lock"):  # named inside one too
        fp.token(UserDict(lock=threading.Lock()), "argument 'cfg'")
    assert fp.token(types.MappingProxyType({"a": 1}), "a") != fp.token(types.MappingProxyType({"a": 2}), "a")
    import argparse  # train(parser.parse_args()): by its attributes, a string naming a file is a value

    (tmp_path / "val.bin").write_text("v")
    ns = argparse.Namespace(lr=0.1, val=str(tmp_path / "val.bin"))
    assert fp.token(ns, "a") == fp.token(argparse.Namespace(val=str(tmp_path / "val.bin"), lr=0.1), "a")
    assert fp.token(ns, "a") != fp.token(argparse.Namespace(lr=0.2, val=str(tmp_path / "val.bin")), "a")
    assert str(tmp_path / "val.bin") not in fp.files  # a string: what the stage opens is observed


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


def test_a_string_is_a_value_and_a_path_names_a_file_the_stage_is_told_about(tmp_path, monkeypatch):
    """A Path or File is a file the stage is given (its content joins the identity); a string is a value,
    even one naming a file: what the stage opens is observed when it runs (``identity.reads``)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("1")
    fp = Fingerprinter(strict=True)
    fp.token(["data/x.txt", {"p": Path("data/x.txt"), "long": "x" * 5000}], "a")
    assert fp.files == {str(tmp_path / "data" / "x.txt")}
    assert fp.token("data/x.txt", "a") == fp.token("data/x.txt", "a") != fp.token("data/y.txt", "a")

    def reads():
        return open("data/x.txt").read()

    fp = Fingerprinter(strict=False)
    fp.function(reads)
    assert fp.files == set()


def test_a_glob_pattern_given_as_a_file_is_compared_by_its_matches(tmp_path, monkeypatch):
    """``files=["data/shard_*.bin"]``: its matches, each by size and mtime (as a directory's files), so a shard
    added, removed or rewritten reruns the stage; a script's pattern argument is made absolute, as a path is."""
    from parsl_torch.apps.stage.scriptargs import caller_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "deep").mkdir(parents=True)
    for name in ("shard_1.bin", "shard_2.bin", "deep/shard_3.bin"):
        (tmp_path / "data" / name).write_text(name)
    pattern, deep = str(tmp_path / "data" / "shard_*.bin"), str(tmp_path / "data" / "**" / "*.bin")
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


def test_literal_imports_are_found_in_functions_and_modules():
    import importlib

    def stage():
        name = "not_" + "literal"
        return importlib.import_module("helpermod"), importlib.import_module(name)

    from parsl_torch.apps.identity.bytecode import imported_names as _imported_names

    assert "helpermod" in _imported_names(stage.__code__) and "not_literal" not in _imported_names(stage.__code__)
    source = b"import os, importlib\ndef f():\n    return importlib.import_module('pkg.mod')\n"
    assert [0, "pkg.mod", []] in usercode.parse_module(source, "m.py").imports


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


def test_a_user_modules_values_read_by_the_code_are_compared_as_they_are_now(tmp_path, monkeypatch):
    """What the workflow sets in a module at run time (``config.SCALE = args.scale``) is in the stage's
    fingerprint, read directly or by a function of the module; what is not plain data is not compared."""
    import threading

    (tmp_path / "fpconfig.py").write_text("SCALE = 1\nLOCK = None\n\n\ndef scaled(x):\n    return x * SCALE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fpconfig

    namespace = {"__name__": "__main__", "fpconfig": fpconfig}
    exec("def direct():\n    return 10 * fpconfig.SCALE, fpconfig.LOCK\n\n\n"
         "def through():\n    return fpconfig.scaled(10)\n", namespace)

    def digests() -> tuple[str, str]:
        return tuple(Fingerprinter(strict=False).digest(namespace[name], name) for name in ("direct", "through"))

    try:
        fpconfig.SCALE, fpconfig.LOCK = 2, threading.Lock()
        two = digests()
        fpconfig.SCALE, fpconfig.LOCK = 3, threading.Lock()  # (another lock: not compared, the same)
        three = digests()
        assert two[0] != three[0] and two[1] != three[1]
        assert digests() == three
        fpconfig.SCALE = 2
        assert digests() == two
        apart = Fingerprinter(strict=False, state_apart=True)  # a stage's: the code's digest is the code's
        code = apart.digest(namespace["through"], "through")
        assert set(apart.state) == {"fpconfig.SCALE"}
        fpconfig.SCALE = 3
        again = Fingerprinter(strict=False, state_apart=True)
        assert again.digest(namespace["through"], "through") == code and again.state != apart.state
    finally:
        sys.modules.pop("fpconfig", None)
