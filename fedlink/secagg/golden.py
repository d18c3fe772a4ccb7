"""Golden vectors of secure aggregation: every derivation a second implementation must match.

``python -m fedlink.secagg.golden protos/testdata`` writes ``secagg_*.json``
(``docs/protocol.md``, "Secure aggregation" says what each field means):

- ``secagg_keys.json``: X25519 private keys (field elements), their public keys, and the keys
  two clients agree for each purpose and round (HKDF-SHA256 of the shared secret);
- ``secagg_masks.json``: the PRG (AES-256-CTR keystream as little-endian uint32 words) for a
  few seeds, a pairwise mask with both signs, Shamir shares of a secret from given
  coefficients, and one share encrypted with AES-256-GCM (key, nonce, associated data);
- ``secagg_encoding.json``: values clipped, scaled and stochastically rounded, with the uniform
  draws that decided each rounding; their packing at the ring's bits; the group's random-k
  seed and kept coordinates for a few rounds, and ``k`` for a few densities; a SecAgg+ graph
  (the cycle's order and each client's neighbours); a weighted update under group random-k
  (``[w * kept values, w]``, ``weighted``); one client's distributed-DP encoding (``ddp``:
  clipping, conditional rounding with every draw it took, its noise share, and the
  accounting's bounds and RDP);
- ``secagg_round.json``: one whole secure round of four clients, one of which drops after
  sharing its keys: each client's random draws, every message of the four phases, and the
  unmasked sum.

Every random choice is written down, so the files need no particular random generator.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

from fedlink.compress.sparse import kept_count
from fedlink.secagg import crypto, shamir
from fedlink.secagg.base import SecAggConfig
from fedlink.secagg.ddp import RDP_ORDERS, SkellamConfig
from fedlink.secagg.encoding import encode, encode_weighted
from fedlink.secagg.graph import cycle_order, neighbours
from fedlink.secagg.packing import pack
from fedlink.secagg.protocol import SecureClient, SecureSum
from fedlink.secagg.sparse import SharedRandK, group_indices, round_seed

ROUND_ID = 7
ROUND_CLIENTS = 4
ROUND_SIZE = 6
ROUND_DROPPED = 3
ROUND_CONFIG = SecAggConfig(modulus_bits=16, quantization_bits=8, clip=1.0, max_clients=4)


def element(value: int) -> str:
    """A field element (key, seed, share) as the hex of its 32 little-endian bytes."""
    return crypto.element_bytes(value).hex()


def words(values: np.ndarray) -> list[int]:
    """uint32 values as JSON integers."""
    return [int(v) for v in np.asarray(values, dtype=np.uint32)]


class Recorded:
    """``random_below`` that draws from ``random.Random(seed)`` and writes every draw down."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.draws: list[int] = []

    def __call__(self, bound: int) -> int:
        value = self._rng.randrange(bound)
        self.draws.append(value)
        return value


def replay(draws: list[int]) -> Iterator[int]:
    """The draws again, in order (``random_below`` for a replayed client: ``next``)."""
    return iter(draws)


def keys_vector() -> dict[str, Any]:
    """Two clients' keys and what they agree, per purpose and round."""
    draw = Recorded(1)
    a, b = crypto.private_key(draw), crypto.private_key(draw)
    agreed = [{"purpose": purpose, "round": r,
               "info": f"fedlink-secagg/{purpose}/{r}",
               "key": crypto.agree(a, crypto.public_key(b), purpose, r).hex()}
              for purpose in ("share", "mask") for r in (0, ROUND_ID)]
    return {"private_a": element(a), "private_b": element(b),
            "public_a": crypto.public_key(a).hex(), "public_b": crypto.public_key(b).hex(),
            "agreed": agreed}


def masks_vector() -> dict[str, Any]:
    """PRG expansions, a signed pairwise mask, Shamir shares and one encrypted share."""
    seeds = [bytes(32), bytes(range(32)), bytes(range(255, 223, -1))]
    prg = [{"seed": s.hex(), "words": words(crypto.expand(s, 12))} for s in seeds]
    mask = crypto.expand(seeds[1], 5)
    coefficients = [shamir.PRIME - 2, 123456789]
    draws = replay(coefficients)
    secret = (1 << 254) + 12345
    shares = shamir.split(secret, [1, 2, 3, 4], 3, lambda n: next(draws))
    key, plain = bytes(range(100, 132)), bytes(range(64))
    return {
        "prg": prg,
        "pairwise": {"seed": seeds[1].hex(), "modulus_bits": 16,
                     "plus": words(mask & np.uint32(0xFFFF)),
                     "minus": words((np.uint32(0) - mask) & np.uint32(0xFFFF))},
        "shamir": {"prime": str(shamir.PRIME), "secret": element(secret), "threshold": 3,
                   "coefficients": [element(c) for c in coefficients],
                   "shares": {str(x): element(y) for x, y in shares.items()}},
        "share_encryption": {"key": key.hex(), "plaintext": plain.hex(), "round": ROUND_ID,
                             "sender": 1, "receiver": 2,
                             "nonce": crypto.share_nonce(1, 2).hex(),
                             "associated_data": f"fedlink-secagg/share/{ROUND_ID}/1/2",
                             "ciphertext": crypto.encrypt(key, plain, ROUND_ID, 1, 2).hex()},
    }


