"""The device setting's grammar: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:<i>"`` or ``"mps"``.

Torch-free, so that ``[client] device`` is checked when a config is read, on any machine.
Whether the device exists is a question for torch, answered where a trainer or evaluator is
built (``fedlink.client.torch_trainer.resolve_device``):

- ``"cpu"`` (the default): the CPU;
- ``"cuda:<i>"``: that CUDA device;
- ``"cuda"``: a CUDA device; virtual-mode training workers are spread over all visible ones,
  worker ``w`` taking device ``w mod count``;
- ``"mps"``: Apple's Metal device;
- ``"auto"``: CUDA as ``"cuda"`` says when there is one, else MPS, else the CPU.
"""

from __future__ import annotations

import re

from fedlink.errors import ConfigError

DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:<i>", "mps")
"""What a device setting may say."""

DEFAULT_DEVICE = "cpu"
"""The device when nothing is set (a run's numbers do not depend on the machine)."""

_GRAMMAR = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device(value: object, key: str = "device") -> str:
    """``value`` if it is a device setting (see the module docstring), else ``ConfigError``
    naming ``key``."""
    if not isinstance(value, str) or not _GRAMMAR.fullmatch(value):
        raise ConfigError(f"{key}: must be one of {', '.join(DEVICE_NAMES)}, got {value!r}")
    return value
