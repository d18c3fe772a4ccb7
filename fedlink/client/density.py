"""Bandwidth-aware density: pick the top-k density so the upload fits before the deadline.

The rule, applied to each update of a sparsifying codec (``topk``, ``randk`` and their ``+q8``
etc. variants) when a ``DensityPolicy`` is configured::

    budget  = safety * G * T_left
    density = the largest d in [min_density, max_density] with size_bound(d, n) <= budget

where ``G`` is the client's recent upload goodput (payload bytes over the seconds that upload
and commit took, averaged over recent uploads with weight ``smoothing`` on the newest),
``T_left`` the seconds left before the task's deadline once training is done, and
``size_bound(d, n)`` the codec's worst-case bytes for ``n`` values at density ``d`` (so the
planned upload never exceeds the budget). When even ``min_density`` does not fit, the client
sends ``min_density`` (it may still make it; the coordinator decides). Without a measurement
yet (the first upload) or without a deadline the codec's configured density is used, clamped
into the bounds. ``G`` includes round trips, so small uploads understate the link's bandwidth:
the rule errs on the side of fitting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedlink.compress import Sparsifier
from fedlink.config import require


@dataclass(frozen=True)
class DensityPolicy:
    """Bounds and safety margin of the density rule (module docstring)."""

    min_density: float = 0.001
    max_density: float = 0.1
    safety: float = 0.5

    def __post_init__(self) -> None:
        require(0.0 < self.min_density <= self.max_density <= 1.0, "density",
                f"need 0 < min_density <= max_density <= 1, got [{self.min_density}, "
                f"{self.max_density}]")
        require(0.0 < self.safety <= 1.0, "density.safety",
                f"must be in (0, 1], got {self.safety}")

    def choose(self, codec: Sparsifier, size: int, goodput: float | None,
               time_left_s: float | None) -> Sparsifier:
        """The codec at the density the rule gives for an update of ``size`` values."""
        if goodput is None or time_left_s is None or size == 0:
            return codec.with_density(self._clamp(codec.density))
        budget = self.safety * goodput * max(0.0, time_left_s)
        low = max(1, math.ceil(self.min_density * size))
        high = max(low, math.floor(self.max_density * size))
        if codec.with_density(low / size).size_bound(size) > budget:
            return codec.with_density(low / size)
        while low < high:  # largest k whose bound fits the budget (bounds grow with k)
            mid = (low + high + 1) // 2
            if codec.with_density(mid / size).size_bound(size) <= budget:
                low = mid
            else:
                high = mid - 1
        return codec.with_density(low / size)

    def _clamp(self, density: float) -> float:
        return min(self.max_density, max(self.min_density, density))


class GoodputMeter:
    """Recent upload goodput in bytes per second (an exponentially weighted average)."""

    def __init__(self, smoothing: float = 0.5) -> None:
        require(0.0 < smoothing <= 1.0, "goodput.smoothing",
                f"must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        self.bytes_per_s: float | None = None

    def observe(self, num_bytes: int, seconds: float) -> None:
        """One upload of ``num_bytes`` took ``seconds`` (upload and commit)."""
        if num_bytes <= 0 or seconds <= 0:
            return
        rate = num_bytes / seconds
        previous = self.bytes_per_s
        self.bytes_per_s = rate if previous is None else \
            self.smoothing * rate + (1 - self.smoothing) * previous
