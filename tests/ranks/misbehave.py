"""A rank that fails or hangs on purpose; the others wait forever.

usage: misbehave.py exit3|hang|killpg|killparent MARKER   (MARKER tags the processes for the leak check)
"""

import os
import signal
import sys
import time

mode, rank = sys.argv[1], int(os.environ["RANK"])
if rank == 1 and mode != "hang":
    time.sleep(0.5)
    if mode == "exit3":
        sys.exit(3)
    if mode == "killpg":  # the rank's own process group: its launcher's processes too
        os.killpg(os.getpgrp(), signal.SIGKILL)
    if mode == "killparent":  # the process that started it (parsl-torch's shim)
        os.kill(os.getppid(), signal.SIGKILL)
time.sleep(600)
