"""A model's parameters as one flat float32 vector plus a ``ParamSpec``.

``ParamSpec`` is numpy-only and imported eagerly. The torch converters (``spec_of``,
``to_vector``, ``load_vector``; see ``fedlink.params.flat``) load torch on first use, so
``from fedlink.params import ParamSpec`` works where torch must not be imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedlink.params.base import (
    BUFFER,
    COUNTER,
    FROZEN,
    KINDS,
    TRAINABLE,
    VECTOR_DTYPE,
    ParamSpec,
    default_kind,
)

if TYPE_CHECKING:
    from fedlink.params.flat import load_vector, spec_of, to_vector

__all__ = ["BUFFER", "COUNTER", "FROZEN", "KINDS", "TRAINABLE", "VECTOR_DTYPE", "ParamSpec",
           "default_kind", "load_vector", "spec_of", "to_vector"]

_TORCH_NAMES = frozenset({"load_vector", "spec_of", "to_vector"})


def __getattr__(name: str) -> Any:
    """Load the torch converters on first access."""
    if name in _TORCH_NAMES:
        return getattr(importlib.import_module("fedlink.params.flat"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
