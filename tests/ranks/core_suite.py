"""Runs on every rank of a real launch (mpiexec or torchrun) and records what
the test then checks: topology, DDP, FSDP2 (fp32, bf16, float8), TP, FSDP2 x TP.

usage: core_suite.py OUT_DIR SCENARIO[,SCENARIO...]
"""

import copy
import json
import os
import sys

import torch
import torch.distributed as dist

import parsl_torch as pt
from parsl_torch.core.models import MLP, FeedForward, Transformer

out_dir, scenarios = sys.argv[1], sys.argv[2].split(",")
rank = pt.setup_torch(seed=0)
world = pt.get_world_size()
result: dict = {"rank": rank, "world_size": world}


def global_batch(step: int, n: int = 16):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(n, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def train_mlp(model, steps, shard: bool, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = global_batch(step)
        if shard:
            x, y = x.chunk(world)[rank], y.chunk(world)[rank]
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def full_loss(model):
    x, y = global_batch(10_000)
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x).float(), y).item()


def param_checksum(model):
    return float(sum(p.detach().double().sum() for p in model.parameters()))


if "topology" in scenarios:
    t = pt.get_topology()
    result["topology"] = {k: getattr(t, k) for k in
                          ("rank", "local_rank", "world_size", "local_world_size", "num_nodes",
                           "rank_source", "master_addr", "master_port")}
    result["dist_rank"] = dist.get_rank()
    result["backend"] = dist.get_backend()

if "ddp" in scenarios:
    torch.manual_seed(0)
    model = pt.wrap_model(MLP(in_dim=8, dim=16), strategy="ddp")
    # each rank sees different data; DDP must keep the replicas identical
    train_mlp(model, 3, shard=True)
    result["ddp_checksum"] = param_checksum(model)

for name, dtype, recompute in (("fsdp", None, None), ("fsdp_bf16", "bf16", None), ("fsdp_ac", None, "full")):
    if name in scenarios:
        torch.manual_seed(0)
        base = MLP(in_dim=8, dim=16)
        reference = copy.deepcopy(base)
        model = pt.wrap_model(base, strategy="fsdp", dtype=dtype, activation_checkpointing=recompute)
        losses = train_mlp(model, 20, shard=True)
        result[name] = {"losses": losses, "eval": full_loss(model),
                        "sharded": type(model).__name__}
        ref_losses = train_mlp(reference, 20, shard=False)
        result[name]["ref_eval"] = full_loss(reference)
        result[name]["ref_losses"] = ref_losses

if "tp" in scenarios:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    layer = FeedForward(8, 32)
    plain = copy.deepcopy(layer)
    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(layer, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    result["tp_max_abs_diff"] = (layer(x) - plain(x)).abs().max().item()
    result["tp_local_fc1_rows"] = layer.fc1.weight.to_local().shape[0]

if "fsdp_tp" in scenarios:
    tp = 2
    torch.manual_seed(0)
    base = Transformer(vocab_size=64, dim=32, n_heads=4, n_layers=2, max_seq_len=16)
    reference = copy.deepcopy(base)
    # (the blocks' activations recomputed in the backward pass: the same losses as the plain reference's)
    model = pt.wrap_model(base, strategy="fsdp+tp", tp_size=tp, activation_checkpointing="full")
    dp_rank, dp_size = pt.data_parallel_coords(tp)

    def lm_losses(m, shard):
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        losses = []
        for step in range(15):
            g = torch.Generator().manual_seed(step % 3)
            tokens = torch.randint(0, 64, (8, 16), generator=g)
            if shard:
                tokens = tokens.chunk(dp_size)[dp_rank]
            logits = m(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64).float(), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    result["fsdp_tp"] = {"losses": lm_losses(model, True), "ref_losses": lm_losses(reference, False),
                         "dp": [dp_rank, dp_size]}

if "fsdp_float8" in scenarios:  # FSDP2 over torchao's float8 linear layers, on CPUs: what an H100 runs
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        result["fsdp_float8"] = None  # (the lowest versions' run: no torchao for torch 2.8)
    else:
        import parsl_torch.core.wrap as wrap
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        wrap.check_precision = lambda precision, device_type: None  # (the CPU's refusal is test_precision's)
        torch.manual_seed(0)
        base = Transformer(64, 32, 2, 2, 16)
        tokens = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(1))
        mine = tokens.chunk(world)[rank]

        def lm_loss(m, batch):
            return torch.nn.functional.cross_entropy(m(batch[:, :-1]).reshape(-1, 64).float(), batch[:, 1:].reshape(-1))

        def float8_losses(model, forward):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            losses = []
            for _ in range(8):
                loss = lm_loss(forward, mine)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return losses

        # compiled as the train stage compiles (the wrapped model whole), traced by dynamo and AOTAutograd
        # through torchao's float8 tensors and FSDP2's hooks; aot_eager: inductor's CPU kernels (25 s to
        # build) are not what a GPU runs
        twin = pt.wrap_model(copy.deepcopy(base), strategy="fsdp", precision="float8")
        compiled = float8_losses(twin, torch.compile(twin, backend="aot_eager"))
        from torch._dynamo.utils import counters

        graphs = counters["stats"]["unique_graphs"]  # (none: compile fell back to eager, which proves nothing)
        model = pt.wrap_model(base, strategy="fsdp", precision="float8")
        losses = float8_losses(model, model)
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # (on every rank)
        plain = Transformer(64, 32, 2, 2, 16)  # an evaluation without float8 loads the checkpoint
        plain.load_state_dict(full, strict=True)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            result["fsdp_float8"] = {"losses": losses, "compiled_losses": compiled, "graphs": graphs,
                                     "layer": type(base.blocks[0].attn.q).__name__,
                                     "head": type(base.head).__name__, "plain_loss": lm_loss(plain, mine).item(),
                                     "loss": lm_loss(model, mine).item()}

if "ddp_resume" in scenarios:  # a resumed DDP (a new one, the state put back) against the run it continues
    from parsl_torch.core.models import TokenMLP

    def lm_step(model, step):
        tokens = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(100 * step + rank))
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, 64), tokens[:, 1:].reshape(-1))
        return loss

    def resumed(state, settle):
        torch.manual_seed(0)
        model = pt.wrap_model(TokenMLP(64, 32, 2), strategy="ddp")
        model.module.load_state_dict(state[0])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt.load_state_dict(copy.deepcopy(state[1]))  # (its tensors would be the kept ones: updated in place)
        if settle:
            pt.settle_buckets(model, lambda: lm_step(model, 4).backward())
        return model, opt

    def grads_from(model, opt, start, stop, keep_at=None):
        """Per step, the sum of the gradients DDP averaged (bitwise: as a float64's hex) and the loss."""
        seen = []
        for step in range(start, stop):
            loss = lm_step(model, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            seen.append((float(sum(p.grad.double().sum() for p in model.parameters())).hex(), loss.item()))
            opt.step()
            if step + 1 == keep_at:
                kept.append((copy.deepcopy(model.module.state_dict()), copy.deepcopy(opt.state_dict())))
        return seen

    kept: list = []
    torch.manual_seed(0)
    model = pt.wrap_model(TokenMLP(64, 32, 2), strategy="ddp")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    result["ddp_resume"] = {"plain": grads_from(model, opt, 0, 8, keep_at=4)}
    for settle in (False, True):
        result["ddp_resume"][f"settled={settle}"] = grads_from(*resumed(kept[0], settle), 4, 8)

with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
pt.cleanup()
pt.exit_process(0)  # torch can abort in exit-time destructors after a process group (README)
