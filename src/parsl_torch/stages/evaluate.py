"""The built-in evaluate stage: loads a train stage's checkpoint, measures
loss and next-token accuracy on held-out batches, writes its own history.

As an app: ``pt.stages.evaluate.evaluate(config, inputs=[train_future.outputs[1]],
outputs=[File("eval.h5")])``. As a program on every rank:
``python -m parsl_torch.stages.evaluate --config configs/eval.yaml --checkpoint model.pt``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..apps.stage.app import distributed_app, submit_builtin
from ..apps.session.request import BuiltinCall
from ..core.device import get_torch_device
from ..core.dist import exit_process
from ..core.ranks import get_world_size
from ..errors import ConfigError
from .config import (
    DataConfig,
    ModelConfig,
    at_least,
    check_data_fits_model,
    check_strategy,
    data_files,
    load_config,
)
from .entry import run_stage
from .model import build_model, check_checkpoint_model

STAGE = "evaluate"


@dataclass(frozen=True)
class EvalConfig:
    """configs/eval.yaml: every field is documented there."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=lambda: DataConfig(seed=10_000))
    batches: int = 20
    strategy: str = "ddp"

    def __post_init__(self) -> None:
        check_strategy(self.strategy)
        at_least(self, 1, "batches")
        check_data_fits_model(self.data, self.model)


def run_evaluate(cfg: EvalConfig, checkpoint_path: Any, history_path: Any, stage: str = STAGE) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ..core.wrap import data_parallel_coords, wrap_model
    from ..history.recorder import History
    from . import checkpoint as ckpt
    from .data import batch

    try:
        state = ckpt.read(checkpoint_path)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"stage {stage!r}: checkpoint {checkpoint_path} cannot be used: {exc}") from None
    check_checkpoint_model(state, cfg.model, checkpoint_path, stage)
    device = get_torch_device()
    # DDP only syncs gradients: an evaluation's ranks hold the whole model unwrapped (and skip the
    # 1-2 s of CPU that DDP's import of torch._dynamo costs every rank)
    model = wrap_model(build_model(cfg.model).to(device), strategy="none" if cfg.strategy == "ddp" else cfg.strategy)
    ckpt.restore(state, model)
    model.eval()
    history = History(stage, path=history_path, config=asdict(cfg))
    dp_rank, dp_size = data_parallel_coords()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, tokens
    with torch.no_grad():
        for b in range(cfg.batches):
            tokens = batch(cfg.data, cfg.model, b, dp_rank, dp_size).to(device)
            logits = model(tokens[:, :-1]).float()
            target = tokens[:, 1:]
            loss = F.cross_entropy(logits.reshape(-1, cfg.model.vocab_size), target.reshape(-1), reduction="sum")
            correct = (logits.argmax(-1) == target).sum()
            n = target.numel()
            totals += torch.stack([loss.double(), correct.double(), torch.tensor(n, dtype=torch.float64, device=device)])
            history.update({"eval_loss": loss.item() / max(n, 1), "eval_acc": correct.item() / max(n, 1)}, step=b)
    if dist.is_initialized():
        dist.all_reduce(totals)
    path = history.finalize(history_path)
    return {"stage": stage, "eval_loss": float(totals[0] / totals[2]), "eval_acc": float(totals[1] / totals[2]),
            "trained_steps": state["step"], "history": str(path), "world_size": get_world_size()}


def _evaluate_on_ranks(config: EvalConfig, inputs=(), outputs=()) -> dict[str, Any]:
    if len(inputs) != 1 or len(outputs) != 1:
        raise ConfigError("stage 'evaluate' needs inputs=[checkpoint] and outputs=[history .h5]")
    return run_evaluate(config, inputs[0], outputs[0])  # (checked once, where the stage was called)


_evaluate = distributed_app(_evaluate_on_ranks, name=STAGE)


def evaluate(config: Any, inputs=(), outputs=("eval.h5",), **call: Any):
    """Submit the evaluate stage; ``config`` is checked here, before anything is submitted."""
    cfg = load_config(config, EvalConfig, call.get("stage", STAGE))
    if len(inputs) != 1:
        raise ConfigError(f"stage {call.get('stage', STAGE)!r}: inputs must hold exactly one checkpoint "
                          f"(e.g. inputs=[train_future.outputs[1]]), got {len(inputs)}")
    return submit_builtin(BuiltinCall.of(STAGE, cfg, tuple(inputs), tuple(outputs), tuple(data_files(cfg.data)),
                                         call), _evaluate)


def main(argv: list[str] | None = None) -> int:
    return run_stage(argv, prog=f"python -m {__name__}", description=__doc__.splitlines()[0],
                     config_class=EvalConfig, stage=STAGE,
                     files={"--checkpoint": {"required": True}, "--history": {"default": "eval.h5"}},
                     run=lambda cfg, args: run_evaluate(cfg, args.checkpoint, args.history))


if __name__ == "__main__":
    exit_process(main())  # a finished rank must not die in torch's exit-time destructors
