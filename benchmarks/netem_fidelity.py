"""Fidelity of the TCP proxy tier: configured against measured RTT and throughput, per preset.

For every preset of ``fedlink.netem.presets`` a ``TcpProxy`` relays to an asyncio upstream on
127.0.0.1 in this process, and the benchmark measures:

- **RTT**: the median round trip of 64-byte echoes (over several connections at once, or one
  for RTTs under 10 ms), against the configured ``2 x latency_ms``. The error compares the
  round trip the link *adds* (measured minus ``rtt_base_ms``, the same echo without the proxy:
  the emulated link replaces the wire, not the two endpoints' stacks) with the configured one;
  the proxy's own hops stay in it. Jitter is kept: it is symmetric, so the median stays
  ``2 x latency`` (the measured spread, from the interquartile range, is printed next to the
  configured ``sqrt(2) x jitter``; clipping delays at zero raises it a little for
  ``wifi-lossy``, whose jitter is 75% of its latency).
- **Throughput**, each direction on its own connection at once: the slope of bytes received
  over time at the receiver (least squares over its reads, after the first 10% of the bytes,
  so latency and start-up drop out), against ``up_kbps`` / ``down_kbps``.
  ``throughput_error_<preset>`` is the worse direction.
- **Loss**: ``n/a (proxy tier)``: a TCP proxy cannot drop packets (the packet tier measures it).

This measures the fidelity of latency and bandwidth: blackouts and resets (``flaky``,
``commute``) are switched off for the measurements, since an outage in the middle of a
sample measures the outage, not the link (their own calibration is in
``tests/integration/test_netem_proxy.py``).

Finally the proxy's own cost on a clean profile (no impairment): the throughput of a bulk
transfer (asyncio streams, the same client and server code) through the proxy divided by the
same transfer direct, alternating in this run, best of N on each side.
``proxy_throughput_ratio`` has the proxy as ``fedlink netem proxy`` deploys it, in its own
process (``proxy_mb_s`` and ``direct_mb_s`` are the absolute rates).
``same_loop_throughput_ratio`` repeats it with the proxy sharing the load's event loop, as in
a one-process simulation: one core then moves every byte twice, so expect about 0.5 (not a
target). On a busy 2-core machine the own-process figure drops towards that too.

Figures: ``rtt_base_ms``; per preset ``rtt_ms_<p>``, ``rtt_error_<p>``, ``up_kbps_<p>``,
``down_kbps_<p>``, ``throughput_error_<p>`` (and the configured values and spreads);
``max_rtt_error``, ``max_throughput_error``, ``loss``, ``blackout_stall_s`` and
``blackout_stall_error`` (a forced 1 s blackout against an echo stream), ``reset_planned_s``
and ``reset_time_error_s`` (a time-planned reset), ``proxy_throughput_ratio``,
``proxy_mb_s``, ``direct_mb_s``, ``same_loop_throughput_ratio``.
Targets: every relative error <= 0.15; ``proxy_throughput_ratio`` >= 0.5.

Run: ``python benchmarks/netem_fidelity.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.netem.presets import PRESETS
from fedlink.netem.profile import LinkProfile
from fedlink.netem.proxy import TcpProxy, plan_connection, split_address

PING = b"p" * 64
BULK_CHUNK = 256 * 1024
RAMP = 0.1
"""Throughput is fitted from the read that completes this share of the bytes (see ``Reads``)."""
SEQUENTIAL_BELOW_S = 0.010
"""Configured RTTs below this are pinged on one connection (concurrent pings would queue on
the event loop for a noticeable share of such a short round trip)."""


@dataclass(frozen=True)
class Plan:
    """How much to measure (``--quick`` or full)."""

    ping_connections: int
    pings: int
    transfer_s: float
    bulk_bytes: int
    bulk_pairs: int


QUICK = Plan(ping_connections=10, pings=10, transfer_s=1.0, bulk_bytes=256 << 20, bulk_pairs=3)
FULL = Plan(ping_connections=20, pings=20, transfer_s=3.0, bulk_bytes=1 << 30, bulk_pairs=5)


@dataclass
class Reads:
    """When a receiver's reads returned and how many bytes it had by then."""

    total: int = 0
    marks: list[tuple[float, int]] = field(default_factory=list)

    def add(self, nbytes: int) -> None:
        self.total += nbytes
        self.marks.append((time.perf_counter(), self.total))

    @property
    def t_last(self) -> float:
        return self.marks[-1][0]

    def rate(self, skip: float = RAMP) -> float:
        """Bytes per second: the least-squares slope of bytes over time, after ``skip``.

        A slope over every read, rather than (bytes / time) between two reads, keeps one
        chunk's jitter at either end from moving the figure.
        """
        marks = [(t, n) for t, n in self.marks if n >= skip * self.total]
        if len(marks) < 2:
            return float("nan")
        times, counts = zip(*marks, strict=True)
        return statistics.linear_regression(times, counts).slope


