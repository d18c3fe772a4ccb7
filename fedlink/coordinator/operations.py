"""Operator-facing coordinator settings: the metrics endpoint and the netcheck probe.

``[coordinator.metrics]`` turns on a Prometheus ``/metrics`` endpoint (``fedlink.observe``);
``[coordinator.netcheck]`` allows ``fedlink netcheck`` to measure the link to this coordinator
through the ``Probe`` call, within a rate limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedlink.config import check_fields, require

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
        check_fields(self, "coordinator.metrics")
        require(bool(self.host), "coordinator.metrics.host", "must not be empty")
        require(0 <= self.port <= 65535, "coordinator.metrics.port",
                f"must be in [0, 65535], got {self.port}")


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
        check_fields(self, "coordinator.netcheck")
        require(0 < self.max_bytes <= MAX_PROBE_BYTES, "coordinator.netcheck.max_bytes",
                f"must be in [1, {MAX_PROBE_BYTES}], got {self.max_bytes}")
        require(self.probes_per_minute >= 1, "coordinator.netcheck.probes_per_minute",
                f"must be >= 1, got {self.probes_per_minute}")
