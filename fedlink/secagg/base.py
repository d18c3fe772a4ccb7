"""The secure-aggregation contract: settings, errors, and the messages of one secure round.

A secure round (SecAgg, Bonawitz et al. CCS 2017; with a sparse neighbour graph, SecAgg+,
Bell et al. CCS 2020) has four phases, each a message from every client still taking part and
an answer from the coordinator:

1. **advertise keys**: each client sends two X25519 public keys (``AdvertiseKeys``): one to
   agree the keys that encrypt its shares for a neighbour, one to agree its pairwise masks;
2. **share keys**: each client splits its self-mask seed and its mask private key into Shamir
   shares, one per neighbour, and sends them encrypted to each neighbour (``EncryptedShare``),
   through the coordinator, which cannot read them;
3. **masked input**: each client sends its update as integers in Z_m plus its self mask plus
   the pairwise masks agreed with its neighbours (``MaskedInput``); the coordinator sees only
   this sum of masks and data;
4. **unmask**: the coordinator names who delivered a masked input and who did not; each client
   still there answers with its shares of the survivors' self-mask seeds and of the dropped
   clients' mask keys (``UnmaskShares``), never both for one client. With ``threshold`` shares
   of each, the coordinator removes every mask and learns only the sum.

These are fedlink's own types (frozen dataclasses); they hold bytes and integers, no generated
protobuf types and no numpy arrays except the masked vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fedlink.errors import ConfigError, SecAggError

KEY_BYTES = 32
"""Bytes of an X25519 key, public or private."""


class SecAggAborted(SecAggError):
    """Too few clients are left to unmask the sum: the round's result is lost, and why."""


@dataclass(frozen=True)
class SecAggConfig:
    """How a secure round encodes updates and how many clients it needs.

    ``modulus_bits``: the sum is computed in Z_m with ``m = 2**modulus_bits`` (8..32; each
    masked coordinate travels in ``modulus_bits`` bits, packed (``fedlink.secagg.packing``): 3
    bytes by default, less than a float32). ``max_clients``: the most clients one sum may hold.
    ``clip``: every value a client encodes is clipped to ``[-clip, clip]`` (after the update's
    L2 norm bound, which is the privacy pipeline's). ``quantization_bits``: a value maps to an
    integer in ``[0, 2**quantization_bits]`` by stochastic rounding, so the quantization step is
    ``2 * clip / 2**quantization_bits`` and the rounding is unbiased; by default the most the
    modulus allows, ``modulus_bits - ceil(log2(max_clients + 1))`` (16 for the defaults: a step
    of 3.1e-5 for ``clip`` 1). The modulus must hold the sum of ``max_clients`` such integers
    (checked). ``neighbours``: how many neighbours each client masks with and shares with (None:
    every other client of the round, SecAgg; a number: SecAgg+'s sparse graph, tolerating fewer
    dropouts). ``threshold``: the fraction of a client's neighbours whose shares rebuild its
    secrets (a coalition smaller than that learns nothing from them); at unmasking, every client
    needs that many neighbours still answering.
    """

    modulus_bits: int = 24
    quantization_bits: int | None = None
    clip: float = 1.0
    max_clients: int = 255
    neighbours: int | None = None
    threshold: float = 0.5

    def __post_init__(self) -> None:
        if not 8 <= self.modulus_bits <= 32:
            raise ConfigError(f"secagg modulus_bits: 8..32, got {self.modulus_bits}")
        if self.max_clients < 2:
            raise ConfigError(f"secagg max_clients: at least 2, got {self.max_clients}")
        if self.quantization_bits is None:
            room = self.modulus_bits - math.ceil(math.log2(self.max_clients + 1))
            object.__setattr__(self, "quantization_bits", room)
        if not 1 <= self.bits < self.modulus_bits:
            raise ConfigError(f"secagg quantization_bits: 1..modulus_bits-1, got "
                              f"{self.quantization_bits} (modulus_bits {self.modulus_bits}, "
                              f"max_clients {self.max_clients})")
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise ConfigError(f"secagg clip: a positive number, got {self.clip}")
        if self.max_clients * (1 << self.bits) >= (1 << self.modulus_bits):
            raise ConfigError(
                f"secagg: the sum of {self.max_clients} values of {self.bits} bits "
                f"does not fit in Z_m with modulus_bits {self.modulus_bits}: lower "
                f"quantization_bits to at most "
                f"{self.modulus_bits - math.ceil(math.log2(self.max_clients + 1))} or "
                f"max_clients")
        if self.neighbours is not None and self.neighbours < 2:
            raise ConfigError(f"secagg neighbours: at least 2 (or none for all), got "
                              f"{self.neighbours}")
        if not 0 < self.threshold < 1:
            raise ConfigError(f"secagg threshold: a fraction in (0, 1), got {self.threshold}")

    @classmethod
    def for_cohort(cls, clients: int, quantization_bits: int, clip: float, *,
                   neighbours: int | None = None, threshold: float = 0.5) -> SecAggConfig:
        """The smallest ring that holds the sum of ``clients`` values of ``quantization_bits``
        bits: ``modulus_bits = quantization_bits + ceil(log2(clients + 1))`` (refused above 32)."""
        if clients < 2 or quantization_bits < 1:
            raise ConfigError(f"secagg: a cohort of at least 2 and at least 1 quantization "
                              f"bit, got {clients} and {quantization_bits}")
        return cls(modulus_bits=quantization_bits + math.ceil(math.log2(clients + 1)),
                   quantization_bits=quantization_bits, clip=clip, max_clients=clients,
                   neighbours=neighbours, threshold=threshold)

    @property
    def bits(self) -> int:
        """``quantization_bits`` as set or derived."""
        assert self.quantization_bits is not None  # set in __post_init__
        return self.quantization_bits

    @property
    def modulus(self) -> int:
        """``m``, the size of the ring the sum is computed in."""
        return 1 << self.modulus_bits

    @property
    def levels(self) -> int:
        """``2**quantization_bits``: the integer a value of ``clip`` encodes to."""
        return 1 << self.bits

    @property
    def step(self) -> float:
        """The quantization step, ``2 * clip / levels``."""
        return 2 * self.clip / self.levels

    def shares_needed(self, neighbours: int) -> int:
        """Shares that rebuild a secret shared among ``neighbours`` clients (at least 2)."""
        return max(2, math.ceil(self.threshold * neighbours))

    def vector_bytes(self, size: int) -> int:
        """Bytes a masked vector of ``size`` values takes on the wire, packed."""
        return (size * self.modulus_bits + 7) // 8


