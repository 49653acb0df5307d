"""On the ``PYTHONPATH`` of a stage's ranks (set by the shim): every Python process they start
observes what it reads (``common.observe``), then runs the ``sitecustomize`` it hides, if any.
A Python without parsl-torch is not observed (the manual says so)."""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # (the user's sys.path, as it was)
_HIDDEN = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)  # (a site's, a venv's)

try:
    from parsl_torch.common.observe import install_from_env
except ImportError:
    pass
else:
    install_from_env()

if _HIDDEN is not None and _HIDDEN.loader is not None:
    _HIDDEN.loader.exec_module(importlib.util.module_from_spec(_HIDDEN))
