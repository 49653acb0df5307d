"""Layer 6, the ``parsl-torch`` command: thin handlers over the layers below,
and ``doctor``. User mistakes print one line and exit 2."""

from .commands import main

__all__ = ["main"]