def encoding_vector() -> dict[str, Any]:
    """Values to integers (with their draws), packing, and the group's random-k."""
    config = SecAggConfig.for_cohort(100, 5, 0.3)
    values = np.array([-0.5, -0.3, -0.1234, 0.0, 0.01, 0.15, 0.2999, 0.3, 1e-9, 0.45])
    draws = np.random.default_rng(11).random(values.size)
    encoded = encode(values, config, np.random.default_rng(11)).values
    randk = SharedRandK(0.25)
    rounds = [{"run_seed": 5, "round": r, "seed": str(round_seed(5, r)),
               "indices": [int(i) for i in randk.indices(round_seed(5, r), 40)]}
              for r in range(3)]
    clients = [0, 2, 3, 5, 8, 9, 11, 12, 14]
    return {
        "config": {"modulus_bits": config.modulus_bits, "quantization_bits": config.bits,
                   "clip": config.clip, "max_clients": config.max_clients},
        "values": values.tolist(), "draws": draws.tolist(), "encoded": words(encoded),
        "packed": pack(encoded, config.modulus_bits).hex(),
        "randk": {"density": randk.density, "size": 40, "rounds": rounds,
                  "kept_count": {str(d): kept_count(d, 100) for d in (0.07, 0.25, 0.5)}},
        "graph": {"seed": 7, "neighbours": 4, "clients": clients,
                  "order": cycle_order(clients, 7),
                  "graph": {str(c): list(v) for c, v in neighbours(clients, 4, 7).items()}},
        "weighted": weighted_vector(), "ddp": ddp_vector(),
    }


class LoggedDraws:
    """The two draws the encodings make of a ``numpy`` generator, each written down."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.uniforms: list[list[float]] = []
        self.poissons: list[list[int]] = []

    def random(self, size: Any) -> np.ndarray:
        values = self._rng.random(size)
        self.uniforms.append(values.tolist())
        return values

    def poisson(self, lam: float, size: Any) -> np.ndarray:
        values = self._rng.poisson(lam, size)
        self.poissons.append([int(v) for v in values])
        return values

    def generator(self) -> np.random.Generator:
        """This object where an encoding takes a generator (it uses only these two draws)."""
        return cast(np.random.Generator, self)


WEIGHTED_UPDATE = np.linspace(-1.2, 0.9, 40)
"""40 values, some beyond the ring's clip of 1 once weighted by 1 (not by 0.5)."""
DDP = SkellamConfig(clip_norm=1.0, noise_multiplier=1.0, clients=4, size=8,
                    granularity_bits=4, modulus_bits=16)
DDP_UPDATE = np.array([0.9, -0.7, 0.5, -0.3, 0.2, 1.1, -0.05, 0.0])
"""Norm about 1.7: clipped to ``DDP.clip_norm``."""


def weighted_vector() -> dict[str, Any]:
    """A stale member's update under group random-k: ``[w * kept values, w]`` encoded."""
    weight, density, run_seed, round_id = 0.5, 0.25, 5, 1
    indices = group_indices(density, run_seed, round_id, WEIGHTED_UPDATE.size)
    assert indices is not None
    draws = LoggedDraws(12)
    encoded = encode_weighted(WEIGHTED_UPDATE[indices], weight, ROUND_CONFIG, draws.generator())
    return {"config": {"modulus_bits": ROUND_CONFIG.modulus_bits, "clip": ROUND_CONFIG.clip,
                       "quantization_bits": ROUND_CONFIG.bits},
            "update": WEIGHTED_UPDATE.tolist(), "weight": weight, "density": density,
            "run_seed": run_seed, "round": round_id, "indices": [int(i) for i in indices],
            "draws": draws.uniforms[0], "encoded": words(encoded.values)}


