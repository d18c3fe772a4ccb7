"""Who may ``Join``, and how fast a registered caller may call: budgets that survive new ids.

A ``Join`` is cheap for a client and costs the coordinator a registry entry, so new identities
are budgeted before they fill ``max_clients``. ``JoinGate.admit`` spends one token of each
budget that applies, and refuses with ``ResourceExhausted`` and a retry hint when one is empty:

- **global**: every new id, whoever asks (``join_global_per_s``, ``join_global_burst``): what
  an attacker rotating source addresses (or holding many tokens) cannot get around;
- **per peer address**, without per-client tokens (``join_per_peer_per_s``,
  ``join_burst_per_peer``): the port is left out, a new connection is no new identity. Under
  per-client tokens the token is the identity, and devices behind one NAT are not throttled
  together;
- **per token** (``join_per_token_per_s``, ``join_burst_per_token``) with at most
  ``max_ids_per_token`` live ids per token name.

Once registered, a caller spends the **request-rate budget of its identity**, not of its id
(``CallerCheck``): under per-client tokens the token's client name, without them the peer
address together with the name the client joined under. An id that joins again under the same
identity (after it expired, was refused, or left) inherits what its identity had left instead
of a fresh bucket. Without tokens a client that joins under a new name is a new identity, and
only the Join budgets bound those (``docs/deployment.md``, "Identities").

The peer address reaches the gate through ``calling_from`` (``fedlink.coordinator.auth``: a
context variable the gRPC edge sets around every call). Buckets live in bounded LRUs, so a
flood from many addresses or names cannot grow them either.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from fedlink.coordinator.auth import calling_from, peer_address, peer_host
from fedlink.coordinator.config import LimitsConfig
from fedlink.coordinator.limits import Limiter, TokenBucket
from fedlink.coordinator.registry import ClientRegistry
from fedlink.errors import ResourceExhausted

__all__ = ["MAX_TRACKED", "CallerCheck", "JoinGate", "calling_from", "peer_host"]

MAX_TRACKED = 65_536
"""Buckets kept per kind; the least recently used go first (a full bucket is lost then)."""


class _Buckets:
    """Token buckets by key, at most ``MAX_TRACKED`` of them (least recently used dropped)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, key: str, now: float) -> float:
        """Spend one token of ``key``'s bucket; the seconds to wait when none is left."""
        if self.rate <= 0:
            return 0.0
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.burst, self.burst, now)
        self._buckets[key] = bucket
        while len(self._buckets) > MAX_TRACKED:
            self._buckets.popitem(last=False)
        return bucket.take(now)


class JoinGate:
    """Enforces ``LimitsConfig``'s ``Join`` budgets; see the module docstring."""

    def __init__(self, limits: LimitsConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._peers = _Buckets(limits.join_per_peer_per_s, limits.join_burst_per_peer)
        self._tokens = _Buckets(limits.join_per_token_per_s, limits.join_burst_per_token)
        self._everyone = _Buckets(limits.join_global_per_s, limits.join_global_burst)

    def admit(self, token_name: str | None, live_ids: Callable[[str], int]) -> None:
        """Let one new id through, or raise ``ResourceExhausted``.

        ``token_name``: the caller's per-client token name (``None`` without per-client
        tokens); ``live_ids(name)`` counts the ids that name holds now.
        """
        now = self._clock()
        if token_name is None:
            peer = peer_address()
            if peer:
                self._refuse_if(self._peers.take(peer, now), f"Joins from {peer}",
                                self.limits.join_per_peer_per_s, "join_per_peer_per_s")
        else:
            cap = self.limits.max_ids_per_token
            if cap and live_ids(token_name) >= cap:
                raise ResourceExhausted(
                    f"token {token_name[:64]!r} already holds {cap} live client ids "
                    "(limits.max_ids_per_token); Leave with one, or wait for it to expire",
                    retry_after_s=self.limits.retry_after_s)
            self._refuse_if(self._tokens.take(token_name, now), f"Joins with token "
                            f"{token_name[:64]!r}", self.limits.join_per_token_per_s,
                            "join_per_token_per_s")
        self._refuse_if(self._everyone.take("", now), "new client ids",
                        self.limits.join_global_per_s, "join_global_per_s")

    @staticmethod
    def _refuse_if(wait: float, what: str, rate: float, key: str) -> None:
        if wait > 0:
            raise ResourceExhausted(f"{what} exceed {rate:g}/s (limits.{key}); retry in "
                                    f"{wait:.3f}s", retry_after_s=wait)


class CallerCheck:
    """Admission of a registered caller on every call but ``Join``: known (and marked seen),
    then within its identity's request rate (module docstring). Shared by the coordinator's
    pieces."""

    def __init__(self, registry: ClientRegistry, limiter: Limiter,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.limiter = limiter
        self._clock = clock
        limits = limiter.limits
        self._rates = _Buckets(limits.requests_per_s, limits.request_burst)

    def admit(self, client_id: str) -> None:
        """``Unauthenticated`` for an unknown id; ``ResourceExhausted`` over its rate."""
        self.registry.touch(client_id)
        wait = self._rates.take(self.registry.budget_key(client_id), self._clock())
        if wait > 0:
            limits = self.limiter.limits
            raise ResourceExhausted(
                f"client {client_id!r} exceeds {limits.requests_per_s:g} requests/s (burst "
                f"{limits.request_burst}, limits.requests_per_s); retry in {wait:.3f}s",
                retry_after_s=wait)
