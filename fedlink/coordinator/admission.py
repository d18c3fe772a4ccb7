"""Who may ``Join``: rate limits per peer address and per token, and live ids per token.

A ``Join`` is cheap for a client and costs the coordinator a registry entry, so an
unauthenticated flood (or one holder of a per-client token minting ids) must be slowed down
before it fills ``max_clients``. ``JoinGate.admit`` takes one token from the bucket of the
caller's peer address (``ipv4:10.0.0.7``: the port is left out, a new connection is no new
identity) and, under per-client tokens, from the bucket of the token's client name, and
refuses a name that already holds ``max_ids_per_token`` live ids. Every refusal is
``ResourceExhausted`` with a retry hint.

The peer address reaches the gate through ``calling_from`` (a context variable the gRPC
servicer sets around ``Join``), the way ``fedlink.coordinator.auth`` passes the caller's name.
The buckets live in a bounded LRU, so a flood from many addresses cannot grow them either.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from fedlink.coordinator.config import LimitsConfig
from fedlink.coordinator.limits import Limiter, TokenBucket
from fedlink.coordinator.registry import ClientRegistry
from fedlink.errors import ResourceExhausted

MAX_TRACKED = 65_536
"""Buckets kept per kind; the least recently used go first (a full bucket is lost then)."""

_PEER: contextvars.ContextVar[str] = contextvars.ContextVar("fedlink_peer", default="")


@contextlib.contextmanager
def calling_from(peer: str) -> Iterator[None]:
    """Handle the enclosed call as coming from gRPC peer ``peer`` (``ipv4:1.2.3.4:5678``)."""
    reset = _PEER.set(peer_host(peer))
    try:
        yield
    finally:
        # A streaming handler cut short is closed by whichever task finalises its generator,
        # in another context: there is nothing of this call's to restore there.
        with contextlib.suppress(ValueError):
            _PEER.reset(reset)


def peer_host(peer: str) -> str:
    """The address of a gRPC peer string without its port (``ipv6:[::1]:5`` -> ``ipv6:[::1]``)."""
    if peer.startswith(("ipv4:", "ipv6:")):
        host, _, port = peer.rpartition(":")
        return host if port.isdigit() else peer
    return peer


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
    """Enforces ``LimitsConfig``'s ``Join`` limits; see the module docstring."""

    def __init__(self, limits: LimitsConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._peers = _Buckets(limits.join_per_peer_per_s, limits.join_burst_per_peer)
        self._tokens = _Buckets(limits.join_per_token_per_s, limits.join_burst_per_token)

    def admit(self, token_name: str | None, live_ids: Callable[[str], int]) -> None:
        """Let one ``Join`` through, or raise ``ResourceExhausted``.

        ``token_name``: the caller's per-client token name (``None`` without per-client
        tokens); ``live_ids(name)`` counts the ids that name holds now.
        """
        now = self._clock()
        peer = _PEER.get()
        if peer:
            self._refuse_if(self._peers.take(peer, now), f"Joins from {peer}",
                            self.limits.join_per_peer_per_s)
        if token_name is None:
            return
        cap = self.limits.max_ids_per_token
        if cap and live_ids(token_name) >= cap:
            raise ResourceExhausted(
                f"token {token_name[:64]!r} already holds {cap} live client ids "
                "(limits.max_ids_per_token); Leave with one, or wait for it to expire",
                retry_after_s=self.limits.retry_after_s)
        self._refuse_if(self._tokens.take(token_name, now), f"Joins with token "
                        f"{token_name[:64]!r}", self.limits.join_per_token_per_s)

    @staticmethod
    def _refuse_if(wait: float, what: str, rate: float) -> None:
        if wait > 0:
            raise ResourceExhausted(f"{what} exceed {rate:g}/s; retry in {wait:.3f}s",
                                    retry_after_s=wait)


class CallerCheck:
    """Admission of a registered caller on every call but ``Join``: known (and marked seen),
    then within its request rate. Shared by the coordinator's pieces."""

    def __init__(self, registry: ClientRegistry, limiter: Limiter) -> None:
        self.registry = registry
        self.limiter = limiter

    def admit(self, client_id: str) -> None:
        """``Unauthenticated`` for an unknown id; ``ResourceExhausted`` over its rate."""
        self.registry.touch(client_id)
        self.limiter.admit(client_id)
