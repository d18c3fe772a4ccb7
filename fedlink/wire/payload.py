"""Tensor payloads: pack a vector with a codec into header + bytes, unpack and verify.

Both sides use this: the coordinator packs the model and unpacks updates; clients do the
reverse. Verification order is the order of the status codes a sender needs to fix things:
encoding known, shape and dtype as expected, size as declared, checksum, then decoded values
finite and matching their checksum.

Two checksums describe a payload (both ``sha256:<lowercase hex>``): ``checksum`` covers the
encoded bytes as sent (transport integrity, checked before decoding), ``values_checksum``
covers the decoded values as little-endian float32 bytes. Only the second can be checked by a
receiver that obtained the values another way, e.g. by applying a delta: re-encoding them
would have to reproduce the sender's compressor byte for byte, which two zlib builds do not.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fedlink.compress import Codec, decoder_for
from fedlink.errors import DataLoss, InvalidArgument
from fedlink.messages import TensorHeader

DTYPE = "float32"
CHECKSUM_ALGORITHM = "sha256"
DEFAULT_CHUNK_BYTES = 1 << 20  # 1 MiB: well under gRPC's 4 MiB message limit


@dataclass(frozen=True)
class Payload:
    """An encoded tensor ready to send: its header and its bytes."""

    header: TensorHeader
    data: bytes


def checksum(data: bytes) -> str:
    """``"sha256:<hex>"`` of ``data``."""
    return f"{CHECKSUM_ALGORITHM}:{hashlib.sha256(data).hexdigest()}"


def values_checksum(vector: np.ndarray) -> str:
    """``"sha256:<hex>"`` of ``vector`` as little-endian float32 bytes (``TensorHeader``'s
    ``values_checksum``)."""
    values = np.ascontiguousarray(vector, dtype="<f4").reshape(-1)
    # hashed in place (no copy of a model-sized vector): memory stays O(model)
    return f"{CHECKSUM_ALGORITHM}:{hashlib.sha256(values.data).hexdigest()}"


def pack(vector: np.ndarray, codec: Codec, rng: np.random.Generator | None = None, *,
         checksums: bool = True) -> Payload:
    """Encode a flat float32 vector with ``codec`` (stochastic codecs draw from ``rng``) and
    describe it in a header, with the checksum of the values a receiver decodes.

    ``checksums=False`` leaves both checksums empty, for a payload that crosses no wire and is
    unpacked with ``verify=False`` (a virtual run's update): hashing it, and decoding a lossy
    one to hash its values, was a few percent of a small model's simulated task.
    """
    flat = np.ascontiguousarray(vector, dtype=np.float32).reshape(-1)
    encoded = codec.encode(flat, rng)
    sent = checksum(encoded.data) if checksums else ""
    if not checksums:
        values = ""
    elif codec.raw:  # the bytes are the values: one hash is both checksums
        values = sent
    else:
        decoded = flat if codec.lossless else codec.decode(encoded.data, encoded.params,
                                                           flat.size)
        values = values_checksum(decoded)
    header = TensorHeader(
        encoding=codec.name,
        shape=(int(flat.size),),
        dtype=DTYPE,
        num_bytes=len(encoded.data),
        checksum=sent,
        codec_params=dict(encoded.params),
        values_checksum=values,
    )
    return Payload(header, encoded.data)


def unpack(header: TensorHeader, data: bytes, expected_size: int,
           verify: bool = True) -> np.ndarray:
    """Verify ``data`` against ``header`` and decode it into a finite float32 vector.

    Raises ``InvalidArgument`` (unknown encoding, wrong shape/dtype/size, non-finite values) or
    ``DataLoss`` (checksum or, when the header has one, values checksum mismatch).
    ``verify=False`` skips the two checksums (nothing else), for bytes that never crossed a
    network: a virtual run's payloads, packed in the same run (``pack(checksums=False)``
    leaves them empty).
    """
    codec = decoder_for(header.encoding)
    check_header(header, expected_size, checksums=verify)
    if len(data) != header.num_bytes:
        raise InvalidArgument(f"payload has {len(data)} bytes, header says {header.num_bytes}")
    received = checksum(data) if verify else ""
    if verify and received != header.checksum:
        raise DataLoss(f"checksum mismatch: header says {header.checksum!r}, "
                       f"received bytes hash to {received!r}")
    try:
        vector = codec.decode(data, header.codec_params, expected_size)
    except (ValueError, KeyError, TypeError, IndexError, OverflowError, zlib.error) as exc:
        # e.g. codec_params that do not parse, or bytes that do not match them
        raise InvalidArgument(f"{header.encoding!r} payload does not decode: {exc}") from None
    if not np.isfinite(vector).all():
        bad = int(np.count_nonzero(~np.isfinite(vector)))
        raise InvalidArgument(f"update holds {bad} non-finite values (NaN or Inf)")
    if verify:
        # raw fp32: the values' hash is the bytes' hash, just computed
        check_values(header, vector, received if codec.raw else None)
    return vector


def check_values(header: TensorHeader, vector: np.ndarray, known: str | None = None) -> None:
    """``DataLoss`` unless ``vector`` matches ``header.values_checksum`` (when it has one);
    ``known``: ``values_checksum(vector)``, when the caller has it already."""
    if not header.values_checksum:
        return
    got = known or values_checksum(vector)
    if got != header.values_checksum:
        raise DataLoss(f"decoded values do not match values_checksum "
                       f"{header.values_checksum!r}: got {got!r}")


def check_header(header: TensorHeader, expected_size: int, checksums: bool = True) -> None:
    """Raise ``InvalidArgument`` unless the header describes a flat float32 vector of the size
    (and, with ``checksums``, names its checksums' algorithm)."""
    if header.dtype != DTYPE:
        raise InvalidArgument(f"dtype {header.dtype!r} is not supported; send {DTYPE!r}")
    if tuple(header.shape) != (expected_size,):
        raise InvalidArgument(f"shape {list(header.shape)} does not match the model: "
                              f"expected [{expected_size}]")
    if not checksums:
        return
    for name, value in (("checksum", header.checksum),
                        ("values_checksum", header.values_checksum or f"{CHECKSUM_ALGORITHM}:")):
        if not value.startswith(f"{CHECKSUM_ALGORITHM}:"):
            raise InvalidArgument(f"{name} must be '{CHECKSUM_ALGORITHM}:<hex>', got {value!r}")


def iter_chunks(data: bytes, chunk_bytes: int, offset: int = 0,
                end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(offset, piece)`` pairs covering ``data[offset:end]`` in pieces of ``chunk_bytes``
    (``end``: the end of ``data`` when ``None``)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    stop = len(data) if end is None else min(end, len(data))
    view = memoryview(data)
    for start in range(offset, stop, chunk_bytes):
        yield start, bytes(view[start:min(start + chunk_bytes, stop)])
