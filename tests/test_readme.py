"""Every Python example in the README and the manual (docs/) runs as written (a few sizes made small),
in a fresh directory that holds what the examples name: the configs, a folder script
(mingpt/main.py) and its data. An example the README repeats from a page runs once."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import BIN, clean_env
from .test_own_scripts import EVAL_CKPT, MAIN_PY, TRAIN_CKPT

REPO = Path(__file__).parent.parent
README = REPO / "README.md"
#: the pages whose examples run: the README, then the manual's (architecture.md's Grid Engine record
#: runs in test_layout, registered as a scheduler)
PAGES = [README, *sorted(p for p in (REPO / "docs").rglob("*.md") if p.name != "architecture.md")]
CONFIGS = Path(__file__).parent.parent / "configs"
SMALL = {"steps": 40, "checkpoint_every": 20, "log_every": 10,
         "model": {"dim": 32, "n_heads": 2, "n_layers": 1, "seq_len": 16}}

# a line of each example -> how it runs: "python" (one process), "launch" (2 ranks through
# parsl-torch launch); the text it must print; the only edits made to it (sizes)
EXAMPLES = {
    'with pt.workflow(site="auto", run_dir="runs/demo")': ("python", "'eval_acc'", ()),
    "def finetune(cfg: dict": ("python", "{'final_loss': ", ()),
    "rank = pt.setup_torch(seed=0)": ("python", "", ()),
    'strategy="fsdp+tp", tp_size=2)': ("launch", "", (("n_heads=8", "n_heads=2, dim=16"),)),
    'activation_checkpointing="selective:2")': ("python", "", ()),
    'layout = pt.Layout(pp=2, pp_schedule="1f1b"': ("launch", "rank 1: stage 1, loss ", ()),
    'site = pt.sites.load("auto")': ("python", "MyProj", ()),
    'h = pt.History(name="train"': ("python", "", ()),
    'with h5py.File("outputs/train/history.h5")': ("python", "complete 1", ()),
    "import parsl_torch.compat.ezpz as ezpz": ("python", "", ()),
    "parsl_torch.compat.ezpz.alias()": ("python", "", ()),
    "def long_loop(steps: int)": ("python", "200", ()),
    "def kept_loop(steps: int)": ("python", "True", ()),
    # two sites need a Globus Compute endpoint: here both are the local site (test_remote runs the
    # same flow across a local site and an endpoint's engine)
    'sites=["polaris-gc", "local"]': ("python", "accuracy ", (('sites=["polaris-gc", "local"]', 'sites=["local"]'),)),
    "def trial(lr: float) -> float": ("python", "[20.0, 10.0, 4.0]", ()),
    '"model.dim": [16, 32]}, base="configs/train.yaml"': ("python", "best: ", ()),
    'space = pt.Sampled(study, {"lr": FloatDistribution': ("python", "told 4 trials; best lr ", ()),
    "def own_trial(config: dict) -> float:": ("python", "0.6 stopped 2", ()),
    'evaluate(t.outputs[0], "--scale", 2': ("python", '"sum": 6.0', ()),
    "meter = pt.Throughput(net": ("launch", "tflops=", ()),
    'run_dir="runs/packed"': ("python", "'lr=0.1 on GPU ", ()),
    # one node here (local site)
    "num_nodes=64, min_nodes=48": ("python", "[[0, 2]]", (('site="aurora", run_dir="runs/big", nodes=64',
                                                           'site="local", run_dir="runs/big"'),
                                                          ("num_nodes=64, min_nodes=48", "num_nodes=1, min_nodes=1"))),
}


def all_examples() -> list[tuple[str, str]]:
    """(where: page:line, code) of every ```python block of every page, in order."""
    found = []
    for page in PAGES:
        text = page.read_text()
        found += [(f"{page.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 2}", m.group(1))
                  for m in re.finditer(r"```python\n(.*?)```", text, re.S)]
    return found


def examples() -> list[tuple[str, str]]:
    """The distinct examples (the first place each appears)."""
    seen: dict[str, str] = {}
    for where, code in all_examples():
        seen.setdefault(code, where)
    return [(where, code) for code, where in seen.items()]


def spec(code: str):
    found = [key for key in EXAMPLES if key in code]
    assert len(found) == 1, f"an example without exactly one entry in EXAMPLES: {code[:200]!r}"
    return EXAMPLES[found[0]]


def test_every_example_has_one_entry_and_every_entry_an_example():
    used = set()
    for where, code in all_examples():
        spec(code)
        used |= {key for key in EXAMPLES if key in code}
    assert used == set(EXAMPLES), f"entries without an example (removed?): {set(EXAMPLES) - used}"
    assert len(examples()) == len(EXAMPLES), "two different examples share an entry: give each its own"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """What the examples name, where they run: configs/ (small sizes), mingpt/main.py, data/, the
    train -> eval script chain's scripts."""
    root = tmp_path_factory.mktemp("readme")
    (root / "configs").mkdir()
    train = yaml.safe_load((CONFIGS / "train.yaml").read_text())
    (root / "configs" / "train.yaml").write_text(yaml.safe_dump({**train, **SMALL}))
    (root / "configs" / "eval.yaml").write_text(yaml.safe_dump({"model": SMALL["model"], "batches": 4}))
    (root / "mingpt").mkdir()
    (root / "mingpt" / "main.py").write_text(MAIN_PY)
    (root / "data").mkdir()
    (root / "data" / "tokens.txt").write_text("1 2 3 4")
    (root / "train_ckpt.py").write_text(TRAIN_CKPT)
    (root / "eval_ckpt.py").write_text(EVAL_CKPT)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("index", [pytest.param(i, marks=pytest.mark.alone) if 'walltime="00:00:30"' in code else i
                                   for i, (_, code) in enumerate(examples())])  # 30 s blocks: alone
def test_readme_example_runs_as_written(workdir, index, plots):  # (as a user runs them: plots too)
    where, code = examples()[index]
    how, expected, edits = spec(code)
    for old, new in edits:
        assert old in code
        code = code.replace(old, new)
    script = workdir / f"example_{index}.py"
    script.write_text(code)
    env = clean_env(MPLBACKEND="Agg")
    if how == "launch":
        cmd = [str(BIN / "parsl-torch"), "launch", "-n", "2", "--", sys.executable, str(script)]
    else:
        cmd = [sys.executable, str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=workdir)
    assert out.returncode == 0, f"{where}:\n{code}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    assert expected in out.stdout, f"{where}: {expected!r} not in {out.stdout[-2000:]!r}"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_another_torch_for_make_demo_is_installed_into_the_existing_venv(tmp_path):
    """`make demo TORCH=...` (or TORCH_INDEX=...) after a first demo installs that torch: the venv is
    there, but the torch asked for is not the one installed (the stages then rerun: torch's version is
    in their identity)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # a venv that exists

    def planned(*variables: str) -> str:
        out = subprocess.run(["make", "-n", "-C", str(REPO), f"VENV={venv}", *variables, "demo"],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():  # what make would do, done for the stamps (the rest is not run)
            if line.startswith(("touch ", "rm -f")):
                subprocess.run(line, shell=True, check=True)
        return out

    assert 'pip install -q --no-compile  "torch==2.13.0"' in planned()  # the first demo
    assert "pip install -q --no-compile  \"torch" not in planned()  # the same torch: nothing to install
    assert 'pip install -q --no-compile  "torch"' in planned("TORCH=torch")  # another one: installed
    cpu = planned("TORCH_INDEX=https://download.pytorch.org/whl/cpu")
    assert '--index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"' in cpu
    # then make test (no TORCH_INDEX): the torch installed is kept when it satisfies the request
    default = next(line for line in planned().splitlines() if 'pip install -q --no-compile  "torch==2.13.0"' in line)
    check = default.split(" 2>/dev/null ||")[0].replace(f"{venv}/bin/python", sys.executable, 1)
    installed = __import__("importlib.metadata").metadata.version("torch").split("+")[0]
    assert subprocess.run(check.replace("'torch==2.13.0'", f"'torch=={installed}'"), shell=True).returncode == 0
    assert subprocess.run(check.replace("'torch==2.13.0'", "'torch==1.0.0'"), shell=True).returncode == 1
