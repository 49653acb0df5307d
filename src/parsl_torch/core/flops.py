"""Training FLOPs and the accelerator's peak, for throughput and MFU without any device sync.

FLOPs per token as torchtitan counts them: ``6 N + 12 L d T``, with ``N`` the parameters
outside embeddings (forward 2N, backward 4N per token) and the attention's score and value
products (``L`` layers, width ``d``, sequence ``T``). MFU divides the achieved FLOP/s of one
device by its dense bf16 peak (torchtitan's convention, whatever the precision ran), from the
vendors' published figures below, or ``PARSL_TORCH_PEAK_TFLOPS`` where the table has none or
is wrong for a part.
"""

from __future__ import annotations

import time
from typing import Any

from ..common import settings
from .device import get_torch_device
from .ranks import get_world_size

#: dense bf16 TFLOP/s of one device as torch names it (a substring of its name), from the vendors' data
#: sheets: NVIDIA H100 SXM and H200 (989), H100 PCIe (756), H100 NVL (835.5), A100 (312); AMD MI250X (383 per GPU, 191.5
#: per GCD, the device torch sees), MI300X (1307); Intel Data Center GPU Max 1550 (839 per GPU, two
#: tiles: 419.5 per tile, the device torch sees in FLAT mode on Aurora)
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.5), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0), ("A100", 312.0),
    ("MI250X", 191.5), ("MI300X", 1307.4), ("Max 1550", 419.5),
)


def flops_per_token(model: Any, n_layers: int = 0, dim: int = 0, seq_len: int = 0) -> float:
    """``6 N + 12 L d T`` for ``model`` (a torch module; ``N`` leaves out its embeddings)."""
    import torch

    embedding = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters())
    total = sum(p.numel() for p in model.parameters())
    return 6.0 * (total - embedding) + 12.0 * n_layers * dim * seq_len


def peak_flops(device: Any) -> float | None:
    """The device's dense bf16 peak in FLOP/s: ``PARSL_TORCH_PEAK_TFLOPS``, else the table; None for a CPU
    or a part the table does not know (no MFU is recorded then)."""
    given = settings.PEAK_TFLOPS.get()
    if given is not None:
        return given * 1e12
    if getattr(device, "type", device) not in ("cuda", "xpu"):
        return None
    import torch

    name = getattr(torch, device.type).get_device_name(device)
    return next((tflops * 1e12 for part, tflops in PEAK_BF16_TFLOPS if part in name), None)


def throughput(tokens: int, seconds: float, flops_per_token_: float, peak: float | None,
               devices: int = 1) -> dict[str, float]:
    """A step's ``tokens_per_s`` (all ``devices``), ``tflops`` (per device) and ``mfu`` (where the peak is
    known): ``tokens`` is what one device processed in ``seconds``."""
    if seconds <= 0:
        return {}
    achieved = flops_per_token_ * tokens / seconds
    out = {"tokens_per_s": tokens * devices / seconds, "tflops": achieved / 1e12}
    if peak:
        out["mfu"] = achieved / peak
    return out


class Throughput:
    """Tokens/s, TFLOP/s and MFU of your own training loop, as the built-in train stage records them.

    ``model``: the model before ``wrap_model`` (its parameters, embeddings left out, give ``6 N``
    FLOPs per token); ``n_layers``, ``dim``, ``seq_len``: a Transformer's, for the attention's
    ``12 L d T`` (leave them 0 for other models). The peak is this rank's device's
    (``PARSL_TORCH_PEAK_TFLOPS`` overrides the table; no MFU on a CPU). ``step(tokens)`` after each
    optimizer step, with the tokens this rank processed in it, returns the figures since the
    previous call ({} on the first, which has no interval yet), ready for ``History.update``.
    It times with the host's clock and makes no device sync: on a GPU the figures are right
    once the loop waits for the device somewhere each step (a ``loss.item()`` does)."""

    def __init__(self, model: Any, *, n_layers: int = 0, dim: int = 0, seq_len: int = 0,
                 device: Any = None) -> None:
        self.flops_per_token = flops_per_token(model, n_layers, dim, seq_len)
        self.peak = peak_flops(device if device is not None else get_torch_device())
        self.devices = get_world_size()
        self._last: float | None = None

    def step(self, tokens: int, seconds: float | None = None) -> dict[str, float]:
        """``tokens_per_s`` (all ranks), ``tflops`` (per device) and ``mfu`` of the step that just ended:
        over ``seconds`` if given, else since the previous call."""
        now = time.perf_counter()
        last, self._last = self._last, now
        if seconds is None:
            if last is None:
                return {}
            seconds = now - last
        return throughput(tokens, seconds, self.flops_per_token, self.peak, self.devices)
