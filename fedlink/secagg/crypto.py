"""The cryptographic primitives of a secure round, all from the ``cryptography`` package.

- Key agreement: X25519; the raw shared secret goes through HKDF-SHA256 with a label that says
  what the key is for and the round it belongs to, so the share-encryption key and the mask
  seed of one pair of clients are unrelated, and no key is reused across rounds.
- Share encryption: AES-256-GCM; the associated data binds the ciphertext to (round, sender,
  receiver), so the coordinator cannot redirect a share. The key is agreed per pair and per
  round and each direction sends one message, so the nonce is the (sender, receiver) pair
  itself: unique under each key, and nothing to send.
- Mask expansion (the PRG): AES-256 in counter mode keyed by a 32-byte seed, from a zero
  counter; its keystream, read as little-endian uint32 words, is the mask.

Private keys are drawn below 2^255 - 19 so that each is one element of the Shamir field (an
X25519 private key is any 32 bytes; the curve clamps them).
"""

from __future__ import annotations

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedlink.secagg.base import KEY_BYTES, SecAggError
from fedlink.secagg.shamir import PRIME, RandomBelow


def share_nonce(sender: int, receiver: int) -> bytes:
    """The 96-bit AES-GCM nonce of ``sender``'s one message to ``receiver`` in a round."""
    return sender.to_bytes(4, "little") + receiver.to_bytes(4, "little") + bytes(4)


def private_key(random_below: RandomBelow) -> int:
    """A fresh X25519 private key, as a field element (its 32 little-endian bytes)."""
    return random_below(PRIME)


def public_key(private: int) -> bytes:
    """The 32-byte X25519 public key of ``private``."""
    key = X25519PrivateKey.from_private_bytes(private.to_bytes(KEY_BYTES, "little"))
    return key.public_key().public_bytes_raw()


def agree(private: int, peer_public: bytes, purpose: str, round_id: int) -> bytes:
    """A 32-byte key for ``purpose`` in round ``round_id``, agreed with the peer's public key
    (both sides get the same bytes)."""
    key = X25519PrivateKey.from_private_bytes(private.to_bytes(KEY_BYTES, "little"))
    try:
        shared = key.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:  # a low-order point: the exchange gives all zeros
        raise SecAggError(f"key agreement failed: {exc}") from exc
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                info=f"fedlink-secagg/{purpose}/{round_id}".encode()).derive(shared)


def _associated(round_id: int, sender: int, receiver: int) -> bytes:
    return f"fedlink-secagg/share/{round_id}/{sender}/{receiver}".encode()


def encrypt(key: bytes, plaintext: bytes, round_id: int, sender: int, receiver: int) -> bytes:
    """AES-256-GCM ciphertext (with its tag) of ``plaintext``, bound to the round and pair."""
    return AESGCM(key).encrypt(share_nonce(sender, receiver), plaintext,
                               _associated(round_id, sender, receiver))


def decrypt(key: bytes, ciphertext: bytes, round_id: int, sender: int, receiver: int) -> bytes:
    """The plaintext, or ``SecAggError`` when the ciphertext was altered or misdirected."""
    try:
        return AESGCM(key).decrypt(share_nonce(sender, receiver), ciphertext,
                                   _associated(round_id, sender, receiver))
    except InvalidTag as exc:
        raise SecAggError(f"a share from client {sender} to {receiver} does not decrypt "
                          f"(altered or misdirected)") from exc


def expand(seed: bytes, size: int) -> np.ndarray:
    """``size`` pseudo-random uint32 words from a 32-byte seed (AES-256-CTR keystream)."""
    if len(seed) != KEY_BYTES:
        raise SecAggError(f"a mask seed is {KEY_BYTES} bytes, got {len(seed)}")
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    stream = encryptor.update(bytes(4 * size)) + encryptor.finalize()
    return np.frombuffer(stream, dtype="<u4").astype(np.uint32, copy=False)


def element_bytes(value: int) -> bytes:
    """A field element (a seed, a private key) as 32 little-endian bytes."""
    return value.to_bytes(KEY_BYTES, "little")
