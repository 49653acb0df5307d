"""The package's shape: layers import only downwards, no import circles, the
package's own light modules are imported at the top, every ``python -m``
entry point exists, and a scheduler is one record (the worked example in
docs/architecture.md, executed as written)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import parsl_torch
from parsl_torch.common import entrypoints, settings

from .conftest import clean_env

PKG = Path(parsl_torch.__file__).parent
DOC = Path(__file__).parent.parent / "docs" / "architecture.md"
# subpackage (or top module) -> layer; a module may import lower layers and its own subpackage
LAYERS = {"errors": 0, "parslext": 0, "common": 0, "core": 1, "observe": 1, "history": 2, "launch": 2, "sites": 3, "compat": 4, "apps": 4, "stages": 5,
          "cli": 6}
HEAVY = {"torch", "numpy", "h5py", "parsl", "dill", "yaml", "matplotlib", "xarray", "wandb", "globus_compute_sdk",
         "globus_compute_endpoint", "globus_compute_common",
         "mpi4py", "h5netcdf"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in the file."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    target = f"{base}.{child.module}" if child.module else base
                else:
                    target = child.module or ""
                for alias in child.names:  # `from pkg import submodule` imports the submodule
                    sub = f"{target}.{alias.name}"
                    found.append((sub if sub in MODULES else target, top))
            visit(child, inner)

    visit(tree, True)
    return found


EDGES = {name: _imports(name, path) for name, path in MODULES.items()}


def _subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _heavy(module: str, seen: frozenset = frozenset()) -> bool:
    """Imports a heavy third-party module at its top, itself or through the package's modules."""
    for target, top in EDGES.get(module, ()):
        if not top:
            continue
        if target.split(".")[0] in HEAVY:
            return True
        if target in MODULES and target not in seen and _heavy(target, seen | {module}):
            return True
    return False


def test_every_module_sits_in_a_layer():
    outside = sorted(m for m in MODULES if m != "parsl_torch" and _subpackage(m) not in LAYERS)
    assert not outside, f"modules outside the layers of docs/architecture.md: {outside}"


def test_layers_import_only_downwards():
    wrong = []
    for module, edges in EDGES.items():
        if module == "parsl_torch":
            continue  # the public facade names modules as strings, lazily
        mine = LAYERS[_subpackage(module)]
        for target, _ in edges:
            if target == "parsl_torch":
                wrong.append(f"{module} imports the top-level package (import the layer's module instead)")
            elif target.startswith("parsl_torch."):
                theirs = _subpackage(target)
                if LAYERS[theirs] >= mine and theirs != _subpackage(module) and theirs != "errors":
                    wrong.append(f"{module} (layer {mine}) imports {target} (layer {LAYERS[theirs]})")
    assert not wrong, "\n".join(wrong)


def test_no_import_circles():
    graph = {m: {t for t, _ in edges if t in MODULES} for m, edges in EDGES.items()}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]))
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def test_function_level_imports_are_for_heavy_modules_only():
    light = [f"{module} imports {target} inside a function: it is light, import it at the top"
             for module, edges in EDGES.items() for target, top in edges
             if not top and target in MODULES and not _heavy(target)]
    assert not light, "\n".join(light)


def test_workflow_side_modules_import_nothing_heavy():
    """What the workflow process, a login node and the CLI import stays light."""
    light = ["parsl_torch", "parsl_torch.apps.session.workflow", "parsl_torch.apps.stage.app", "parsl_torch.launch.plan",
             "parsl_torch.launch.supervise", "parsl_torch.sites", "parsl_torch.cli", "parsl_torch.stages.train",
             "parsl_torch.stages.evaluate"]
    code = ("import importlib, sys\n"
            f"for m in {light!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in ('torch', 'parsl', 'numpy', 'h5py', 'dill', 'wandb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", [entrypoints.SUPERVISE, entrypoints.SHIM, entrypoints.STAGE_MAIN, entrypoints.WARM_RANK, entrypoints.CLI,
                                    entrypoints.INTERCHANGE,
                                    entrypoints.stage_module("train"), entrypoints.stage_module("evaluate")])
