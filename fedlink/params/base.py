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


@dataclass(frozen=True)
class ParamSpec:
    """Names, shapes and dtypes of a model's parameters, in the order they sit in the vector.

    Parameter ``i`` occupies ``vector[offsets[i] : offsets[i] + numels[i]]`` and is laid out in
    C (row-major) order. ``dtypes`` are the parameters' own dtype names (``"float32"``,
    ``"float16"``, ...); the vector itself is always float32.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
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
        numels = tuple(math.prod(shape) for shape in shapes)
        offsets = tuple(itertools.accumulate(numels[:-1], initial=0)) if numels else ()
        for attr, value in (("names", names), ("shapes", shapes), ("dtypes", dtypes),
                            ("numels", numels), ("offsets", offsets), ("size", sum(numels))):
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly description (``from_dict`` reads it back)."""
        return {
            "names": list(self.names),
            "shapes": [list(shape) for shape in self.shapes],
            "dtypes": list(self.dtypes),
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
        )
