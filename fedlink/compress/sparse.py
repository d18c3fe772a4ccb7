"""Sparsifiers: top-k and random-k, each sending its ``k`` values through a value codec.

``topk`` keeps the ``k = ceil(density * n)`` values of largest magnitude; ``randk`` keeps ``k``
values at indices drawn from a seed. Both are biased (use error feedback). Names join a
sparsifier and a value codec with ``+``: ``topk`` (fp32 values), ``topk+fp16``, ``topk+bf16``,
``topk+q8``/``topk+q4`` (stochastic 8/4-bit quantization of the kept values, max-norm scaled),
and the same for ``randk``. Options: ``density`` (0 < density <= 1), and ``norm`` for the
quantized ones.

Formats (little-endian):

* ``topk``: mode (1 byte: 0 varint gaps, 1 bitmap; see ``fedlink.compress.indexcode``),
  ``k`` (uint32), the index section, then the value codec's encoding of the ``k`` kept values
  in index order: ``5 + min(varint, ceil(n / 8)) + values(k)`` bytes.
* ``randk``: ``k`` (uint32), then the values: ``4 + values(k)`` bytes. The indices are not
  sent: parameter ``seed`` (0 <= seed < 2**63) rebuilds them. Protocol 1.1 (parameter
  ``index_rule = "splitmix64"``, what fedlink encodes): the ``k`` indices ``i`` with the
  smallest ``splitmix64(seed + (i + 1) * GAMMA)``, sorted (``splitmix_keys``; integer-only, any
  language). Without ``index_rule`` (protocol 1.0): ``numpy`` PCG64 ``choice`` without
  replacement, sorted; still decoded, encoded only with ``index_rule="numpy"``.

``topk`` keeps ``k`` values of largest magnitude, ties broken by the lower index, so any
implementation picks the same indices.

Value codec parameters travel beside the sparsifier's in ``codec_params``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from fedlink.compress.base import CODECS, Codec, Encoded, expect_length, param
from fedlink.compress.identity import BFloat16Codec, Float16Codec, Float32Codec, as_fp32
from fedlink.compress.indexcode import (
    bitmap_size,
    decode_indices,
    encode_indices,
    encoded_indices_size,
    varint_bound,
)
from fedlink.compress.quantize import StochasticQuantizer
from fedlink.errors import ConfigError, InvalidArgument

_U32 = np.dtype("<u4")
GAMMA = 0x9E3779B97F4A7C15
"""SplitMix64's increment (the odd constant nearest ``2**64 / golden ratio``)."""
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
INDEX_RULES = ("splitmix64", "numpy")
"""``randk`` index rules: ``splitmix64`` (protocol 1.1) and ``numpy`` (protocol 1.0)."""
SEED_LIMIT = 2**63
"""A ``randk`` seed is an integer in ``[0, SEED_LIMIT)``, written in decimal."""