def test_entry_points_exist(module):
    mod = importlib.import_module(module)
    assert callable(getattr(mod, "main", None)), f"{module} has no main()"
    out = subprocess.run([sys.executable, "-m", module, "--help"], env=clean_env(), capture_output=True, text=True)
    assert "usage" in (out.stdout + out.stderr).lower(), out.stderr


def test_module_paths_in_commands_are_written_once():
    """Only common/entrypoints.py spells a `python -m parsl_torch...` path in code."""
    spelled = []
    for module, path in MODULES.items():
        if module == "parsl_torch.common.entrypoints":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.search(r"(^|-m )parsl_torch\.\w+\.\w+$", node.value):
                spelled.append(f"{module}: {node.value!r}")
    assert not spelled, "\n".join(spelled)


# -- a scheduler is one record ---------------------------------------------
def _worked_example() -> str:
    text = DOC.read_text()
    match = re.search(r"```python\n(# worked example: Grid Engine\n.*?)```", text, re.S)
    assert match, f"{DOC} lost its worked example"
    return match.group(1)


@pytest.fixture
def gridengine(tmp_path, monkeypatch):
    """The record from docs/architecture.md, registered for one test."""
    from parsl_torch.launch.schedulers import SCHEDULERS

    namespace: dict = {}
    exec(compile(_worked_example(), str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    yield SCHEDULERS["gridengine"]
    SCHEDULERS.pop("gridengine")


def test_adding_a_scheduler_is_one_record(gridengine, tmp_path, monkeypatch):
    from parsl.providers import GridEngineProvider

    from parsl_torch import sites
    from parsl_torch.cli.commands import build_parser
    from parsl_torch.launch.plan import LaunchRequest, plan_launch
    from parsl_torch.launch.schedulers import detect_scheduler
    from parsl_torch.sites.endpoint import endpoint_config

    # detection: its job variable
    env = {"JOB_ID": "42", "PE_HOSTFILE": str(tmp_path / "pe_hostfile")}
    (tmp_path / "pe_hostfile").write_text("n1 2 all.q@n1 UNDEFINED\nn2 2 all.q@n2 UNDEFINED\n")
    d = detect_scheduler(env)
    assert (d.scheduler, d.in_job) == ("gridengine", True)
    # launch: its nodes and its launch command
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "mpirun").write_text("#!/bin/sh\n")
    (bindir / "mpirun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{clean_env()['PATH']}")
    p = plan_launch(LaunchRequest(("python", "train.py"), ranks_per_node=2), d, env, python="python")
    assert p.argv[:6] == ("mpirun", "-np", "4", "--map-by", "ppr:2:node", "--host") and p.nodes == ("n1", "n2")
    # the CLI offers its launcher
    assert build_parser().parse_args(["launch", "--launcher", "mpirun"]).launcher == "mpirun"
    # a site file names it; Parsl config, rendered script and endpoint config follow
    (tmp_path / "ge.yaml").write_text("name: ge\nscheduler: gridengine\nprovider: {account: lab, queue: short}\n")
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path))
    site = sites.load("ge")
    config = site.parsl_config(run_dir=str(tmp_path / "runinfo"))
    mpi = config.executors[0]
    assert isinstance(mpi.provider, GridEngineProvider) and mpi.provider.queue == "short"
    script = site.render()
    assert "qsub -q short -terse <script_dir>/parsl.mpi.block-0" in script and "#$ -l h_rt=01:00:00" in script
    assert endpoint_config(site.spec, "/envs/pt")["engine"]["provider"]["type"] == "GridEngineProvider"


def test_every_module_says_what_it_is_for():
    missing = [m for m, path in MODULES.items() if not ast.get_docstring(ast.parse(path.read_text()))]
    assert not missing, f"modules without a docstring at the top: {missing}"


def test_a_stages_error_is_decided_from_the_outcome_record_not_its_output():
    """The supervisor records how a launch ended (common/outcome.py); the workflow's stage error
    reads that record, never a regular expression over what ranks or launchers printed."""
    assert "re" not in {target for target, _ in EDGES["parsl_torch.apps.stage.failures"]}
    assert "parsl_torch.common.outcome" in {target for target, _ in EDGES["parsl_torch.apps.stage.failures"]}
    assert "parsl_torch.common.outcome" in {target for target, _ in EDGES["parsl_torch.launch.supervise"]}


