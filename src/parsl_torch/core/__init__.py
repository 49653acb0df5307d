"""Layer 1, inside a rank: where the ranks are (topology, rank helpers), the
device and backend, the process group (``setup_torch``), model wrapping
(DDP, FSDP2, FSDP2 x TP), rank-aware logging and the package's models.

Works in any torchrun/mpiexec/srun script without Parsl or MPI. torch is
imported inside functions except in ``wrap`` and ``models``, which are
about torch modules; imports only ``common`` and ``errors``.
"""
