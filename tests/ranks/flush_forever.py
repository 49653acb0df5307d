"""Records and flushes to disk at every step until killed (one process).

usage: flush_forever.py FINAL.h5
"""

import sys
from pathlib import Path

import parsl_torch as pt

h = pt.History("flush", path=sys.argv[1], sync_every=1, flush_every=0)
Path(sys.argv[1] + ".ready").touch()
step = 0
while True:
    h.update({f"m{i}": step * 0.5 + i for i in range(8)})
    step += 1
