"""Secure aggregation: the coordinator learns only the sum of the clients' updates.

SecAgg (Bonawitz et al. 2017) and its sparse-graph form SecAgg+ (Bell et al. 2020) as pure
functions and small state objects: ``SecureClient`` and ``SecureSum`` run the four phases
(advertise keys, share keys, masked input, unmask) over whatever carries their messages;
``encoding`` turns updates into integers in Z_m and the sum back; ``run_round`` runs a whole
round in this process with dropouts. Primitives come from ``cryptography`` (X25519, HKDF,
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
from fedlink.secagg.encoding import decode_sum, encode, encode_weighted, weighted_mean
from fedlink.secagg.protocol import SecureClient, SecureSum
from fedlink.secagg.simulate import SecureRound, run_round

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
    "UnmaskRequest",
    "UnmaskShares",
    "decode_sum",
    "encode",
    "encode_weighted",
    "run_round",
    "weighted_mean",
]
