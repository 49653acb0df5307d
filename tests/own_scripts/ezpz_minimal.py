"""A script in the style of ezpz's examples/minimal.py (timeitlogit, iter-keyed updates,
DDP through ezpz.dist, finalize on rank 0 only), written to ezpz's documented API."""

import os
import time

import torch

import parsl_torch.compat.ezpz as ezpz

logger = ezpz.get_logger(__name__)


class Net(torch.nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


@ezpz.timeitlogit(rank=ezpz.get_rank())
def train(model, optimizer):
    unwrapped = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    history = ezpz.History()
    device_type = ezpz.get_torch_device_type()
    isize = unwrapped.layers[0].in_features
    for step in range(int(os.environ.get("TRAIN_ITERS", 40))):
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            t0 = time.perf_counter()
            x = torch.rand((16, isize)).to(device_type)
            loss = ((model(x) - x) ** 2).sum()
            dtf = (t1 := time.perf_counter()) - t0
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step > 2:
                summary = history.update({"iter": step, "loss": loss.item(), "dt": dtf + time.perf_counter() - t1})
        if step % 10 == 0 and step > 2:
            logger.info(summary)
    return history


@ezpz.timeitlogit(rank=ezpz.get_rank())
def setup():
    ezpz.setup_torch(seed=int(os.environ.get("SEED", 0)))
    model = Net([32, 64, 32]).to(ezpz.get_torch_device_type())
    optimizer = torch.optim.Adam(model.parameters())
    if ezpz.get_world_size() > 1:
        model = ezpz.dist.wrap_model_for_ddp(model)
    return model, optimizer


def main():
    model, optimizer = setup()
    history = train(model, optimizer)
    info = ezpz.get_dist_info()
    if ezpz.get_rank() == 0:
        dataset = history.finalize(outdir=os.environ.get("OUTDIR", "./outputs"), run_name="minimal")
        print(f"DATASET steps={dataset.sizes['step']} first={int(dataset['step'][0])} "
              f"rank={info['RANK']} world={info['WORLD_SIZE_IN_USE']} ts={len(ezpz.get_timestamp())} "
              f"mem={ezpz.get_memory_metrics()}", flush=True)
    ezpz.cleanup()


if __name__ == "__main__":
    main()
