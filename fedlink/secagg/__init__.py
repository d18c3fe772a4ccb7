"""Secure aggregation: the coordinator learns only the sum of the clients' updates.

SecAgg (Bonawitz et al. 2017) and its sparse-graph form SecAgg+ (Bell et al. 2020) as pure
functions and small state objects: ``SecureClient`` and ``SecureSum`` run the four phases
(advertise keys, share keys, masked input, unmask) over whatever carries their messages;
``encoding`` turns updates into integers in Z_m and the sum back; ``run_round`` runs a whole
round in this process with dropouts. ``SharedRandK`` is compression that survives masking (the
group keeps the same coordinates; ``packing`` sends ``modulus_bits`` bits per value);
``SkellamConfig`` is distributed differential privacy (each client adds its share of integer
noise). Primitives come from ``cryptography`` (X25519, HKDF,
AES-GCM, AES-CTR); Shamir sharing is over GF(2^255 - 19).
"""

from fedlink.secagg.base import (
    AdvertiseKeys,
    EncryptedShare,
    MaskedInput,
    SecAggAborted,
    SecAggConfig,
    SecAggError,
    UnmaskRequest,
    UnmaskShares,
)
from fedlink.secagg.ddp import SkellamConfig
from fedlink.secagg.encoding import decode_sum, encode, encode_weighted, weighted_mean
from fedlink.secagg.protocol import SecureClient, SecureSum
from fedlink.secagg.simulate import SecureRound, run_round, run_secure_sum
from fedlink.secagg.sparse import SharedRandK, round_seed, scatter

__all__ = [
    "AdvertiseKeys",
    "EncryptedShare",
    "MaskedInput",
    "SecAggAborted",
    "SecAggConfig",
    "SecAggError",
    "SecureClient",
    "SecureRound",
    "SecureSum",
    "SharedRandK",
    "SkellamConfig",
    "UnmaskRequest",
    "UnmaskShares",
    "decode_sum",
    "encode",
    "encode_weighted",
    "round_seed",
    "run_round",
    "run_secure_sum",
    "scatter",
    "weighted_mean",
]
