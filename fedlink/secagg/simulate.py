"""One secure round run in this process, with dropouts: the reference the tests and the
benchmark use, and what a virtual run charges (bytes per phase) for a secure round.

Clients drop at the two places that cost the most: after sharing their keys (the coordinator
must then remove the pairwise masks their neighbours added) and after delivering their masked
input (their self mask must be rebuilt from neighbours, and they no longer answer for others).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedlink.secagg.base import SecAggConfig
from fedlink.secagg.encoding import encode, encode_weighted
from fedlink.secagg.protocol import SecureClient, SecureSum
from fedlink.secagg.shamir import RandomBelow


@dataclass
class SecureRound:
    """What a simulated secure round produced."""

    total: np.ndarray
    """The unmasked integer sum (uint32 in Z_m) of the delivered inputs."""
    plain_total: np.ndarray
    """The integer sum of the same clients' encoded inputs, computed in the clear (mod m)."""
    delivered: frozenset[int]
    bytes_up: dict[int, int] = field(default_factory=dict)
    """Bytes each client sent, all phases (keys, shares, masked input, unmask answer)."""
    bytes_down: dict[int, int] = field(default_factory=dict)
    """Bytes each client was sent (the roster, its shares, the unmask request)."""
    clipped: int = 0

    @property
    def exact(self) -> bool:
        """Whether the unmasked sum equals the plain sum of the delivered clients' inputs."""
        return bool(np.array_equal(self.total, self.plain_total))


def run_round(updates: Sequence[np.ndarray], weights: Sequence[float] | None,
              config: SecAggConfig, *, drop_after_sharing: Collection[int] = (),
              drop_after_input: Collection[int] = (), seed: int = 0,
              random_below: RandomBelow | None = None) -> SecureRound:
    """A secure round of ``len(updates)`` clients (ids 0..n-1) with the given dropouts.

    With ``weights`` each client sends ``[w * update, w]`` (``weighted_mean`` reads the sum);
    with None, its update alone (``decode_sum`` reads the sum).
    """
    rng = np.random.default_rng(seed)
    if weights is None:
        encoded = [encode(u, config, rng) for u in updates]
    else:
        encoded = [encode_weighted(u, w, config, rng)
                   for u, w in zip(updates, weights, strict=True)]
    result = run_secure_sum([e.values for e in encoded], config,
                            drop_after_sharing=drop_after_sharing,
                            drop_after_input=drop_after_input, seed=seed,
                            random_below=random_below)
    result.clipped = sum(encoded[i].clipped for i in result.delivered)
    return result


def run_secure_sum(inputs: Sequence[np.ndarray], config: SecAggConfig, *,
                   drop_after_sharing: Collection[int] = (),
                   drop_after_input: Collection[int] = (), seed: int = 0,
                   random_below: RandomBelow | None = None) -> SecureRound:
    """The secure sum of ``inputs`` (integer vectors in Z_m, one per client, ids 0..n-1)
    with the given dropouts; ``seed`` is the round id and the graph's seed."""
    n, size = len(inputs), int(np.asarray(inputs[0]).size)
    extra = {} if random_below is None else {"random_below": random_below}
    clients = [SecureClient(i, config, seed, size, **extra) for i in range(n)]
    server = SecureSum(config, seed, size, graph_seed=seed)
    up = dict.fromkeys(range(n), 0)
    down = dict.fromkeys(range(n), 0)
    adverts = [c.advertise() for c in clients]
    for a in adverts:
        up[a.client] += a.wire_bytes()
    roster = server.collect_keys(adverts)
    for c in clients:
        down[c.client] += sum(a.wire_bytes() for a in roster)
        shares = c.share_keys(roster, seed)
        up[c.client] += sum(s.wire_bytes() for s in shares)
        server.collect_shares(c.client, shares)
    server.close_sharing()
    going_on = [c for c in clients if c.client not in set(drop_after_sharing)]
    for c in going_on:
        given = server.shares_for(c.client)
        down[c.client] += sum(s.wire_bytes() for s in given)
        c.receive_shares(given)
        masked = c.masked_input(np.asarray(inputs[c.client], dtype=np.uint32))
        up[c.client] += masked.wire_bytes(config)
        server.collect_masked(masked)
    request = server.unmask_request()
    answers = []
    for c in going_on:
        if c.client in set(drop_after_input):
            continue
        down[c.client] += 8 * (len(request.survivors) + len(request.dropped))
        answer = c.unmask(request)
        up[c.client] += answer.wire_bytes()
        answers.append(answer)
    total, _ = server.finish(answers)
    plain = np.zeros(size, dtype=np.uint32)
    for i in request.survivors:
        plain += np.asarray(inputs[i], dtype=np.uint32)
    plain &= np.uint32(config.modulus - 1)
    return SecureRound(total, plain, request.survivors, up, down)
