"""When simulated clients are online: always, a diurnal pattern, or a trace file.

An ``Availability`` answers, for client ``index`` at model time ``t``, whether it is online and,
if not, when it comes back; ``finish`` stretches a piece of work that needs the client online
(a transfer, training) over its offline stretches, which is how the resumable protocol behaves:
a transfer stops when the device goes away and resumes where it was when it returns.

Every answer is computed from (seed, index, t), so a population of 10^6 costs no memory here.

Trace file format (``[virtual] availability = "trace"``, ``trace_file = "avail.csv"``): a CSV
with a header line ``client,start_s,end_s``, one row per *online* interval of a client in model
seconds (FedScale's availability traces reduce to this); a client with no row is always online,
and the trace repeats every ``period_s`` when that is set. An optional fourth column ``speed``
gives the device's compute-time multiplier (2 = twice as slow; FedScale's device-capacity
traces reduce to this): every row of a client that has one must give the same value, and it
replaces the fleet's speed for that client (``TraceAvailability.speeds``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fedlink.errors import ConfigError
from fedlink.experiment.virtual import DAY_S, VirtualSection

_GOLDEN = 0.6180339887498949


class Availability(Protocol):
    """Whether a client is online at a model time, and when it returns."""

    def online(self, index: int, t: float) -> bool:
        """Whether client ``index`` is online at ``t``."""
        ...

    def next_online(self, index: int, t: float) -> float:
        """The first time >= ``t`` when client ``index`` is online."""
        ...

    def next_offline(self, index: int, t: float) -> float:
        """The first time >= ``t`` when client ``index`` is offline (``inf``: never)."""
        ...


def finish(availability: Availability, index: int, start: float, work_s: float) -> float:
    """When ``work_s`` seconds of online work started at ``start`` are done (paused while
    client ``index`` is offline, resumed when it returns)."""
    t, left = availability.next_online(index, start), work_s
    while True:
        gone = availability.next_offline(index, t)
        if t + left <= gone:
            return t + left
        left -= gone - t
        t = availability.next_online(index, gone)


class AlwaysOnline:
    """Every client online all the time."""

    def online(self, index: int, t: float) -> bool:
        """Always."""
        return True

    def next_online(self, index: int, t: float) -> float:
        """``t``."""
        return t

    def next_offline(self, index: int, t: float) -> float:
        """Never."""
        return math.inf


@dataclass(frozen=True)
class Diurnal:
    """Each client is online for ``online_fraction`` of every ``period_s`` (a day), starting at
    its own phase: client ``index``'s phase is the fractional part of ``(index + seed) x
    golden ratio``, so phases spread evenly over the day, and clients are online during their
    local evening (the device charging on Wi-Fi) in the usual reading."""

    online_fraction: float = 0.3
    period_s: float = DAY_S
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.online_fraction <= 1.0:
            raise ConfigError(f"virtual.online_fraction: must be in (0, 1], got "
                              f"{self.online_fraction}")
        if not self.period_s > 0:
            raise ConfigError(f"virtual.period_s: must be > 0, got {self.period_s}")

    def _phase_s(self, index: int) -> float:
        return ((index + self.seed) * _GOLDEN) % 1.0 * self.period_s

    def _position(self, index: int, t: float) -> float:
        """Seconds into the client's current period (0: it just came online)."""
        return (t - self._phase_s(index)) % self.period_s

    def online(self, index: int, t: float) -> bool:
        """Within its daily online window."""
        return self._position(index, t) < self.online_fraction * self.period_s

    def next_online(self, index: int, t: float) -> float:
        """``t`` when online, else the start of its next window."""
        if self.online(index, t):
            return t
        return t + self.period_s - self._position(index, t)

    def next_offline(self, index: int, t: float) -> float:
        """The end of the current window (``inf`` when always online)."""
        if self.online_fraction >= 1.0:
            return math.inf
        if not self.online(index, t):
            return t
        return t + self.online_fraction * self.period_s - self._position(index, t)


def _read_speed(text: str | None, client: int, speeds: dict[int, float], where: str) -> None:
    """Record a row's ``speed`` (blank or absent: none) into ``speeds``, checking it."""
    if text is None or not text.strip():
        return
    speed = float(text)
    if not (math.isfinite(speed) and speed > 0):
        raise ConfigError(f"{where}: speed must be a number > 0, got {text!r}")
    if speeds.setdefault(client, speed) != speed:
        raise ConfigError(f"{where}: client {client} has speed {speeds[client]} on an "
                          f"earlier row and {speed} here; a device has one speed")


@dataclass(frozen=True)
class TraceAvailability:
    """Online intervals per client, from a trace (see the module docstring)."""

    intervals: Mapping[int, Sequence[tuple[float, float]]] = field(default_factory=dict)
    period_s: float = 0.0
    speeds: Mapping[int, float] = field(default_factory=dict)

    @classmethod
    def from_csv(cls, path: str | Path, period_s: float = 0.0) -> TraceAvailability:
        """Read ``client,start_s,end_s[,speed]`` rows (``ConfigError`` naming a bad row)."""
        rows: dict[int, list[tuple[float, float]]] = {}
        speeds: dict[int, float] = {}
        try:
            with open(path, newline="", encoding="utf-8") as f:
                for number, row in enumerate(csv.DictReader(f), start=2):
                    start, end = float(row["start_s"]), float(row["end_s"])
                    if not 0 <= start < end:
                        raise ConfigError(f"{path}:{number}: need 0 <= start_s < end_s")
                    client = int(row["client"])
                    rows.setdefault(client, []).append((start, end))
                    _read_speed(row.get("speed"), client, speeds, f"{path}:{number}")
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(f"availability trace {path}: {exc}") from exc
        return cls({k: sorted(v) for k, v in rows.items()}, period_s, speeds)

    def _windows(self, index: int, t: float) -> list[tuple[float, float]]:
        """The client's intervals around ``t`` (this period's and the next, when it repeats)."""
        spans = list(self.intervals[index])
        if not self.period_s:
            return spans
        base = math.floor(t / self.period_s) * self.period_s
        return [(base + k * self.period_s + a, base + k * self.period_s + b)
                for k in (0, 1) for a, b in spans]

    def online(self, index: int, t: float) -> bool:
        """Within one of its intervals (always, without any)."""
        if index not in self.intervals:
            return True
        return any(a <= t < b for a, b in self._windows(index, t))

    def next_online(self, index: int, t: float) -> float:
        """``t`` when online, else its next interval's start (``inf``: never again)."""
        if self.online(index, t):
            return t
        return min((a for a, _ in self._windows(index, t) if a > t), default=math.inf)

    def next_offline(self, index: int, t: float) -> float:
        """The end of the interval holding ``t`` (``t`` when offline)."""
        if index not in self.intervals:
            return math.inf
        return next((b for a, b in self._windows(index, t) if a <= t < b), t)


def build_availability(section: VirtualSection, seed: int) -> Availability:
    """The availability model ``[virtual] availability`` names."""
    if section.availability == "diurnal":
        return Diurnal(section.online_fraction, section.period_s, seed)
    if section.availability == "trace":
        return TraceAvailability.from_csv(section.trace_file, section.period_s
                                          if section.period_s != DAY_S else 0.0)
    return AlwaysOnline()
