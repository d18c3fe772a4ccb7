"""torch module (or named tensors) <-> one flat float32 numpy vector.

Which tensors are in the vector
    For an ``nn.Module``: its **trainable** parameters (``requires_grad=True``) and its
    persistent **buffers** (BatchNorm's ``running_mean``, ``running_var`` and
    ``num_batches_tracked``, ...), in ``state_dict()`` order. That order is the registration
    order, stable across processes for the same model code; shared (tied) tensors appear once,
    under their first name. Buffers travel because a model is its state, not just its weights:
    a BatchNorm network whose running statistics stayed at their initial values would be
    evaluated (and served) silently wrong. Frozen parameters are left out: they never change in
    local training, so every client keeps its own copy (build models from the same seed so the
    copies agree). Non-persistent buffers are not part of a model's state and are left out too.

    For a mapping of names to tensors (for example ``model.state_dict()``): every entry, in the
    mapping's order.

Kinds
    The spec records each tensor's kind (``fedlink.params.base``): a module's parameters are
    ``trainable``, its floating-point buffers ``buffer`` (running statistics) and its integer
    buffers ``counter``. In a mapping an ``nn.Parameter`` is ``trainable`` (``frozen`` when it
    does not require grad) and a plain tensor takes its dtype's default (integers ``counter``,
    the rest ``trainable``): ``model.state_dict()`` has lost which tensors were buffers, so
    build specs from the module itself (or ``state_dict(keep_vars=True)``, whose buffers are
    still told apart from parameters only by name; the module is the reliable source).

dtypes
    Floating-point tensors (float16, bfloat16, float32, float64) and integer tensors (counters
    such as ``num_batches_tracked``). Values are stored as float32: the round trip is bit-exact
    for float32, float16 and bfloat16 tensors and for integers of magnitude up to 2**24
    (averaged counters are rounded back to the nearest integer on load); float64 tensors are
    rounded to float32. Any other dtype (bool, complex) is refused: a tensor the vector cannot
    carry must not be silently left behind.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import nn

from fedlink.errors import ConfigError
from fedlink.params.base import BUFFER, COUNTER, FROZEN, TRAINABLE, ParamSpec, default_kind

ModuleOrTensors = nn.Module | Mapping[str, torch.Tensor]


EXACT_INTEGER = 2**24
"""Integers of at most this magnitude are exact in float32."""


def _module_state(module: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """Trainable parameters and persistent buffers, in ``state_dict`` order, each tensor once."""
    seen: set[int] = set()
    for name, tensor in module.state_dict(keep_vars=True).items():
        frozen = isinstance(tensor, nn.Parameter) and not tensor.requires_grad
        if frozen or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        yield name, tensor


def _carried(tensor: torch.Tensor) -> bool:
    """Whether the vector can hold ``tensor`` (floating point or integer, not bool)."""
    if tensor.is_floating_point():
        return True
    return not tensor.is_complex() and tensor.dtype != torch.bool


def _named_tensors(source: ModuleOrTensors) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs that make up the vector, validated."""
    if isinstance(source, nn.Module):
        pairs: Iterable[tuple[str, torch.Tensor]] = _module_state(source)
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
        if not _carried(tensor):
            raise ConfigError(
                f"{name!r} has dtype {tensor.dtype}; a parameter vector carries floating-point "
                f"and integer tensors only, so this model's state cannot be exchanged (make "
                f"it a non-persistent buffer if it need not travel)"
            )
    return named


