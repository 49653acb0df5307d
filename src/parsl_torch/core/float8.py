"""float8 training of a model's linear layers (torchao's ``Float8Linear``, tensorwise scaling), as
torchtitan does it: the matmuls of the eligible ``nn.Linear`` layers run in float8 on GPUs that have
float8 tensor cores (NVIDIA compute capability 8.9 or newer: L4, L40S, H100, H200, B200); everything
else runs in bf16. The layers keep their parameters (fp32, or FSDP2's bf16), so a checkpoint is an
ordinary state dict that loads into the model without float8 (an evaluation in bf16).

Eligible: both dimensions divisible by 16 (float8 matmuls need it), and not the model's output layer
(the last ``nn.Linear`` it registers: torchtitan keeps its ``output`` in bf16, where float8 costs
accuracy). Converted before wrapping, so FSDP2, TP and compile see the float8 layers."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

#: float8 matmuls need both dimensions divisible by this
ALIGN = 16
#: NVIDIA's first compute capability with float8 tensor cores (Ada, Hopper)
MIN_CAPABILITY = (8, 9)


def check_float8(device_type: str) -> None:
    """A ConfigError unless this rank's device trains in float8 (an NVIDIA GPU of capability 8.9+)."""
    fix = "use precision 'bf16'"
    if device_type != "cuda":
        raise ConfigError(f"precision='float8' needs an NVIDIA GPU of compute capability "
                          f"{'.'.join(map(str, MIN_CAPABILITY))} or newer (H100, H200, L40S...); this rank runs on "
                          f"{device_type}: {fix}")
    import torch

    name, capability = torch.cuda.get_device_name(), torch.cuda.get_device_capability()
    if torch.version.hip or tuple(capability) < MIN_CAPABILITY:
        raise ConfigError(f"precision='float8' needs an NVIDIA GPU of compute capability "
                          f"{'.'.join(map(str, MIN_CAPABILITY))} or newer; this rank's {name} "
                          f"({'ROCm' if torch.version.hip else 'compute capability ' + '.'.join(map(str, capability))})"
                          f" has no float8 tensor cores: {fix}")


def float8_layers(model: Any) -> list[str]:
    """The names of the ``nn.Linear`` layers of ``model`` that float8 trains (module docstring)."""
    from torch import nn

    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    return [name for name, m in linears[:-1] if m.in_features % ALIGN == 0 and m.out_features % ALIGN == 0]


def to_float8(model: Any) -> Any:
    """``model`` with its eligible linear layers swapped, in place, for torchao's Float8Linear."""
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError:
        raise ConfigError("precision='float8' needs torchao: pip install 'parsl-torch[float8]'") from None
    eligible = set(float8_layers(model))
    if not eligible:
        raise ConfigError(f"precision='float8': {type(model).__name__} has no linear layer (but its output layer) "
                          f"with both dimensions divisible by {ALIGN}, so float8 would change nothing: use 'bf16'")
    convert_to_float8_training(model, module_filter_fn=lambda module, name: name in eligible)
    return model
