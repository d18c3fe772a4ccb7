"""Judging a client's silence against the link the coordinator has measured for it.

Every call a client makes and every chunk of its transfers is a sign of life
(``ClientRegistry.touch``). On a clean link those come at least every heartbeat interval; on
a lossy one TCP's retransmission backoff delays them all (heartbeats share the connection
with the transfer), by tens of seconds at 25% loss, while the client is alive and its
transfer is moving. A fixed timeout either releases such a client's task (a false timeout:
its update is accepted later) or is too long to notice a dead client on a good link. So each
client's silence bound follows the gaps between its own signs of life::

    bound = clamp(gap_multiple x p99(recent gaps), base, max_s)

``base`` is ``limits.liveness_timeout`` (what a clean link gets), ``max_s`` is
``limits.max_liveness_timeout_s`` (by default ten times ``base``). A gap the client chose
(after ``GetTask`` answers, it may wait or train) is not a sample (``pause``). A client that
was released and comes back teaches the gap that misled the coordinator, so the same link never
fools it twice.

Progress counts too. The coordinator sees a transfer's bytes only a whole chunk (up to a
MiB) at a time, and on a lossy uplink the client's heartbeats queue behind its upload's data
in the socket buffers: a client uploading at 40 kB/s may show nothing for half a minute while
its bytes arrive. So while one of its transfer streams is open (a download being sent, an
upload whose first chunk arrived), a client's bound is ``max_s``: the stream is evidence of a
connection that answers the coordinator's keepalive pings (a dead one is cut within the
server's ping timeout, and the stream with it). When the stream ends, the client counts as
seen then.

What this cannot see: clients that share one TCP connection (in-process simulated clients
whose channel options are identical share one) queue their heartbeats behind each other's
uploads, and a client between two of its own streams may then look silent while the others'
bytes arrive. Its bound grows with the first such gap.
"""

from __future__ import annotations

import math
from collections import deque

GAP_WINDOW = 128
"""Gaps kept per client (the most recent): p99 over them is about the second largest."""

GAP_QUANTILE = 0.99
"""The quantile of a client's gaps its silence bound is a multiple of."""


class GapWindow:
    """The most recent gaps between one client's signs of life, and their p99."""

    def __init__(self, size: int = GAP_WINDOW) -> None:
        self._gaps: deque[float] = deque(maxlen=size)
        self._p99: float | None = 0.0
        self.paused = False

    def add(self, gap_s: float) -> None:
        """A gap of ``gap_s`` seconds between two signs of life."""
        self._gaps.append(gap_s)
        self._p99 = None  # computed again when asked

    def __len__(self) -> int:
        return len(self._gaps)

    def p99(self) -> float:
        """The 99th percentile of the gaps held (nearest rank; 0 with none)."""
        if self._p99 is None:
            ordered = sorted(self._gaps)
            rank = max(1, math.ceil(GAP_QUANTILE * len(ordered)))
            self._p99 = ordered[rank - 1] if ordered else 0.0
        return self._p99


class ClientLinks:
    """What the coordinator has seen of every registered client's link: the gaps between its
    signs of life, and its transfer streams open now (kept by ``ClientRegistry``)."""

    def __init__(self) -> None:
        self._windows: dict[str, GapWindow] = {}
        self._streams: dict[str, int] = {}

    def seen(self, client_id: str, previous: float, now: float, sample: bool = True) -> None:
        """``client_id`` showed life at ``now``; it last did at ``previous``. ``sample=False``:
        the time between says nothing about its link (a stream was open meanwhile)."""
        window = self._windows.setdefault(client_id, GapWindow())
        if window.paused or not sample:  # the gap was the client's choice, or not silence
            window.paused = False
        elif now > previous:
            window.add(now - previous)

    def pause(self, client_id: str) -> None:
        """The client may now stay away by choice (told to wait): skip its next gap."""
        self._windows.setdefault(client_id, GapWindow()).paused = True

    def opened(self, client_id: str) -> None:
        """A transfer stream of ``client_id`` is open (a download, or an upload whose first
        chunk named its client)."""
        self._streams[client_id] = self._streams.get(client_id, 0) + 1

    def closed(self, client_id: str) -> None:
        """One of ``client_id``'s transfer streams ended (done, cancelled or cut)."""
        left = self._streams.get(client_id, 0) - 1
        if left > 0:
            self._streams[client_id] = left
        else:
            self._streams.pop(client_id, None)

    def transferring(self, client_id: str) -> bool:
        """Whether a transfer stream of ``client_id`` is open now."""
        return client_id in self._streams

    def p99(self, client_id: str) -> float:
        """The p99 gap of ``client_id`` (0 before any)."""
        window = self._windows.get(client_id)
        return 0.0 if window is None else window.p99()

    def samples(self, client_id: str) -> int:
        """How many gaps of ``client_id`` are held."""
        window = self._windows.get(client_id)
        return 0 if window is None else len(window)

    def forget(self, client_id: str) -> None:
        """``client_id`` left or expired."""
        self._windows.pop(client_id, None)
        self._streams.pop(client_id, None)


def silence_bound(p99_gap_s: float, base_s: float, gap_multiple: float, max_s: float) -> float:
    """How long a client whose gaps have a p99 of ``p99_gap_s`` may be silent while holding a
    task: ``gap_multiple x p99_gap_s``, at least ``base_s``, at most ``max_s`` (never below
    ``base_s``)."""
    return max(base_s, min(gap_multiple * p99_gap_s, max_s))
