"""The coordinator limits a real-gRPC simulation runs with: per-device caps sized for a population
that shares one address and one connection.

The coordinator's defaults assume one device per peer address and per HTTP/2 connection
(``fedlink.coordinator.config.LimitsConfig``): at most ``join_burst_per_peer`` Joins at once
from one address (``join_global_burst`` from all), ``max_streams_per_connection``
concurrent calls on one connection, ``max_clients`` in all (and ``max_connections``, when
set, connections in all: a client behind an emulated link has a connection of its own).
``fedlink simulate`` runs every client in one process, from 127.0.0.1, and gRPC gives
channels to the same target one shared connection, so those caps would refuse a population
larger than a device's worth of calls: at 10,000 clients the Joins met ``REFUSED_STREAM``
(stream cap) and per-peer Join throttling until their retry budgets ran out. A simulation
raises those caps to what its population needs (never lowers them); caps per client (request
rate, uploads, tokens) are kept, as each simulated client is one (with its own name, so its
own request budget).

A large population also gets pace steering (``limits.checkins_per_s``, unless the config sets
it): one process serves every idle client's long polls, and 10,000 of them asking again every
second or so would be a load of their own.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from fedlink.coordinator.config import CoordinatorConfig

log = logging.getLogger(__name__)

STREAMS_PER_CLIENT = 4
"""Concurrent calls one client may hold: a long poll, a heartbeat, an upload, a download."""

STREAM_HEADROOM = 100
"""Streams beyond the population's own (probes, the health check)."""

CONNECTIONS_PER_CLIENT = 2
"""Connections one client may hold for a while: its own (each client behind an emulated
link dials through a proxy of its own) and the one it left after a stall, until it closes."""

CONNECTION_HEADROOM = 100
"""Connections beyond the population's own (probes, the health check)."""

PACED_FROM_CLIENTS = 2000
"""From this population on, a simulation steers idle clients' pace (smaller ones keep the
plain ``retry_after_s``)."""

SIM_CHECKINS_PER_S = 200.0
"""The check-in rate a paced simulation aims at: about a tenth of what one event loop serves."""


def for_population(config: CoordinatorConfig, clients: int) -> CoordinatorConfig:
    """``config`` with the per-address and per-connection caps raised to fit ``clients`` (and,
    for a large population, pace steering on)."""
    limits = config.limits
    wanted: dict[str, Any] = {
        "max_clients": max(limits.max_clients, clients),
        "join_burst_per_peer": max(limits.join_burst_per_peer, clients),
        "join_global_burst": max(limits.join_global_burst, clients),
        "max_streams_per_connection": max(limits.max_streams_per_connection,
                                          STREAMS_PER_CLIENT * clients + STREAM_HEADROOM),
    }
    if limits.max_connections:
        wanted["max_connections"] = max(limits.max_connections,
                                        CONNECTIONS_PER_CLIENT * clients
                                        + CONNECTION_HEADROOM)
    if clients >= PACED_FROM_CLIENTS and not limits.checkins_per_s:
        wanted["checkins_per_s"] = SIM_CHECKINS_PER_S
    raised = {key: value for key, value in wanted.items() if value != getattr(limits, key)}
    if not raised:
        return config
    log.info("simulating %d clients from one address over one connection: raising %s",
             clients, ", ".join(f"limits.{k} to {v}" for k, v in raised.items()))
    return dataclasses.replace(config, limits=dataclasses.replace(limits, **raised))
