"""The built-in train stage.

As an app: ``pt.stages.train.train(config, outputs=[File("train.h5"),
File("model.pt")])`` inside ``pt.workflow``. As a program on every rank:
``python -m parsl_torch.stages.train --config configs/train.yaml
--history train.h5 --checkpoint model.pt`` (mpiexec, srun, Globus Compute).

Checkpoints (full model and optimizer state) are written every
``checkpoint_every`` steps, and when the batch block is about to end
(``should_checkpoint``: the stage then exits "to be continued" and the workflow
submits it again); a rerun (Parsl retry, continuation) finds the checkpoint,
resumes from its step, and keeps the history of the steps before it, so the
history has no lost or duplicated steps.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..apps.stage.app import distributed_app, submit_builtin
from ..apps.session.request import BuiltinCall
from ..common import settings
from ..core.deadline import note_checkpoint, should_checkpoint, stop_requested
from ..core.deadline import promoted, to_be_continued
from ..core.device import get_torch_device
from ..core.dist import exit_process
from ..core.flops import flops_per_token, peak_flops, throughput
from ..core.layout import Layout, from_strategy
from ..core.log import get_logger
from ..core.precision import (
    check_precision,
    default_precision,
    grad_scaler,
    normalize_precision,
    use_tf32,
)
from ..core.ranks import get_rank, get_world_size
from ..core.recompute import checkpoint_every
from ..core.snapshot import Snapshots
from ..core.topology import env_topology
from ..errors import ConfigError
from . import faults
from .config import (
    DataConfig,
    ModelConfig,
    at_least,
    check_data_fits_model,
    check_seed,
    check_strategy,
    data_files,
    load_config,
)
from .entry import run_stage
from .model import build_model, check_checkpoint_model

STAGE = "train"
#: the history's units and descriptions of the metrics the stage records
UNITS = {"dt": "s", "lr": "1", "tokens_per_s": "1/s", "tflops": "TFLOP/s", "mfu": "1"}
DESCRIPTIONS = {"loss": "next-token cross-entropy", "dt": "seconds per step (the first one compiles, with compile)",
                "tokens_per_s": "tokens per second over all ranks",
                "tflops": "achieved TFLOP/s per device (6N + 12 L d T per token)",
                "mfu": "model FLOPs utilisation: tflops over the device's dense bf16 peak"}


@dataclass(frozen=True)
class TrainConfig:
    """configs/train.yaml: every field is documented there."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    steps: int = 200
    lr: float = 3e-3
    strategy: str = "ddp"  # none | ddp | fsdp | fsdp+tp
    tp_size: int | None = None
    precision: str | None = None  # fp32 | bf16 | fp16 | float8; None: bf16 on GPUs that run it, fp32 elsewhere
    dtype: str | None = None  # precision's older name (FSDP's compute dtype)
    tf32: bool = True  # fp32 on CUDA: TF32 matmuls
    compile: bool = False  # torch.compile the wrapped model (its compile time is the result's compile_s)
    activation_checkpointing: str = "none"  # none | full | selective | selective:K (core.recompute)
    parallel: Layout | None = None  # every parallel dimension (core.layout), instead of strategy/tp_size
    checkpoint_every: int = 50
    #: steps between states kept in node memory (``core.snapshot``); None: chosen so they cost 2 % of the
    #: step time; 0: none
    snapshot_every: int | None = None
    log_every: int = 20
    read_every: int | None = None  # steps between reads of the loss from the device (None: log_every on a GPU, 1 on a CPU)
    seed: int = 0

    def __post_init__(self) -> None:
        strategy = check_strategy(self.strategy)
        at_least(self, 1, "steps", "checkpoint_every", "log_every")
        if self.read_every is not None:
            at_least(self, 1, "read_every")
        if self.snapshot_every is not None:
            at_least(self, 0, "snapshot_every")
        if not 0 < self.lr < math.inf:
            raise ConfigError(f"lr: must be a finite number > 0, got {self.lr!r}")
        precision, dtype = normalize_precision(self.precision), normalize_precision(self.dtype, "dtype")
        if precision is not None and dtype is not None and precision != dtype:
            raise ConfigError(f"precision: {self.precision!r} and dtype: {self.dtype!r} disagree: keep precision alone")
        if self.tp_size is not None and self.tp_size < 2:
            raise ConfigError(f"tp_size: must be at least 2 (ranks per tensor-parallel group), got {self.tp_size}")
        check_seed(self, "seed")
        checkpoint_every(self.activation_checkpointing)
        check_data_fits_model(self.data, self.model)
        if self.tp_size is not None and strategy != "fsdp+tp":
            raise ConfigError(f"tp_size: applies to strategy fsdp+tp, not {self.strategy!r}: remove it or "
                              f"change strategy")
        if self.parallel is not None:
            check_parallel(self)


