"""What the packet tier does to each packet: pure scheduling, no I/O (unit-testable).

One ``DirectionShaper`` per direction turns "a packet of ``n`` bytes arrived at time ``t``"
into either a drop (with its cause) or a release time, and hands packets back once they are
due. Times are seconds on one monotonic clock, supplied by the caller in nondecreasing order.

A packet goes through these stages, in order:

1. **Outage** (``blackout_every_s`` / ``blackout_s``; shared by both directions): a packet that
   arrives while the link is down is dropped, and so is one whose release falls in an outage.
   Real links drop during an outage rather than hold; kernel TCP on both ends stays up and
   retransmits once the link is back.
2. **Random loss** (``loss_up`` / ``loss_down``), then **Gilbert-Elliott loss**
   (``burst_loss``, one independent chain per direction). Both chains are advanced for every
   packet that arrives, so the loss pattern does not depend on the other impairments. Lost
   packets are dropped on arrival and do not occupy the bottleneck.
3. **Bottleneck**: a drop-tail FIFO queue bounded in bytes, drained either at a fixed rate
   (``up_kbps`` / ``down_kbps``: each packet's whole IP length is serialized at that rate) or
   by a Mahimahi delivery trace (``trace_up`` / ``trace_down``; a trace replaces the rate limit
   of its direction). A packet that does not fit in the queue is dropped.
4. **Delay**: ``latency_ms`` plus a normal jitter of standard deviation ``jitter_ms`` (never
   below zero) after the packet leaves the bottleneck. Order is kept: a packet is never
   released before the one ahead of it, so large jitter on a busy link skews delays upward.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from fedlink.netem.packet_trace import OPPORTUNITY_BYTES, DeliveryTrace, load_trace
from fedlink.netem.profile import GilbertElliott, LinkProfile

DROP_CAUSES = ("outage", "loss", "burst", "queue", "error")
"""Why a packet can be dropped (``error``: the forwarder could not write it)."""

MIN_QUEUE_BYTES = 32 * 1024
"""Smallest default bottleneck queue, bytes (about 21 full-size packets)."""

QUEUE_SECONDS = 0.25
"""Default bottleneck queue: this many seconds of the direction's rate (at least the minimum)."""


def default_queue_bytes(kbps: float) -> int:
    """The default drop-tail limit for a bottleneck of ``kbps`` kbit/s."""
    return max(MIN_QUEUE_BYTES, int(kbps * 1000 / 8 * QUEUE_SECONDS))


def seeded_rng(seed: int, direction: str, component: str) -> random.Random:
    """An independent, reproducible random stream per (seed, direction, component)."""
    return random.Random(f"fedlink.netem.packet/{seed}/{direction}/{component}")


class OutageSchedule:
    """Outages of exponential duration separated by exponential gaps (both directions).

    The gap from the end of one outage to the start of the next has mean ``every_s``; the
    first outage starts one such gap after ``start``. ``every_s=None`` means no outages.
    """

    def __init__(self, every_s: float | None, mean_s: float, rng: random.Random,
                 start: float) -> None:
        self._every_s = every_s
        self._mean_s = mean_s
        self._rng = rng
        self._begin = self._end = start
        self._count = 0
        self._past_s = 0.0
        if every_s is not None:
            self._plan_after(start)

    def _plan_after(self, end: float) -> None:
        assert self._every_s is not None
        self._begin = end + self._rng.expovariate(1.0 / self._every_s)
        self._end = self._begin + self._rng.expovariate(1.0 / self._mean_s)

    def _advance(self, now: float) -> None:
        while self._every_s is not None and now >= self._end:
            self._count += 1
            self._past_s += self._end - self._begin
            self._plan_after(self._end)

    def is_down(self, now: float) -> bool:
        """Whether the link is in an outage at ``now``."""
        self._advance(now)
        return self._every_s is not None and self._begin <= now < self._end

    def summary(self, now: float) -> tuple[int, float]:
        """(outages begun so far, seconds spent in outages so far) at ``now``."""
        down = self.is_down(now)
        current = now - self._begin if down else 0.0
        return self._count + int(down), self._past_s + current


