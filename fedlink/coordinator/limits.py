"""Overload protection: per-client request rate, concurrent uploads, and connected clients.

A ``Limiter`` answers every refusal with ``ResourceExhausted`` carrying ``retry_after_s``: the
servicer sends it as a ``google.rpc.RetryInfo`` in the rich status (``fedlink.wire.status``),
and the client SDK waits at least that long before trying again.

- **Request rate**: one token bucket per client id (``requests_per_s`` refill, ``request_burst``
  capacity); each call takes one token. The hint is the time until the next token.
- **Concurrent uploads**: at most ``max_uploads_per_client`` ``Upload`` streams per client at
  once; the hint is the configured ``retry_after_s``.
- **Connected clients**: ``Join`` is refused once ``max_clients`` are registered; the hint is
  the configured ``retry_after_s`` (a place frees when a client leaves).

Zero disables a limit. The limiter keeps state only for registered clients (callers check the
client id first) and forgets a client when it leaves.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fedlink.coordinator.config import LimitsConfig
from fedlink.errors import ResourceExhausted


@dataclass
class TokenBucket:
    """``capacity`` tokens, refilled at ``rate`` per second; ``take`` spends one."""

    rate: float
    capacity: float
    tokens: float
    updated: float

    def take(self, now: float) -> float:
        """Spend a token and return 0.0, or return the seconds until one is available."""
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class Limiter:
    """Enforces ``LimitsConfig``'s overload limits; see the module docstring."""

    def __init__(self, limits: LimitsConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._uploads: dict[str, dict[str, int]] = {}  # client -> upload id -> streams

    def admit(self, client_id: str) -> None:
        """Take one request token for ``client_id`` (``ResourceExhausted`` when none is left)."""
        rate = self.limits.requests_per_s
        if rate <= 0:
            return
        now = self._clock()
        bucket = self._buckets.get(client_id)
        if bucket is None:
            burst = float(self.limits.request_burst)
            bucket = self._buckets[client_id] = TokenBucket(rate, burst, burst, now)
        wait = bucket.take(now)
        if wait > 0:
            raise ResourceExhausted(
                f"client {client_id!r} exceeds {rate:g} requests/s (burst "
                f"{self.limits.request_burst}); retry in {wait:.3f}s", retry_after_s=wait)

    def check_join(self, connected: int) -> None:
        """Refuse a ``Join`` when ``connected`` clients already fill every place."""
        cap = self.limits.max_clients
        if cap > 0 and connected >= cap:
            raise ResourceExhausted(f"the coordinator already serves its maximum of {cap} "
                                    "clients; retry later",
                                    retry_after_s=self.limits.retry_after_s)

    @contextlib.contextmanager
    def upload_slot(self, client_id: str, upload_id: str = "") -> Iterator[None]:
        """Hold one of ``client_id``'s concurrent upload places for the ``with`` block.

        Places count distinct uploads, not streams: a stream that resumes ``upload_id`` shares
        the place of that upload's earlier stream, which may still look alive on a dead
        connection (the coordinator learns of the break late), so a client resuming its one
        upload is never refused as if it had started a second.
        """
        cap = self.limits.max_uploads_per_client
        streams = self._uploads.setdefault(client_id, {})
        if cap > 0 and upload_id not in streams and len(streams) >= cap:
            raise ResourceExhausted(f"client {client_id!r} already has {len(streams)} uploads "
                                    f"in progress (limit {cap}); finish one first",
                                    retry_after_s=self.limits.retry_after_s)
        streams[upload_id] = streams.get(upload_id, 0) + 1
        try:
            yield
        finally:
            streams[upload_id] -= 1
            if not streams[upload_id]:
                del streams[upload_id]
            if not streams:
                self._uploads.pop(client_id, None)

    def uploads_in_progress(self, client_id: str) -> int:
        """How many distinct uploads of ``client_id`` have a stream running."""
        return len(self._uploads.get(client_id, {}))

    def forget(self, client_id: str) -> None:
        """Drop the rate state of a client that left."""
        self._buckets.pop(client_id, None)