def check_world(cfg: TrainConfig, world: int, local_world: int, cpus_only: bool = False) -> None:
    """What needs the call's ranks, checked at the call (not 3 to 5 s later on them): ``parallel:`` fills
    ``world`` ranks of ``local_world`` per node and the model's blocks, tp splits its heads, cp has GPUs
    (``cpus_only``: known to have none), ``data.batch_size`` splits over the data-parallel ranks."""
    layout = cfg.parallel or from_strategy(cfg.strategy, world, cfg.tp_size)
    layout.check(world, local_world, cfg.model.n_layers)
    if layout.tp > 1 and cfg.model.kind == "transformer" and cfg.model.n_heads % layout.tp:
        raise ConfigError(f"parallel.tp: tp={layout.tp} does not divide the model's {cfg.model.n_heads} attention "
                          f"heads (model.n_heads): use a tp that divides it, or more heads")
    if layout.cp > 1 and cpus_only:
        raise ConfigError("parallel.cp: torch's context-parallel attention runs on CUDA GPUs only, and the site's "
                          "nodes have none: use cp: 1 here")
    shards = layout.coords(0, world).dp_size
    per = shards * (layout.microbatches if layout.pp > 1 else 1)
    if cfg.data.batch_size % per:
        split = f"{shards} data-parallel shards of {layout.microbatches} microbatches each (parallel.pp_microbatches)" \
            if layout.pp > 1 else f"its {shards} data-parallel ranks ({layout.describe(world)})"
        raise ConfigError(f"data.batch_size: {cfg.data.batch_size} does not split evenly into {split}: each would "
                          f"train on a different number of samples, or none; use a multiple of {per}")


def check_parallel(cfg: TrainConfig) -> None:
    """What the workflow can check of a ``parallel:`` section (the world size is the ranks')."""
    layout = cfg.parallel
    if cfg.strategy != "ddp" or cfg.tp_size is not None:
        raise ConfigError("parallel: replaces strategy and tp_size: remove them (parallel: {dp_shard: -1} is fsdp, "
                          "{tp: 2} fsdp+tp, {dp_replicate: N, dp_shard: 1} ddp)")
    if layout.pp > 1:
        if cfg.compile:
            raise ConfigError("compile: a pipelined model (parallel.pp > 1) is not compiled here: use compile: false")
        if normalize_precision(cfg.precision or cfg.dtype) == "fp16":
            raise ConfigError("precision: fp16's gradient scaler does not run under parallel.pp > 1: use bf16")
        if layout.stages > cfg.model.n_layers:
            raise ConfigError(f"parallel.pp: {layout.stages} stages ({layout.pp_schedule}) are more than the "
                              f"model's {cfg.model.n_layers} layers (model.n_layers): use a smaller pp")
    if layout.cp > 1 and cfg.model.kind != "transformer":
        raise ConfigError(f"parallel.cp: model.kind {cfg.model.kind!r} has no attention to split: use cp: 1")


