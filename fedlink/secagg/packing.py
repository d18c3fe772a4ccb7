"""Masked vectors on the wire: ``bits`` bits per value, packed with no padding between values.

A value of a ring ``Z_m`` with ``m = 2**bits`` needs exactly ``bits`` bits, so a masked vector
of ``n`` values travels in ``ceil(n * bits / 8)`` bytes, not ``4 * n``. Value ``i`` takes bits
``[i * bits, (i + 1) * bits)`` of the stream, least significant bit first, the stream's bit
``j`` being bit ``j % 8`` of byte ``j // 8`` (the order a little-endian integer of the whole
stream would have); the last byte's unused high bits are zero.
"""

from __future__ import annotations

import numpy as np

from fedlink.secagg.base import SecAggError


def packed_size(count: int, bits: int) -> int:
    """Bytes that ``count`` values of ``bits`` bits take packed."""
    return (count * bits + 7) // 8


def pack(values: np.ndarray, bits: int) -> bytes:
    """``values`` (each below ``2**bits``, ``1 <= bits <= 32``) packed ``bits`` bits apiece."""
    if not 1 <= bits <= 32:
        raise SecAggError(f"packing: 1..32 bits per value, got {bits}")
    words = np.ascontiguousarray(values, dtype="<u4")
    if words.size and int(words.max()) >> bits:
        raise SecAggError(f"packing: a value does not fit in {bits} bits")
    stream = np.unpackbits(words.view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
    return np.packbits(stream[:, :bits].reshape(-1), bitorder="little").tobytes()


def unpack(data: bytes, count: int, bits: int) -> np.ndarray:
    """The ``count`` uint32 values ``pack`` wrote (``SecAggError`` on a wrong length)."""
    if len(data) != packed_size(count, bits):
        raise SecAggError(f"packing: {count} values of {bits} bits take "
                          f"{packed_size(count, bits)} bytes, got {len(data)}")
    stream = np.unpackbits(np.frombuffer(data, np.uint8), count=count * bits, bitorder="little")
    padded = np.zeros((count, 32), dtype=np.uint8)
    padded[:, :bits] = stream.reshape(count, bits)
    return np.packbits(padded, axis=1, bitorder="little").view("<u4").reshape(-1).astype(
        np.uint32)