class Upstream:
    """One asyncio server: a first line ``echo``, ``sink`` or ``source N`` picks its job."""

    def __init__(self) -> None:
        self.sunk: list[Reads] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            job = (await reader.readline()).decode().split()
            if job[0] == "echo":
                while data := await reader.read(65536):
                    writer.write(data)
            elif job[0] == "sink":
                reads = Reads()
                self.sunk.append(reads)
                while data := await reader.read(1 << 20):
                    reads.add(len(data))
            elif job[0] == "source":
                writer.write(b"d" * int(job[1]))
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def dial(address: str, job: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = split_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(job.encode() + b"\n")
    return reader, writer


async def ping(address: str, count: int) -> list[float]:
    """``count`` sequential echoes of 64 bytes: their round-trip times, seconds."""
    reader, writer = await dial(address, "echo")
    rtts = []
    for _ in range(count):
        started = time.perf_counter()
        writer.write(PING)
        await reader.readexactly(len(PING))
        rtts.append(time.perf_counter() - started)
    writer.close()
    return rtts


async def measure_rtt(address: str, plan: Plan, configured_s: float) -> list[float]:
    """Round trips on ``plan.ping_connections`` connections at once (one for short RTTs)."""
    if configured_s < SEQUENTIAL_BELOW_S:
        return await ping(address, plan.ping_connections * plan.pings)
    runs = await asyncio.gather(*(ping(address, plan.pings)
                                  for _ in range(plan.ping_connections)))
    return [rtt for run in runs for rtt in run]


async def upload(address: str, nbytes: int, upstream: Upstream) -> float:
    """Send ``nbytes`` to the sink: its receive rate, bytes/s."""
    _, writer = await dial(address, "sink")
    count = len(upstream.sunk)
    writer.write(b"u" * nbytes)
    await writer.drain()
    writer.write_eof()
    while len(upstream.sunk) <= count or upstream.sunk[count].total < nbytes:
        await asyncio.sleep(0.01)
    writer.close()
    return upstream.sunk[count].rate()


async def download(address: str, nbytes: int) -> float:
    """Have the upstream send ``nbytes``: the client's receive rate, bytes/s."""
    reader, writer = await dial(address, f"source {nbytes}")
    reads = Reads()
    while reads.total < nbytes and (data := await reader.read(1 << 20)):
        reads.add(len(data))
    writer.close()
    return reads.rate()


def for_fidelity(profile: LinkProfile) -> LinkProfile:
    """The preset without blackouts and resets (see the module docstring)."""
    return profile.replace(blackout_every_s=None, blackout_s=0.0, reset_every_s=None,
                           reset_every_kb=None, limit_data_kb=None)


def relative_error(measured: float, configured: float) -> float:
    return abs(measured - configured) / configured


async def measure_preset(profile: LinkProfile, upstream_address: str, upstream: Upstream,
                         plan: Plan, base_rtt: float) -> dict[str, Any]:
    """RTT and throughput of one preset through a fresh proxy.

    The RTT error compares the round trip the link adds (measured minus ``base_rtt``, the
    same echo without the proxy) with the configured one; the proxy's own hops stay in it.
    """
    name = profile.name
    configured_rtt = 2 * profile.latency_ms / 1000
    async with TcpProxy(for_fidelity(profile), upstream_address) as proxy:
        rtts = await measure_rtt(proxy.address, plan, configured_rtt)
        up_bytes = int((profile.up_kbps or 0) * 125 * plan.transfer_s)
        down_bytes = int((profile.down_kbps or 0) * 125 * plan.transfer_s)
        up_rate, down_rate = await asyncio.gather(
            upload(proxy.address, up_bytes, upstream), download(proxy.address, down_bytes))
    rtt = statistics.median(rtts)
    q1, _, q3 = statistics.quantiles(rtts, n=4)
    up_kbps, down_kbps = up_rate * 8 / 1000, down_rate * 8 / 1000
    assert profile.up_kbps is not None and profile.down_kbps is not None
    return {
        f"rtt_ms_{name}": 1000 * rtt,
        f"rtt_configured_ms_{name}": 1000 * configured_rtt,
        f"rtt_error_{name}": relative_error(rtt - base_rtt, configured_rtt),
        f"rtt_spread_ms_{name}": 1000 * (q3 - q1) / 1.349,
        f"rtt_spread_configured_ms_{name}": 2 ** 0.5 * profile.jitter_ms,
        f"up_kbps_{name}": up_kbps,
        f"down_kbps_{name}": down_kbps,
        f"throughput_error_{name}": max(relative_error(up_kbps, profile.up_kbps),
                                        relative_error(down_kbps, profile.down_kbps)),
    }


async def bulk(address: str, nbytes: int, upstream: Upstream) -> float:
    """One bulk transfer with asyncio streams: sender start to last byte at the sink, B/s."""
    _, writer = await dial(address, "sink")
    count = len(upstream.sunk)
    block = b"x" * BULK_CHUNK
    started = time.perf_counter()
    for _ in range(nbytes // BULK_CHUNK):
        writer.write(block)
        await writer.drain()
    writer.write_eof()
    while len(upstream.sunk) <= count or upstream.sunk[count].total < nbytes:
        await asyncio.sleep(0.001)
    writer.close()
    return nbytes / (upstream.sunk[count].t_last - started)


async def paired_ratio(direct: str, proxied: str, upstream: Upstream,
                       plan: Plan) -> tuple[float, float, float]:
    """Alternating bulk transfers direct and through a proxy: best-rate ratio, best MB/s each.

    Best of N on each side, as ``timeit`` takes the minimum: other load on the machine only
    ever slows a transfer down, so the best run is the closest to each path's capacity.
    """
    rates: dict[str, list[float]] = {direct: [], proxied: []}
    for _ in range(plan.bulk_pairs):
        for address, found in rates.items():
            found.append(await bulk(address, plan.bulk_bytes, upstream))
    best_proxied, best_direct = max(rates[proxied]), max(rates[direct])
    return best_proxied / best_direct, best_proxied / 1e6, best_direct / 1e6


async def start_cli_proxy(upstream_address: str) -> tuple[asyncio.subprocess.Process, str]:
    """``fedlink netem proxy`` on a clean link in its own process, and its address."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fedlink", "netem", "proxy", "--listen", "127.0.0.1:0",
        "--upstream", upstream_address, "--interval", "3600", stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    if not line.startswith("fedlink netem proxy "):
        proc.kill()
        raise RuntimeError(f"the proxy did not start: {line!r}")
    return proc, line.split()[3]  # "fedlink netem proxy HOST:PORT -> ..."


async def proxy_cost(upstream_address: str, upstream: Upstream, plan: Plan) -> dict[str, float]:
    """Clean-profile throughput through the proxy over direct: own process, then same loop."""
    proc, cli_address = await start_cli_proxy(upstream_address)
    try:
        ratio, proxied, direct = await paired_ratio(upstream_address, cli_address, upstream,
                                                    plan)
    finally:
        proc.terminate()
        await proc.wait()
    async with TcpProxy(LinkProfile(name="clean"), upstream_address) as proxy:
        same_loop, _, _ = await paired_ratio(upstream_address, proxy.address, upstream, plan)
    return {"proxy_throughput_ratio": ratio, "proxy_mb_s": proxied, "direct_mb_s": direct,
            "same_loop_throughput_ratio": same_loop}


async def outage_timing(upstream_address: str) -> dict[str, float]:
    """How long a forced 1 s blackout stalls an echo stream, and when a planned reset lands.

    The calibration tests only check these from below (a busy host makes the proxy late, never
    early); this is where their fidelity is measured.
    """
    async with TcpProxy(LinkProfile(name="outage"), upstream_address) as proxy:
        reader, writer = await dial(proxy.address, "echo")
        gaps = []
        for i in range(40):
            if i == 10:
                proxy.force_blackout(1.0)
            started = time.perf_counter()
            writer.write(PING)
            await reader.readexactly(len(PING))
            gaps.append(time.perf_counter() - started)
        writer.close()
    profile = LinkProfile(name="reset", reset_every_s=0.4, seed=11)
    planned = plan_connection(profile, 0).reset_after_s or 0.0
    async with TcpProxy(profile, upstream_address) as proxy:
        reader, writer = await dial(proxy.address, "echo")
        started = time.perf_counter()
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        reset_at = time.perf_counter() - started
        writer.close()
    return {"blackout_stall_s": max(gaps), "blackout_stall_error": relative_error(max(gaps), 1.0),
            "reset_planned_s": planned, "reset_time_error_s": abs(reset_at - planned)}


def print_preset(profile: LinkProfile, f: dict[str, Any]) -> None:
    name = profile.name
    print(f"{name:<10} rtt {f[f'rtt_ms_{name}']:8.2f} ms (configured "
          f"{f[f'rtt_configured_ms_{name}']:6.1f}, error {f[f'rtt_error_{name}']:.3f}; spread "
          f"{f[f'rtt_spread_ms_{name}']:5.1f} vs {f[f'rtt_spread_configured_ms_{name}']:5.1f} ms)"
          f"  up {f[f'up_kbps_{name}']:9.1f}/{profile.up_kbps:g} kbit/s"
          f"  down {f[f'down_kbps_{name}']:9.1f}/{profile.down_kbps:g} kbit/s"
          f"  (error {f[f'throughput_error_{name}']:.3f})  loss: n/a (proxy tier)", flush=True)


async def run(plan: Plan) -> dict[str, Any]:
    upstream = Upstream()
    address = await upstream.start()
    figures: dict[str, Any] = {}
    try:
        base_rtt = statistics.median(await ping(address, plan.ping_connections * plan.pings))
        figures["rtt_base_ms"] = 1000 * base_rtt
        for profile in PRESETS.values():
            measured = await measure_preset(profile, address, upstream, plan, base_rtt)
            print_preset(profile, measured)
            figures.update(measured)
        figures.update(await outage_timing(address))
        print(f"forced 1 s blackout stalled {figures['blackout_stall_s']:.3f} s; planned reset "
              f"at {figures['reset_planned_s']:.3f} s landed "
              f"{figures['reset_time_error_s'] * 1000:.1f} ms off", flush=True)
        figures.update(await proxy_cost(address, upstream, plan))
    finally:
        await upstream.stop()
    return figures


def main() -> None:
    """Measure every preset and the proxy's cost; print the figures."""
    args = parse_args(__doc__ or "")
    plan = QUICK if args.quick else FULL
    started = time.perf_counter()
    figures = asyncio.run(run(plan))
    figures["max_rtt_error"] = max(v for k, v in figures.items() if k.startswith("rtt_error_"))
    figures["max_throughput_error"] = max(v for k, v in figures.items()
                                          if k.startswith("throughput_error_"))
    figures["loss"] = "n/a (proxy tier)"
    figures["seconds"] = time.perf_counter() - started
    report(figures, args.json)


if __name__ == "__main__":
    main()