def run_train(cfg: TrainConfig, history_path: Any, checkpoint_path: Any, stage: str = STAGE) -> dict[str, Any]:
    """Train on every rank (after setup_torch); returns a summary (rank 0's is the app's result)."""
    import torch

    torch.manual_seed(cfg.seed)
    run = _Training.build(cfg, history_path, stage)
    state, start = _resume(run, checkpoint_path)
    # a checkpoint saved where a sweep cut or paused this call: it ends there again, unless promoted since
    ended = state.get("stopped") and not promoted()
    loss, compile_s, stopped = (None, None, start) if ended else _steps(run, start, checkpoint_path)
    # resumed at its last step (killed after the final save, or stopped): the loss that checkpoint recorded
    final = _mean(loss.detach(), run.device) if loss is not None and start < cfg.steps \
        else float(state.get("loss") or math.nan)
    path = run.history.finalize(history_path)
    run.snapshots.finish()  # (its state in node memory: the computation is done)
    if stopped is not None:
        get_logger(__name__).info("[%s] stopped at step %d: a sweep cut or paused it", stage, stopped)
    return {"stage": stage, "final_loss": final, "steps": cfg.steps, "stopped_at": stopped, "resumed_from": start,
            "history": str(path), "checkpoint": str(Path(checkpoint_path).absolute()),
            "world_size": get_world_size(), "segments": run.history.segments, "precision": run.precision,
            "compile_s": compile_s}


@dataclass
class _Training:
    """What a train stage's steps use, built once on each rank."""

    cfg: TrainConfig
    stage: str
    device: Any
    precision: str
    model: Any  # wrapped (DDP, FSDP): what is saved
    forward: Any  # the model, compiled where the config says
    opt: Any
    scaler: Any
    history: Any
    snapshots: Any  # ``core.snapshot.Snapshots``: the state kept in node memory every few steps
    per_token: float  # FLOPs per token
    peak: float | None  # the device's peak FLOP/s

    @classmethod
    def build(cls, cfg: TrainConfig, history_path: Any, stage: str) -> _Training:
        import torch

        from ..core.wrap import wrap_model
        from ..history.recorder import History

        device = get_torch_device()
        precision = normalize_precision(cfg.precision or cfg.dtype) or default_precision(device.type)
        check_precision(precision, device.type)
        if precision == "fp32":
            use_tf32(device.type, cfg.tf32)
        built = build_model(cfg.model)  # (pipelined: each rank moves only its stages to its device)
        if cfg.parallel is None or cfg.parallel.pp == 1:
            built = built.to(device)
        per_token = flops_per_token(built, *((cfg.model.n_layers, cfg.model.dim, cfg.model.seq_len)
                                             if cfg.model.kind == "transformer" else ()))
        split = {"strategy": cfg.strategy, "tp_size": cfg.tp_size} if cfg.parallel is None \
            else {"layout": cfg.parallel, "loss_fn": _loss_fn(cfg.model)}
        model = wrap_model(built, precision=precision, activation_checkpointing=cfg.activation_checkpointing, **split)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, fused=device.type in ("cuda", "xpu") or None)
        read_every = cfg.read_every or (1 if device.type == "cpu" else cfg.log_every)
        history = History(stage, path=history_path, config={**asdict(cfg), "precision": precision},
                          units=UNITS, descriptions=DESCRIPTIONS, read_every=read_every)
        forward = torch.compile(model) if cfg.compile else model  # (checkpoints hold the module's own names)
        run = cls(cfg, stage, device, precision, model, forward, opt, grad_scaler(precision, device.type), history,
                  None, per_token, peak_flops(device))
        run.snapshots = _snapshots(run)
        return run


