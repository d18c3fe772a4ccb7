"""Secure aggregation's primitives written from the protocol docs with ``cryptography`` and
integers only, no fedlink: what the golden-vector tests check fedlink's files against, as an
implementer in another language would."""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

P = (1 << 255) - 19
"""The Shamir field's prime, 2^255 - 19."""


def prg(seed: bytes, count: int) -> list[int]:
    """``count`` words of the mask PRG: AES-256-CTR's keystream as little-endian uint32."""
    stream = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor().update(
        bytes(4 * count))
    return [int.from_bytes(stream[4 * i: 4 * i + 4], "little") for i in range(count)]


def agree(private: int, public: bytes, info: str) -> bytes:
    """The key two clients agree for ``info``: HKDF-SHA256 of their X25519 shared secret."""
    key = X25519PrivateKey.from_private_bytes(private.to_bytes(32, "little"))
    shared = key.exchange(X25519PublicKey.from_public_bytes(public))
    return HKDF(hashes.SHA256(), 32, None, info.encode()).derive(shared)


def lagrange_at_zero(points: list[tuple[int, int]]) -> int:
    """The secret at x = 0 of the Shamir shares ``(x, y)`` over GF(2^255 - 19)."""
    secret = 0
    for xj, yj in points:
        weight = 1
        for xm, _ in points:
            if xm != xj:
                weight = weight * xm * pow(xm - xj, -1, P) % P
        secret = (secret + yj * weight) % P
    return secret
