"""The packet tier (``fedlink.netem.packet``): calibration of loss, burst loss, rate, delay,
traces and outages, measured by probes through real namespaces; cleanup, also after a crash.

Tests that create namespaces skip with the reason from ``packet_tier_available()`` unless run
as root with ``/dev/net/tun``. All traffic stays inside the namespaces each test creates.
Rates are kept to a few Mbit/s so the Python forwarder is never the bottleneck.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedlink.errors import ConfigError
from fedlink.netem.packet import (
    PacketLink,
    PacketTierUnavailable,
    cleanup_stale,
    load_trace,
    packet_tier_available,
)
from fedlink.netem.packet_ns import STATE_DIR, list_namespaces, process_start_ticks
from fedlink.netem.packet_probe import loss_runs, tcp_bulk_kbps, udp_probes, udp_rate_kbps
from fedlink.netem.packet_shaper import (
    BurstLoss,
    OutageSchedule,
    RateBottleneck,
    TraceBottleneck,
    seeded_rng,
)
from fedlink.netem.profile import GilbertElliott, LinkProfile

AVAILABLE, REASON = packet_tier_available()
needs_packet_tier = pytest.mark.skipif(not AVAILABLE, reason=REASON)
# one xdist worker for every packet-tier test (test_lossy_packets too): a link's start cleans
# up stale links, which would race with the check of what cleanup_stale removed
pytestmark = pytest.mark.xdist_group("packet-tier")


# --- leak checks ----------------------------------------------------------------------------


def root_devices() -> str:
    """``ip -o link`` of the root namespace."""
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                          check=True).stdout


def assert_nothing_left(link: PacketLink, forwarder_pid: int) -> None:
    """No namespace, device, marker, forwarder or helper thread of ``link`` remains."""
    namespaces = list_namespaces()
    assert link.client_ns not in namespaces and link.server_ns not in namespaces
    devices = root_devices()
    assert link.client_dev not in devices and link.server_dev not in devices
    assert process_start_ticks(forwarder_pid) is None, "the forwarder process is still there"
    assert not (STATE_DIR / f"{link.link_id}.json").exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("fedlink-setns")]


@contextlib.contextmanager
def open_link(profile: LinkProfile, **options: int) -> Iterator[PacketLink]:
    """A running link that is checked for leftovers once closed."""
    link = PacketLink(profile, **options)
    with link:
        pid = link.forwarder_pid
        assert pid is not None and process_start_ticks(pid) is not None
        assert link.client_ns.startswith("fl-") and link.server_ns.startswith("fl-")
        yield link
    assert_nothing_left(link, pid)


# --- calibration through real namespaces -----------------------------------------------------


@needs_packet_tier
@pytest.mark.timeout(30)
def test_random_loss_each_way_within_three_points() -> None:
    profile = LinkProfile(name="lossy", loss_up=0.05, loss_down=0.05, seed=1)
    with open_link(profile) as link:
        probes = udp_probes(link, 4000, per_second=5000)
        counters = link.counters
    assert counters.dropped_up + counters.packets_up == 4000, "probes lost outside the link"
    assert abs(probes.loss_up - 0.05) <= 0.03, probes.loss_up
    assert abs(probes.loss_down - 0.05) <= 0.03, probes.loss_down
    assert counters.dropped_down == len(probes.at_server) - len(probes.echoed)


@needs_packet_tier
@pytest.mark.timeout(30)
def test_gilbert_elliott_losses_come_in_bursts_of_mean_one_over_r() -> None:
    burst = GilbertElliott(p=0.03, r=0.25)
    profile = LinkProfile(name="bursty", burst_loss=burst, seed=2)
    with open_link(profile) as link:
        probes = udp_probes(link, 10_000, per_second=8000, echo=False)
    runs = loss_runs(probes.at_server, probes.sent)
    assert len(runs) > 100
    assert abs(statistics.mean(runs) - 1 / burst.r) <= 0.3 / burst.r, statistics.mean(runs)
    assert abs(probes.loss_up - burst.mean_loss) <= 0.03


@needs_packet_tier
@pytest.mark.timeout(30)
def test_rate_limit_caps_each_way_and_drops_the_excess() -> None:
    """Each direction is capped at its own rate (never faster; a loaded host can only make
    it slower, so how close it comes is benchmarks/netem_packet.py's figure), and what is
    offered beyond the rate is dropped by the bounded queue, not delivered late."""
    profile = LinkProfile(name="slow", latency_ms=10, up_kbps=1000, down_kbps=2000)
    with open_link(profile) as link:
        tcp_up = tcp_bulk_kbps(link, 250_000, upload=True)  # 2 s at 1000 kbit/s
        udp_down = udp_rate_kbps(link, offered_kbps=2500, seconds=1.5, upload=False)
        counters = link.counters
    assert 0 < tcp_up <= 1000 * 1.15, tcp_up
    assert 0 < udp_down <= 2000 * 1.15, udp_down
    assert counters.dropped_down > 0, "the offered excess is dropped by the bounded queue"
    assert link.stats()["queue_down"] == counters.dropped_down, "dropped by the queue only"
    assert counters.dropped_up == 0


@needs_packet_tier
@pytest.mark.timeout(30)
def test_round_trip_is_twice_the_latency_and_jitter_spreads_it() -> None:
    with open_link(LinkProfile(name="far", latency_ms=50)) as link:
        rtts = udp_probes(link, 100, per_second=100, settle_s=0.3).rtts
    assert len(rtts) == 100
    # Never early. Late only by the host's scheduling (a starved forwarder adds delay), which
    # delays some probes, never all: the fastest one shows a delay applied once each way, not
    # twice. Fidelity is measured, not asserted, by benchmarks/netem_packet.py (rtt_error_*).
    assert min(rtts) >= 0.100 * 0.95, min(rtts)
    assert min(rtts) < 0.200, min(rtts)
    # Probes 40 ms apart: order-keeping almost never delays one behind the previous.
    with open_link(LinkProfile(name="jittery", latency_ms=40, jitter_ms=10, seed=3)) as link:
        rtts = udp_probes(link, 100, per_second=25, settle_s=0.3).rtts
    assert statistics.mean(rtts) >= 0.080 * 0.85, statistics.mean(rtts)
    expected_sd = math.sqrt(2) * 0.010  # two independent one-way jitters
    assert statistics.stdev(rtts) >= 0.7 * expected_sd, statistics.stdev(rtts)  # a spread


@needs_packet_tier
@pytest.mark.timeout(30)
def test_delivery_follows_the_trace_of_each_direction(tmp_path: Path) -> None:
    """Each direction delivers at its own trace's opportunities: never faster than its trace
    allows, and the direction with ten times the opportunities delivers faster than the other
    (how close each comes to its trace is benchmarks/netem_packet.py's figure: a loaded host
    only slows the forwarder). The opportunity arithmetic is tested on its own below
    (test_trace_bottleneck_shares_an_opportunity_and_wastes_idle_ones)."""
    fast, slow = tmp_path / "12mbps.trace", tmp_path / "1.2mbps.trace"
    fast.write_text("1\n")   # one 1500-byte opportunity every millisecond: 12 Mbit/s
    slow.write_text("10\n")  # one every 10 ms: 1.2 Mbit/s
    profile = LinkProfile(name="traced", trace_up=str(fast), trace_down=str(slow))
    with open_link(profile) as link:
        up = tcp_bulk_kbps(link, 1_500_000, upload=True)
        down = tcp_bulk_kbps(link, 150_000, upload=False)
        stats = link.stats()
    assert 0 < up <= 12_000 * 1.15, up
    assert 0 < down <= 1_200 * 1.15, down
    assert up > 2 * down, (up, down)
    assert stats["bytes_up"] >= 1_500_000 and stats["bytes_down"] >= 150_000


@needs_packet_tier
@pytest.mark.timeout(30)
def test_outages_drop_what_is_sent_during_them() -> None:
    profile = LinkProfile(name="outages", blackout_every_s=0.4, blackout_s=0.3, seed=4)
    with open_link(profile) as link:
        probes = udp_probes(link, 600, per_second=250, echo=False, settle_s=0.1)
        counters = link.counters
        stats = link.stats()
    assert counters.blackouts >= 2
    assert counters.stalled_s > 0
    # what was lost was lost to the outages, and nothing else was lost (the share of time the
    # link spent down against the share of probes lost is benchmarks/netem_packet.py's figure)
    assert probes.loss_up > 0
    assert stats["outage_up"] == counters.dropped_up > 0
    assert counters.packets_up + counters.dropped_up == 600


# --- cleanup --------------------------------------------------------------------------------

CRASHING_OWNER = textwrap.dedent("""
    import time
    from fedlink.netem.packet import PacketLink
    from fedlink.netem.profile import LinkProfile
    link = PacketLink(LinkProfile(latency_ms=5)).start()
    print(link.client_ns, link.server_ns, link.forwarder_pid, flush=True)
    time.sleep(60)
""")


def crash_an_owner() -> tuple[str, str]:
    """Start a link in a child process, SIGKILL the child (no cleanup code of it runs) and wait
    until its orphaned forwarder has exited; returns the link's two namespaces."""
    owner = subprocess.Popen([sys.executable, "-c", CRASHING_OWNER], stdout=subprocess.PIPE,
                             text=True, cwd=Path(__file__).parents[2])
    try:
        assert owner.stdout is not None
        client_ns, server_ns, forwarder = owner.stdout.readline().split()
        assert {client_ns, server_ns} <= set(list_namespaces())
    finally:
        owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    give_up = time.monotonic() + 5
    while process_start_ticks(int(forwarder)) is not None and time.monotonic() < give_up:
        time.sleep(0.05)
    assert process_start_ticks(int(forwarder)) is None, "the orphaned forwarder did not exit"
    return client_ns, server_ns


@needs_packet_tier
@pytest.mark.timeout(60)
def test_a_crashed_owner_leaves_nothing_after_cleanup_stale() -> None:
    # stale links are machine-wide: any process on this machine that starts a link (another
    # test worker, another suite sharing the machine) cleans them up too, so a crash whose
    # namespaces were taken before this test's own call (before it or between its check and
    # its call) proves nothing and is repeated
    for _ in range(3):
        client_ns, server_ns = crash_an_owner()
        removed = cleanup_stale()
        if {client_ns, server_ns} <= set(removed):
            break
        # not removed by this call: another process took them first, or the call failed
        assert not {client_ns, server_ns} & set(list_namespaces()), removed
    else:
        pytest.fail("another process removed the crashed owner's namespaces three times over")
    assert not {client_ns, server_ns} & set(list_namespaces())


@needs_packet_tier
@pytest.mark.timeout(30)
def test_helpers_run_commands_inside_the_namespaces() -> None:
    with open_link(LinkProfile(name="plain")) as link:
        server = link.popen_in_server(["sleep", "30"])
        shown = link.run_in_client(["ip", "-o", "-4", "addr", "show", "dev", link.client_dev],
                                   capture_output=True, text=True, check=True).stdout
        assert link.client_addr in shown
        cleanup_stale()  # a live owner's link is not stale
        assert {link.client_ns, link.server_ns} <= set(list_namespaces()) and link.running
    assert server.poll() is not None, "close() stops processes started in the namespaces"


# --- errors and pure scheduling (no root needed) --------------------------------------------


@pytest.mark.parametrize(("content", "line", "what"), [
    ("1\n2\nabc\n", 3, "expected an integer"),
    ("5\n3\n", 2, "must not decrease"),
    ("0\n-4\n", 2, "must be >= 0"),
])
def test_a_malformed_trace_fails_naming_file_and_line(tmp_path: Path, content: str, line: int,
                                                      what: str) -> None:
    trace = tmp_path / "bad.trace"
    trace.write_text(content)
    with pytest.raises(ConfigError, match=f"{re.escape(str(trace))}, line {line}: .*{what}"):
        PacketLink(LinkProfile(trace_up=str(trace)))


def test_an_empty_or_missing_trace_fails_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "empty.trace").write_text("\n")
    with pytest.raises(ConfigError, match=r"empty\.trace: holds no timestamps"):
        load_trace(tmp_path / "empty.trace")
    with pytest.raises(ConfigError, match=r"missing\.trace: cannot read it"):
        PacketLink(LinkProfile(trace_down=str(tmp_path / "missing.trace")))