#: lines a module may have: one concept each (docs/architecture.md), split by concept, not by a count
MODULE_LINES = 600


def test_every_reach_into_parsls_private_parts_is_listed_once_and_holds_for_the_installed_parsl():
    """``parslext.PATCHES`` is the one list (the manual's is generated from it): each holds for the Parsl CI
    installs, names a place in parsl-torch that exists, and a Parsl that moved one is named at start."""
    from parsl_torch import parslext
    from parsl_torch.errors import ConfigError

    parslext.check()
    for patch in parslext.PATCHES:
        for where in patch.where.split(", "):
            module, _, name = where.partition(".")
            path = PKG / f"{module}.py"
            assert path.is_file() and name.split(".")[0] in path.read_text(), patch
    moved = parslext.Patch("a gone one", "parsl.dataflow.futures:NoSuchThing", "sites/executors.SettlesEarly", "",
                           "", lambda found: True)
    with pytest.raises(ConfigError, match=r"a gone one \(parsl.dataflow.futures:NoSuchThing, used by sites/exe"):
        parslext.check((moved,))


def test_every_module_stays_under_600_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert not long, f"split these by their concepts: {long}"


#: lines a function's body may have (its docstring aside): one job each
FUNCTION_LINES = 50


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_every_function_stays_under_50_lines():
    long = {}
    for m, path in MODULES.items():
        for fn in _functions(ast.parse(path.read_text())):
            body = fn.body[1:] if ast.get_docstring(fn) and len(fn.body) > 1 else fn.body
            if (n := fn.end_lineno - body[0].lineno + 1) > FUNCTION_LINES:
                long[f"{m}.{fn.name}"] = n
    assert not long, f"split these by their jobs: {long}"


def test_a_stage_call_is_recognised_by_its_record_not_by_position_or_keyword_strings():
    """A stage's apps take its ``StageCall`` first (``apps/stage/call.py``); nothing in apps/ picks a call
    apart by the position of Parsl's arguments or hands itself flags through keyword strings."""
    found = []
    for m, path in MODULES.items():
        if not m.startswith("parsl_torch.apps"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "args" \
                    and isinstance(node.slice, ast.Constant) and (m, node.slice.value) != ("parsl_torch.apps.stage.call", 0):
                found.append(f"{m}: args[{node.slice.value}]")
            if isinstance(node, ast.keyword) and (node.arg or "").startswith("parsl_torch"):
                found.append(f"{m}: keyword {node.arg}")
            if isinstance(node, ast.arg) and node.arg.startswith("parsl_torch"):
                found.append(f"{m}: parameter {node.arg}")
    assert not found, found


#: what changes the interpreter's garbage collector for the whole process
GC_SETTERS = frozenset({"gc.disable", "gc.freeze", "gc.set_threshold"})


def _process_state(m: str, tree: ast.Module) -> set[str]:
    """What module ``m`` keeps or changes for the whole process: context variables, ``lru_cache``d
    functions, ``os.environ`` and garbage collector changes (by the function that makes them),
    attributes set on another module (a patch)."""
    found = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call) and \
                ast.unparse(node.value.func).endswith("ContextVar"):
            found |= {t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])}
    for fn in _functions(tree):
        if any("lru_cache" in ast.unparse(d) for d in fn.decorator_list):
            found.add(fn.name)
        for node in ast.walk(fn):
            target = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    ast.unparse(node.func.value) == "os.environ" and node.func.attr in MUTATORS:
                target = fn.name
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in GC_SETTERS:
                target = fn.name
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    ast.unparse(node.func.value) == "sys.modules" and node.func.attr in MUTATORS:
                target = fn.name
            elif isinstance(node, (ast.Assign, ast.Delete)):
                for t in node.targets:
                    text = ast.unparse(t)
                    if text.startswith(("os.environ[", "sys.modules[")):
                        target = fn.name
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                            t.value.id not in {"self", "cls"} and t.attr not in OWN_ATTRIBUTES:
                        target = t.attr  # an attribute no class of ours has, set on another's object
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                            t.value.id not in {a.arg for a in fn.args.args} | {"self", "cls"} and \
                            isinstance(node, ast.Assign) and t.value.id in _imported_modules(fn):
                        target = t.attr  # a module's attribute, replaced: a patch
            if target:
                found.add(target)
    return found


