"""Layer 2, on a login node, in a batch script, or a Parsl worker: which
scheduler and machine this is (one record per scheduler, one per machine),
the launch command (mpiexec, srun, torchrun) for a request, and the
supervisor and per-rank shim that make a launch fail fast and leave nothing
behind. No torch; Parsl only inside a scheduler record's provider methods.
Imports ``core.topology`` (host lists, free ports) and ``common``.
"""
