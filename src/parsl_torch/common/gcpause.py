"""Python's cyclic garbage collector kept out of a process's start.

Importing torch (and ``torch._dynamo``, which an optimizer's first ``step`` and DDP's constructor
import) or Parsl creates about a million objects, and the collector, run every 700 allocations,
moves them up to its older generations and walks them there again and again on the way: a sixth
of a one-rank train stage's CPU (3.2 s against 2.8 s, the built-in train stage; docs/architecture.md).
Paused while a process starts, then what it imported is frozen (``gc.freeze``: moved to a generation
that no collection walks again), as pre-forking servers do. A rank that parsl-torch starts then collects its
youngest generation every ``RANK_GC_THRESHOLD[0]`` allocations instead of 700, so that the imports a
stage's function makes itself (``torch._dynamo``) cost little more than these: cyclic garbage still
goes, after 10,000 allocations at most rather than 700 (the older generations as CPython's defaults).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: a rank's collection thresholds: the youngest generation's (CPython's default: 700), the older ones' as default
RANK_GC_THRESHOLD = (10_000, 10, 10)


@contextlib.contextmanager
def paused_gc(freeze: bool = False) -> Iterator[None]:
    """No automatic collection inside; with ``freeze``, what exists when it ends is frozen (for a
    process parsl-torch owns: in a user's workflow script, garbage made before would stay)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


def rank_gc() -> None:
    """The collection threshold of a rank's life after its start (``RANK_GC_THRESHOLD``)."""
    gc.set_threshold(*RANK_GC_THRESHOLD)
