"""The TCP proxy tier: an asyncio proxy that impairs one client's link, no root needed.

``TcpProxy(profile, upstream="127.0.0.1:50051")`` listens on ``listen`` (a free loopback port
by default) and relays every accepted connection to ``upstream`` through two *pipes*, **up**
(client -> upstream) and **down** (upstream -> client). Each pipe models one direction of a
link as a serializer followed by a delay line, scheduled per chunk from its arrival; the
serializer is the link's, shared by all its connections in the order their bytes arrive::

    leave    = max(arrival, serializer free) + size / bandwidth      (rate limit)
    delivery = max(leave + max(0, latency + N(0, jitter)), previous delivery)   (order kept)

Chunks wait in a buffer until their delivery time, so many are in flight at once and
throughput is limited by bandwidth, never by ``chunk / latency`` (see NETWORK-FACTS.md). A
rate-limited pipe schedules what it reads in pieces of about 20 ms of transmission time (512 B
to 16 KiB), so pacing is smooth. When more than ``bandwidth x (latency + 3 jitter + 1 s)``
bytes (4 MiB without a rate limit) wait in a pipe, the proxy stops reading its source socket,
so TCP backpressure reaches the sender. Since pieces never overtake each other, back-to-back
pieces of a bulk transfer see less jitter, and a little more delay, than a lone request.

Other impairments:

- **Resets** (``reset_every_kb``, ``reset_every_s``): per connection, an exponential draw of
  the bytes (both directions, counted as delivered) or seconds until the proxy resets both
  sockets with RST (``SO_LINGER`` 0). ``plan_connection`` gives the draws of connection ``i``.
- **Blackouts** (``blackout_every_s``, ``blackout_s``): link-wide, exponential gaps and
  durations. A blackout freezes the link: nothing is delivered either way, chunks in flight
  and the serializers' schedules move later by its duration, TCP stays up. ``force_blackout``
  starts one by hand (for tests and chaos drills); ``stall_connections`` freezes only the
  connections open at that moment (a stalled TCP connection while a fresh one would pass).
- **Data limit** (``limit_data_kb``): each connection is closed (FIN) once that many kB
  (both directions) have been delivered.
- Packet-only fields (loss, burst loss, traces) cannot be done on a TCP stream: they are
  ignored, said once per profile at info level (a simulation's report names them in its
  network table; every preset from 3G down sets loss, so a warning would only be noise).

Every random draw comes from ``random.Random`` generators derived from ``profile.seed`` (one per
connection and direction, one for blackouts), so a run is reproducible up to timing.

Delivery timers: epoll rounds timeouts up to whole milliseconds, so a plain timer delivers up
to 1 ms late. On links with under ``SPIN_BELOW_MS`` of latency, where that is a noticeable
share, the last ``spin_s`` seconds before a delivery are waited by polling the event loop
instead (precise to a few microseconds, at the price of a busy loop meanwhile); pass
``spin_s`` to choose (0: never poll). Bandwidth is exact either way: delivery times are
absolute, so a late wake-up never accumulates.

Counters (``LinkCounters``) are live: bytes delivered each way, connections accepted, resets
injected, blackouts and seconds blacked out (``stalled_s``: link-wide, including the rest of
a blackout in progress; ``stop`` takes back what did not happen).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from fedlink.errors import ConfigError
from fedlink.netem.base import LinkCounters
from fedlink.netem.profile import LinkProfile

logger = logging.getLogger(__name__)

MAX_CHUNK = 16 * 1024
"""Largest piece a rate-limited pipe schedules as one unit (smaller at low rates)."""
MIN_CHUNK = 512
PACING_S = 0.02
"""A rate-limited pipe cuts data into pieces of about this much transmission time."""
MAX_BUFFER = 4 * 1024 * 1024
"""Bytes a pipe holds before it stops reading (the bound without a rate limit)."""
MIN_BUFFER = 64 * 1024
DEFAULT_SPIN_S = 0.001
SPIN_BELOW_MS = 20.0
"""Links with less latency than this poll for the last ``DEFAULT_SPIN_S`` by default."""

_warned_profiles: set[LinkProfile] = set()


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) -> ``(host, port)``; ``ConfigError`` if not."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"address: expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def _rng(seed: int, *parts: object) -> random.Random:
    """An independent, reproducible generator for one purpose (connection, direction...)."""
    return random.Random("/".join(["fedlink.netem.proxy", str(seed), *map(str, parts)]))


@dataclass(frozen=True)
class ConnectionPlan:
    """The random draws of one connection: when it will be reset (``None``: never)."""

    reset_after_bytes: int | None
    reset_after_s: float | None


def plan_connection(profile: LinkProfile, index: int) -> ConnectionPlan:
    """The reset draws of the proxy's connection number ``index`` (0-based, accept order)."""
    rng = _rng(profile.seed, "connection", index)
    after_bytes = after_s = None
    if profile.reset_every_kb is not None:
        after_bytes = max(1, round(rng.expovariate(1.0 / (profile.reset_every_kb * 1000))))
    if profile.reset_every_s is not None:
        after_s = rng.expovariate(1.0 / profile.reset_every_s)
    return ConnectionPlan(after_bytes, after_s)