def _as_float32(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` flattened to float32 on CPU; integers beyond 2**24 are refused (inexact)."""
    flat = tensor.detach().reshape(-1).to(device="cpu")
    if not tensor.is_floating_point() and flat.numel() and int(flat.abs().max()) > EXACT_INTEGER:
        raise ConfigError(
            f"{name!r} holds integers beyond {EXACT_INTEGER}, which a float32 vector cannot "
            f"carry exactly"
        )
    return flat.to(dtype=torch.float32)


def _dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def _kind(tensor: torch.Tensor, module_buffer: bool) -> str:
    """The kind of one tensor: a parameter by ``requires_grad``, a buffer by its dtype."""
    if isinstance(tensor, nn.Parameter):
        return TRAINABLE if tensor.requires_grad else FROZEN
    if module_buffer:
        return BUFFER if tensor.is_floating_point() else COUNTER
    return default_kind(_dtype_name(tensor.dtype))


def _spec(named: list[tuple[str, torch.Tensor]], from_module: bool = True) -> ParamSpec:
    """The spec of validated (name, tensor) pairs (``from_module``: a tensor that is not an
    ``nn.Parameter`` is known to be a buffer)."""
    return ParamSpec(
        names=tuple(name for name, _ in named),
        shapes=tuple(tuple(t.shape) for _, t in named),
        dtypes=tuple(_dtype_name(t.dtype) for _, t in named),
        kinds=tuple(_kind(t, from_module) for _, t in named),
    )


def spec_of(source: ModuleOrTensors) -> ParamSpec:
    """The ``ParamSpec`` of a module's trainable parameters and buffers (or of a mapping),
    each tensor's kind recorded (see the module docstring)."""
    return _spec(_named_tensors(source), from_module=isinstance(source, nn.Module))


def to_vector(source: ModuleOrTensors) -> np.ndarray:
    """The parameters as a new, C-contiguous float32 vector (a copy, never a view)."""
    named = _named_tensors(source)
    if not named:
        return np.zeros(0, dtype=np.float32)
    with torch.no_grad():
        parts = [_as_float32(name, t) for name, t in named]
        flat = torch.cat(parts)
    return flat.numpy()


def load_vector(module: nn.Module, vector: np.ndarray, spec: ParamSpec | None = None) -> None:
    """Write ``vector`` into ``module``'s trainable parameters and buffers, in place.

    ``vector`` (any real floating dtype, 1-D) is left untouched and the module keeps no
    reference to it. When ``spec`` is given it must describe ``module`` (same names, shapes and
    dtypes), which catches a vector meant for another architecture even when the lengths happen
    to agree. Raises ``ConfigError`` when the vector's length or the spec does not match.
    """
    named = _named_tensors(module)
    actual = _spec(named)
    if spec is not None and not spec.same_layout(actual):
        raise ConfigError(
            f"spec does not describe this module: expected {spec}, module has {actual}"
        )
    flat = actual.check(vector)
    if not flat.flags.writeable:
        flat = flat.copy()  # torch.from_numpy refuses read-only memory
    source = torch.from_numpy(flat)
    with torch.no_grad():
        for (_, tensor), offset, numel in zip(named, actual.offsets, actual.numels, strict=True):
            part = source[offset : offset + numel].view(tensor.shape)
            # An averaged counter is fractional; round it rather than truncate.
            tensor.copy_(part if tensor.is_floating_point() else part.round())


def _layout_key(module: nn.Module) -> tuple[tuple[object, ...], ...]:
    """What a ``BoundVector`` of ``module`` depends on: each parameter's and buffer's identity,
    shape, dtype, ``requires_grad`` and device. (A cached ``BoundVector`` holds its tensors, so
    their ids cannot be reused by other tensors while it is cached.)"""
    return tuple([(id(t), t.shape, t.dtype, t.requires_grad, t.device)
                  for t in _all_tensors(module)])


def _all_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of ``module`` and its submodules (each module once).

    The same tensors as ``parameters()`` and ``buffers()``, read from each module's own
    ``_parameters`` and ``_buffers`` without building the dotted names those walks make: this
    walk runs once per simulated task, where the names cost more than the check (a list, not
    a generator: a generator's frame per module cost about as much as the walk).
    """
    seen: set[int] = set()
    stack = [module]
    found: list[torch.Tensor] = []
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        found.extend([t for t in current._parameters.values() if t is not None])
        found.extend([t for t in current._buffers.values() if t is not None])
        stack.extend([m for m in current._modules.values() if m is not None])
    return found


class BoundVector:
    """A module's vector tensors, found and checked once: ``load`` and ``read`` as
    ``load_vector`` and ``to_vector`` do, without walking the module each time.

    For a trainer that loads and reads the same module once per task (a simulation builds one
    per task): the module's tensors must stay the same objects (in-place updates, as
    optimizers make, are fine). ``trainable`` lists the module's parameters that require grad
    (in ``parameters()`` order) and ``devices`` the devices its tensors are on, as they were
    when it was bound.

    ``load`` and ``read`` go through one float32 staging vector on the CPU, cut into a view per
    tensor once, so a task's load or read is a copy per tensor and no slicing; once the
    module's owner lets the binding ``adopt`` its tensors, one copy in all.
    """

    def __init__(self, module: nn.Module) -> None:
        named = _named_tensors(module)
        self.spec = _spec(named)
        self._tensors = [tensor for _, tensor in named]
        self.trainable = [p for p in module.parameters() if p.requires_grad]
        self.devices = frozenset(t.device for t in (*module.parameters(), *module.buffers()))
        self._staging = torch.empty(self.spec.size, dtype=torch.float32)
        self._staging_array = self._staging.numpy()  # the same memory, as numpy sees it
        self._parts = [self._staging[offset : offset + numel].view(tensor.shape)
                       for tensor, offset, numel in zip(self._tensors, self.spec.offsets,
                                                        self.spec.numels, strict=True)]
        self._adopted = False

    def adopt(self) -> bool:
        """Make the module's tensors views of the staging vector, when all are float32 on the
        CPU; whether they now are.

        Each tensor stays the same object with the same values (its ``.data`` is moved into
        the staging vector), so ``load`` is one copy into the module and ``read`` one copy out
        of it, not a copy per tensor: a six-tensor MLP's load and read cost more than a step
        of its training. Only for the module's owner (``WorkingModelTrainers``: a simulation's
        working module), since the tensors then share one block of memory.
        """
        # tensors that share memory (one a view of another) keep it: moving one would not
        storages = {t.untyped_storage().data_ptr() for t in self._tensors}
        if not self._adopted and len(storages) == len(self._tensors) and all(
                t.dtype == torch.float32 and t.device.type == "cpu" for t in self._tensors):
            with torch.no_grad():
                for tensor, part in zip(self._tensors, self._parts, strict=True):
                    part.copy_(tensor)
                    tensor.data = part
            self._adopted = True
        return self._adopted

    @classmethod
    def of(cls, module: nn.Module) -> BoundVector:
        """``module``'s ``BoundVector``, found once and reused while the module's tensors are
        the same objects with the same shape, dtype, ``requires_grad`` and device (a
        simulation builds a trainer per task on one working module; finding and checking its
        tensors cost more than a small task's training)."""
        key = _layout_key(module)
        cached = _BOUND.get(module)
        if cached is not None and cached[0] == key:
            return cached[1]
        bound = cls(module)
        _BOUND[module] = (key, bound)
        return bound

    def load(self, vector: np.ndarray) -> None:
        """Write ``vector`` into the tensors (``ConfigError`` when its length is wrong)."""
        # copied into the staging vector: a read-only vector needs no copy of its own
        np.copyto(self._staging_array, self.spec.check(vector))
        if self._adopted:
            return  # the tensors are views of the staging vector
        with torch.no_grad():
            for tensor, part in zip(self._tensors, self._parts, strict=True):
                tensor.copy_(part if tensor.is_floating_point() else part.round())

    def read(self) -> np.ndarray:
        """The tensors as a new float32 vector."""
        if self._adopted:
            return self._staging_array.copy()
        with torch.no_grad():
            for name, tensor, part in zip(self.spec.names, self._tensors, self._parts,
                                          strict=True):
                part.copy_(tensor if tensor.is_floating_point()
                           else _as_float32(name, tensor).view(part.shape))
        return self._staging_array.copy()


_BOUND: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[tuple[object, ...], ...], BoundVector]] = (
    weakref.WeakKeyDictionary())
"""Each working module's ``BoundVector`` and the layout it was found for (``BoundVector.of``);
an entry goes with its module."""