class Bottleneck(Protocol):
    """A drop-tail queue in front of a rate-limited or trace-driven link."""

    def departure(self, size: int, now: float) -> float | None:
        """When a packet of ``size`` bytes arriving at ``now`` leaves; ``None``: queue full."""
        ...


class _QueueAccount:
    """Bytes that have entered the bottleneck and not yet left it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._queued: deque[tuple[float, int]] = deque()
        self._bytes = 0

    def fits(self, size: int, now: float) -> bool:
        """Forget packets that left by ``now``; whether ``size`` more bytes fit."""
        while self._queued and self._queued[0][0] <= now:
            self._bytes -= self._queued.popleft()[1]
        return self._bytes + size <= self.limit

    def add(self, size: int, departure: float) -> None:
        """Count a packet that leaves at ``departure``."""
        self._queued.append((departure, size))
        self._bytes += size


class RateBottleneck:
    """Serializes each packet at ``kbps`` kbit/s behind the ones already queued."""

    def __init__(self, kbps: float, queue_bytes: int) -> None:
        self._seconds_per_byte = 8.0 / (kbps * 1000.0)
        self._queue = _QueueAccount(queue_bytes)
        self._last = -1.0

    def departure(self, size: int, now: float) -> float | None:
        """See ``Bottleneck.departure``."""
        if not self._queue.fits(size, now):
            return None
        self._last = max(now, self._last) + size * self._seconds_per_byte
        self._queue.add(size, self._last)
        return self._last


class TraceBottleneck:
    """Delivers queued bytes at a Mahimahi trace's opportunities (see ``packet_trace``)."""

    def __init__(self, trace: DeliveryTrace, queue_bytes: int, start: float) -> None:
        self._trace = trace
        self._start = start
        self._queue = _QueueAccount(queue_bytes)
        self._index = -1
        self._credit = 0
        self._last = -1.0

    def departure(self, size: int, now: float) -> float | None:
        """See ``Bottleneck.departure``."""
        if not self._queue.fits(size, now):
            return None
        if self._last < now:  # the queue has drained: leftover credit is wasted
            self._index = self._trace.first_at_or_after((now - self._start) * 1000.0)
            self._credit = OPPORTUNITY_BYTES
        need = size
        while need > self._credit:
            need -= self._credit
            self._index += 1
            self._credit = OPPORTUNITY_BYTES
        self._credit -= need
        self._last = self._start + self._trace.opportunity_ms(self._index) / 1000.0
        self._queue.add(size, self._last)
        return self._last


class Unlimited:
    """No bottleneck: a packet leaves as soon as it arrives."""

    def departure(self, size: int, now: float) -> float | None:
        """See ``Bottleneck.departure``."""
        return now


class BurstLoss:
    """A Gilbert-Elliott chain: loss decided in the current state, then one transition."""

    def __init__(self, model: GilbertElliott, rng: random.Random) -> None:
        self._model = model
        self._rng = rng
        self._bad = False

    def lost(self) -> bool:
        """Whether the next packet is lost."""
        model, rng = self._model, self._rng
        lost = rng.random() < (model.loss_bad if self._bad else model.loss_good)
        flip = model.r if self._bad else model.p
        if rng.random() < flip:
            self._bad = not self._bad
        return lost


@dataclass
class DirectionStats:
    """What one direction did so far."""

    offered: int = 0
    packets: int = 0
    bytes: int = 0
    drops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_CAUSES, 0))

    @property
    def dropped(self) -> int:
        """Packets dropped for any cause."""
        return sum(self.drops.values())


