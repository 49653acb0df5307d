"""A rank that fails or hangs on purpose; the others wait forever.

usage: misbehave.py exit3|hang MARKER   (MARKER tags the processes for the leak check)
"""

import os
import sys
import time

mode, rank = sys.argv[1], int(os.environ["RANK"])
if rank == 1 and mode == "exit3":
    time.sleep(0.5)
    sys.exit(3)
time.sleep(600)
