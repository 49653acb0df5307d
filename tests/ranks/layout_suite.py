"""Runs on every rank of a real launch: a tiny Transformer under parallel layouts, next to the
same model trained in this process alone on the whole batch.

usage: layout_suite.py OUT_DIR curves NAME=JSON[;NAME=JSON...]   each layout's loss curve and the
                                                                 one-process curve (JSON: Layout's
                                                                 fields, plus "ac")
       layout_suite.py OUT_DIR save CKPT JSON    3 steps under the layout, a sharded checkpoint,
                                                 then 2 more steps (their losses recorded)
       layout_suite.py OUT_DIR resume CKPT JSON  the checkpoint loaded under this layout (or
                                                 "one" rank), then the same 2 steps
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import parsl_torch as pt
from parsl_torch.core.layout import Layout
from parsl_torch.core.models import Transformer
from parsl_torch.core.pipeline import split_model
from parsl_torch.stages import checkpoint

STEPS, VOCAB, SEQ, BATCH = 20, 32, 16, 8
ONE = None  # the model trained in this process alone
out_dir, mode = sys.argv[1], sys.argv[2]
rank = pt.setup_torch(seed=0)
world = pt.get_world_size()


def loss_fn(output, target):
    return F.cross_entropy(output.reshape(-1, VOCAB).float(), target.reshape(-1))


def batch(step):
    """Arithmetic sequences mod VOCAB (a random start and stride per row): learnable in a few steps."""
    g = torch.Generator().manual_seed(step)
    start, stride = torch.randint(0, VOCAB, (BATCH, 1), generator=g), torch.randint(1, 4, (BATCH, 1), generator=g)
    tokens = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return tokens[:, :-1], tokens[:, 1:]


def build(spec, seed=0):
    """(the wrapped model, its layout) for a JSON spec; the plain model for "one"."""
    torch.manual_seed(seed)
    plain = Transformer(vocab_size=VOCAB, dim=32, n_heads=4, n_layers=4, max_seq_len=SEQ)
    if spec == "one":
        global ONE
        ONE = plain
        return plain, Layout(dp_shard=1)
    spec = json.loads(spec)
    ac, custom = spec.pop("ac", None), spec.pop("custom_split", False)
    layout = Layout(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()})
    split = (lambda model, stage, n: split_model(model, stage, [range(0, 1), range(1, 4)])) if custom else None
    return pt.wrap_model(plain, layout=layout, activation_checkpointing=ac, pipeline_split=split,
                         loss_fn=loss_fn if layout.pp > 1 else None), layout


def steps(model, layout, opt, first, last):
    """Steps first..last-1 on this rank's share of each global batch; their mean losses over the ranks."""
    coords = layout.coords(rank, world) if model is not ONE else layout.coords(0, 1)
    losses = []
    for step in range(first, last):
        x, y = (t.chunk(coords.dp_size)[coords.dp] for t in batch(step))
        opt.zero_grad()
        if layout.pp > 1:
            loss = model.step(x, y)
        else:
            loss = loss_fn(model(x), y)
            loss.backward()
        opt.step()
        loss = loss.detach().clone()
        if model is not ONE:
            dist.all_reduce(loss)  # every rank of a data-parallel shard holds that shard's loss
        losses.append(float(loss) / (world if model is not ONE else 1))
    return losses


def optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


if mode == "curves":
    ref_model, one = build("one")
    result = {"ref": steps(ref_model, one, optimizer(ref_model), 0, STEPS)}
    for name, spec in (s.split("=", 1) for s in sys.argv[3].split(";")):
        model, layout = build(spec)
        result[name] = {"losses": steps(model, layout, optimizer(model), 0, STEPS),
                        "coords": list(layout.coords(rank, world)), "kind": type(model).__name__,
                        "names": sorted(model.state_dict())}
        if layout.pp > 1:  # a held-out batch, forward only, against the one-process model's
            x, y = (t.chunk(layout.coords(rank, world).dp_size)[layout.coords(rank, world).dp] for t in batch(999))
            model.eval()
            try:
                result[name]["eval"] = float(model.evaluate(x, y))
            except pt.ConfigError as e:  # (torch before 2.9 has no forward-only schedule)
                result[name]["eval_refused"] = str(e)
            with torch.no_grad():
                result[name]["ref_eval"] = float(loss_fn(ref_model(x), y))
else:
    path, spec = sys.argv[3], sys.argv[4]
    model, layout = build(spec, seed=0 if mode == "save" else 1)  # (a resumed model starts elsewhere)
    opt = optimizer(model)
    if mode == "save":
        steps(model, layout, opt, 0, 3)
        checkpoint.save(path, model, opt, 3, {"n_layers": 4}, strategy=f"parallel: {layout.describe(world)}")
    else:
        checkpoint.restore(checkpoint.read(path), model, opt)
    result = {"next": steps(model, layout, opt, 3, 5), "kind": type(model).__name__}
json.dump(result, open(f"{out_dir}/rank{rank}.json", "w"))
pt.cleanup()