def splitmix_keys(seed: int, n: int) -> np.ndarray:
    """``splitmix64(seed + (i + 1) * GAMMA)`` for ``i`` in ``[0, n)``, all arithmetic mod 2**64.

    The ``i``-th output of a SplitMix64 generator started at state ``seed``: counter-based, so
    every key is computed on its own. The states are distinct (``GAMMA`` is odd) and the mix
    is a bijection, so no two keys are equal and "the ``k`` smallest" needs no tie rule.
    """
    z = np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(GAMMA)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def splitmix_indices(seed: int, n: int, k: int) -> np.ndarray:
    """The ``k`` indices of ``[0, n)`` with the smallest ``splitmix_keys``, ascending."""
    if k >= n:
        return np.arange(n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    keys = splitmix_keys(seed, n)
    return np.sort(np.argpartition(keys, k - 1)[:k])
_VALUE_CODECS: dict[str, Callable[[str], Codec]] = {
    "fp32": lambda norm: Float32Codec(),
    "fp16": lambda norm: Float16Codec(),
    "bf16": lambda norm: BFloat16Codec(),
    "q8": lambda norm: StochasticQuantizer(bits=8, norm=norm),
    "q4": lambda norm: StochasticQuantizer(bits=4, norm=norm),
}


def kept_count(density: float, n: int) -> int:
    """``k`` for ``density`` of ``n`` values: ``ceil(density * n - 1e-9)`` (so that 0.07 of
    100 keeps 7, not the 8 that binary floating point's ``0.07 * 100`` would round up to), at
    least 1 (if ``n``), at most ``n``."""
    return min(n, max(1, math.ceil(density * n - 1e-9))) if n else 0


class Sparsifier(Codec):
    """Keeps ``k`` of ``n`` values and encodes them with a value codec (shared logic)."""

    biased = True
    kind = ""

    def __init__(self, values: str = "fp32", density: float = 0.01, norm: str = "max") -> None:
        if not 0.0 < density <= 1.0:
            raise ConfigError(f"density must be in (0, 1], got {density}")
        if values not in _VALUE_CODECS:
            raise ConfigError(f"value codec must be one of {sorted(_VALUE_CODECS)}")
        self.value_name = values
        self.norm = norm
        self.values = _VALUE_CODECS[values](norm)
        self.density = density
        self.name = self.kind if values == "fp32" else f"{self.kind}+{values}"
        self.stochastic = self.kind == "randk" or self.values.stochastic

    def with_density(self, density: float) -> Sparsifier:
        """The same codec at another ``density`` (bandwidth-aware density uses this)."""
        return type(self)(self.value_name, density, self.norm)

    def _encode_values(self, kept: np.ndarray, rng: np.random.Generator | None) -> Encoded:
        return self.values.encode(kept, rng)

    def _decode_values(self, data: bytes, params: Mapping[str, str], k: int,
                       n: int) -> np.ndarray:
        expect_length(f"{self.name} value section", data, self.values.size_bound(k))
        return self.values.decode(data, params, k)

    @staticmethod
    def _header_k(data: bytes, offset: int, n: int) -> int:
        if len(data) < offset + 4:
            raise InvalidArgument(f"sparse payload of {len(data)} bytes is truncated")
        k = int(np.frombuffer(data, dtype=_U32, count=1, offset=offset)[0])
        if k > n:
            raise InvalidArgument(f"sparse payload keeps {k} values of {n}")
        return k

    @staticmethod
    def _scatter(indices: np.ndarray, kept: np.ndarray, n: int) -> np.ndarray:
        out = np.zeros(n, dtype=np.float32)
        out[indices] = kept
        return out


class TopK(Sparsifier):
    """The ``k`` largest magnitudes, with compact index coding (module docstring)."""

    kind = "topk"

    def select(self, values: np.ndarray) -> np.ndarray:
        """Sorted indices of the ``k`` largest magnitudes of ``values``; among equal
        magnitudes at the cut, the lowest indices (a rule any implementation can follow)."""
        n = values.size
        k = kept_count(self.density, n)
        if k == n:
            return np.arange(n)
        magnitude = np.abs(values)
        cut = np.partition(magnitude, n - k)[n - k]  # the k-th largest magnitude
        above = np.flatnonzero(magnitude > cut)
        at_cut = np.flatnonzero(magnitude == cut)[:k - above.size]
        return np.sort(np.concatenate([above, at_cut]))

    def encode(self, vector: np.ndarray, rng: np.random.Generator | None = None) -> Encoded:
        """Mode, ``k``, indices, values."""
        values = as_fp32(vector)
        indices = self.select(values)
        mode, index_bytes = encode_indices(indices, values.size)
        encoded = self._encode_values(values[indices], rng)
        head = bytes([mode]) + np.array([indices.size], dtype=_U32).tobytes()
        return Encoded(head + index_bytes + encoded.data,
                       {"density": repr(self.density), **encoded.params})

    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """Scatter the decoded values to their decoded indices."""
        k = self._header_k(data, 1, size)
        body = np.frombuffer(data, dtype=np.uint8, offset=5)
        indices, used = decode_indices(data[0], body, size, k)
        kept = self._decode_values(data[5 + used:], params, k, size)
        return self._scatter(indices, kept, size)

    def size_bound(self, size: int) -> int:
        """``5 + min(varint bound, bitmap) + values(k)``."""
        k = kept_count(self.density, size)
        return 5 + min(varint_bound(size, k), bitmap_size(size)) + self.values.size_bound(k)

    def encoded_size(self, vector: np.ndarray) -> int:
        """Exact: the index section depends on where the largest values are."""
        values = as_fp32(vector)
        indices = self.select(values)
        return (5 + encoded_indices_size(indices, values.size)
                + self.values.size_bound(indices.size))


class RandK(Sparsifier):
    """``k`` values at seeded random indices; only the seed and the values are sent."""

    kind = "randk"

    def __init__(self, values: str = "fp32", density: float = 0.01, norm: str = "max",
                 index_rule: str = "splitmix64") -> None:
        super().__init__(values, density, norm)
        if index_rule not in INDEX_RULES:
            raise ConfigError(f"index_rule must be one of {INDEX_RULES}, got {index_rule!r}")
        self.index_rule = index_rule

    def with_density(self, density: float) -> Sparsifier:
        """The same codec at another ``density``, keeping its index rule."""
        return RandK(self.value_name, density, self.norm, self.index_rule)

    @staticmethod
    def indices(seed: int, n: int, k: int, rule: str = "splitmix64") -> np.ndarray:
        """The sorted indices that ``seed`` picks under ``rule`` (both sides call this)."""
        if rule == "splitmix64":
            return splitmix_indices(seed, n, k)
        rng = np.random.Generator(np.random.PCG64(seed))
        return np.sort(rng.choice(n, size=k, replace=False))

    def encode(self, vector: np.ndarray, rng: np.random.Generator | None = None) -> Encoded:
        """``k`` and the values at the seed's indices; the seed goes in the parameters."""
        values = as_fp32(vector)
        seed = int((rng or np.random.default_rng()).integers(SEED_LIMIT))
        k = kept_count(self.density, values.size)
        picked = self.indices(seed, values.size, k, self.index_rule)
        encoded = self._encode_values(values[picked], rng)
        head = np.array([k], dtype=_U32).tobytes()
        rule = {"index_rule": self.index_rule} if self.index_rule != "numpy" else {}
        return Encoded(head + encoded.data, {"seed": str(seed), **rule, **encoded.params})

    def decode(self, data: bytes, params: Mapping[str, str], size: int) -> np.ndarray:
        """Rebuild the indices from ``seed`` (by the header's index rule) and scatter."""
        k = self._header_k(data, 0, size)
        seed = int(param(params, "seed", int, self.name))
        if not 0 <= seed < SEED_LIMIT:
            raise InvalidArgument(f"{self.name}: seed {seed} is out of range [0, 2**63)")
        rule = params.get("index_rule", "numpy")  # absent: a protocol 1.0 sender
        if rule not in INDEX_RULES:
            raise InvalidArgument(f"{self.name}: unknown index_rule {rule!r} "
                                  f"(known: {', '.join(INDEX_RULES)})")
        kept = self._decode_values(data[4:], params, k, size)
        return self._scatter(self.indices(seed, size, k, rule), kept, size)

    def size_bound(self, size: int) -> int:
        """``4 + values(k)`` (exact)."""
        return 4 + self.values.size_bound(kept_count(self.density, size))


def _register(cls: type[Sparsifier], values: str) -> None:
    name = cls.kind if values == "fp32" else f"{cls.kind}+{values}"

    def factory(density: float = 0.01, norm: str = "max") -> Codec:
        return cls(values, density, norm)

    CODECS.register(name)(factory)


def _register_randk(values: str) -> None:
    name = "randk" if values == "fp32" else f"randk+{values}"

    def factory(density: float = 0.01, norm: str = "max",
                index_rule: str = "splitmix64") -> Codec:
        return RandK(values, density, norm, index_rule)

    CODECS.register(name)(factory)


for _values in _VALUE_CODECS:
    _register(TopK, _values)
for _values in _VALUE_CODECS:
    _register_randk(_values)