def _own_attributes() -> set[str]:
    """The attributes parsl-torch's own classes have: declared in a class body, or set on ``self``."""
    found: set[str] = set()
    for path in MODULES.values():
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    found.add(node.target.id)
                elif isinstance(node, ast.Assign):
                    found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                    found |= {t.attr for t in node.targets if isinstance(t, ast.Attribute)
                              and isinstance(t.value, ast.Name) and t.value.id == "self"}
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in cls.body:
                    found.add(node.name)
    return found


OWN_ATTRIBUTES = _own_attributes()


def _imported_modules(fn: ast.AST) -> set[str]:
    return {(a.asname or a.name).split(".")[0] for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names}


def test_every_piece_of_process_wide_state_is_named_in_the_architecture_page():
    """docs/architecture.md's table of process-wide state says the whole truth: each context variable,
    cached singleton, change of ``os.environ`` and patch of another module is named there."""
    from parsl_torch import parslext

    page = DOC.read_text()
    section = page[page.index("## Process-wide state"):page.index("## Vocabulary")] + parslext.markdown_table()
    unnamed = {f"{m}: {name}" for m, path in MODULES.items()
               for name in _process_state(m, ast.parse(path.read_text())) if name not in section}
    assert not unnamed, f"say where this state lives and why (docs/architecture.md): {sorted(unnamed)}"


REPO = PKG.parent.parent
VARIABLE = re.compile(r"\bPARSL_TORCH_[A-Z0-9_]+\b")


def test_every_environment_variable_is_spelled_once_in_the_settings_registry():
    """A module reads or sets a variable through its ``settings.Setting``: no other module holds
    a variable's name as a string of its own (messages may name it, as text)."""
    names = set(settings.REGISTRY)
    spelled = [(m, node.value) for m, path in MODULES.items() if m != "parsl_torch.common.settings"
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and node.value in names]
    assert not spelled, f"use the Setting from parsl_torch.common.settings instead: {spelled}"


def test_every_variable_named_anywhere_is_in_the_registry():
    """A variable named in the code, the tests, the workflows or the docs is one parsl-torch knows."""
    places = [*PKG.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "workflows").rglob("*.py"),
              *(REPO / "benchmarks").rglob("*.py"), *(REPO / "docs").rglob("*.md"), REPO / "README.md",
              REPO / ".ci" / "run"]
    unknown = {(str(p.relative_to(REPO)), name) for p in places if p.is_file()
               for name in VARIABLE.findall(p.read_text()) if name not in settings.REGISTRY}
    assert not unknown, f"add these to parsl_torch/common/settings.py (or fix the name): {sorted(unknown)}"