def test_without_root_the_link_refuses_with_a_clear_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    available, reason = packet_tier_available()
    assert not available and "root" in reason
    with pytest.raises(PacketTierUnavailable, match="needs root"):
        PacketLink(LinkProfile()).start()


def test_rate_bottleneck_serializes_and_drops_tail() -> None:
    bottleneck = RateBottleneck(kbps=1200, queue_bytes=3000)  # 1500 B take 10 ms
    assert bottleneck.departure(1500, 0.0) == pytest.approx(0.010)
    assert bottleneck.departure(1500, 0.0) == pytest.approx(0.020)
    assert bottleneck.departure(1500, 0.0) is None  # 3000 B queued: full
    assert bottleneck.departure(1500, 0.015) == pytest.approx(0.030)


def test_trace_bottleneck_shares_an_opportunity_and_wastes_idle_ones(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("10\n")
    bottleneck = TraceBottleneck(load_trace(tmp_path / "t"), queue_bytes=10**6, start=0.0)
    assert bottleneck.departure(1000, 0.0) == pytest.approx(0.010)
    assert bottleneck.departure(500, 0.001) == pytest.approx(0.010)  # rest of the same one
    assert bottleneck.departure(1000, 0.002) == pytest.approx(0.020)
    assert bottleneck.departure(100, 0.025) == pytest.approx(0.030)  # idle credit was lost


def test_burst_loss_chain_has_the_configured_burst_length() -> None:
    chain = BurstLoss(GilbertElliott(p=0.05, r=0.2), seeded_rng(0, "up", "burst"))
    lost = [chain.lost() for _ in range(100_000)]
    received = [i for i, gone in enumerate(lost) if not gone]
    assert statistics.mean(loss_runs(received, len(lost))) == pytest.approx(5.0, rel=0.05)


def test_outage_schedule_matches_its_means() -> None:
    outages = OutageSchedule(every_s=2.0, mean_s=0.5, rng=seeded_rng(0, "both", "outage"),
                             start=0.0)
    down = sum(outages.is_down(t / 100) for t in range(200_000)) / 200_000
    count, stalled = outages.summary(2000.0)
    assert down == pytest.approx(0.5 / 2.5, abs=0.02)
    assert stalled / 2000 == pytest.approx(down, abs=0.01)
    assert count == pytest.approx(2000 / 2.5, rel=0.1)