def _resume(run: _Training, checkpoint_path: Any) -> tuple[dict[str, Any], int]:
    """(the checkpoint's state, the step to start at): this call's own checkpoint restored, if there is one."""
    from . import checkpoint as ckpt

    cfg, stage, logger = run.cfg, run.stage, get_logger(__name__)
    if (kept := run.snapshots.restore()) is not None:  # (this computation's state in node memory: newest)
        run.history.resume(before_step=kept)
        return {"step": kept}, kept
    state = ckpt.read(checkpoint_path) if Path(checkpoint_path).exists() else None
    if state is not None and state.get("call") != settings.CALL_ID.raw():
        # a checkpoint of another call of this stage (another config, code or input): never resume it
        logger.info("[%s] %s was written by another call of this stage: training from step 0", stage,
                    checkpoint_path)
        state = None
    if state is None:
        return {}, 0
    check_checkpoint_model(state, cfg.model, checkpoint_path, stage)
    if cfg.parallel is None and state.get("strategy", cfg.strategy) != cfg.strategy:
        raise ConfigError(f"stage {stage!r}: strategy={cfg.strategy!r} but checkpoint {checkpoint_path} was "
                          f"written with strategy={state['strategy']!r}: resume with the strategy it was "
                          f"trained with")
    ckpt.restore(state, run.model, run.opt)
    run.history.resume(before_step=state["step"])
    logger.info("[%s] resumed from the checkpoint of step %d (%s)", stage, state["step"], checkpoint_path)
    return state, state["step"]


def _snapshots(run: _Training) -> Any:
    """The stage's state kept in node memory (``core.snapshot``): model, optimizer, RNG and scaler; one copy
    serves every rank where the layout only replicates (ddp, none)."""
    import torch

    def state() -> dict[str, Any]:
        run.history.sync()  # (collective) the history on disk covers every step the state does
        run.history.flush()
        kept = {"model": run.model.state_dict(), "opt": run.opt.state_dict(), "rng": torch.get_rng_state()}
        if run.device.type == "cuda":
            kept["device_rng"] = torch.cuda.get_rng_state(run.device)
        return {**kept, "scaler": run.scaler.state_dict()} if run.scaler is not None else kept

    def load(kept: dict[str, Any]) -> None:
        for name, target in run.model.state_dict().items():
            (target.to_local() if hasattr(target, "to_local") else target).copy_(kept["model"][name])
        run.opt.load_state_dict(_optimizer_state(run.opt, kept["opt"]))
        torch.set_rng_state(kept["rng"])
        if "device_rng" in kept:
            torch.cuda.set_rng_state(kept["device_rng"], run.device)
        if run.scaler is not None:
            run.scaler.load_state_dict(kept["scaler"])

    cfg = run.cfg
    return Snapshots(state, load, replicated=cfg.parallel is None and cfg.strategy in ("none", "ddp"),
                     every=cfg.snapshot_every, enabled=cfg.snapshot_every != 0)


def _optimizer_state(opt: Any, kept: dict[str, Any]) -> dict[str, Any]:
    """A kept optimizer state as the optimizer takes it: a sharded parameter's state as its shard (kept as
    this rank's part), the rest as it is."""
    params = [p for group in opt.param_groups for p in group["params"]]
    for index, entries in kept["state"].items():
        param = params[index]
        if not hasattr(param, "device_mesh"):
            continue
        from torch.distributed.tensor import DTensor

        for key, value in entries.items():
            if getattr(value, "dim", lambda: 0)() > 0:
                entries[key] = DTensor.from_local(value.to(param.to_local().device), param.device_mesh,
                                                  param.placements, run_check=False, shape=param.shape,
                                                  stride=param.stride())
    return kept


