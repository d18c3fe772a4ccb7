"""Packet-tier fidelity: configured against measured loss, RTT and rate, per preset.

For every preset (``fedlink.netem.presets``; a few profiles of our own when that module is
missing) a ``PacketLink`` is built from the preset's packet-tier parameters, and probes
inside its namespaces measure:

- **loss** each way: sequence-numbered UDP probes echoed by the server, on the preset with its
  rate limit removed (so that only loss drops probes). Configured loss is
  ``1 - (1 - loss) * (1 - burst mean loss)``. ``loss_error_<preset>_<dir>`` is
  measured - configured in **points** (percentage points).
- **RTT**: echoed UDP probes spaced four jitter deviations apart (at least 10 ms, so that
  keeping packet order hardly ever delays one), through the whole preset.
  Configured RTT is twice the mean one-way delay (latency plus jitter, cut at zero) plus
  the probe's serialization time at the preset's rates. ``rtt_error_<preset>`` is
  measured mean / configured - 1.
- **rate** each way: UDP offered at 1.25x the configured rate; the receiver's rate of IP
  bytes, on the preset without loss and jitter. ``rate_error_<preset>_<dir>`` is
  measured / configured - 1.

Outages (``blackout_*``) are left out of every measurement above: over a few seconds their
random share of time would swamp the errors being measured.

The forwarder's own cost, measured in the same run on a clean profile:
``forwarder_us_per_packet`` (CPU time of the forwarder process per packet forwarded, during
a TCP bulk transfer), ``clean_tcp_mbps`` (that transfer's goodput: the ceiling of the
Python forwarder on this machine) and ``rtt_overhead_ms`` (median RTT of a clean link minus
that of loopback in one namespace). Targets: |loss error| <= 1 point, |rtt error| <= 0.15,
|rate error| <= 0.15, except the RTT of sub-millisecond presets (``lan``), where the
forwarder's fixed ~0.2-0.5 ms per round trip dominates.

Needs root and ``/dev/net/tun``; otherwise prints the reason and writes
``{"skipped": reason}``. Run: ``python benchmarks/netem_packet.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.netem.packet import PacketLink, packet_tier_available
from fedlink.netem.packet_probe import (
    PROBE,
    UDP_IP_OVERHEAD,
    tcp_bulk_kbps,
    udp_probes,
    udp_rate_kbps,
)
from fedlink.netem.profile import GilbertElliott, LinkProfile

PROBE_BYTES = 64  # UDP payload of a loss / RTT probe


def presets() -> Mapping[str, LinkProfile]:
    """The library's presets, or a few stand-ins when ``fedlink.netem.presets`` is absent."""
    try:
        from fedlink.netem.presets import PRESETS
    except ImportError:
        return {p.name: p for p in (
            LinkProfile(name="good", latency_ms=10, jitter_ms=2, up_kbps=5000, down_kbps=10000),
            LinkProfile(name="lossy", latency_ms=40, jitter_ms=10, up_kbps=1000,
                        down_kbps=2000, loss_up=0.02, loss_down=0.02,
                        burst_loss=GilbertElliott(p=0.01, r=0.25, loss_bad=0.5)),
            LinkProfile(name="slow", latency_ms=200, jitter_ms=40, up_kbps=100, down_kbps=200,
                        loss_up=0.01, loss_down=0.01),
        )}
    return PRESETS


def key(name: str) -> str:
    """A preset name as a figure-name part (``wifi-good`` -> ``wifi_good``)."""
    return name.replace("-", "_")


def without_outages(profile: LinkProfile) -> LinkProfile:
    """``profile`` with its blackouts removed."""
    return profile.replace(blackout_every_s=None, blackout_s=0.0)


def configured_loss(profile: LinkProfile, direction: str) -> float:
    """Long-run loss of one direction: random loss, then burst loss."""
    loss = profile.loss_up if direction == "up" else profile.loss_down
    burst = profile.burst_loss.mean_loss if profile.burst_loss else 0.0
    return 1 - (1 - loss) * (1 - burst)


def mean_one_way_s(latency_ms: float, jitter_ms: float) -> float:
    """Mean of ``max(0, N(latency, jitter))``: the profile's delay, never below zero."""
    if jitter_ms <= 0:
        return latency_ms / 1000
    z = latency_ms / jitter_ms
    cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    pdf = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    return (latency_ms * cdf + jitter_ms * pdf) / 1000


def configured_rtt_s(profile: LinkProfile) -> float:
    """Two mean one-way delays plus a probe's serialization each way."""
    bits = (PROBE_BYTES + UDP_IP_OVERHEAD) * 8
    serialize = sum(bits / (kbps * 1000) for kbps in (profile.up_kbps, profile.down_kbps) if kbps)
    return 2 * mean_one_way_s(profile.latency_ms, profile.jitter_ms) + serialize


def measure_loss(profile: LinkProfile, probes: int) -> dict[str, float]:
    """Loss each way, configured and measured, plus the error in points."""
    lossy = without_outages(profile).replace(up_kbps=None, down_kbps=None)
    with PacketLink(lossy) as link:
        result = udp_probes(link, probes, per_second=2000,
                            settle_s=2 * profile.latency_ms / 1000 + 0.5, size=PROBE_BYTES)
    figures: dict[str, float] = {}
    for direction, measured in (("up", result.loss_up), ("down", result.loss_down)):
        configured = configured_loss(profile, direction)
        name = f"{key(profile.name)}_{direction}"
        figures[f"loss_configured_{name}"] = configured
        figures[f"loss_measured_{name}"] = measured
        figures[f"loss_error_{name}"] = 100 * (measured - configured)
    return figures


