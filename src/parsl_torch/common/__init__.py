"""Layer 0, used everywhere: plain-data records, run metadata and secret
redaction, this Python's environment, the module paths run with ``python -m``.

Imports nothing of the package but ``errors``, and nothing heavy (no torch,
Parsl, numpy or h5py).
"""
