"""Mahimahi delivery traces for the packet tier.

A trace file holds one integer per line: a millisecond timestamp at which the link may deliver
one 1500-byte packet's worth of bytes (a *delivery opportunity*). Timestamps never decrease;
several opportunities may share a millisecond. The trace loops: after the last timestamp
``T`` it starts again at ``T`` ms, so a file holding the single line ``1`` is a 12 Mbit/s link
and one holding ``10`` is a 1.2 Mbit/s link (Mahimahi's convention). Blank lines are ignored.

Semantics of delivery (as in Mahimahi's link shell): at each opportunity, up to 1500 bytes of
the queue head leave the bottleneck; a packet may collect its bytes over several opportunities.
An opportunity that finds the queue empty is wasted, and so is what is left of one once the
queue has drained.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from fedlink.errors import ConfigError

OPPORTUNITY_BYTES = 1500
"""Bytes one delivery opportunity carries (Mahimahi's MTU-sized opportunity)."""


@dataclass(frozen=True)
class DeliveryTrace:
    """A loaded, validated trace: sorted opportunity times (ms) within one period."""

    path: str
    times_ms: tuple[int, ...]

    @property
    def period_ms(self) -> int:
        """Length of one loop of the trace (its last timestamp)."""
        return self.times_ms[-1]

    @property
    def mean_kbps(self) -> float:
        """Average capacity in kbit/s over one period."""
        return len(self.times_ms) * OPPORTUNITY_BYTES * 8 / self.period_ms

    def opportunity_ms(self, index: int) -> int:
        """Time (ms since the trace started) of opportunity number ``index`` (0-based)."""
        loops, within = divmod(index, len(self.times_ms))
        return loops * self.period_ms + self.times_ms[within]

    def first_at_or_after(self, time_ms: float) -> int:
        """Index of the first opportunity whose time is ``>= time_ms``."""
        loops_f, within = divmod(max(0.0, time_ms), self.period_ms)
        loops = int(loops_f)
        if loops > 0 and within == 0:  # the previous loop's last opportunity is at this instant
            loops, within = loops - 1, self.period_ms
        return loops * len(self.times_ms) + bisect.bisect_left(self.times_ms, within)


def _parse_line(path: str, number: int, text: str, previous: int) -> int:
    """One timestamp, or ``ConfigError`` naming the file and line."""
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"trace {path}, line {number}: expected an integer millisecond "
                          f"timestamp, got {text!r}") from None
    if value < 0:
        raise ConfigError(f"trace {path}, line {number}: timestamps must be >= 0, got {value}")
    if value < previous:
        raise ConfigError(f"trace {path}, line {number}: timestamps must not decrease "
                          f"({value} after {previous})")
    return value


def load_trace(path: str | Path) -> DeliveryTrace:
    """Read and validate a Mahimahi trace file.

    Raises ``ConfigError`` naming the file (and the line, where one is at fault) when the file
    cannot be read, holds something other than non-decreasing integers, is empty, or ends at
    0 ms (a trace must span at least one millisecond).
    """
    name = str(path)
    try:
        lines = Path(path).read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"trace {name}: cannot read it ({exc})") from None
    times: list[int] = []
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if text:
            times.append(_parse_line(name, number, text, times[-1] if times else 0))
    if not times:
        raise ConfigError(f"trace {name}: holds no timestamps")
    if times[-1] <= 0:
        raise ConfigError(f"trace {name}: the last timestamp must be > 0 ms, got {times[-1]}")
    return DeliveryTrace(name, tuple(times))