def _hard_abort(transport: asyncio.Transport | None) -> None:
    """Abort ``transport`` with an RST (``SO_LINGER`` 0) rather than a FIN."""
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


RECEIVE_BUFFER = 64 * 1024
"""Kernel receive buffer of a socket the proxy reads for a rate-limited pipe."""


def _limit_receive_buffer(transport: asyncio.Transport) -> None:
    """Keep the kernel from queueing megabytes in front of a rate-limited pipe.

    The pipe holds about a second of data, then stops reading; what the sender writes after
    that waits in kernel buffers, which on loopback autotune to several MB: seconds of queue at
    link rate, ahead of gRPC's keepalive ping acks (the coordinator then closes the connection
    with GOAWAY ``ping_timeout``). A fixed, small receive buffer passes backpressure on.
    """
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)


@dataclass(slots=True)
class _Chunk:
    """Bytes waiting in a pipe (``None``: the source's EOF) and when they are delivered."""

    due: float
    data: memoryview | None


@dataclass
class _Serializer:
    """One direction of the link's bottleneck, shared by every connection over the link (a
    client that opens two connections gets the link's bandwidth once, not twice):
    ``free_at``, the loop time when it has sent what it was given."""

    free_at: float = 0.0

    def freeze(self, now: float, extra: float) -> None:
        """A blackout: what it was sending leaves ``extra`` seconds later."""
        if self.free_at > now:
            self.free_at += extra


