"""The injector's contract: a link that carries one client's traffic and counts what it did.

Both tiers take a ``LinkProfile`` (``fedlink.netem.profile``). The TCP proxy tier implements
``Link`` directly: start it, point the client at ``address``, stop it. The packet tier wraps
whole network namespaces instead (see ``fedlink.netem.packet``) and reports the same counters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

from fedlink.netem.profile import LinkProfile


@dataclass
class LinkCounters:
    """Live counters of one link (updated while it runs)."""

    bytes_up: int = 0
    bytes_down: int = 0
    connections: int = 0
    resets: int = 0
    blackouts: int = 0
    stalled_s: float = 0.0
    packets_up: int = 0
    packets_down: int = 0
    dropped_up: int = 0
    dropped_down: int = 0

    def as_dict(self) -> dict[str, float]:
        """Plain-dict form (for events and reports)."""
        return asdict(self)


class Link(Protocol):
    """A running impaired link between clients and one upstream address."""

    profile: LinkProfile
    counters: LinkCounters

    @property
    def address(self) -> str:
        """``host:port`` that clients dial instead of the upstream."""
        ...

    async def start(self) -> str:
        """Start carrying traffic; returns ``address``."""
        ...

    async def stop(self) -> None:
        """Close every connection and the listener; nothing is left running."""
        ...
