"""PMI's goodbye to MPICH's hydra proxy (``mpiexec``), for a rank whose own MPI did not say it.

Hydra hands each rank a PMI socket (``PMI_FD``) and expects ``cmd=finalize`` on it before the
rank exits. Without it (5.0.2 here):

* a rank that initialised MPI and ends with os._exit (MPICH sends the message in a C exit
  handler): hydra SIGKILLs the ranks still running ("BAD TERMINATION ... EXIT CODE: 9") though
  their work is done (measured: 2 of 30 4-rank runs);
* a rank that never initialised MPI (torch over gloo or NCCL; any shim's rank): from its exit to
  the last rank's, the node's proxy reads the socket's end over and over, a whole core (measured:
  2 ranks, one ending 3.5 s before the other: the proxy's CPU 3.4 s, 0.0 s with the goodbye).
"""

from __future__ import annotations

import os
import socket
import struct


def finish_pmi(timeout: float = 10.0) -> bool:
    """Tell hydra's proxy that this rank is done; whether it was told. Only a socket whose peer
    is a hydra proxy gets the message (Slurm's PMI-2 and PALS speak otherwise; an MPICH that
    finalized PMI itself has closed it already, and the proxy's end with it)."""
    raw = os.environ.get("PMI_FD", "")
    if not raw.isdigit():
        return False
    try:
        sock = socket.socket(fileno=os.dup(int(raw)))
    except OSError:
        return False  # closed: finalized already
    with sock:
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer_pid = struct.unpack("3i", creds)[0]
            with open(f"/proc/{peer_pid}/comm") as f:
                if f.read().strip() != "hydra_pmi_proxy":
                    return False
            sock.settimeout(timeout)
            sock.sendall(b"cmd=finalize\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(256)
                if not chunk:
                    break
                reply += chunk
            return reply.startswith(b"cmd=finalize_ack")
        except OSError:
            return False