@dataclass(frozen=True)
class AdvertiseKeys:
    """Phase 1: a client's two X25519 public keys (32 bytes each)."""

    client: int
    cipher_public: bytes
    mask_public: bytes

    def wire_bytes(self) -> int:
        """Its size on the wire (ids are 4 bytes)."""
        return 4 + len(self.cipher_public) + len(self.mask_public)

    def keyed(self) -> bool:
        """Whether it carries both keys (a roster names non-neighbours by index alone)."""
        return len(self.cipher_public) == KEY_BYTES and len(self.mask_public) == KEY_BYTES


@dataclass(frozen=True)
class EncryptedShare:
    """Phase 2: ``sender``'s shares for ``receiver``, AES-GCM encrypted under their agreed key
    (the nonce is the pair's ids: see ``fedlink.secagg.crypto.share_nonce``)."""

    sender: int
    receiver: int
    ciphertext: bytes

    def wire_bytes(self) -> int:
        """Its size on the wire (two 4-byte ids and the ciphertext with its tag)."""
        return 8 + len(self.ciphertext)


@dataclass(frozen=True)
class MaskedInput:
    """Phase 3: the masked integer vector (uint32 values in ``[0, m)``; on the wire packed
    ``modulus_bits`` bits apiece, ``fedlink.secagg.packing``)."""

    client: int
    values: np.ndarray = field(repr=False)

    def wire_bytes(self, config: SecAggConfig) -> int:
        """Its size on the wire: a 4-byte id and the values packed at the config's bits."""
        return 4 + config.vector_bytes(int(self.values.size))


@dataclass(frozen=True)
class UnmaskRequest:
    """Phase 4, from the coordinator: who delivered a masked input and who did not."""

    survivors: frozenset[int]
    dropped: frozenset[int]


@dataclass(frozen=True)
class UnmaskShares:
    """Phase 4, a client's answer: its share (x, y) of each survivor's self-mask seed and of
    each dropped neighbour's mask key, by the client the secret belongs to."""

    client: int
    seed_shares: dict[int, tuple[int, int]]
    key_shares: dict[int, tuple[int, int]]

    def wire_bytes(self) -> int:
        """Its size on the wire (``size_of`` its shares)."""
        return self.size_of(len(self.seed_shares) + len(self.key_shares))

    @staticmethod
    def size_of(shares: int) -> int:
        """The wire size of an answer of ``shares`` shares: an owner id, then an x and a
        32-byte y per share."""
        return 4 + 40 * shares
