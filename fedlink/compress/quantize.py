"""Unbiased stochastic quantization to ``b`` bits, norm-scaled (QSGD-style), and sign + scale.

``qsgd`` (options ``bits`` in 2..8, ``norm`` ``"max"`` or ``"l2"``): with ``s = 2**(b-1) - 1``
levels per sign and scale ``c`` (the vector's max-abs or L2 norm, as float32), each value
``v`` becomes ``sign(v) * l * c / s`` where ``l`` is ``floor(|v| s / c)`` plus one with
probability equal to the remainder. ``E[decode(encode(v))] = v`` exactly. ``"max"`` has far
lower variance at a given ``b``; ``"l2"`` is the original QSGD scaling.
Format: ``c`` (float32, 4 bytes), then ``n`` codes ``l + s`` in ``[0, 2s]``, ``b`` bits each,
packed most significant bit first: ``4 + ceil(n b / 8)`` bytes. Parameters: ``bits``, ``norm``.

``sign`` (biased; use error feedback): scale ``c = mean(|v|)`` (float32, 4 bytes), then one bit
per value (1 for ``v >= 0``), packed most significant bit first: ``4 + ceil(n / 8)`` bytes.
Each value decodes to ``+c`` or ``-c``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedlink.compress.base import CODECS, FP32, Codec, Encoded, expect_length, param
from fedlink.compress.identity import as_fp32
from fedlink.errors import ConfigError, InvalidArgument

NORMS = ("max", "l2")
MIN_BITS, MAX_BITS = 2, 8


def pack_codes(codes: np.ndarray, bits: int) -> bytes:
    """``codes`` (uint8, each < ``2**bits``) as a big-endian bit stream of ``bits`` per code."""
    codes = codes.astype(np.uint8)
    if bits == 8:
        return codes.tobytes()
    if 8 % bits == 0:  # whole codes per byte: shift and add, no bit planes
        per = 8 // bits
        padded = np.zeros(-(-codes.size // per) * per, dtype=np.uint8)
        padded[:codes.size] = codes
        groups = padded.reshape(-1, per)
        packed = np.zeros(groups.shape[0], dtype=np.uint8)
        for j in range(per):
            packed |= groups[:, j] << np.uint8(8 - bits * (j + 1))
        return packed.tobytes()
    planes = np.unpackbits(codes[:, None], axis=1)[:, 8 - bits:]
    return np.packbits(planes.reshape(-1)).tobytes()


def unpack_codes(data: bytes, bits: int, count: int) -> np.ndarray:
    """The ``count`` codes of ``bits`` bits each packed in ``data`` (see ``pack_codes``)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if bits == 8:
        return raw.copy()
    if 8 % bits == 0:
        per = 8 // bits
        mask = np.uint8((1 << bits) - 1)
        shifts = np.array([8 - bits * (j + 1) for j in range(per)], dtype=np.uint8)
        return ((raw[:, None] >> shifts) & mask).reshape(-1)[:count]
    planes = np.unpackbits(raw, count=count * bits).reshape(count, bits)
    padded = np.zeros((count, 8), dtype=np.uint8)
    padded[:, 8 - bits:] = planes
    return np.packbits(padded, axis=1).reshape(-1)


def _scale(values: np.ndarray, norm: str) -> np.float32:
    if values.size == 0:
        return np.float32(0.0)
    if norm == "max":
        return np.float32(np.max(np.abs(values)))
    return np.float32(np.linalg.norm(values.astype(np.float64)))


@CODECS.register("qsgd")
class StochasticQuantizer(Codec):
    """Unbiased stochastic quantization (see the module docstring for the format)."""

    name = "qsgd"
    stochastic = True

    def __init__(self, bits: int = 8, norm: str = "max", seed: int = 0) -> None:
        if not MIN_BITS <= bits <= MAX_BITS:
            raise ConfigError(f"bits must be in [{MIN_BITS}, {MAX_BITS}], got {bits}")
        if norm not in NORMS:
            raise ConfigError(f"norm must be one of {NORMS}, got {norm!r}")
        self.bits = bits
        self.norm = norm
        self._rng = np.random.default_rng(seed)  # only when encode is given no rng

    @property
    def levels(self) -> int:
        """``s``: quantization levels per sign."""
        return (1 << (self.bits - 1)) - 1

    def encode(self, vector: np.ndarray, rng: np.random.Generator | None = None) -> Encoded:
        """Scale, randomly round to ``s`` levels, pack ``bits`` per value."""
        values = as_fp32(vector)
        scale = _scale(values, self.norm)
        s = self.levels
        if scale > 0:
            x = np.abs(values) / scale * np.float32(s)  # |v| <= c: no overflow, even for tiny c
            level = np.floor(x)
            level += (rng or self._rng).random(values.size, dtype=np.float32) < (x - level)
            level = np.minimum(level, s)  # float rounding must not push past the top level
        else:
            level = np.zeros(values.size, dtype=np.float32)
        codes = np.where(values < 0, s - level, s + level).astype(np.uint8)
        data = np.array([scale], dtype=FP32).tobytes() + pack_codes(codes, self.bits)
        return Encoded(data, {"bits": str(self.bits), "norm": self.norm})

    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """``(code - s) * c / s`` for each packed code."""
        bits = int(param(params, "bits", int, self.name))
        if not MIN_BITS <= bits <= MAX_BITS:
            raise InvalidArgument(f"{self.name}: bits must be in [{MIN_BITS}, {MAX_BITS}], "
                                  f"got {bits}")
        expect_length(self.name, data, 4 + (size * bits + 7) // 8)
        scale = np.frombuffer(data[:4], dtype=FP32)[0]
        if not np.isfinite(scale) or scale < 0:
            raise InvalidArgument(f"{self.name}: scale {scale} is not a finite non-negative value")
        s = (1 << (bits - 1)) - 1
        codes = unpack_codes(data[4:], bits, size).astype(np.float32)
        if codes.size and codes.max() > 2 * s:
            raise InvalidArgument(f"{self.name}: code {int(codes.max())} exceeds {2 * s}")
        return (codes - np.float32(s)) * (scale / np.float32(s))

    def size_bound(self, size: int) -> int:
        """``4 + ceil(size * bits / 8)``."""
        return 4 + (size * self.bits + 7) // 8


@CODECS.register("sign")
class SignCodec(Codec):
    """One bit per value and a mean-magnitude scale (biased; see the module docstring)."""

    name = "sign"
    biased = True

    def encode(self, vector: np.ndarray, rng: np.random.Generator | None = None) -> Encoded:
        """``mean(|v|)`` then the packed sign bits."""
        values = as_fp32(vector)
        scale = np.float32(np.mean(np.abs(values), dtype=np.float64)) if values.size else 0.0
        head = np.array([scale], dtype=FP32).tobytes()
        return Encoded(head + np.packbits(values >= 0).tobytes())

    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """``+c`` where the bit is set, ``-c`` where it is clear."""
        expect_length(self.name, data, self.size_bound(size))
        scale = np.frombuffer(data[:4], dtype=FP32)[0]
        if not np.isfinite(scale) or scale < 0:
            raise InvalidArgument(f"{self.name}: scale {scale} is not a finite non-negative value")
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8, offset=4), count=size)
        return np.where(bits.astype(bool), scale, -scale).astype(np.float32)

    def size_bound(self, size: int) -> int:
        """``4 + ceil(size / 8)``."""
        return 4 + (size + 7) // 8
