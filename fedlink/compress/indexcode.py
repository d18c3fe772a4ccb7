"""Compact coding of a sorted set of ``k`` distinct indices into ``[0, n)``.

Two formats, and the smaller one is used for each vector (``encode_indices``):

* **varint gaps** (mode 0): ``i_0``, then ``i_j - i_{j-1} - 1`` for ``j >= 1``, each as an
  unsigned LEB128 varint (7 bits per byte, high bit set on all but the last byte). About one
  byte per index while the mean gap is below 128 (density above ~1%).
* **bitmap** (mode 1): ``ceil(n / 8)`` bytes, bit ``i`` (most significant bit first) set when
  ``i`` is kept, padding bits clear. Smaller once the density passes about 1/8.

Both are vectorised with numpy (no Python loop over indices).
"""

from __future__ import annotations

import numpy as np

from fedlink.errors import InvalidArgument

VARINT, BITMAP = 0, 1
_MAX_VARINT_BYTES = 5  # enough for indices below 2**35


def varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes each non-negative integer in ``values`` takes as a LEB128 varint."""
    v = values.astype(np.uint64)
    lengths = np.ones(v.size, dtype=np.int64)
    for j in range(1, _MAX_VARINT_BYTES):
        lengths += v >= (1 << (7 * j))
    return lengths


def encode_varints(values: np.ndarray) -> bytes:
    """``values`` (non-negative integers) as concatenated LEB128 varints."""
    v = values.astype(np.uint64)
    lengths = varint_lengths(v)
    ends = np.cumsum(lengths)
    out = np.zeros(int(ends[-1]) if v.size else 0, dtype=np.uint8)
    starts = ends - lengths
    for j in range(int(lengths.max()) if v.size else 0):
        live = lengths > j
        byte = (v[live] >> np.uint64(7 * j)) & np.uint64(0x7F)
        more = (lengths[live] > j + 1).astype(np.uint64) << np.uint64(7)
        out[starts[live] + j] = (byte | more).astype(np.uint8)
    return out.tobytes()


def decode_varints(data: np.ndarray, count: int) -> tuple[np.ndarray, int]:
    """The first ``count`` varints in ``data`` (uint8) and the bytes they take."""
    ends = np.flatnonzero(data < 0x80)
    if ends.size < count:
        raise InvalidArgument(f"index section holds {ends.size} complete varints, "
                              f"expected {count}")
    if count == 0:
        return np.zeros(0, dtype=np.int64), 0
    ends = ends[:count]
    used = int(ends[-1]) + 1
    starts = np.concatenate(([0], ends[:-1] + 1))
    if int((ends - starts).max()) >= _MAX_VARINT_BYTES:
        raise InvalidArgument("index varint is too long")
    body = data[:used].astype(np.int64) & 0x7F
    position = np.arange(used) - np.repeat(starts, ends - starts + 1)
    return np.add.reduceat(body << (7 * position), starts), used


def gaps_of(indices: np.ndarray) -> np.ndarray:
    """The varint-mode gaps of sorted, distinct ``indices``."""
    gaps = np.diff(indices.astype(np.int64), prepend=-1) - 1
    return gaps


def varint_size(indices: np.ndarray) -> int:
    """Bytes of the varint-gap coding of sorted, distinct ``indices``."""
    return int(varint_lengths(gaps_of(indices)).sum())


def bitmap_size(n: int) -> int:
    """Bytes of the bitmap coding over ``n`` positions."""
    return (n + 7) // 8


def varint_bound(n: int, k: int) -> int:
    """The most bytes the varint coding of any ``k`` indices into ``[0, n)`` takes.

    The gaps sum to at most ``n``, so at most ``n // 128**j`` of them reach ``128**j``.
    """
    return k + sum(min(k, n >> (7 * j)) for j in range(1, _MAX_VARINT_BYTES))


def encoded_indices_size(indices: np.ndarray, n: int) -> int:
    """Bytes ``encode_indices`` produces (the smaller format)."""
    return min(varint_size(indices), bitmap_size(n))


def encode_indices(indices: np.ndarray, n: int) -> tuple[int, bytes]:
    """``(mode, bytes)`` of sorted, distinct ``indices`` into ``[0, n)``: the smaller format."""
    if varint_size(indices) <= bitmap_size(n):
        return VARINT, encode_varints(gaps_of(indices))
    mask = np.zeros(n, dtype=bool)
    mask[indices] = True
    return BITMAP, np.packbits(mask).tobytes()


def decode_indices(mode: int, data: np.ndarray, n: int, k: int) -> tuple[np.ndarray, int]:
    """``(indices, bytes used)`` from the start of ``data``; ``InvalidArgument`` if malformed."""
    if mode == VARINT:
        gaps, used = decode_varints(data, k)
        indices = np.cumsum(gaps + 1) - 1
        if k and int(indices[-1]) >= n:
            raise InvalidArgument(f"index {int(indices[-1])} is out of range for {n} values")
        return indices, used
    if mode == BITMAP:
        used = bitmap_size(n)
        if data.size < used:
            raise InvalidArgument(f"bitmap needs {used} bytes, payload has {data.size}")
        bits = np.unpackbits(data[:used])
        if bits[n:].any():
            raise InvalidArgument("bitmap padding bits are set")
        indices = np.flatnonzero(bits[:n])
        if indices.size != k:
            raise InvalidArgument(f"bitmap marks {indices.size} indices, header says {k}")
        return indices, used
    raise InvalidArgument(f"unknown index coding mode {mode}")
