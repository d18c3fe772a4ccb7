"""Calibration of the TCP proxy tier (``fedlink.netem.proxy``), all on 127.0.0.1.

Each test relays through a ``TcpProxy`` to a tiny asyncio upstream (``Peer``) that echoes,
or sinks what it receives and optionally streams bytes back, and times what arrives.
Numbers are small so the file runs in well under a minute. The checks hold on a busy machine:
a proxy may be late under load but never early, so timings are checked from below (RTT at
least 2 x latency, a transfer no faster than its bandwidth, a blackout's stall at least its
duration) and from above only loosely, against what a broken proxy would show (a
sleep-per-chunk proxy, a missing blackout). Byte counts, reset points and counters are exact.
How close the proxy comes to its profile is measured, not asserted, by
``benchmarks/netem_fidelity.py`` (RTT, throughput, jitter spread, blackout stall).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import psutil
import pytest
from conftest import CoordinatorFactory, TowardTrainer, run_async, wait_until

from fedlink.cli import build_parser
from fedlink.cli.netem import profile_from_args
from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.netem.presets import preset
from fedlink.netem.profile import LinkProfile
from fedlink.netem.proxy import TcpProxy, plan_connection, split_address

PING = b"p" * 64


def _own_tcp_sockets() -> set[tuple[object, object]]:
    """This process's TCP sockets that are not in TIME_WAIT, as (local, remote) addresses."""
    return {(c.laddr, c.raddr) for c in psutil.Process().net_connections(kind="tcp")
            if c.status != psutil.CONN_TIME_WAIT}


@pytest.fixture(autouse=True)
def nothing_leaks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After every test: each proxy it started was stopped with no task, connection or
    listener left, and the process holds no TCP socket it did not hold before the test."""
    before = _own_tcp_sockets()
    started: list[TcpProxy] = []
    stopped_cleanly: list[TcpProxy] = []
    original_start, original_stop = TcpProxy.start, TcpProxy.stop

    async def start(proxy: TcpProxy) -> str:
        started.append(proxy)
        return await original_start(proxy)

    async def stop(proxy: TcpProxy) -> None:
        await original_stop(proxy)
        if not proxy._tasks and not proxy.sides and proxy.active_connections == 0:
            stopped_cleanly.append(proxy)

    monkeypatch.setattr(TcpProxy, "start", start)
    monkeypatch.setattr(TcpProxy, "stop", stop)
    yield
    assert all(proxy in stopped_cleanly for proxy in started), "a proxy left tasks or sides"
    deadline = time.monotonic() + 3.0  # the peer side of a closed socket closes a moment later
    while (left := _own_tcp_sockets() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"sockets left open: {left}"


@dataclass
class Arrivals:
    """What one upstream connection received."""

    nbytes: int = 0
    data: bytearray = field(default_factory=bytearray)
    times: list[float] = field(default_factory=list)
    error: str | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def largest_gap(self) -> float:
        """Longest silence between two arrivals, seconds."""
        return max((b - a for a, b in zip(self.times, self.times[1:], strict=False)),
                   default=0.0)


class Peer:
    """The upstream: echoes (``echo=True``) or sinks; can stream ``send`` bytes to the client."""

    def __init__(self, echo: bool = False, send: int = 0, keep: bool = False) -> None:
        self.echo, self.send, self.keep = echo, send, keep
        self.arrivals: list[Arrivals] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def address(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> Peer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:  # handlers see a closed connection and end
            writer.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        got = Arrivals()
        self.arrivals.append(got)
        sender = asyncio.create_task(self._stream(writer)) if self.send else None
        try:
            while data := await reader.read(1 << 20):
                got.nbytes += len(data)
                got.times.append(time.perf_counter())
                if self.keep:
                    got.data += data
                if self.echo:
                    writer.write(data)
                    await writer.drain()
        except ConnectionError as exc:
            got.error = type(exc).__name__
        finally:
            if sender is not None:
                sender.cancel()
            writer.close()
            got.closed.set()

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"d" * self.send)
        await writer.drain()

    async def connection(self, index: int = 0, timeout: float = 10.0) -> Arrivals:
        """The ``index``-th connection's record, once it has closed."""
        give_up = time.monotonic() + timeout
        while len(self.arrivals) <= index:
            assert time.monotonic() < give_up, "no upstream connection"
            await asyncio.sleep(0.005)
        await asyncio.wait_for(self.arrivals[index].closed.wait(), give_up - time.monotonic())
        return self.arrivals[index]


