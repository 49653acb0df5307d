"""The rank's ``__main__`` while a stage's function runs: the functions and classes it brought from the
workflow script, under their own names.

Where the workflow runs, its script is ``__main__``; its definitions reach the ranks by value (dill). Code
that pickles them by name looks for ``__main__.square``: ``multiprocessing.Pool.map(square, ...)`` with any
start method, a DataLoader's workers with ``spawn`` or ``forkserver`` (Python 3.14's default) handed a
dataset whose class the script defines, ``torch.save`` of such an object. In a rank ``__main__`` is
parsl-torch's entry module, which has none of them, and the call failed with "attribute lookup square on
__main__ failed", where the same code runs under torchrun. For the call's length this module stands in
as ``__main__`` with those definitions; a ``spawn`` or ``forkserver`` child of the rank imports the main
module by name, so it imports this one as its ``__mp_main__``, which loads the same definitions from the
call's payload (``settings.RANK_PAYLOAD``). A fork keeps the parent's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from ...common import settings
from .options import closure_values, load_call


def definitions(fn: Callable, args: tuple = (), kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The top-level functions and classes of the workflow script that a call of ``fn`` reaches, by name
    (``fn`` too: what its globals, closures and defaults hold, the classes of its arguments, and so on
    through those and the classes' members)."""
    found: dict[str, Any] = {}
    todo, seen = [fn, *(type(a) for a in (*args, *(kwargs or {}).values()))], set()
    while todo:
        obj = todo.pop()
        obj = getattr(obj, "__func__", obj)  # (a staticmethod or classmethod in a class's members)
        if id(obj) in seen or not isinstance(obj, (types.FunctionType, type)) or \
                getattr(obj, "__module__", None) != "__main__":
            continue
        seen.add(id(obj))
        if obj.__qualname__.isidentifier():  # (not a method, a nested function or a lambda: no name reaches them)
            found.setdefault(obj.__qualname__, obj)
        if isinstance(obj, type):
            todo.extend(vars(obj).values())
        else:
            todo.extend(obj.__globals__.values())
            todo.extend(closure_values(obj))
            todo.extend(obj.__defaults__ or ())
            todo.extend((obj.__kwdefaults__ or {}).values())
    return found


@contextlib.contextmanager
def as_main(payload: str, fn: Callable, args: tuple, kwargs: dict[str, Any]) -> Iterator[None]:
    """``__main__`` is a module holding the call's definitions while the block runs, under this module's name,
    which a spawned child imports as its main module, finding them through ``payload`` (nothing changes when
    the call brought none)."""
    found = definitions(fn, args, kwargs)
    if not found:
        yield
        return
    entry, module = sys.modules["__main__"], types.ModuleType("__main__")
    module.__spec__, module.__file__ = __spec__, __file__  # what a spawned child imports as its main module
    vars(module).update(found)
    os.environ[settings.RANK_PAYLOAD.name] = os.path.abspath(payload)
    sys.modules["__main__"] = module
    try:
        yield
    finally:
        sys.modules["__main__"] = entry
        os.environ.pop(settings.RANK_PAYLOAD.name, None)


if __name__ == "__mp_main__" and settings.RANK_PAYLOAD.get():  # a rank's spawned child, importing its main module
    globals().update(definitions(*load_call(settings.RANK_PAYLOAD.get())))
