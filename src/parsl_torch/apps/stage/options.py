"""What a stage call carries to its worker and ranks: its function (``ShippedFunction``), its
options (``StageOptions``) and the files among its arguments (``StageFile``). (The files a stage
leaves in its directory are named in ``common.stagedir``.)

Light on purpose: the ranks unpickle these, and must not import Parsl to do
it (that costs ~0.6 s of every stage start).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import os
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ShippedFunction:
    """A stage's function, pickled where it was defined, with the globals it
    uses (a function from the workflow script travels by value)."""

    name: str
    blob: bytes
    #: which of Parsl's ``inputs``/``outputs`` it takes: the worker passes them without unpickling it
    #: (only the ranks import what the function needs)
    takes: tuple[str, ...] = ()

    @classmethod
    def of(cls, fn: Callable) -> ShippedFunction:
        buffer = io.BytesIO()
        _pickler_class()(buffer, recurse=True).dump(fn)
        params = inspect.signature(fn).parameters  # (by name, or through **kwargs)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        takes = tuple(k for k in ("inputs", "outputs") if takes_any or k in params)
        return cls(f"{fn.__module__}.{fn.__qualname__}", buffer.getvalue(), takes)

    def load(self) -> Callable:
        import dill

        return dill.loads(self.blob)


def closure_values(fn: types.FunctionType) -> list[Any]:
    """What the closure of ``fn`` holds (a cell not yet set is left out)."""
    values = []
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # (an empty cell)
            continue
    return values


def load_call(payload: str) -> tuple[Callable, tuple, dict[str, Any]]:
    """The function, positional and keyword arguments of the call that a distributed app wrote to ``payload``."""
    import dill

    with open(payload, "rb") as f:
        shipped, args, kwargs = dill.load(f)
    return shipped.load(), args, kwargs


@functools.lru_cache(maxsize=1)
def _pickler_class() -> type:
    """dill's Pickler, but the package's own modules travel by reference.

    dill copies a module's whole namespace when the module is not installed
    in site-packages (a source checkout, ``pip install -e``): a function that
    uses ``pt.`` would drag the package's state along (a ContextVar, which
    cannot be pickled). Every rank imports parsl_torch anyway.
    """
    import dill

    save_module = dill.Pickler.dispatch[types.ModuleType]

    def save_module_by_reference(pickler: dill.Pickler, module: types.ModuleType) -> None:
        if module.__name__.partition(".")[0] == __name__.partition(".")[0]:
            pickler.save_reduce(importlib.import_module, (module.__name__,), obj=module)
        else:
            save_module(pickler, module)

    dispatch = type(dill.Pickler.dispatch)(dill.Pickler.dispatch)
    dispatch[types.ModuleType] = save_module_by_reference
    return type("ShippingPickler", (dill.Pickler,), {"dispatch": dispatch})


@dataclass(frozen=True)
class StageOptions:
    """How one call of a stage runs, and what its code is: carried to the worker with the call."""

    stage_dir: str
    num_nodes: int
    ranks_per_node: int
    walltime: float | None
    env: tuple[tuple[str, str], ...]
    launcher_args: tuple[str, ...]  # the site's binding flags, after $PARSL_MPI_PREFIX
    code: str = ""  # fingerprint of the function (apps.identity.fingerprint); a script's comes from its file
    #: user modules the function reaches, as (file, module name); their imports are followed (apps.identity.usercode)
    code_roots: tuple[tuple[str, str], ...] = ()
    script: str | None = None  # the script a script stage runs (its imports are followed too)
    module: str | None = None  # the module a ``python -m`` stage runs
    files: tuple[str, ...] = ()  # files and directories the stage is told about besides inputs= (Path arguments...)
    packages: tuple[str, ...] = ()  # installed top-level modules its function reaches (apps.identity.packages)
    #: what user modules hold that its function reads, as they were at the call (``config.SCALE`` -> digest)
    state: tuple[tuple[str, str], ...] = ()
    site_setup: str = ""  # the site's provider.worker_init (module loads: the software the ranks get)
    #: its nodes have accelerators: a result computed on CPUs is not what a GPU node would compute (compared)
    accelerated: bool = False
    import_path: tuple[str, ...] = ()  # the ranks' PYTHONPATH: what the workflow imports from (not compared)
    preflight: float = 0.0  # seconds each node has to answer before a multi-node launch (not compared)

    @property
    def num_ranks(self) -> int:
        return self.num_nodes * self.ranks_per_node

    @property
    def environment(self) -> dict[str, str]:
        """``env`` as a mapping (kept as pairs: the record is frozen and compared)."""
        return dict(self.env)

    @property
    def rank_path(self) -> tuple[str, ...]:
        """The ranks' ``PYTHONPATH``: the one the stage's ``env=`` (or its site's ``environment``) gives, then
        the workflow's own folders (``import_path``)."""
        given = [p for p in self.environment.get("PYTHONPATH", "").split(os.pathsep) if p]
        return (*given, *(p for p in self.import_path if p not in given))


@dataclass(frozen=True)
class StageFile:
    """What a stage's function receives for a Parsl ``File``: its path and URL."""

    filepath: str
    url: str

    def __fspath__(self) -> str:
        return self.filepath

    def __str__(self) -> str:
        return self.filepath

    @property
    def filename(self) -> str:
        return os.path.basename(self.filepath)


def plain_files(value: Any) -> Any:
    """``value`` with each Parsl File (also inside lists, tuples, dicts) as a StageFile."""
    from parsl.data_provider.files import File

    if isinstance(value, File):
        return StageFile(value.filepath, value.url)
    if isinstance(value, list) or type(value) is tuple:
        return type(value)(plain_files(v) for v in value)
    if isinstance(value, dict):
        return {k: plain_files(v) for k, v in value.items()}
    return value
