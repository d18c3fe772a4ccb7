"""Lossless codecs that send every value."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedlink.compress.base import CODECS, Codec, Encoded
from fedlink.errors import InvalidArgument

_FP32 = np.dtype("<f4")


@CODECS.register("fp32")
class Float32Codec(Codec):
    """Identity: little-endian float32, 4 bytes per value, bit-exact."""

    name = "fp32"

    def encode(self, vector: np.ndarray) -> Encoded:
        """Raw little-endian float32 bytes of ``vector``."""
        return Encoded(np.ascontiguousarray(vector, dtype=_FP32).tobytes())

    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """The float32 vector in ``data``; its length must be exactly ``4 * size`` bytes."""
        if len(data) != size * _FP32.itemsize:
            raise InvalidArgument(
                f"fp32 payload holds {len(data)} bytes, expected {size * _FP32.itemsize} "
                f"for {size} values"
            )
        return np.frombuffer(data, dtype=_FP32).astype(np.float32, copy=True)
