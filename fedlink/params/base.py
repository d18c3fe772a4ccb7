"""``ParamSpec``: the layout of a model's parameters inside one flat float32 vector.

This module is numpy-only, so code that must not import torch (the coordinator, aggregation,
compression) can hold, compare, persist and validate specs and slice vectors by parameter.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedlink.errors import ConfigError

VECTOR_DTYPE = np.dtype(np.float32)
"""The dtype of every parameter vector."""

TRAINABLE = "trainable"
"""A weight that local training changes (``requires_grad=True``): stepped by the server
optimizer, clipped and noised by privacy, compressed, screened by robust rules."""
FROZEN = "frozen"
"""A weight that local training leaves alone (``requires_grad=False``): averaged, never
stepped."""
BUFFER = "buffer"
"""A floating-point buffer (BatchNorm's ``running_mean``/``running_var``): the plain mean of
the round's client values, never stepped by momentum or an adaptive optimizer."""
COUNTER = "counter"
"""An integer buffer (BatchNorm's ``num_batches_tracked``): averaged, rounded on load."""
KINDS = (TRAINABLE, FROZEN, BUFFER, COUNTER)
"""Every kind a tensor of a ``ParamSpec`` may have."""


def default_kind(dtype: str) -> str:
    """The kind a tensor of ``dtype`` has when nothing else is known: integers are counters,
    everything else a trainable weight (the rule for specs that predate kinds)."""
    return COUNTER if np.issubdtype(np.dtype(dtype), np.integer) else TRAINABLE


@dataclass(frozen=True)
class ParamSpec:
    """Names, shapes and dtypes of a model's parameters, in the order they sit in the vector.

    Parameter ``i`` occupies ``vector[offsets[i] : offsets[i] + numels[i]]`` and is laid out in
    C (row-major) order. ``dtypes`` are the parameters' own dtype names (``"float32"``,
    ``"float16"``, ...); the vector itself is always float32.

    ``kinds`` says what each tensor is (``TRAINABLE``, ``FROZEN``, ``BUFFER``, ``COUNTER``;
    see ``docs/model-state.md`` for what each kind gets in a flush). When it is left empty
    every tensor takes ``default_kind`` of its dtype (integers are counters, the rest
    trainable), which is what a spec written before kinds existed means.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    kinds: tuple[str, ...] = ()
    numels: tuple[int, ...] = field(init=False, repr=False)
    offsets: tuple[int, ...] = field(init=False, repr=False)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        names, shapes, dtypes = tuple(self.names), tuple(self.shapes), tuple(self.dtypes)
        shapes = tuple(tuple(int(d) for d in shape) for shape in shapes)
        if not len(names) == len(shapes) == len(dtypes):
            raise ConfigError(
                f"ParamSpec: names, shapes and dtypes differ in length "
                f"({len(names)}, {len(shapes)}, {len(dtypes)})"
            )
        if len(set(names)) != len(names):
            raise ConfigError(f"ParamSpec: duplicate parameter names in {names}")
        if any(d < 0 for shape in shapes for d in shape):
            raise ConfigError(f"ParamSpec: negative dimension in shapes {shapes}")
        kinds = _checked_kinds(tuple(self.kinds), dtypes)
        numels = tuple(math.prod(shape) for shape in shapes)
        offsets = tuple(itertools.accumulate(numels[:-1], initial=0)) if numels else ()
        for attr, value in (("names", names), ("shapes", shapes), ("dtypes", dtypes),
                            ("kinds", kinds), ("numels", numels), ("offsets", offsets),
                            ("size", sum(numels))):
            object.__setattr__(self, attr, value)

    def __len__(self) -> int:
        """Number of parameters (tensors, not scalars; ``size`` counts scalars)."""
        return len(self.names)

    def check(self, vector: np.ndarray) -> np.ndarray:
        """``vector`` as a 1-D C-contiguous float32 array of ``size`` elements.

        Accepts any real floating dtype (cast to float32, copying only when needed). Raises
        ``ConfigError`` naming the expected and actual length when the shape does not fit.
        """
        array = np.asarray(vector)
        if array.ndim != 1:
            raise ConfigError(f"parameter vector must be 1-D, got shape {array.shape}")
        if not np.issubdtype(array.dtype, np.floating):
            raise ConfigError(f"parameter vector must be floating point, got {array.dtype}")
        if array.shape[0] != self.size:
            raise ConfigError(
                f"parameter vector has {array.shape[0]} elements, the model has {self.size} "
                f"({len(self)} tensors)"
            )
        return np.ascontiguousarray(array, dtype=VECTOR_DTYPE)

    def unflatten(self, vector: np.ndarray) -> dict[str, np.ndarray]:
        """Per-parameter views of ``vector`` (no copy when it is already float32), by name."""
        flat = self.check(vector)
        return {
            name: flat[offset : offset + numel].reshape(shape)
            for name, shape, offset, numel in zip(
                self.names, self.shapes, self.offsets, self.numels, strict=True
            )
        }

    def same_layout(self, other: ParamSpec) -> bool:
        """Whether ``other`` lays out the same tensors (names, shapes, dtypes; kinds aside)."""
        return (self.names, self.shapes, self.dtypes) == (other.names, other.shapes,
                                                          other.dtypes)

    def mask(self, *kinds: str) -> np.ndarray:
        """A boolean array over the vector: True where the element's tensor is of ``kinds``."""
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise ConfigError(f"unknown parameter kinds {unknown}; known: {list(KINDS)}")
        out = np.zeros(self.size, dtype=bool)
        for kind, offset, numel in zip(self.kinds, self.offsets, self.numels, strict=True):
            if kind in kinds:
                out[offset : offset + numel] = True
        return out

    @property
    def all_trainable(self) -> bool:
        """Whether every tensor is a trainable weight (nothing to treat apart)."""
        return all(kind == TRAINABLE for kind in self.kinds)

    def trainable_mask(self) -> np.ndarray | None:
        """``mask(TRAINABLE)``, or ``None`` when every element is trainable (no work to do)."""
        return None if self.all_trainable else self.mask(TRAINABLE)

    def names_of(self, *kinds: str) -> tuple[str, ...]:
        """The names of the tensors of ``kinds``, in vector order."""
        return tuple(n for n, k in zip(self.names, self.kinds, strict=True) if k in kinds)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly description (``from_dict`` reads it back)."""
        return {
            "names": list(self.names),
            "shapes": [list(shape) for shape in self.shapes],
            "dtypes": list(self.dtypes),
            "kinds": list(self.kinds),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParamSpec:
        """The spec that ``to_dict`` described (``ConfigError`` when a key is missing)."""
        missing = sorted({"names", "shapes", "dtypes"} - set(data))
        if missing:
            raise ConfigError(f"ParamSpec description lacks {missing}")
        shapes: Sequence[Sequence[int]] = data["shapes"]
        return cls(
            names=tuple(data["names"]),
            shapes=tuple(tuple(shape) for shape in shapes),
            dtypes=tuple(data["dtypes"]),
            kinds=tuple(data.get("kinds", ())),
        )


def _checked_kinds(kinds: tuple[str, ...], dtypes: tuple[str, ...]) -> tuple[str, ...]:
    """``kinds`` validated, or each dtype's ``default_kind`` when ``kinds`` is empty."""
    if not kinds:
        return tuple(default_kind(dtype) for dtype in dtypes)
    if len(kinds) != len(dtypes):
        raise ConfigError(f"ParamSpec: {len(kinds)} kinds for {len(dtypes)} tensors")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ConfigError(f"ParamSpec: unknown kinds {unknown}; known: {list(KINDS)}")
    return kinds
