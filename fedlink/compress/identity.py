"""Codecs that send every value: fp32 (identity), fp16, bf16, and lossless fp32-zlib.

Byte formats (``n`` values, all little-endian):

* ``fp32``: ``4n`` bytes of IEEE float32, bit-exact.
* ``fp16``: ``2n`` bytes of IEEE float16, round to nearest; values beyond +-65504 saturate.
* ``bf16``: ``2n`` bytes, the upper half of each float32 rounded to nearest-even (8 exponent
  bits, so no overflow short of float32's own range; 8 significant bits).
* ``fp32-zlib``: the float32 bytes split into 4 byte planes (all lowest bytes, ..., all highest
  bytes) and deflated: lossless, and small where planes repeat (sign/exponent bytes of weights
  of similar size, or zeros of a sparse delta). Meant for the downlink.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np

from fedlink.compress.base import CODECS, FP32, Codec, Encoded, expect_length
from fedlink.errors import ConfigError, InvalidArgument

_FP16 = np.dtype("<f2")
_U16 = np.dtype("<u2")
_U32 = np.dtype("<u4")
_FP16_MAX = float(np.finfo(np.float16).max)
_BF16_MAX = float(np.array([0x7F7F0000], dtype=np.uint32).view(np.float32)[0])


def as_fp32(vector: np.ndarray) -> np.ndarray:
    """``vector`` as a flat, contiguous little-endian float32 array (no copy when it is one)."""
    return np.ascontiguousarray(vector, dtype=FP32).reshape(-1)


@CODECS.register("fp32")
class Float32Codec(Codec):
    """Identity: little-endian float32, 4 bytes per value, bit-exact."""

    name = "fp32"
    lossless = True
    raw = True

    def encode(self, vector: np.ndarray, rng: np.random.Generator | None = None) -> Encoded:
        """Raw little-endian float32 bytes of ``vector``."""
        return Encoded(as_fp32(vector).tobytes())

    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """The float32 vector in ``data``; its length must be exactly ``4 * size`` bytes."""
        expect_length(self.name, data, size * FP32.itemsize)
        return np.frombuffer(data, dtype=FP32).astype(np.float32, copy=True)

    def size_bound(self, size: int) -> int:
        """``4 * size``."""
        return 4 * size


@CODECS.register("fp16")
class Float16Codec(Codec):
    """IEEE half precision, 2 bytes per value; out-of-range values saturate at +-65504."""

    name = "fp16"

    def encode(self, vector: np.ndarray, rng: np.random.Generator | None = None) -> Encoded:
        """``vector`` clipped to the float16 range and rounded to nearest."""
        clipped = np.clip(as_fp32(vector), -_FP16_MAX, _FP16_MAX)
        return Encoded(clipped.astype(_FP16).tobytes())

    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """The float16 values in ``data`` widened to float32."""
        expect_length(self.name, data, 2 * size)
        return np.frombuffer(data, dtype=_FP16).astype(np.float32)

    def size_bound(self, size: int) -> int:
        """``2 * size``."""
        return 2 * size


@CODECS.register("bf16")
class BFloat16Codec(Codec):
    """bfloat16 by bit manipulation: the top 16 bits of float32, rounded to nearest-even."""

    name = "bf16"

    def encode(self, vector: np.ndarray, rng: np.random.Generator | None = None) -> Encoded:
        """Round each float32 to its nearest bfloat16 (ties to even) and keep the top half."""
        clipped = np.clip(as_fp32(vector), -_BF16_MAX, _BF16_MAX)
        bits = clipped.view(_U32)  # clipped, so adding under 2**16 cannot overflow 32 bits
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
            >> np.uint32(16)
        return Encoded(rounded.astype(_U16).tobytes())

    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """Each 16-bit pattern shifted into the top half of a float32."""
        expect_length(self.name, data, 2 * size)
        high = np.frombuffer(data, dtype=_U16).astype(_U32) << 16
        return high.view(np.float32).astype(np.float32, copy=False)

    def size_bound(self, size: int) -> int:
        """``2 * size``."""
        return 2 * size


@CODECS.register("fp32-zlib")
class ShuffledZlibCodec(Codec):
    """Lossless: float32 byte planes, deflated (see the module docstring)."""

    name = "fp32-zlib"
    lossless = True

    def __init__(self, level: int = 6) -> None:
        if not 0 <= level <= 9:
            raise ConfigError(f"zlib level must be in [0, 9], got {level}")
        self.level = level

    def encode(self, vector: np.ndarray, rng: np.random.Generator | None = None) -> Encoded:
        """Deflate the byte planes of ``vector``."""
        planes = as_fp32(vector).view(np.uint8).reshape(-1, 4).T
        return Encoded(zlib.compress(np.ascontiguousarray(planes).tobytes(), self.level))

    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """Inflate and interleave the byte planes back into float32 values."""
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(data, 4 * size + 1)
        except zlib.error as exc:
            raise InvalidArgument(f"malformed {self.name} payload: {exc}") from exc
        if not inflater.eof or inflater.unused_data or inflater.unconsumed_tail:
            raise InvalidArgument(f"malformed {self.name} payload: truncated, too long, or "
                                  "followed by extra bytes")
        expect_length(f"inflated {self.name}", raw, 4 * size)
        planes = np.frombuffer(raw, dtype=np.uint8).reshape(4, size)
        return np.ascontiguousarray(planes.T).view(FP32).reshape(-1).astype(np.float32)

    def size_bound(self, size: int) -> int:
        """zlib's ``compressBound`` of ``4 * size`` bytes."""
        n = 4 * size
        return n + (n >> 12) + (n >> 14) + (n >> 25) + 13

    def encoded_size(self, vector: np.ndarray) -> int:
        """The deflated length (depends on the values)."""
        return len(self.encode(vector).data)
