"""Exact model deltas for downloads: what turns the version a client holds into the new one.

``xor-zlib`` XORs the float32 bit patterns of the two versions and deflates the result. It is
lossless (the client rebuilds the new version bit for bit, which an arithmetic ``new - old``
in float32 cannot promise), and it is smaller than the model because weights that moved a
little keep their sign, exponent and leading mantissa bits, which XOR to runs of zeros.
"""

from __future__ import annotations

import zlib

import numpy as np

from fedlink.errors import InvalidArgument

DELTA_ENCODING = "xor-zlib"
_BITS = np.dtype("<u4")
_LEVEL = 1  # fast: the coordinator makes one delta per (held version, new version) pair


def _bits(vector: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vector, dtype=np.dtype("<f4")).reshape(-1).view(_BITS)


def encode_delta(old: np.ndarray, new: np.ndarray) -> bytes:
    """The ``xor-zlib`` delta from ``old`` to ``new`` (same length, float32)."""
    if old.size != new.size:
        raise ValueError(f"delta needs equal lengths, got {old.size} and {new.size}")
    return zlib.compress((_bits(old) ^ _bits(new)).tobytes(), _LEVEL)


def apply_delta(old: np.ndarray, data: bytes) -> np.ndarray:
    """``new`` from ``old`` and its ``xor-zlib`` delta (``InvalidArgument`` if malformed)."""
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        raise InvalidArgument(f"malformed {DELTA_ENCODING} delta: {exc}") from exc
    if len(raw) != old.size * _BITS.itemsize:
        raise InvalidArgument(f"{DELTA_ENCODING} delta holds {len(raw) // 4} values, "
                              f"the model has {old.size}")
    return (_bits(old) ^ np.frombuffer(raw, dtype=_BITS)).view(np.float32).copy()