def _steps(run: _Training, start: int, checkpoint_path: Any) -> tuple[Any, float | None, int | None]:
    """Steps ``start`` to the end, with their checkpoints; (the last step's loss, the first step's
    time where it compiled, the step where a sweep's cut stopped it or None)."""
    import torch

    from .data import batch

    cfg, world = run.cfg, get_world_size()
    layout = cfg.parallel or from_strategy(cfg.strategy, world, cfg.tp_size)
    coords = layout.coords(get_rank(), world)
    if layout.pp > 1 and cfg.data.batch_size % (coords.dp_size * layout.microbatches):  # (the CLI's; with fewer nodes)
        check_world(cfg, world, env_topology().local_world_size)
    loss, compile_s = torch.tensor(float("nan")), None
    if start and start < cfg.steps:  # resumed: DDP sums the first step's gradients as the run it continues did
        settling = time.perf_counter()
        if _settle(run, batch(cfg.data, cfg.model, start, coords.dp, coords.dp_size).to(run.device)) and cfg.compile:
            compile_s = time.perf_counter() - settling  # (its pass compiled: the first step's time is a step's)
    faults.install(run.model, get_rank(), start)  # (the resilience tests' PARSL_TORCH_FAULT: from the loop's steps)
    reads = _Reads(time.perf_counter(), start)
    for step in range(start, cfg.steps):
        tokens = batch(cfg.data, cfg.model, step, coords.dp, coords.dp_size).to(run.device)
        loss = _step(run, tokens[:, :-1], tokens[:, 1:])
        # this rank's share of the step's tokens; a pipeline's bubble is time without useful FLOPs
        dt = _record(run, step, loss, reads, tokens[:, :-1].numel() * coords.dp_size // world,
                     step in (start, cfg.steps - 1) or step % cfg.log_every == 0)  # (a line logged shows the loss)
        if cfg.compile and compile_s is None:
            compile_s = dt  # the first step compiles: its time is kept apart, in the result
        saving = time.perf_counter()
        if run.snapshots.due(step):
            run.snapshots.keep(step)
        if _checkpoint_if_due(run, step, loss, checkpoint_path):
            return loss, compile_s, step + 1
        reads.since += time.perf_counter() - saving  # (a checkpoint's time is not a step's)
    return loss, compile_s, None


def _settle(run: _Training, tokens: Any) -> bool:
    """A resumed DDP's buckets laid out as the run it continues had them (``core.wrap.settle_buckets``)."""
    from ..core.wrap import settle_buckets

    return settle_buckets(run.model, lambda: _loss_fn(run.cfg.model)(run.forward(tokens[:, :-1]), tokens[:, 1:]).backward())


@dataclass
class _Reads:
    """The steps since the last read of the loss: when they started, and the first of them."""

    since: float
    first: int


def _record(run: _Training, step: int, loss: Any, reads: _Reads, share: int, must_read: bool) -> float | None:
    """The step into the history: between reads, its loss as a tensor (read later: no wait for the device)
    and lr; at a read (``read_every``, and ``must_read``), everything, with dt, tokens/s and MFU as the
    means over the steps since the last read (after ``.item()`` their work on the device is done). Its dt."""
    cfg = run.cfg
    if step % run.history.read_every and not must_read:
        run.history.update({"loss": loss.detach(), "lr": cfg.lr}, step=step)
        return None
    value = loss.item()
    dt = (time.perf_counter() - reads.since) / (step + 1 - reads.first)
    reads.since, reads.first = time.perf_counter(), step + 1
    line = run.history.update({"loss": value, "lr": cfg.lr, "dt": dt, **throughput(
        share, dt, run.per_token, run.peak, get_world_size())}, step=step)
    if step % cfg.log_every == 0:
        get_logger(__name__).info("[%s] %s", run.stage, line)
    return dt


def _step(run: _Training, inputs: Any, targets: Any) -> Any:
    """One optimizer step on this rank's batch; its loss."""
    from ..core.parallelize import sequence_shards

    if hasattr(run.model, "step"):  # pipelined: the schedule runs forward and backward over microbatches
        run.opt.zero_grad(set_to_none=True)
        loss = run.model.step(inputs, targets)
        run.opt.step()
        return loss
    with sequence_shards(run.model, inputs, targets) as positions:  # (None without context parallel)
        extra = {"positions": positions} if positions is not None else {}
        loss = _loss_fn(run.cfg.model)(run.forward(inputs, **extra), targets)
        _update(run, loss)
    return loss


