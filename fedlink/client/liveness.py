"""Liveness that fits the link: ping-ack timeout, TCP user timeout and call deadlines.

A silent link (no reset, no data) is noticed only by a keepalive ping whose ack does not come
back in time, so on a short-RTT link that timeout must be short. But the ack of a ping takes
at least one round trip, and longer when it queues behind data in flight on a busy link: a
fixed timeout shorter than that kills every call on a long or busy link (a 10 s RTT link with a
5 s timeout never completed a ``Join``). So the timeouts follow what the link has shown::

    ping_ack_timeout = clamp(widen x max(min_ping_timeout_s,
                                         rtt_multiple x srtt + queued_bytes / goodput),
                             min_ping_timeout_s, max_ping_timeout_s)
    unary_deadline   = clamp(widen x max(Timeouts.unary_s, rtt_multiple x srtt),
                             ..., max_deadline_s)

``srtt`` is a smoothed round trip learned from completed short calls (``Join``, ``Commit``,
``Heartbeat`` ...; never ``GetTask``, whose long poll is not a round trip), ``goodput`` from
completed transfers (bytes over seconds), and ``queued_bytes`` the largest message the client
sends or receives (a chunk): what a ping's ack may wait behind. ``widen`` starts at 1, grows by
``widen_factor`` after every failure that came with no reply at all (a ping timeout, a missed
deadline: the link may be longer than anything seen yet) and shrinks back by the same factor
after each call that succeeds. Nothing is learned from a reply that did not come.

A changed estimate never opens a connection by itself: the next call's deadlines follow it on
the channel that is open, and the ping-ack timeout (fixed when a channel opens) changes only
when that channel is known dead (``reopen_reason``): its connection broke, a ping went
unanswered, or a transfer on it stalled. Reconnecting over a lossy link costs handshakes whose
SYNs are lost too, so a connection that works is kept.

A stalled transfer is told from its progress, not from TCP: every chunk a download receives and
every chunk an upload's stream takes (gRPC takes one only when HTTP/2 flow control has room, so
the coordinator has acknowledged what came before) resets a watch, and a transfer that makes
none for ``stall_s`` is abandoned and resumed on a fresh connection::

    stall_s = clamp(max(min_stall_s x 2^replaced, rtt_multiple x min_rtt),
                    min_stall_s, max_ping_timeout_s)

``min_rtt`` is the shortest of the last ``RTT_WINDOW`` round trips: the link's own delay. On a
lossy link a short call often waits behind a transfer's retransmissions on the same
connection, which lengthens ``srtt`` (seen: 1.5 s on a 20 ms link) but says nothing about
how soon the next chunk of a moving transfer is due.

Chunks are sized to arrive well within ``min_stall_s`` (below), so the bound needs no room for
the bytes queued ahead of them, and it is not widened by calls that got no reply: under heavy
random loss a stalled TCP connection is deep in retransmission backoff (the coordinator's
retransmission timeout was seen at 37 s after a loss burst), and every second waited on it is a
second the round waits. Without this watch such a connection waits until the ping check
notices, which on a link that taught a long ping-ack timeout is minutes.

A stalled connection is not used again (``Transport``): measured under 25% random loss, one
that had stalled and then drained moved the next transfers 3 to 4 times slower than a fresh
one: its sender's slow-start threshold stays low and, after deep backoff, its
retransmission timeout long. When a fresh connection stalls before it has completed a single
transfer, the link rather than the connection is at fault, and the floor
doubles (``replaced``): a link that stalls faster than a connection can complete a transfer is
given longer before the next one, so a run opens a few connections, not one per stall.

A connection that a ping-ack timeout killed although its timeout was under ``rtt_multiple`` of
the shortest recent round trips says that the link delays acks that long: the timeout it asks
for stays above ``widen_factor`` times the one that died (``ping_floor_s``), however many calls
succeed afterwards, so that the next connection does not die the same way. A timeout of many
round trips that still killed a connection was a spell of TCP backoff under loss: it is kept,
and gRPC brings the channel back on a fresh connection with it. Raising it would keep later
connections alive through such spells, and a connection that lived through one is slow
afterwards (above). A death before any round trip is measured (the first ``Join`` over a
10 s link, or over a lossy one) cannot be told apart: it raises the floor the same way, but
only until the link's round trips are known, and it lapses once they show that the timeout
was many of them. Kept for good, such a floor leaves a client under 25% loss on connections
that live through every backoff spell: measured, that client was the last of the round in
most rounds.

Progress can only be as fine as the chunks: a download asks for chunks that take at most a
quarter of ``min_stall_s`` at the goodput the link can be counted on
(``progress_chunk_bytes``), so that a slow download that moves is never taken for a stalled
one. That is the slowest of the last ``RTT_WINDOW`` transfers (``slow_goodput_bps``), not an
average: under 25% random loss the same 1.1 MB download took from 0.4 s to 9.6 s, and chunks
sized on a smoothed rate that had climbed with the fast ones grew to the whole model, whose
first byte of progress then came only when all of it had arrived; a download slowed by a loss
burst (or by four other clients fetching the same round's model) showed none for the stall
bound and was moved to a new connection while its bytes were arriving.

The sockets' ``TCP_USER_TIMEOUT`` is a separate, fixed bound (``tcp_user_timeout_s``). gRPC
sets it from ``grpc.keepalive_timeout_ms``; the ping-ack wait itself is
``grpc.http2.ping_timeout_ms`` (measured: a 5 s ping timeout with a 60 s keepalive timeout
still notices a blackholed link 7 s into it). Keeping the user timeout long lets TCP carry a
connection through a loss burst that its retransmissions survive, instead of the kernel
aborting it (``ETIMEDOUT``) after a few seconds of unacknowledged data.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fedlink.config import check_fields, from_table, require

RTT_WINDOW = 16
"""Round trips kept for ``LinkEstimate.min_rtt_s``."""
SRTT_GAIN = 0.25
"""Weight of a new round-trip sample in the smoothed estimate (TCP uses 1/8; calls are rarer)."""
CHUNKS_PER_STALL = 4
"""Download chunks that fit in ``min_stall_s`` at the measured goodput
(``progress_chunk_bytes``)."""
FIRST_PROGRESS_BYTES = 128 << 10
"""The download chunk asked for before any goodput is measured (it arrives within a 10 s
stall bound from 13 kB/s up)."""
REOPEN_GROWTH = 2.0
"""A dead channel is replaced when the link asks for a ping-ack timeout this much longer..."""
REOPEN_SHRINK = 4.0
"""... or this much shorter (``reopen_reason``)."""
STALL_BACKOFF = 2.0
"""Each stall of a connection that had completed no transfer multiplies the stall floor by
this (``LinkEstimate.stalled``)."""
MIN_PROGRESS_BYTES = 16 << 10
"""The smallest download chunk asked for, however slow the link."""


@dataclass(frozen=True)
class LivenessConfig:
    """Bounds of the link-following timeouts (``[client.liveness]``); see the module docstring.

    ``keepalive_time_s``: idle time before a keepalive ping (how soon silence is probed).
    ``min_ping_timeout_s`` / ``max_ping_timeout_s``: the ping-ack timeout's bounds; a silent
    short-RTT link is noticed about ``keepalive_time_s + min_ping_timeout_s`` into it.
    ``rtt_multiple``: round trips a ping ack or a short call is allowed. ``widen_factor``: how
    much the timeouts grow after a failure with no reply. ``max_deadline_s``: the largest
    deadline of a short call. ``tcp_user_timeout_s``: the sockets' ``TCP_USER_TIMEOUT``
    (``0``: the kernel's default, about 15 minutes of retransmissions). ``min_stall_s``: the
    shortest time a transfer may make no progress before it is resumed on a fresh connection.
    """

    keepalive_time_s: float = 2.0
    min_ping_timeout_s: float = 5.0
    max_ping_timeout_s: float = 120.0
    rtt_multiple: float = 4.0
    widen_factor: float = 3.0
    max_deadline_s: float = 300.0
    tcp_user_timeout_s: float = 300.0
    min_stall_s: float = 5.0

    def __post_init__(self) -> None:
        check_fields(self, "client.liveness")
        for name in ("keepalive_time_s", "min_ping_timeout_s", "max_ping_timeout_s",
                     "rtt_multiple", "widen_factor", "max_deadline_s", "tcp_user_timeout_s",
                     "min_stall_s"):
            require(math.isfinite(getattr(self, name)), f"client.liveness.{name}",
                    f"must be finite, got {getattr(self, name)!r}")
        require(self.keepalive_time_s > 0, "client.liveness.keepalive_time_s", "must be > 0")
        require(self.min_ping_timeout_s > 0, "client.liveness.min_ping_timeout_s", "must be > 0")
        require(self.max_ping_timeout_s >= self.min_ping_timeout_s,
                "client.liveness.max_ping_timeout_s", "must be >= min_ping_timeout_s")
        require(self.rtt_multiple >= 1, "client.liveness.rtt_multiple", "must be >= 1")
        require(self.widen_factor >= 1, "client.liveness.widen_factor", "must be >= 1")
        require(self.max_deadline_s > 0, "client.liveness.max_deadline_s", "must be > 0")
        require(0 < self.min_stall_s <= self.max_ping_timeout_s, "client.liveness.min_stall_s",
                "must be > 0 and <= max_ping_timeout_s")
        require(self.tcp_user_timeout_s == 0
                or self.tcp_user_timeout_s >= self.max_ping_timeout_s,
                "client.liveness.tcp_user_timeout_s",
                "must be 0 (kernel default) or >= max_ping_timeout_s: the kernel must not "
                "abort a connection that the ping check still considers alive")

    @classmethod
    def from_dict(cls, table: Mapping[str, Any],
                  section: str = "client.liveness") -> LivenessConfig:
        """Build from a TOML table such as ``[client.liveness]``; unknown keys are an error."""
        return from_table(cls, table, section)


def is_no_reply(code: str, detail: str) -> bool:
    """Whether a failed call got no reply at all: a ping-ack timeout or a missed deadline."""
    return code == "DEADLINE_EXCEEDED" or is_ping_timeout(detail)


def is_ping_timeout(detail: str) -> bool:
    """Whether a failed call's connection was killed by its ping-ack timeout."""
    return "ping timeout" in detail.lower()


def is_link_dead(code: str) -> bool:
    """Whether a failed call says its connection is gone (reset, GOAWAY, ping timeout: gRPC
    reports all of them ``UNAVAILABLE``). A missed deadline alone says nothing about it."""
    return code == "UNAVAILABLE"


def reopen_reason(channel_ping_s: float, wanted_ping_s: float, dead: bool,
                  stalled: bool) -> str | None:
    """Why the next call needs a new channel, or ``None`` to keep the open one.

    ``channel_ping_s``: the open channel's ping-ack timeout; ``wanted_ping_s``: the one the
    link now asks for (``LinkEstimate.channel_ping_timeout_s``). ``dead``: a call on the channel
    failed with its connection gone; ``stalled``: a transfer on it made no progress. A stalled
    connection is replaced whatever the estimate (its TCP may still be backing off); a dead one
    only if it would come back with a ping-ack timeout at least twice as long (a shorter one
    kills the calls of a slow link) or at most a quarter as long (a much longer one notices a
    silent link late): gRPC reconnects it anyway, but a new channel is one more connection
    (and one more handshake over a lossy link) for every client that moves, so smaller moves
    wait; a live one never.
    """
    if stalled:
        return "a transfer stalled"
    if dead and not (channel_ping_s / REOPEN_SHRINK < wanted_ping_s
                     < channel_ping_s * REOPEN_GROWTH):
        return f"connection lost; ping-ack timeout {channel_ping_s:.1f} s -> {wanted_ping_s:.1f} s"
    return None


class Progress:
    """When a transfer last made progress, on the clock ``now`` (``time.monotonic``-like)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.last = now()
        self.events = 0
        self.longest_s = 0.0  # the longest wait that ended in progress

    def moved(self) -> None:
        """A chunk went through: the transfer is alive."""
        now = self._now()
        self.longest_s = max(self.longest_s, now - self.last)
        self.last = now
        self.events += 1

    def idle_s(self) -> float:
        """Seconds since the last progress (or the start)."""
        return self._now() - self.last

    def stalled(self, stall_s: float) -> bool:
        """Whether the transfer has made no progress for longer than ``stall_s``."""
        return self.idle_s() > stall_s


class LinkEstimate:
    """What one client has learned about its link to the coordinator (see the module docs).

    Not thread-safe: one per ``Transport``, used from its event loop.
    """

    def __init__(self, config: LivenessConfig | None = None, queued_bytes: int = 0) -> None:
        self.config = config or LivenessConfig()
        self.queued_bytes = queued_bytes
        self.srtt_s: float | None = None
        self._rtts: deque[float] = deque(maxlen=RTT_WINDOW)
        self.goodput_bps: float | None = None
        self._rates: deque[float] = deque(maxlen=RTT_WINDOW)  # recent transfers, bytes/s
        self.stalls = 0
        self.replaced = 0  # stalls of connections that had completed no transfer
        self.ping_floor_s = 0.0  # above every ping-ack timeout the link's delay explained
        self._died_unmeasured_s = 0.0  # the longest one that died before any round trip
        self.widen = 1.0

    def observe_rtt(self, seconds: float) -> None:
        """A short call completed in ``seconds`` (at least one round trip)."""
        if seconds <= 0:
            return
        self._rtts.append(seconds)
        self.srtt_s = seconds if self.srtt_s is None else \
            (1 - SRTT_GAIN) * self.srtt_s + SRTT_GAIN * seconds

    def observe_transfer(self, num_bytes: int, seconds: float) -> None:
        """A transfer moved ``num_bytes`` in ``seconds``; large ones teach the goodput."""
        if seconds <= 0 or num_bytes < 64 << 10:  # small ones measure latency, not rate
            return
        rate = num_bytes / seconds
        self.goodput_bps = rate if self.goodput_bps is None else \
            (1 - SRTT_GAIN) * self.goodput_bps + SRTT_GAIN * rate
        self._rates.append(rate)

    @property
    def slow_goodput_bps(self) -> float | None:
        """The slowest of the last ``RTT_WINDOW`` transfers' rates (``None`` before any): what
        a transfer can count on, where the smoothed ``goodput_bps`` follows the fast ones."""
        return min(self._rates, default=None)

    def succeeded(self) -> None:
        """A call got its reply: shrink a widening back toward 1."""
        self.widen = max(1.0, self.widen / self.config.widen_factor)

    def no_reply(self) -> None:
        """A call got no reply at all: widen the timeouts (bounded by the config)."""
        self.widen = min(self.widen * self.config.widen_factor,
                         self.config.max_ping_timeout_s / self.config.min_ping_timeout_s)

    def ping_timeout_s(self) -> float:
        """The ping-ack timeout the link asks for (taken up when a channel opens)."""
        cfg = self.config
        learned = cfg.rtt_multiple * (self.srtt_s or 0.0)
        if self.goodput_bps:
            learned += self.queued_bytes / self.goodput_bps
        floor = max(self.ping_floor_s, self._unmeasured_floor_s())
        wanted = max(self.widen * max(cfg.min_ping_timeout_s, learned), floor)
        return min(max(wanted, cfg.min_ping_timeout_s), cfg.max_ping_timeout_s)

    def ping_died(self, channel_ping_s: float) -> bool:
        """A connection opened with a ping-ack timeout of ``channel_ping_s`` died of it;
        whether later connections get a longer one.

        When the link's own delay explains it (``channel_ping_s`` under ``rtt_multiple`` of
        the shortest recent round trips), the link delays acks that long: widens like any call
        without reply, and keeps every later ping-ack timeout above ``widen_factor`` times it.
        Before any round trip is measured it may be either: it is taken for the link's delay
        until round trips are known (``_unmeasured_floor_s``). Otherwise the connection died
        in a spell of TCP backoff on a short lossy link: the timeout is kept, so gRPC brings
        the channel back on a fresh connection with the same one, and later connections are
        not kept alive through such spells, which leave them slow."""
        if self._loss_explains(channel_ping_s):
            return False
        self.no_reply()
        if self._rtts:
            self.ping_floor_s = max(self.ping_floor_s,
                                    self.config.widen_factor * channel_ping_s)
        else:
            self._died_unmeasured_s = max(self._died_unmeasured_s, channel_ping_s)
        return True

    def _unmeasured_floor_s(self) -> float:
        """The floor a death before any round trip set: ``widen_factor`` times the timeout
        that died, until the link's round trips show that it was many of them (0 then)."""
        died = self._died_unmeasured_s
        if not died or self._loss_explains(died):
            return 0.0
        return self.config.widen_factor * died

    def _loss_explains(self, channel_ping_s: float) -> bool:
        """Whether a ping-ack timeout of ``channel_ping_s`` is many of the link's shortest
        round trips (so a ping that waited longer was lost, not slow)."""
        return bool(self._rtts) and channel_ping_s >= self.config.rtt_multiple * self.min_rtt_s()

    def channel_ping_timeout_s(self) -> float:
        """The ping-ack timeout a new channel is opened with: ``ping_timeout_s`` rounded up to
        ``min_ping_timeout_s`` times a power of two (at most ``max_ping_timeout_s``).

        gRPC shares one connection among channels to one target whose options are identical,
        and opens one per distinct option set. Rounded, clients that learned similar links ask
        for the same options: thousands of in-process simulated clients whose round trips
        grew with the event loop's load stay on a few connections instead of one each.
        """
        cfg = self.config
        steps = math.ceil(math.log2(self.ping_timeout_s() / cfg.min_ping_timeout_s) - 1e-9)
        return min(cfg.min_ping_timeout_s * 2.0 ** max(0, steps), cfg.max_ping_timeout_s)

    def stall_s(self) -> float:
        """How long a transfer may make no progress before it is resumed elsewhere.

        A few of the link's shortest recent round trips (the first chunk of a stream needs
        one), at least the floor; never widened by calls without reply nor by the bytes
        queued on the link: progress is counted in chunks sized to arrive well within
        ``min_stall_s`` (``progress_chunk_bytes``)."""
        cfg = self.config
        learned = cfg.rtt_multiple * self.min_rtt_s()
        return min(max(self.stall_floor_s(), learned, cfg.min_stall_s), cfg.max_ping_timeout_s)

    def min_rtt_s(self) -> float:
        """The shortest of the recent round trips (0 before any)."""
        return min(self._rtts, default=0.0)

    def stall_floor_s(self) -> float:
        """``min_stall_s``, doubled by every stall of a connection that had completed no
        transfer."""
        return self.config.min_stall_s * STALL_BACKOFF ** min(self.replaced, 16)

    def stalled(self, fresh_one_too: bool) -> None:
        """A transfer made no progress for ``stall_s`` and moves to a fresh connection;
        ``fresh_one_too``: the stalled connection was itself fresh (it had completed no
        transfer), so the floor doubles for good."""
        self.stalls += 1
        if fresh_one_too:
            self.replaced += 1

    def progress_chunk_bytes(self, ceiling: int) -> int:
        """The largest download chunk to ask for, at most ``ceiling`` (0: no ceiling).

        Progress shows a whole chunk at a time, so a chunk must arrive well within the stall
        bound or a slow but moving download looks stalled (a 1 MiB chunk takes 25 s at
        40 kB/s): at the slowest recent transfer's rate (``slow_goodput_bps``: fast transfers
        between slow ones must not bring back 1 MiB chunks) a chunk takes at most
        ``min_stall_s / CHUNKS_PER_STALL``; before any goodput is measured it is
        ``FIRST_PROGRESS_BYTES``. Never below ``MIN_PROGRESS_BYTES``.
        """
        slow = self.slow_goodput_bps
        if slow is None:
            fits = FIRST_PROGRESS_BYTES
        else:
            fits = int(slow * self.config.min_stall_s / CHUNKS_PER_STALL)
        fits = max(MIN_PROGRESS_BYTES, fits)
        return min(fits, ceiling) if ceiling > 0 else fits

    def unary_deadline_s(self, floor_s: float) -> float:
        """The deadline of a short call, at least ``floor_s`` (the configured one)."""
        learned = self.config.rtt_multiple * (self.srtt_s or 0.0)
        return min(self.widen * max(floor_s, learned), max(self.config.max_deadline_s, floor_s))