def test_the_manuals_references_are_generated_from_the_code():
    """docs/hooks.py fills the settings table, each command's --help and the site files in when the
    manual is built (CI runs mkdocs build --strict): they cannot drift from the code."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.on_page_markdown("<!-- settings-table -->\n<!-- cli-reference -->\n<!-- site-file: polaris -->")
    assert settings.markdown_table() in page and "PARSL_TORCH_TIMEOUT" in page
    for command in ("parsl-torch launch", "parsl-torch run", "parsl-torch sites render", "parsl-torch status"):
        assert f"## `{command}`" in page, command
    assert "name: polaris" in page and "<!--" not in page
    # the layer table: a row per package, from its docstring, its layer the one this test enforces, every module
    rows = {row.split(" | ")[1].strip("`"): row for row in hooks.layer_table().splitlines()[2:]}
    for module in MODULES:
        parts = module.split(".")[1:]
        if not parts:
            continue
        package = "/".join(parts[:-1]) + "/" if (PKG / "/".join(parts[:-1])).is_dir() and len(parts) > 1 else ""
        if (PKG / "/".join(parts)).is_dir():
            package, name = "/".join(parts) + "/", None
        else:
            name = parts[-1]
        key = package or f"{parts[0]}.py"
        assert key in rows, (module, sorted(rows))
        assert name is None or key.endswith(".py") or f"`{name}`" in rows[key], (module, rows[key])
        assert rows[key].startswith(f"| {LAYERS[parts[0].removesuffix('.py')]} |"), rows[key]
    for placeholder in ("settings-table", "cli-reference"):
        assert any(placeholder in p.read_text() for p in (REPO / "docs" / "reference").glob("*.md")), placeholder


#: where process-wide state may live: the registries (settings, schedulers) and the ranks' state object
STATE_HOLDERS = {"parsl_torch.common.settings": {"REGISTRY"}, "parsl_torch.core.ranks": {"_STATE"},
                 # scheduler records, added by register(); the host files the process wrote, removed at its exit
                 "parsl_torch.launch.schedulers": {"SCHEDULERS", "_HOST_FILES"}}
MUTATORS = {"append", "extend", "add", "update", "pop", "remove", "clear", "setdefault", "insert", "discard"}


def _module_state_changes(tree: ast.Module) -> set[str]:
    """Module-level names that the module's functions rebind (``global``) or change in place
    (a method that mutates, an item or attribute assigned)."""
    top = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
           for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    top |= {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    changed: set[str] = set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Global):
                changed.update(node.names)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name):
                changed.add(node.func.value.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name):
                        changed.add(t.value.id)
    locals_ = {a.arg for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
               for a in (*f.args.args, *f.args.kwonlyargs)}
    return {name for name in changed & top if name not in locals_ or name in
            {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}}


def test_no_module_level_mutable_state_outside_the_registry_and_the_rank_state():
    """State that outlives a call lives on an object passed where it is needed (a History's
    communicator, a workflow's digest cache); what must be process-wide is on ``RankState``."""
    found = {m: sorted(names) for m, path in MODULES.items()
             if (names := _module_state_changes(ast.parse(path.read_text())) - STATE_HOLDERS.get(m, set()))}
    assert not found, f"module-level state changed by functions: {found}"


def test_what_is_not_a_stages_input_is_listed_once():
    """The variables that are not a stage's input are one list, in the module every observed process loads
    (observe/recorder.py); its launch group holds the visibility variables a stage's launch narrows."""
    from parsl_torch.observe import recorder as observe
    from parsl_torch.core.claim import VISIBILITY

    assert set(VISIBILITY) <= set(observe.LAUNCH_PREFIXES)
    elsewhere = [(m, target.id) for m, path in MODULES.items() if m != "parsl_torch.observe.recorder"
                 for node in ast.parse(path.read_text()).body if isinstance(node, ast.Assign)
                 for target in node.targets
                 if isinstance(target, ast.Name) and re.search(r"SESSION|(LAUNCH|PROCESS)_(NAMES|PREFIXES)", target.id)]
    assert not elsewhere, f"use observe/recorder.py's lists: {elsewhere}"


def test_stage_directory_file_names_are_spelled_once():
    """Every file of a stage's directory is named in common/stagedir.py, read and written through it."""
    from parsl_torch.common import stagedir

    names = {v for k, v in vars(stagedir).items() if k.isupper() and isinstance(v, str)}
    spelled = [(m, node.value) for m, path in MODULES.items() if m != "parsl_torch.common.stagedir"
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and node.value in names]
    assert not spelled, f"use the name from parsl_torch.common.stagedir: {spelled}"


def test_every_floor_in_pyproject_is_the_version_ci_installs_for_the_lowest_run():
    """``make test-lowest`` installs .ci/lowest.txt exactly: each floor is a version that was tested."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # (the manual's tools and the linter are not a runtime floor: make docs and make test use what they install)
    requirements = [*project["dependencies"], *(r for name, extra in project["optional-dependencies"].items()
                                                 if name not in ("docs", "lint") for r in extra)]
    floors = {}
    for requirement in requirements:
        name, _, floor = requirement.partition(">=")
        if not name.startswith("parsl-torch") and floor:
            floors[name.split("[")[0].strip().lower()] = floor.strip()
        elif not name.startswith(("parsl-torch", "parsl[")):
            raise AssertionError(f"{requirement!r} in pyproject.toml has no floor: give it one CI tests")
    pins = dict(line.split("==") for line in (REPO / ".ci" / "lowest.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert floors == pins, "pyproject.toml's floors and .ci/lowest.txt's pins must be the same versions"
