"""One rank of the launch benchmark: set up, one all_reduce, then a fixed
amount of wall time, so launcher overhead is all that differs between runs.

usage: fixed_job.py SECONDS
"""

import sys
import time

import torch
import torch.distributed as dist

import parsl_torch as pt

pt.setup_torch()
t = torch.ones(1)
dist.all_reduce(t)
time.sleep(float(sys.argv[1]))
dist.barrier()
pt.cleanup()
