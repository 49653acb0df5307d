"""ezpz's quickstart loop, written to ezpz's documented API; only the import differs."""

import os
import time

import torch

import parsl_torch.compat.ezpz as ezpz

rank = ezpz.setup_torch(seed=0)  # returns the global rank
device = ezpz.get_torch_device()  # "cpu" here: a device type, as ezpz returns it
logger = ezpz.get_logger(__name__)

model = torch.nn.Linear(128, 64).to(device)
model = ezpz.wrap_model(model, use_fsdp=True, dtype="bfloat16")  # ezpz's defaults spelled out
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
history = ezpz.History()

for step in range(int(os.environ.get("TRAIN_ITERS", 100))):
    t0 = time.perf_counter()
    x = torch.randn(32, 128, device=device)
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    ezpz.synchronize()
    logger.info(history.update({"step": step, "loss": loss.item(), "dt": time.perf_counter() - t0}))

dataset = history.finalize(outdir=os.environ.get("OUTDIR", "./outputs"))  # every rank calls it here
if rank == 0:
    print(f"DATASET steps={dataset.sizes['step']} vars={sorted(dataset.data_vars)[:3]} "
          f"world={ezpz.get_world_size()} device={device} backend={ezpz.get_torch_backend()}", flush=True)
ezpz.cleanup()