async def dial(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = split_address(address)
    return await asyncio.open_connection(host, port)


async def ping_rtts(address: str, count: int) -> list[float]:
    """``count`` sequential 64-byte echoes on one connection: their round trips, seconds."""
    reader, writer = await dial(address)
    rtts = []
    for _ in range(count):
        started = time.perf_counter()
        writer.write(PING)
        await reader.readexactly(len(PING))
        rtts.append(time.perf_counter() - started)
    writer.close()
    return rtts


async def ping_for(address: str, seconds: float) -> list[float]:
    """Sequential 64-byte echoes for ``seconds``: their round trips, seconds."""
    reader, writer = await dial(address)
    rtts: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        writer.write(PING)
        await reader.readexactly(len(PING))
        rtts.append(time.perf_counter() - started)
    writer.close()
    return rtts


async def send_all(address: str, nbytes: int) -> tuple[float, asyncio.StreamWriter]:
    """Send ``nbytes`` and half-close: when the sending started, and the writer."""
    _, writer = await dial(address)
    started = time.perf_counter()
    writer.write(b"u" * nbytes)
    await writer.drain()
    writer.write_eof()
    return started, writer


async def read_until_closed(reader: asyncio.StreamReader) -> tuple[int, str | None]:
    """Bytes read until EOF or an error, and the error's type name."""
    total = 0
    try:
        while data := await reader.read(1 << 20):
            total += len(data)
    except ConnectionError as exc:
        return total, type(exc).__name__
    return total, None


@pytest.mark.timeout(20)
def test_latency_doubles_into_rtt() -> None:
    """100 ms one-way: a small request's round trip is never under 200 ms, and not a multiple."""

    async def main() -> list[float]:
        async with Peer(echo=True) as peer, \
                TcpProxy(LinkProfile(latency_ms=100), peer.address) as proxy:
            return await ping_rtts(proxy.address, 7)

    rtts = run_async(main())
    assert min(rtts) >= 0.195  # never early
    # one delay each way, not two: a doubled delay makes every ping >= 400 ms, whereas load
    # only delays some of them (how close to 200 ms they come is benchmarks/netem_fidelity.py)
    assert min(rtts) < 0.400


@pytest.mark.timeout(20)
def test_bandwidth_paces_a_transfer_each_way() -> None:
    """1000 kbit/s: 250 KB takes at least 2 s, up and down at once. The directions are
    independent: both at once take about as long as one alone (sharing one budget would take
    twice as long), compared within this test so that a loaded host slows both alike."""
    size = 250_000
    profile = LinkProfile(up_kbps=1000, down_kbps=1000)

    async def both_ways() -> tuple[float, float]:
        async with Peer(send=size) as peer, TcpProxy(profile, peer.address) as proxy:
            reader, writer = await dial(proxy.address)
            started = time.perf_counter()
            writer.write(b"u" * size)
            await reader.readexactly(size)
            down = time.perf_counter() - started
            writer.write_eof()
            got = await peer.connection()
            assert got.nbytes == size
            writer.close()
            return got.times[-1] - started, down

    async def up_alone() -> float:
        async with Peer() as peer, TcpProxy(profile, peer.address) as proxy:
            started, writer = await send_all(proxy.address, size)
            got = await peer.connection()
            writer.close()
            assert got.nbytes == size
            return got.times[-1] - started

    alone = run_async(up_alone())
    up, down = run_async(both_ways())
    for elapsed in (alone, up, down):
        assert elapsed >= 2.0 * 0.95  # paced: never faster than the bandwidth
    assert max(up, down) < 1.5 * alone  # one shared budget: 2 x alone


def test_connections_over_one_link_share_its_bandwidth() -> None:
    """1000 kbit/s: two connections sending 125 KB each at once take as long as 250 KB over
    one (at least 2 s), not as long as 125 KB alone: the link, not each connection, has the
    bandwidth (a client that stripes a download over two connections gets it once)."""
    size = 125_000

    async def two_at_once() -> float:
        async with Peer() as peer, TcpProxy(LinkProfile(up_kbps=1000), peer.address) as proxy:
            (started, first), (_, second) = await asyncio.gather(
                send_all(proxy.address, size), send_all(proxy.address, size))
            got = [await peer.connection(i) for i in range(2)]
            first.close()
            second.close()
            assert [g.nbytes for g in got] == [size, size]
            return max(g.times[-1] for g in got) - started

    assert run_async(two_at_once()) >= 2.0 * 0.95  # paced: never faster than the link


@pytest.mark.timeout(30)
def test_throughput_is_bandwidth_bound_not_latency_bound() -> None:
    """100 ms + 8000 kbit/s: 1 MB takes about what it takes without the latency, plus 100 ms
    (a sleep-per-chunk proxy would need more than 6 times as long); the two are measured in
    this test, so that a loaded host slows both alike."""
    size = 1_000_000

    async def main(latency_ms: float) -> float:
        profile = LinkProfile(latency_ms=latency_ms, up_kbps=8000)
        async with Peer() as peer, TcpProxy(profile, peer.address) as proxy:
            started, writer = await send_all(proxy.address, size)
            got = await peer.connection()
            writer.close()
            assert got.nbytes == size
            return got.times[-1] - started

    without = run_async(main(0))
    elapsed = run_async(main(100))
    assert elapsed >= (size * 8 / 8e6 + 0.100) * 0.95
    assert elapsed < 3 * without  # a sleep-per-chunk proxy: > 6 x


@pytest.mark.timeout(20)
def test_reset_breaks_transfers_at_the_planned_point() -> None:
    """Each connection is reset (RST) exactly after its exponential draw of bytes."""
    profile = LinkProfile(reset_every_kb=50, seed=3)
    connections = 8

    async def main() -> tuple[list[int], list[str | None], TcpProxy]:
        async with Peer() as peer, TcpProxy(profile, peer.address) as proxy:
            client_errors = []
            for i in range(connections):
                reader, writer = await dial(proxy.address)
                writer.write(b"u" * 1_000_000)
                client_errors.append((await read_until_closed(reader))[1])
                writer.close()
                await peer.connection(i)
        return [a.nbytes for a in peer.arrivals], client_errors, proxy

    received, client_errors, proxy = run_async(main())
    planned = [plan_connection(profile, i).reset_after_bytes for i in range(connections)]
    assert received == planned
    assert client_errors == ["ConnectionResetError"] * connections
    assert proxy.counters.resets == connections
    assert proxy.counters.bytes_up == sum(received)
    # the draws themselves average the configured 50 kB
    mean = statistics.mean(plan_connection(profile, i).reset_after_bytes or 0
                           for i in range(4000))
    assert mean == pytest.approx(50_000, rel=0.05)


@pytest.mark.timeout(20)
def test_reset_every_s_breaks_a_connection_at_its_planned_time() -> None:
    profile = LinkProfile(reset_every_s=0.4, seed=11)
    planned = plan_connection(profile, 0).reset_after_s
    assert planned is not None and planned < 3

    async def main() -> tuple[float, str | None]:
        async with Peer(echo=True) as peer, TcpProxy(profile, peer.address) as proxy:
            reader, writer = await dial(proxy.address)
            started = time.perf_counter()
            _, error = await read_until_closed(reader)
            writer.close()
            assert proxy.counters.resets == 1
            return time.perf_counter() - started, error

    elapsed, error = run_async(main())
    assert error == "ConnectionResetError"
    assert elapsed >= planned - 0.01  # never early; late only by the host's scheduling


@pytest.mark.timeout(20)
def test_blackout_stalls_a_transfer_for_its_duration() -> None:
    """A 1 s blackout 0.3 s into a 1 s paced transfer: it ends 1 s later; TCP stays up."""
    size = 250_000

    async def main() -> tuple[Arrivals, float, TcpProxy, list[float]]:
        profile = LinkProfile(up_kbps=2000, latency_ms=20)
        async with Peer(echo=True, send=0) as peer, TcpProxy(profile, peer.address) as proxy:
            reader, writer = await dial(proxy.address)
            started = time.perf_counter()
            writer.write(b"u" * size)
            await asyncio.sleep(0.3)
            proxy.force_blackout(1.0)
            assert proxy.blacked_out
            await reader.readexactly(size)
            elapsed = time.perf_counter() - started
            rtts = await ping_rtts(proxy.address, 3)  # the link works again
            writer.close()
            return await peer.connection(), elapsed, proxy, rtts

    got, elapsed, proxy, rtts = run_async(main())
    assert elapsed >= (size * 8 / 2e6 + 0.040 + 1.0) * 0.98  # the blackout added its 1 s
    assert got.largest_gap >= 0.95  # nothing passed during it
    assert proxy.counters.blackouts == 1
    assert proxy.counters.stalled_s == pytest.approx(1.0)
    assert min(rtts) >= 0.039  # the link is back, with its own latency


@pytest.mark.timeout(20)
def test_scheduled_blackouts_come_from_the_profile() -> None:
    """``blackout_every_s``/``blackout_s``: blackouts happen, counted, and stall pings."""
    profile = LinkProfile(blackout_every_s=0.3, blackout_s=0.2, seed=5)

    async def main() -> tuple[list[float], TcpProxy]:
        async with Peer(echo=True) as peer, TcpProxy(profile, peer.address) as proxy:
            rtts = await ping_for(proxy.address, 1.5)
        return rtts, proxy

    rtts, proxy = run_async(main())
    counters = proxy.counters
    assert counters.blackouts >= 2
    assert counters.stalled_s > 0
    stalled = [rtt for rtt in rtts if rtt > 0.01]  # a clear link answers in well under 1 ms
    assert len(stalled) >= 2
    # pings in flight cover the stalls (load only adds to them: that side is the benchmark's)
    assert sum(stalled) >= 0.7 * counters.stalled_s


@pytest.mark.timeout(20)
def test_jitter_spread_matches_configuration() -> None:
    """20 ms one-way jitter spreads the RTTs around 2 x latency (std ~ sqrt(2) x 20 = 28 ms;
    the benchmark measures how close: here, that there is a spread and it is centred)."""
    latency, jitter = 0.060, 0.020

    async def main() -> list[float]:
        profile = LinkProfile(latency_ms=latency * 1000, jitter_ms=jitter * 1000, seed=2)
        async with Peer(echo=True) as peer, TcpProxy(profile, peer.address) as proxy:
            runs = await asyncio.gather(*(ping_rtts(proxy.address, 10) for _ in range(10)))
        return [rtt for run in runs for rtt in run]

    rtts = run_async(main())
    assert statistics.median(rtts) >= 2 * latency * 0.85
    # the spread from the interquartile range (robust to a scheduling hiccup of the host)
    q1, _, q3 = statistics.quantiles(rtts, n=4)
    assert (q3 - q1) / 1.349 >= 0.5 * 2 ** 0.5 * jitter


@pytest.mark.timeout(20)
def test_jitter_keeps_the_byte_order() -> None:
    """Heavy jitter on a paced stream: every byte comes back, in order."""
    payload = np.random.default_rng(0).bytes(300_000)

    async def main() -> bytes:
        profile = LinkProfile(latency_ms=5, jitter_ms=10, up_kbps=20_000, down_kbps=20_000)
        async with Peer(echo=True) as peer, TcpProxy(profile, peer.address) as proxy:
            reader, writer = await dial(proxy.address)
            writer.write(payload)
            echoed = await reader.readexactly(len(payload))
            writer.close()
            return echoed

    assert run_async(main()) == payload


@pytest.mark.timeout(20)
def test_limit_data_closes_after_n_bytes() -> None:
    """``limit_data_kb=10``: the upstream gets exactly 10,000 bytes, then a clean close."""

    async def main() -> tuple[Arrivals, int, str | None, TcpProxy]:
        profile = LinkProfile(limit_data_kb=10)
        async with Peer() as peer, TcpProxy(profile, peer.address) as proxy:
            reader, writer = await dial(proxy.address)
            writer.write(b"u" * 50_000)
            read, error = await read_until_closed(reader)
            writer.close()
            return await peer.connection(), read, error, proxy

    got, read, error, proxy = run_async(main())
    assert (got.nbytes, got.error) == (10_000, None)
    assert (read, error) == (0, None)  # the client sees EOF, not a reset
    assert proxy.counters.resets == 0
    assert proxy.counters.bytes_up == 10_000


def _proxy_tasks() -> list[asyncio.Task[object]]:
    """Tasks running code of ``fedlink.netem.proxy``."""
    return [t for t in asyncio.all_tasks()
            if "fedlink/netem/proxy" in t.get_coro().cr_code.co_filename]  # type: ignore[union-attr]


def _open_sockets_on(port: int) -> list[object]:
    return [c for c in psutil.Process().net_connections(kind="tcp")
            if port in (c.laddr.port if c.laddr else None, c.raddr.port if c.raddr else None)]


@pytest.mark.timeout(20)
def test_stop_leaves_no_task_socket_or_listener() -> None:
    profile = LinkProfile(latency_ms=200, up_kbps=500, blackout_every_s=0.2, blackout_s=0.1)

    async def main() -> None:
        async with Peer() as peer:
            proxy = TcpProxy(profile, peer.address)
            address = await proxy.start()
            port = split_address(address)[1]
            writers = []
            for _ in range(3):  # connections with bytes in flight
                reader, writer = await dial(address)
                writer.write(b"u" * 200_000)
                writers.append((reader, writer))
            await wait_until(lambda: proxy.active_connections == 3, what="3 proxied connections")
            assert _proxy_tasks()
            await proxy.stop()
            assert _proxy_tasks() == []
            assert proxy.active_connections == 0 and not proxy.sides
            with pytest.raises(ConnectionRefusedError):
                await dial(address)
            for reader, writer in writers:  # every client connection was closed
                await asyncio.wait_for(read_until_closed(reader), 2)
                writer.close()

            def own() -> list[object]:  # the proxy's own sockets, once the kernel settles
                return [c for c in _open_sockets_on(port) if c.status != psutil.CONN_TIME_WAIT]
            await wait_until(lambda: own() == [], what=f"no socket left on {port}")

    run_async(main())


@pytest.mark.timeout(10)
def test_packet_only_fields_are_noted_once_at_info_level(
        caplog: pytest.LogCaptureFixture) -> None:
    # info, not a warning: every preset from 3G down sets loss, and a simulation's report
    # names what the proxy could not apply
    profile = LinkProfile(name="warn-test", loss_up=0.05, trace_down="some.trace")

    async def main() -> None:
        async with Peer(echo=True) as peer:
            for seed in (1, 2):
                async with TcpProxy(profile.with_seed(seed), peer.address) as proxy:
                    assert await ping_rtts(proxy.address, 1)

    with caplog.at_level(logging.INFO, logger="fedlink.netem.proxy"):
        run_async(main())
    notes = [r.getMessage() for r in caplog.records if "only the packet tier" in r.getMessage()]
    assert len(notes) == 1
    assert "loss_up" in notes[0] and "trace_down" in notes[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.timeout(10)
def test_unreachable_upstream_resets_the_client() -> None:
    async def main() -> tuple[int, str | None]:
        async with Peer() as peer:
            dead = peer.address
        async with TcpProxy(LinkProfile(), dead) as proxy:
            reader, writer = await dial(proxy.address)
            result = await read_until_closed(reader)
            writer.close()
            return result

    assert run_async(main()) == (0, "ConnectionResetError")


@pytest.mark.timeout(30)
def test_grpc_session_completes_rounds_through_the_proxy(coordinator: CoordinatorFactory) -> None:
    """A real ClientSession over a 20 ms link finishes 2 synchronous rounds."""
    config = CoordinatorConfig(rounds=2, flush=FlushRule(goal=1, deadline_s=None),
                               limits=LimitsConfig(long_poll_s=2.0, retry_after_s=0.05))
    trainer = TowardTrainer(np.ones(32, np.float32))
    retry = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)

    async def main() -> tuple[int, int, TcpProxy]:
        async with coordinator(config, np.zeros(32, np.float32)) as server, \
                TcpProxy(LinkProfile(latency_ms=20), f"127.0.0.1:{server.port}") as proxy:
            session = ClientSession(proxy.address, trainer, ClientOptions("via-proxy",
                                                                          retry=retry))
            stats = await asyncio.wait_for(session.run(), 20)
            await asyncio.wait_for(server.wait_finished(), 10)
            return stats.tasks, stats.accepted, proxy

    tasks, accepted, proxy = run_async(main())
    assert (tasks, accepted) == (2, 2)
    assert proxy.counters.connections >= 1
    assert proxy.counters.bytes_up > 0 and proxy.counters.bytes_down > 0


def test_cli_builds_the_profile_from_a_preset_and_flags() -> None:
    args = build_parser().parse_args([
        "netem", "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9",
        "--profile", "3g", "--latency-ms", "50", "--seed", "4"])
    assert profile_from_args(args) == preset("3g").replace(latency_ms=50.0, seed=4)
    args = build_parser().parse_args([
        "netem", "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9",
        "--up-kbps", "100", "--blackout-every-s", "10", "--blackout-s", "2"])
    profile = profile_from_args(args)
    assert (profile.up_kbps, profile.blackout_every_s, profile.blackout_s) == (100, 10, 2)
    assert profile.latency_ms == 0
