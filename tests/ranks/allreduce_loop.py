"""All-reduces every 0.1 s for SECONDS, after writing MARKERS/rank<N> ("host pid").

usage: allreduce_loop.py MARKERS SECONDS   (tests kill ranks or nodes mid-run)
"""

import os
import socket
import sys
import time
from pathlib import Path

import torch

import parsl_torch as pt

markers, seconds = Path(sys.argv[1]), float(sys.argv[2])
pt.setup_torch()
t = torch.ones(1)
torch.distributed.all_reduce(t)
markers.mkdir(parents=True, exist_ok=True)
(markers / f"rank{pt.get_rank()}").write_text(f"{socket.gethostname()} {os.getpid()}")
end = time.monotonic() + seconds
while time.monotonic() < end:
    torch.distributed.all_reduce(t)
    time.sleep(0.1)
print(f"rank {pt.get_rank()} done", flush=True)
pt.exit_process(0)