class _Pipe:
    """One direction of one connection: schedules chunks on arrival, delivers them when due."""

    def __init__(self, conn: _Connection, direction: str, rate_kbps: float | None) -> None:
        profile = conn.proxy.profile
        self.conn = conn
        self.direction = direction
        self.serializer = conn.proxy.serializers[direction]
        self.loop = conn.proxy.loop
        self.bytes_per_s = None if rate_kbps is None else rate_kbps * 1000 / 8
        self.latency_s = profile.latency_ms / 1000
        self.jitter_s = profile.jitter_ms / 1000
        self.rng = _rng(profile.seed, "connection", conn.index, direction)
        self.piece = self._piece_size()
        self.bound = self._buffer_bound()
        self.src: _Side
        self.dst: _Side
        self.queue: deque[_Chunk] = deque()
        self.buffered = 0
        self.last_due = 0.0
        self.timer: asyncio.Handle | None = None
        self.done = False  # EOF delivered (or the destination is gone)

    def _piece_size(self) -> int:
        if self.bytes_per_s is None:
            return 0  # no splitting: deliver what was read as one chunk
        return int(min(MAX_CHUNK, max(MIN_CHUNK, self.bytes_per_s * PACING_S)))

    def _buffer_bound(self) -> int:
        if self.bytes_per_s is None:
            return MAX_BUFFER
        wanted = self.bytes_per_s * (self.latency_s + self.jitter_s * 3 + 1.0)
        return int(min(MAX_BUFFER, max(MIN_BUFFER, wanted)))

    def _stamp(self, now: float, size: int) -> float:
        """Delivery time of ``size`` bytes arriving at ``now`` (after those before them).

        They queue for the link's serializer, behind every connection's bytes before them;
        a connection stalled alone (``stall_connections``) sends them after its stall
        without holding the link meanwhile, so the others pass.
        """
        send_s = size / self.bytes_per_s if self.bytes_per_s else 0.0
        start = max(now, self.conn.proxy.dark_until)
        if self.conn.dark_until > start:
            leave = self.conn.dark_until + send_s
        else:
            leave = max(start, self.serializer.free_at) + send_s
            self.serializer.free_at = leave
        delay = self.latency_s
        if self.jitter_s > 0:
            delay = max(0.0, delay + self.rng.gauss(0.0, self.jitter_s))
        self.last_due = max(leave + delay, self.last_due)
        return self.last_due

    def push(self, data: bytes | None) -> None:
        """Schedule bytes read from the source (``None``: its EOF)."""
        if self.done or self.conn.ended:
            return
        now = self.loop.time()
        if data is None:
            self.queue.append(_Chunk(self._stamp(now, 0), None))
        else:
            view = memoryview(data)
            step = self.piece or len(view)
            for start in range(0, len(view), step):
                piece = view[start:start + step]
                self.queue.append(_Chunk(self._stamp(now, len(piece)), piece))
            self.buffered += len(view)
            if self.buffered > self.bound:
                self.src.pause_reading()
        if self.timer is None:
            self.flush()

    def flush(self) -> None:
        """Deliver every chunk that is due, then wait for the next one."""
        self.timer = None
        now = self.loop.time()
        while self.queue and self.dst.writable and not self.conn.ended:
            chunk = self.queue[0]
            if chunk.due > now:
                break
            self.queue.popleft()
            if chunk.data is None:
                self._deliver_eof()
                return
            self.buffered -= len(chunk.data)
            if not self.conn.deliver(self, chunk.data):
                return
        if self.buffered <= self.bound // 2:
            self.src.resume_reading()
        self._arm(now)

    def _arm(self, now: float) -> None:
        """Schedule the next ``flush``: a timer, then polling for the last ``spin_s``."""
        if not self.queue or not self.dst.writable or self.conn.ended:
            return
        spin = self.conn.proxy.spin_s
        wake = self.queue[0].due - spin
        if wake > now:
            self.timer = self.loop.call_at(wake, self.flush)
        else:
            self.timer = self.loop.call_soon(self.flush)

    def _deliver_eof(self) -> None:
        self.done = True
        self.dst.write_eof()
        self.conn.pipe_done()

    def freeze(self, now: float, extra: float) -> None:
        """A stall of this connection: everything in flight moves ``extra`` seconds later
        (a blackout moves the link's serializers too: ``TcpProxy.force_blackout``)."""
        for chunk in self.queue:
            chunk.due = max(chunk.due, now) + extra
        if self.last_due > now:
            self.last_due += extra

    def discard(self) -> None:
        """Drop whatever waits and stop the timer (the connection is over)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()
        self.buffered = 0


class _Side(asyncio.Protocol):
    """One socket of a connection (the client's or the upstream's)."""

    def __init__(self, conn: _Connection, name: str) -> None:
        self.conn = conn
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.writable = True
        self.reading = True
        self.outgoing: _Pipe  # carries what this socket reads
        self.incoming: _Pipe  # writes into this socket

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.outgoing.bytes_per_s is not None:
            _limit_receive_buffer(transport)
        self.conn.proxy.side_opened(self)
        self.conn.side_made(self)

    def data_received(self, data: bytes) -> None:
        self.outgoing.push(data)

    def eof_received(self) -> bool:
        self.outgoing.push(None)
        return True  # keep the other half open until the EOF has been delivered

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        if self.incoming.timer is None:
            self.incoming.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.proxy.side_closed(self)
        self.conn.side_lost(exc)

    def pause_reading(self) -> None:
        if self.reading and self.transport is not None and not self.transport.is_closing():
            self.reading = False
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.reading and self.transport is not None and not self.transport.is_closing():
            self.reading = True
            self.transport.resume_reading()

    def write(self, data: memoryview) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def write_eof(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing() and transport.can_write_eof():
            # the peer may be gone already (ENOTCONN); its connection_lost ends the connection
            with contextlib.suppress(OSError):
                transport.write_eof()


class _Connection:
    """One client connection relayed to the upstream: two sides, two pipes, its budgets."""

    def __init__(self, proxy: TcpProxy, index: int) -> None:
        profile = proxy.profile
        self.proxy = proxy
        self.index = index
        self.plan = plan_connection(profile, index)
        self.client = _Side(self, "client")
        self.upstream = _Side(self, "upstream")
        self.up = _Pipe(self, "up", profile.up_kbps)
        self.down = _Pipe(self, "down", profile.down_kbps)
        self._wire(self.up, self.client, self.upstream)
        self._wire(self.down, self.upstream, self.client)
        self.delivered = 0
        self.limit = None if profile.limit_data_kb is None else round(profile.limit_data_kb * 1000)
        self.ended = False
        self.connector: asyncio.Task[None] | None = None
        self.reset_timer: asyncio.TimerHandle | None = None
        self.dark_until = 0.0  # this connection alone is stalled until this loop time

    @staticmethod
    def _wire(pipe: _Pipe, src: _Side, dst: _Side) -> None:
        pipe.src, pipe.dst = src, dst
        src.outgoing, dst.incoming = pipe, pipe

    def side_made(self, side: _Side) -> None:
        """The client side is accepted: hold its bytes and dial the upstream."""
        if side is self.client:
            side.pause_reading()
            self.connector = self.proxy.spawn(self._connect(), f"netem-connect-{self.index}")

    async def _connect(self) -> None:
        host, port = self.proxy.upstream_host, self.proxy.upstream_port
        try:
            await self.proxy.loop.create_connection(lambda: self.upstream, host, port)
        except OSError as exc:
            logger.warning("netem proxy: upstream %s:%s unreachable (%s); resetting client",
                           host, port, exc)
            self.end(rst=True)
            return
        if self.ended:  # stopped while dialing
            _hard_abort(self.upstream.transport)
            return
        self.client.resume_reading()
        if self.plan.reset_after_s is not None:
            self.reset_timer = self.proxy.loop.call_later(self.plan.reset_after_s, self.reset)

    def deliver(self, pipe: _Pipe, data: memoryview) -> bool:
        """Write ``data`` to ``pipe``'s destination within the budgets; False once it ended."""
        left = self._budget_left()
        if left is not None and len(data) >= left:
            self._write(pipe, data[:left])
            self._budget_spent()
            return False
        self._write(pipe, data)
        return True

    def _write(self, pipe: _Pipe, data: memoryview) -> None:
        pipe.dst.write(data)
        self.delivered += len(data)
        counters = self.proxy.counters
        if pipe is self.up:
            counters.bytes_up += len(data)
        else:
            counters.bytes_down += len(data)

    def _budget_left(self) -> int | None:
        budgets = [b - self.delivered for b in (self.plan.reset_after_bytes, self.limit)
                   if b is not None]
        return min(budgets) if budgets else None

    def _budget_spent(self) -> None:
        reset_at = self.plan.reset_after_bytes
        if reset_at is not None and self.delivered >= reset_at:
            self.reset()
        else:
            logger.debug("netem proxy: connection %d cut after %d bytes", self.index,
                         self.delivered)
            self.end(rst=False)

    def reset(self) -> None:
        """Inject a connection reset: RST on both sockets, counted."""
        if not self.ended:
            self.proxy.counters.resets += 1
            logger.debug("netem proxy: reset connection %d after %d bytes", self.index,
                         self.delivered)
            self.end(rst=True)

    def pipe_done(self) -> None:
        """One direction delivered its EOF; when both have, close the connection."""
        if self.up.done and self.down.done:
            self.end(rst=False)

    def side_lost(self, exc: Exception | None) -> None:
        """A socket closed under us: pass an error on as RST, a clean close as FIN."""
        if not self.ended:
            self.end(rst=exc is not None)

    def freeze(self, now: float, extra: float) -> None:
        """A blackout of ``extra`` more seconds starting at ``now``."""
        self.up.freeze(now, extra)
        self.down.freeze(now, extra)

    def end(self, rst: bool) -> None:
        """Close both sockets (RST when ``rst``) and drop everything pending."""
        if self.ended:
            return
        self.ended = True
        self.proxy.connections.discard(self)
        if self.reset_timer is not None:
            self.reset_timer.cancel()
        if self.connector is not None and not self.connector.done():
            self.connector.cancel()
        for pipe in (self.up, self.down):
            pipe.discard()
        for side in (self.client, self.upstream):
            if rst:
                _hard_abort(side.transport)
            elif side.transport is not None:
                side.transport.close()