def ddp_vector() -> dict[str, Any]:
    """One client's distributed-DP encoding of a fresh update (``weight * clipped``, weight
    1), whose first rounding lands beyond the norm bound and is drawn again."""
    weight, config = 1.0, DDP
    norm = float(np.linalg.norm(DDP_UPDATE))
    clipped = DDP_UPDATE * min(1.0, config.clip_norm / norm)
    draws = LoggedDraws(20)  # a seed whose first rounding is refused
    encoded = config.encode(weight * clipped, draws.generator())
    orders = [2, 8, 32]
    rdp = config.rdp()
    return {"config": {"clip_norm": config.clip_norm, "noise_multiplier": config.noise_multiplier,
                       "clients": config.clients, "size": config.size,
                       "granularity_bits": config.granularity_bits,
                       "modulus_bits": config.modulus_bits, "beta": config.beta},
            "update": DDP_UPDATE.tolist(), "weight": weight,
            "gamma": config.gamma, "mu": config.variance, "norm_bound": config.norm_bound,
            "l1_bound": config.l1_bound,
            "rounding_draws": draws.uniforms, "noise_plus": draws.poissons[0],
            "noise_minus": draws.poissons[1], "encoded": words(encoded),
            "rdp": {str(a): float(rdp[RDP_ORDERS.index(a)]) for a in orders}}


def round_vector() -> dict[str, Any]:
    """One secure round of four clients; client 3 drops after sharing its keys."""
    config, n, size = ROUND_CONFIG, ROUND_CLIENTS, ROUND_SIZE
    recorders = [Recorded(100 + i) for i in range(n)]
    clients = [SecureClient(i, config, ROUND_ID, size, recorders[i]) for i in range(n)]
    server = SecureSum(config, ROUND_ID, size, graph_seed=ROUND_ID)
    adverts = [c.advertise() for c in clients]
    roster = server.collect_keys(adverts)
    shares = {c.client: c.share_keys(roster, ROUND_ID) for c in clients}
    for client, sent in shares.items():
        server.collect_shares(client, sent)
    server.close_sharing()
    inputs = {i: np.array([(17 * i + 5 * k) % config.levels for k in range(size)], np.uint32)
              for i in range(n) if i != ROUND_DROPPED}
    masked = {}
    for c in clients[:ROUND_DROPPED]:
        c.receive_shares(server.shares_for(c.client))
        masked[c.client] = c.masked_input(inputs[c.client])
        server.collect_masked(masked[c.client])
    request = server.unmask_request()
    answers = [c.unmask(request) for c in clients[:ROUND_DROPPED]]
    total, count = server.finish(answers)
    return {
        "config": {"modulus_bits": config.modulus_bits, "quantization_bits": config.bits,
                   "clip": config.clip, "max_clients": config.max_clients,
                   "neighbours": config.neighbours, "threshold": config.threshold},
        "round": ROUND_ID, "graph_seed": ROUND_ID, "size": size,
        "draws": {str(i): [element(d) for d in r.draws] for i, r in enumerate(recorders)},
        "advertise": [{"client": a.client, "cipher_public": a.cipher_public.hex(),
                       "mask_public": a.mask_public.hex()} for a in adverts],
        "shares": [{"sender": s.sender, "receiver": s.receiver,
                    "ciphertext": s.ciphertext.hex()} for sent in shares.values() for s in sent],
        "dropped_after_sharing": [ROUND_DROPPED],
        "inputs": {str(i): words(v) for i, v in inputs.items()},
        "masked": {str(i): pack(m.values, config.modulus_bits).hex() for i, m in masked.items()},
        "unmask_request": {"survivors": sorted(request.survivors),
                           "dropped": sorted(request.dropped)},
        "unmask": [{"client": a.client,
                    "seed_shares": {str(j): element(y) for j, (_, y) in a.seed_shares.items()},
                    "key_shares": {str(j): element(y) for j, (_, y) in a.key_shares.items()}}
                   for a in answers],
        "sum": words(total), "count": count,
    }


def vectors() -> dict[str, dict[str, Any]]:
    """Every secure-aggregation golden file, by name."""
    return {"secagg_keys.json": keys_vector(), "secagg_masks.json": masks_vector(),
            "secagg_encoding.json": encoding_vector(), "secagg_round.json": round_vector()}


def write_vectors(folder: Path) -> list[Path]:
    """Write the files into ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in vectors().items():
        path = folder / name
        path.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
        written.append(path)
    return written


def main() -> None:
    """``python -m fedlink.secagg.golden FOLDER``: (re)write the secure-aggregation vectors."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    for path in write_vectors(parser.parse_args().folder):
        print(path)


if __name__ == "__main__":
    main()
