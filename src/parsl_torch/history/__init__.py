"""Layer 2, inside a rank (the recorder) and anywhere (reading files):
``History`` records per-step metrics rank-locally, computes cross-rank
statistics in batches, writes one HDF5 file per stage, and feeds plots and
CSV/wandb sinks. Imports ``core`` and ``common``; never Parsl.
"""