class TcpProxy:
    """An impaired TCP link between clients and one upstream (implements ``Link``).

    ``async with TcpProxy(profile, "127.0.0.1:50051") as proxy:`` then dial ``proxy.address``.
    ``start``/``stop`` do the same by hand; ``stop`` closes the listener and every connection
    and cancels every task and timer of the proxy. Use it from one event loop.

    ``upstream`` and ``listen`` are ``host:port``; ``spin_s`` is how long before a delivery
    the proxy stops sleeping and polls (default: 1 ms on links with under 20 ms of latency,
    else 0; see the module docstring). ``counters`` are live; ``force_blackout`` starts a
    blackout by hand.
    """

    def __init__(self, profile: LinkProfile, upstream: str, listen: str = "127.0.0.1:0",
                 *, spin_s: float | None = None) -> None:
        self.profile = profile
        self.counters = LinkCounters()
        self.upstream = upstream
        self.upstream_host, self.upstream_port = split_address(upstream)
        self.listen_host, self.listen_port = split_address(listen)
        if spin_s is None:
            spin_s = DEFAULT_SPIN_S if profile.latency_ms < SPIN_BELOW_MS else 0.0
        if spin_s < 0:
            raise ConfigError(f"spin_s: must be >= 0, got {spin_s}")
        self.spin_s = spin_s
        self.dark_until = 0.0  # the link is blacked out until this loop time
        self.serializers = {"up": _Serializer(), "down": _Serializer()}
        self.connections: set[_Connection] = set()
        self.sides: set[_Side] = set()
        self._no_sides: asyncio.Event | None = None  # set while no socket is open (start)
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepted = 0
        self._address: str | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the proxy runs on (set by ``start``)."""
        if self._loop is None:
            raise RuntimeError("TcpProxy is not started")
        return self._loop

    @property
    def address(self) -> str:
        """``host:port`` that clients dial instead of the upstream (after ``start``)."""
        if self._address is None:
            raise RuntimeError("TcpProxy is not started")
        return self._address

    @property
    def active_connections(self) -> int:
        """Connections open right now."""
        return len(self.connections)

    @property
    def blacked_out(self) -> bool:
        """Whether a blackout is in progress."""
        return self._loop is not None and self._loop.time() < self.dark_until

    async def start(self) -> str:
        """Listen and start the blackout schedule; returns ``address``."""
        if self._server is not None:
            raise RuntimeError("TcpProxy already started")
        self._loop = asyncio.get_running_loop()
        self._no_sides = asyncio.Event()
        self._no_sides.set()
        self._warn_packet_only()
        self._server = await self._loop.create_server(
            self._accept, self.listen_host, self.listen_port)
        host, port = self._server.sockets[0].getsockname()[:2]
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.profile.blackout_every_s is not None:
            self.spawn(self._blackouts(), "netem-blackouts")
        logger.info("netem proxy %s -> %s (%s)", self._address, self.upstream, self.profile.name)
        return self._address

    async def stop(self) -> None:
        """Close the listener and every connection; cancel every task. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self.connections):
            conn.end(rst=False)
        for side in list(self.sides):
            if side.transport is not None:
                side.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        await self._sockets_closed()
        self._settle_stall()

    def side_opened(self, side: _Side) -> None:
        """A socket of a connection opened."""
        self.sides.add(side)
        if self._no_sides is not None:
            self._no_sides.clear()

    def side_closed(self, side: _Side) -> None:
        """A socket's ``connection_lost`` ran (its socket is closed)."""
        self.sides.discard(side)
        if not self.sides and self._no_sides is not None:
            self._no_sides.set()

    async def _sockets_closed(self, timeout: float = 2.0) -> None:
        """Wait until the aborted transports have run ``connection_lost`` (which closes their
        sockets): on the event that the last one sets, bounded by ``timeout`` (an I/O
        timeout: a transport that never reports its loss must not hang ``stop``)."""
        if self._no_sides is None or not self.sides:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._no_sides.wait(), timeout)

    def _settle_stall(self) -> None:
        """At stop, take back the part of a blackout that had not happened yet."""
        if self._loop is not None:
            ahead = self.dark_until - self._loop.time()
            if ahead > 0:
                self.counters.stalled_s -= ahead
                self.dark_until = self._loop.time()

    async def __aenter__(self) -> TcpProxy:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    def force_blackout(self, seconds: float) -> None:
        """Black the link out now for ``seconds`` (extends one in progress); counted."""
        if seconds <= 0:
            raise ConfigError(f"seconds: must be > 0, got {seconds}")
        loop = self.loop
        now = loop.time()
        until = now + seconds
        extra = until - max(now, self.dark_until)
        if extra <= 0:
            return
        self.dark_until = until
        self.counters.blackouts += 1
        self.counters.stalled_s += extra
        for serializer in self.serializers.values():
            serializer.freeze(now, extra)
        for conn in self.connections:
            conn.freeze(now, extra)

    def stall_connections(self, seconds: float, only: int | None = None) -> int:
        """Stall the connections open now for ``seconds``, as a TCP connection whose segments
        keep being lost: nothing they carry is delivered either way and they stay open, while
        connections opened from now on pass. ``only``: stall just the connection accepted
        ``only``-th (0: the first), when it is open. Returns how many were stalled. Not a
        blackout (the link-wide counters do not change)."""
        if seconds <= 0:
            raise ConfigError(f"seconds: must be > 0, got {seconds}")
        now = self.loop.time()
        chosen = [c for c in self.connections if only is None or c.index == only]
        for conn in chosen:
            extra = now + seconds - max(now, conn.dark_until)
            if extra > 0:
                conn.dark_until = now + seconds
                conn.freeze(now, extra)
        return len(chosen)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``coro`` as a task of the proxy (cancelled by ``stop``)."""
        task = self.loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _accept(self) -> _Side:
        conn = _Connection(self, self._accepted)
        self._accepted += 1
        self.counters.connections += 1
        self.connections.add(conn)
        return conn.client

    async def _blackouts(self) -> None:
        """The link-wide blackout schedule: exponential gaps and durations from the seed."""
        every, mean = self.profile.blackout_every_s, self.profile.blackout_s
        assert every is not None
        rng = _rng(self.profile.seed, "blackouts")
        while True:
            await asyncio.sleep(rng.expovariate(1.0 / every))
            duration = rng.expovariate(1.0 / mean)
            logger.debug("netem proxy %s: blackout for %.2f s", self._address, duration)
            self.force_blackout(duration)
            await asyncio.sleep(duration)

    def _warn_packet_only(self) -> None:
        fields = self.profile.packet_only_fields
        key = self.profile.with_seed(0)
        if fields and key not in _warned_profiles:
            _warned_profiles.add(key)
            logger.info("netem proxy: profile %r sets %s, which only the packet tier can do; "
                        "the TCP proxy ignores them", self.profile.name, ", ".join(fields))
