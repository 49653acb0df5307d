"""Metric values left where they are until they are read: ``History.update`` takes a tensor on its
device as it is, starts its copy to the host without waiting (``non_blocking``), and reads the
copies every ``read_every`` steps and before every sync, checkpoint, end or failure. A ``loss.item()``
per step makes every step wait for the device to finish it; this waits once per interval."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .blocks import as_float


def is_tensor(value: Any) -> bool:
    """A torch tensor (told by its methods: the history needs no torch where none is passed)."""
    return hasattr(value, "detach") and hasattr(value, "numel") and hasattr(value, "device")


class Deferred:
    """The values recorded but not read yet: each is a slot of a column (a list of floats) and the host
    copy that fills it; ``event``: recorded on the device after the last copy (all are done once it is)."""

    def __init__(self) -> None:
        self._slots: list[tuple[list[float], int, str, Any]] = []
        self._event: Any = None
        self.first_step: int | None = None

    def __bool__(self) -> bool:
        return bool(self._slots)

    @staticmethod
    def check(key: str, tensor: Any) -> None:
        if tensor.numel() != 1:
            raise ConfigError(f"metric {key!r} is a tensor of shape {tuple(tensor.shape)}, not a number: pass a "
                              f"scalar tensor (e.g. loss.detach()) or leave it out of update()")

    def add(self, key: str, tensor: Any, column: list[float], index: int, step: int) -> None:
        """``tensor``'s value will be ``column[index]`` (not recorded until it is read)."""
        value = tensor.detach()
        if value.device.type == "cpu":
            host = value.clone()  # (the caller may change its tensor in place before it is read)
        else:
            import torch

            host = value.to("cpu", non_blocking=True)
            self._event = torch.Event(device=value.device)
            self._event.record()
        self._slots.append((column, index, key, host))
        if self.first_step is None:
            self.first_step = step

    def read(self) -> None:
        """Wait for the copies (once) and put their values in their columns."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        for column, index, key, host in self._slots:
            column[index] = as_float(key, host)
        self._slots.clear()
        self.first_step = None

    @staticmethod
    def to_sinks(sinks: Any, rows: list[tuple[int, dict[str, tuple[list[float], int]]]]) -> list:
        """``rows`` (step, metric -> its column and index), their values read, to ``sinks`` in their order;
        what is left (nothing)."""
        for step, row in rows:
            sinks.log(step, {k: col[i] for k, (col, i) in row.items()})
        return []

    def read_or_lose(self) -> str | None:
        """``read``, for a failure's last record: a device that failed cannot give the values (they stay
        not recorded); what went wrong, or None."""
        try:
            self.read()
        except Exception as exc:  # noqa: BLE001 - the device's own error, whatever its kind
            self._slots.clear()
            self._event, self.first_step = None, None
            return f"{type(exc).__name__}: {exc}"
        return None