class DirectionShaper:
    """One direction of the link: ``offer`` packets as they arrive, ``due`` ones to write."""

    def __init__(self, *, loss: float, burst: GilbertElliott | None, bottleneck: Bottleneck,
                 latency_ms: float, jitter_ms: float, outages: OutageSchedule,
                 rngs: tuple[random.Random, random.Random, random.Random]) -> None:
        self._loss = loss
        self._loss_rng, burst_rng, self._delay_rng = rngs
        self._burst = BurstLoss(burst, burst_rng) if burst is not None else None
        self._bottleneck = bottleneck
        self._latency_s = latency_ms / 1000.0
        self._jitter_s = jitter_ms / 1000.0
        self._outages = outages
        self._in_flight: deque[tuple[float, bytes]] = deque()
        self._last_release = 0.0
        self.stats = DirectionStats()

    def _drop_cause(self, now: float) -> str | None:
        random_loss = self._loss > 0 and self._loss_rng.random() < self._loss
        burst_loss = self._burst is not None and self._burst.lost()
        if self._outages.is_down(now):
            return "outage"
        if random_loss:
            return "loss"
        return "burst" if burst_loss else None

    def _delay(self) -> float:
        if self._jitter_s <= 0:
            return self._latency_s
        return max(0.0, self._delay_rng.gauss(self._latency_s, self._jitter_s))

    def drop(self, cause: str) -> None:
        """Count one packet dropped for ``cause`` (one of ``DROP_CAUSES``)."""
        self.stats.drops[cause] += 1

    def offer(self, packet: bytes, now: float) -> None:
        """A packet arrived at ``now``: drop it or schedule its release."""
        self.stats.offered += 1
        cause = self._drop_cause(now)
        departure = None if cause else self._bottleneck.departure(len(packet), now)
        if departure is None:
            self.drop(cause or "queue")
            return
        self._last_release = max(self._last_release, departure + self._delay())
        self._in_flight.append((self._last_release, packet))

    def next_due(self) -> float | None:
        """Release time of the next packet in flight, if any."""
        return self._in_flight[0][0] if self._in_flight else None

    def deliver(self, now: float, write: Callable[[bytes], object]) -> None:
        """Pass the packets released by ``now`` to ``write``, in order. A packet is counted as
        delivered, as an outage drop (the link went down while it was in flight), or as an
        ``error`` drop when ``write`` raises ``OSError``."""
        in_flight, stats = self._in_flight, self.stats
        while in_flight and in_flight[0][0] <= now:
            packet = in_flight.popleft()[1]
            if self._outages.is_down(now):
                self.drop("outage")
                continue
            try:
                write(packet)
            except OSError:
                self.drop("error")
                continue
            stats.packets += 1
            stats.bytes += len(packet)


def _bottleneck(kbps: float | None, trace: str | None, queue_bytes: int | None,
                start: float) -> Bottleneck:
    if trace is not None:
        loaded = load_trace(trace)
        return TraceBottleneck(loaded, queue_bytes or default_queue_bytes(loaded.mean_kbps),
                               start)
    if kbps is not None:
        return RateBottleneck(kbps, queue_bytes or default_queue_bytes(kbps))
    return Unlimited()


@dataclass
class LinkShapers:
    """Both directions of one link and the outage schedule they share."""

    up: DirectionShaper
    down: DirectionShaper
    outages: OutageSchedule


def build_shapers(profile: LinkProfile, start: float,
                  queue_bytes: int | None = None) -> LinkShapers:
    """The shapers for ``profile``, with the trace clock and outage schedule starting at
    ``start``. ``queue_bytes`` overrides the default bottleneck queue of both directions."""
    seed = profile.seed
    outages = OutageSchedule(profile.blackout_every_s, profile.blackout_s,
                             seeded_rng(seed, "both", "outage"), start)

    def shaper(direction: str, loss: float, kbps: float | None,
               trace: str | None) -> DirectionShaper:
        rngs = (seeded_rng(seed, direction, "loss"), seeded_rng(seed, direction, "burst"),
                seeded_rng(seed, direction, "delay"))
        return DirectionShaper(loss=loss, burst=profile.burst_loss,
                               bottleneck=_bottleneck(kbps, trace, queue_bytes, start),
                               latency_ms=profile.latency_ms, jitter_ms=profile.jitter_ms,
                               outages=outages, rngs=rngs)

    return LinkShapers(shaper("up", profile.loss_up, profile.up_kbps, profile.trace_up),
                       shaper("down", profile.loss_down, profile.down_kbps, profile.trace_down),
                       outages)
