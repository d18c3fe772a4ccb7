"""Operator-facing coordinator settings: the metrics endpoint and the netcheck probe.

``[coordinator.metrics]`` turns on a Prometheus ``/metrics`` endpoint (``fedlink.observe``);
``[coordinator.netcheck]`` allows ``fedlink netcheck`` to measure the link to this coordinator
through the ``Probe`` call, within a rate limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedlink.config import require

MAX_PROBE_BYTES = 4 * 1024 * 1024 - 64 * 1024
"""The largest probe payload: below gRPC's default 4 MiB message limit, with room to spare."""


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus endpoint: off unless ``enabled``; ``port = 0`` picks a free port.

    It listens on loopback by default: metrics tell the run's progress to whoever can read
    them, so exposing them beyond the machine is the operator's explicit choice.
    """

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 9464

    def __post_init__(self) -> None:
        require(isinstance(self.enabled, bool), "metrics.enabled", "must be true or false")
        require(bool(self.host), "metrics.host", "must not be empty")
        require(0 <= self.port <= 65535, "metrics.port", f"must be in [0, 65535], got {self.port}")


@dataclass(frozen=True)
class NetcheckConfig:
    """Whether ``Probe`` calls are answered, how large they may be and how often they come.

    ``probes_per_minute`` is one coordinator-wide budget (a token bucket holding at most that
    many), so probes cannot take more than a known share of the coordinator's link whoever
    sends them; calls beyond it are answered ``RESOURCE_EXHAUSTED`` with a retry hint.
    """

    enabled: bool = False
    max_bytes: int = 1024 * 1024
    probes_per_minute: int = 240

    def __post_init__(self) -> None:
        require(isinstance(self.enabled, bool), "netcheck.enabled", "must be true or false")
        require(0 < self.max_bytes <= MAX_PROBE_BYTES, "netcheck.max_bytes",
                f"must be in [1, {MAX_PROBE_BYTES}], got {self.max_bytes}")
        require(self.probes_per_minute >= 1, "netcheck.probes_per_minute",
                f"must be >= 1, got {self.probes_per_minute}")
