"""Each rank claims a device through the rendezvous store, as setup_torch does under nccl:
``same`` makes every rank claim one device (refused on every rank), ``own`` one each."""

import datetime
import sys

import torch.distributed as dist

from parsl_torch.core.claim import claim_device
from parsl_torch.core.topology import get_topology
from parsl_torch.errors import ConfigError

topo = get_topology()
store = dist.TCPStore(topo.master_addr, topo.master_port, topo.world_size, is_master=topo.rank == 0,
                      timeout=datetime.timedelta(seconds=30), multi_tenant=True)
key = "cuda:GPU-same" if sys.argv[1] == "same" else f"cuda:GPU-{topo.local_rank}"
try:
    claim_device(store, topo.hostname, key, topo.world_size, 30, ranks_on_node=topo.local_world_size, visible=1,
                 backend="nccl")
except ConfigError as exc:
    sys.stdout.write(f"rank {topo.rank} refused: {exc}\n")
    sys.stdout.flush()
    sys.exit(3)
sys.stdout.write(f"rank {topo.rank} claimed {key}\n")
sys.stdout.flush()