def _loss_fn(model: ModelConfig) -> Any:
    import torch.nn.functional as F

    def loss_fn(logits: Any, targets: Any) -> Any:
        return F.cross_entropy(logits.reshape(-1, model.vocab_size).float(), targets.reshape(-1))

    return loss_fn


def _update(run: _Training, loss: Any) -> None:
    run.opt.zero_grad(set_to_none=True)
    if run.scaler is None:
        loss.backward()
        run.opt.step()
    else:  # fp16: scaled gradients, a step skipped where they overflowed
        run.scaler.scale(loss).backward()
        run.scaler.step(run.opt)
        run.scaler.update()


def _checkpoint_if_due(run: _Training, step: int, loss: Any, checkpoint_path: Any) -> bool:
    """Collective: the checkpoint after ``step`` when one is due, or when the block ends (then the
    stage stops, to be continued), or when a sweep cut it (then it ends: True)."""
    from . import checkpoint as ckpt

    cfg = run.cfg
    # collective, on every rank at every step but the last: its answer is the same on all ranks
    block_ending = step + 1 < cfg.steps and should_checkpoint()
    stopping = block_ending and stop_requested()
    if block_ending or (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
        run.history.sync()  # the history on disk covers every step the checkpoint does
        run.history.flush()
        t0 = time.perf_counter()
        strategy = cfg.strategy if cfg.parallel is None else f"parallel: {cfg.parallel.describe(get_world_size())}"
        ckpt.save(checkpoint_path, run.model, run.opt, step + 1, asdict(cfg.model), settings.CALL_ID.raw(),
                  strategy, loss=_mean(loss.detach(), run.device), stopped=stopping)
        note_checkpoint(step + 1, time.perf_counter() - t0)
        run.snapshots.keep(step, again=False)  # (node memory is never older than the file: a retry resumes there)
    if stopping:
        return True
    if block_ending:
        get_logger(__name__).info("[%s] the block ends soon: checkpoint of step %d saved, to be continued in "
                                  "the next block", run.stage, step + 1)
        run.snapshots.wait()  # (written whole before the process ends: the next block resumes there)
        to_be_continued(step + 1)
    return False


def _mean(loss: Any, device: Any) -> float:
    """Collective: the loss averaged over the ranks."""
    import torch.distributed as dist

    value = loss.float().reshape(1).to(device)
    if dist.is_initialized():
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return float(value.item())


def _train_on_ranks(config: TrainConfig, outputs=()) -> dict[str, Any]:
    if len(outputs) != 2:
        raise ConfigError("stage 'train' needs outputs=[history .h5, checkpoint .pt]")
    return run_train(config, outputs[0], outputs[1])  # (checked once, where the stage was called)


# the plain function keeps its own name, so workers import it by reference
_train = distributed_app(_train_on_ranks, name=STAGE)


def train(config: Any, outputs=("train.h5", "model.pt"), **call: Any):
    """Submit the train stage: ``config`` (YAML path, mapping or TrainConfig) is
    checked here, before anything is submitted. Returns a StageFuture."""
    cfg = load_config(config, TrainConfig, call.get("stage", STAGE))
    return submit_builtin(BuiltinCall.of(STAGE, cfg, (), tuple(outputs), tuple(data_files(cfg.data)), call),
                          _train, functools.partial(check_world, cfg))


def main(argv: list[str] | None = None) -> int:
    return run_stage(argv, prog=f"python -m {__name__}", description=__doc__.splitlines()[0],
                     config_class=TrainConfig, stage=STAGE,
                     files={"--history": {"default": "train.h5"}, "--checkpoint": {"default": "model.pt"}},
                     run=lambda cfg, args: run_train(cfg, args.history, args.checkpoint))


if __name__ == "__main__":
    exit_process(main())  # a finished rank must not die in torch's exit-time destructors