def measure_rtt(profile: LinkProfile, probes: int) -> dict[str, float]:
    """Mean RTT of probes sent one by one, against the configured RTT."""
    spacing = max(0.01, 4 * profile.jitter_ms / 1000)
    settle = 2 * (profile.latency_ms + 4 * profile.jitter_ms) / 1000 + 0.5
    with PacketLink(without_outages(profile)) as link:
        rtts = udp_probes(link, probes, per_second=1 / spacing, settle_s=settle,
                          size=PROBE_BYTES).rtts
    configured = configured_rtt_s(profile)
    measured = statistics.mean(rtts) if rtts else float("nan")
    name = key(profile.name)
    return {f"rtt_configured_ms_{name}": 1000 * configured,
            f"rtt_measured_ms_{name}": 1000 * measured,
            f"rtt_error_{name}": measured / configured - 1 if configured > 0 else 0.0}


def measure_rate(profile: LinkProfile, seconds: float) -> dict[str, float]:
    """Rate each way under a UDP load of 1.25x the configured rate (no loss, no outages, no
    jitter: jitter would move the first and last arrivals that bound the window). One link
    per direction: the backlog of one run must not share the link with the next."""
    clean = without_outages(profile).replace(loss_up=0.0, loss_down=0.0, burst_loss=None,
                                             jitter_ms=0.0)
    figures: dict[str, float] = {}
    for direction, kbps in (("up", profile.up_kbps), ("down", profile.down_kbps)):
        if kbps is None:
            continue
        with PacketLink(clean) as link:
            measured = udp_rate_kbps(link, 1.25 * kbps, seconds, upload=direction == "up",
                                     settle_s=2 * profile.latency_ms / 1000 + 0.5)
        name = f"{key(profile.name)}_{direction}"
        figures[f"rate_configured_kbps_{name}"] = kbps
        figures[f"rate_measured_kbps_{name}"] = measured
        figures[f"rate_error_{name}"] = measured / kbps - 1
    return figures


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _loopback_rtt_ms(link: PacketLink, count: int) -> float:
    """Median UDP echo RTT over loopback inside the server namespace."""
    with (link.server_socket(kind=socket.SOCK_DGRAM) as server,
          link.server_socket(kind=socket.SOCK_DGRAM) as client):
        server.bind(("127.0.0.1", 0))
        rtts = []
        for seq in range(count):
            start = time.monotonic()
            client.sendto(PROBE.pack(seq, start), server.getsockname())
            data, peer = server.recvfrom(64)
            server.sendto(data, peer)
            client.recvfrom(64)
            rtts.append(time.monotonic() - start)
    return 1000 * statistics.median(rtts)


def forwarder_cost(nbytes: int, probes: int) -> dict[str, float]:
    """The Python forwarder's CPU per packet, goodput ceiling and added round-trip time."""
    with PacketLink(LinkProfile(name="clean")) as link:
        assert link.forwarder_pid is not None
        cpu_before = _cpu_seconds(link.forwarder_pid)
        packets_before = link.counters.packets_up + link.counters.packets_down
        goodput = tcp_bulk_kbps(link, nbytes, upload=True)
        cpu = _cpu_seconds(link.forwarder_pid) - cpu_before
        packets = link.counters.packets_up + link.counters.packets_down - packets_before
        rtt = statistics.median(udp_probes(link, probes, per_second=100, settle_s=0.2).rtts)
        loopback = _loopback_rtt_ms(link, probes)
    return {"forwarder_us_per_packet": 1e6 * cpu / packets,
            "clean_tcp_mbps": goodput / 1000,
            "rtt_overhead_ms": 1000 * rtt - loopback}


def summarize(figures: dict[str, Any]) -> dict[str, float]:
    """Worst errors over all presets."""
    def worst(prefix: str) -> float:
        return max((abs(v) for k, v in figures.items() if k.startswith(prefix)), default=0.0)
    return {"max_abs_loss_error_points": worst("loss_error_"),
            "max_abs_rtt_error": worst("rtt_error_"),
            "max_abs_rate_error": worst("rate_error_")}


def main() -> None:
    """Measure every preset and the forwarder's cost; print and optionally save figures."""
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "netem_packet")
    available, reason = packet_tier_available()
    if not available:
        print(f"skipped: {reason}")
        report({"skipped": reason}, args.json)
        return
    loss_probes, rtt_probes, rate_s = (2000, 20, 0.75) if args.quick else (20000, 100, 4.0)
    figures: dict[str, Any] = {"quick": args.quick}
    started = time.monotonic()
    for profile in presets().values():
        figures |= measure_loss(profile, loss_probes)
        figures |= measure_rtt(profile, rtt_probes)
        figures |= measure_rate(profile, rate_s)
    figures |= forwarder_cost(20_000_000 if args.quick else 100_000_000, rtt_probes * 2)
    figures |= summarize(figures)
    figures["wall_seconds"] = time.monotonic() - started
    report(figures, args.json)


if __name__ == "__main__":
    main()
