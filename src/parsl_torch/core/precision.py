"""Training precision: one word (``fp32``, ``bf16``, ``fp16``, ``float8``) for what runs, honoured at
every world size and strategy, never dropped without a word. ``float8``: bf16, with the linear layers'
matmuls in float8 where the GPU has float8 tensor cores (``core.float8``).

* ``none`` / ``ddp`` (and any strategy on one rank, where there is nothing to shard): the model's
  forward runs under ``torch.autocast`` (parameters and optimizer state stay fp32); fp16 also needs
  a gradient scaler (``grad_scaler``).
* ``fsdp`` / ``fsdp+tp`` on several ranks: FSDP2's ``MixedPrecisionPolicy`` (parameters gathered in
  the compute dtype, gradients reduced in fp32).
* ``fp32`` on CUDA uses TF32 matmuls (as torchtitan does) unless ``tf32=False``: ~3x the speed of
  strict fp32 on an H100 for a result within fp32 training noise.

A precision the device cannot run (bf16 on a GPU without it) is a ConfigError naming the device and
what it can run. The default on GPUs is bf16 (ezpz and torchtitan train in bf16): ~5x fp32 on an
H100; fp32 on CPUs, where bf16 autocast is slower than fp32 on most processors.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError
from .float8 import check_float8

PRECISIONS = ("fp32", "bf16", "fp16", "float8")
_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8": "float8"}


def normalize_precision(value: Any, field: str = "precision") -> str | None:
    """``value`` as one of PRECISIONS (torch dtypes and their names accepted); None stays None (the device's
    default). No torch needed: configs are checked where the workflow runs."""
    if value is None:
        return None
    name = str(value).removeprefix("torch.").strip().lower()
    name = _ALIASES.get(name, name)
    if name not in PRECISIONS:
        raise ConfigError(f"{field}={value!r} is not a precision: use one of {', '.join(PRECISIONS)}")
    return name


def default_precision(device_type: str) -> str:
    """bf16 on a GPU that runs it, else fp32."""
    return "bf16" if device_type in ("cuda", "xpu") and _bf16_supported(device_type) else "fp32"


def _bf16_supported(device_type: str) -> bool:
    import torch

    backend = getattr(torch, device_type)
    check = getattr(backend, "is_bf16_supported", None)
    return bool(check()) if check is not None else True


def check_precision(precision: str, device_type: str) -> None:
    """A ConfigError when ``device_type`` cannot run ``precision``."""
    if precision == "bf16" and device_type in ("cuda", "xpu") and not _bf16_supported(device_type):
        raise ConfigError(f"precision='bf16': this {device_type} device has no bf16: use 'fp16' (with its "
                          f"gradient scaler) or 'fp32'")
    if precision != "fp32" and device_type == "mps":
        raise ConfigError(f"precision={precision!r}: parsl-torch does not run mixed precision on mps: use 'fp32'")
    if precision == "float8":
        check_float8(device_type)


def dtype_of(precision: str) -> Any:
    import torch

    # float8: the linear layers' matmuls (core.float8); everything else, and their parameters' all-gathers, in bf16
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "float8": torch.bfloat16}[precision]


def autocast_forward(model: Any, precision: str, device_type: str) -> Any:
    """``model`` whose forward runs under autocast to ``precision`` (its state dict unchanged)."""
    if precision == "fp32":
        return model
    forward = model.forward

    @functools.wraps(forward)
    def forward_in_autocast(*args: Any, **kwargs: Any) -> Any:
        with autocast(precision, device_type):
            return forward(*args, **kwargs)

    model.forward = forward_in_autocast
    return model


@contextlib.contextmanager
def autocast(precision: str, device_type: str) -> Iterator[None]:
    if precision == "fp32":
        yield
        return
    import torch

    with torch.autocast(device_type, dtype=dtype_of(precision)):
        yield


def grad_scaler(precision: str, device_type: str) -> Any:
    """fp16's gradient scaler (None otherwise): ``scaler.scale(loss).backward(); scaler.step(opt);
    scaler.update()``."""
    if precision != "fp16":
        return None
    import torch

    return torch.amp.GradScaler(device_type)


def use_tf32(device_type: str, enabled: bool = True) -> None:
    """TF32 matmuls and convolutions for fp32 on CUDA (torch leaves them off)."""
    if device_type != "cuda":
        return
    import torch

    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
