"""Layer 1, every process of a stage's ranks: what a stage reads, observed, so that a rerun skips only
when nothing it read changed.

Owns: the Python observer (``recorder``: an audit hook, for the process's life, that writes what the
process reads to a node-local file; loaded by its path from the rank's ``sitecustomize``, so it and its
sibling ``watches`` use the standard library only) and what it watches beyond audit events (``watches``:
the environment's reads, ``h5py``, lookups of missing paths, the children a process starts), and the
native observer of compiled code and programs (``native``: ``native.c``, built with the system's C
compiler on first use, preloaded into every process of a rank). Its one decision: what counts as the
stage's read (not parsl-torch's own, the standard library's or the import system's). The record these
lines end up in, merged over every launch of a computation, is ``common.stagedir.add_reads``. Its adapter
to Parsl: none (it runs below the launcher).
"""
