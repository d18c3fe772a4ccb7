"""torch module (or named tensors) <-> one flat float32 numpy vector.

Which tensors are in the vector
    For an ``nn.Module``: its **trainable** parameters (``requires_grad=True``) in
    ``named_parameters()`` order. That order is the registration order, stable across processes
    for the same model code; shared (tied) parameters appear once, under their first name.
    Frozen parameters are left out: they never change in local training, so every client keeps
    its own copy (build models from the same seed so the copies agree). Buffers (BatchNorm
    running statistics, ...) are out of scope: they are not parameters and are neither read nor
    written.

    For a mapping of names to tensors (for example ``dict(model.named_parameters())``): every
    entry, in the mapping's order. A ``state_dict()`` also holds buffers; pass it only for models
    without buffers.

dtypes
    Floating-point tensors only (float16, bfloat16, float32, float64). Values are stored as
    float32: the round trip is bit-exact for float32, float16 and bfloat16 parameters; float64
    parameters are rounded to float32.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import nn

from fedlink.errors import ConfigError
from fedlink.params.base import ParamSpec

ModuleOrTensors = nn.Module | Mapping[str, torch.Tensor]


def _named_tensors(source: ModuleOrTensors) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs that make up the vector, validated."""
    if isinstance(source, nn.Module):
        pairs: Iterable[tuple[str, torch.Tensor]] = (
            (name, p) for name, p in source.named_parameters() if p.requires_grad
        )
    elif isinstance(source, Mapping):
        pairs = source.items()
    else:
        raise ConfigError(
            f"expected an nn.Module or a mapping of names to tensors, got {type(source).__name__}"
        )
    named = list(pairs)
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            raise ConfigError(f"{name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if not tensor.is_floating_point():
            raise ConfigError(
                f"{name!r} has dtype {tensor.dtype}; only floating-point tensors fit a "
                f"parameter vector (buffers such as BatchNorm counters are out of scope: "
                f"pass dict(model.named_parameters()))"
            )
    return named


def _dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def _spec(named: list[tuple[str, torch.Tensor]]) -> ParamSpec:
    """The spec of validated (name, tensor) pairs."""
    return ParamSpec(
        names=tuple(name for name, _ in named),
        shapes=tuple(tuple(t.shape) for _, t in named),
        dtypes=tuple(_dtype_name(t.dtype) for _, t in named),
    )


def spec_of(source: ModuleOrTensors) -> ParamSpec:
    """The ``ParamSpec`` of a module's trainable parameters (or of a mapping of tensors)."""
    return _spec(_named_tensors(source))


def to_vector(source: ModuleOrTensors) -> np.ndarray:
    """The parameters as a new, C-contiguous float32 vector (a copy, never a view)."""
    named = _named_tensors(source)
    if not named:
        return np.zeros(0, dtype=np.float32)
    with torch.no_grad():
        parts = [t.detach().reshape(-1).to(device="cpu", dtype=torch.float32) for _, t in named]
        flat = torch.cat(parts)
    return flat.numpy()


def load_vector(module: nn.Module, vector: np.ndarray, spec: ParamSpec | None = None) -> None:
    """Write ``vector`` into ``module``'s trainable parameters, in place.

    ``vector`` (any real floating dtype, 1-D) is left untouched and the module keeps no
    reference to it. When ``spec`` is given it must describe ``module`` (same names, shapes and
    dtypes), which catches a vector meant for another architecture even when the lengths happen
    to agree. Raises ``ConfigError`` when the vector's length or the spec does not match.
    """
    named = _named_tensors(module)
    actual = _spec(named)
    if spec is not None and spec != actual:
        raise ConfigError(
            f"spec does not describe this module: expected {spec}, module has {actual}"
        )
    flat = actual.check(vector)
    if not flat.flags.writeable:
        flat = flat.copy()  # torch.from_numpy refuses read-only memory
    source = torch.from_numpy(flat)
    with torch.no_grad():
        for (_, param), offset, numel in zip(named, actual.offsets, actual.numels, strict=True):
            param.copy_(source[offset : offset + numel].view_as(param))
