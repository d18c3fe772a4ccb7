"""Measuring a ``PacketLink`` from the outside: UDP probes, UDP load and TCP bulk transfers.

Every measurement runs between sockets created inside the link's own namespaces, so the
traffic crosses the impaired link and nothing else. Used by the packet tier's tests and by
``benchmarks/netem_packet.py``.

- ``udp_probes``: sequence-numbered, time-stamped datagrams client -> server, echoed back:
  one-way loss each way, loss runs (bursts), round-trip times.
- ``udp_rate_kbps``: a fixed offered load above the configured rate; the receiver's rate
  over the IP bytes it got is the bottleneck's rate.
- ``tcp_bulk_kbps``: the goodput of one kernel TCP transfer.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedlink.netem.packet import PacketLink

PROBE = struct.Struct("!Id")  # sequence number, send time (time.monotonic)
UDP_IP_OVERHEAD = 28  # IPv4 (20) + UDP (8) header bytes per datagram
_POLL_S = 0.05
_RCVBUF = 4 << 20
_TCP_TIMEOUT_S = 30.0


@dataclass
class Probes:
    """What a run of UDP probes saw: sequence numbers that reached the server and came back,
    and the round-trip time of each that came back."""

    sent: int
    at_server: list[int] = field(default_factory=list)
    echoed: list[int] = field(default_factory=list)
    rtts: list[float] = field(default_factory=list)

    @property
    def loss_up(self) -> float:
        """Share of probes lost client -> server."""
        return 1 - len(self.at_server) / self.sent if self.sent else 0.0

    @property
    def loss_down(self) -> float:
        """Share of echoes lost server -> client (of those the server sent)."""
        return 1 - len(self.echoed) / len(self.at_server) if self.at_server else 0.0


def loss_runs(received: list[int], sent: int) -> list[int]:
    """Lengths of the runs of consecutive sequence numbers in ``range(sent)`` not received."""
    got = set(received)
    runs: list[int] = []
    current = 0
    for seq in range(sent):
        if seq in got:
            if current:
                runs.append(current)
            current = 0
        else:
            current += 1
    return runs + ([current] if current else [])


def _pace(start: float, sent: int, per_second: float) -> None:
    """Sleep while more than 2 ms ahead of ``per_second`` (sends go out in small bursts)."""
    ahead = start + sent / per_second - time.monotonic()
    if ahead > 0.002:
        time.sleep(ahead)


def _udp_pair(link: PacketLink) -> tuple[socket.socket, socket.socket]:
    """(server socket, client socket), each bound on its side's address, with large receive
    buffers."""
    server = link.server_socket(kind=socket.SOCK_DGRAM)
    client = link.client_socket(kind=socket.SOCK_DGRAM)
    for sock in (server, client):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
        sock.settimeout(_POLL_S)
    server.bind((link.server_addr, 0))
    client.bind((link.client_addr, 0))
    return server, client


def _collect(sock: socket.socket, stop: threading.Event,
             got: list[tuple[bytes, float]], echo: bool = False) -> None:
    """Record (datagram, arrival time) until ``stop``; send each back when ``echo``."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            data, peer = sock.recvfrom(65536)
            got.append((data, time.monotonic()))
            if echo:
                sock.sendto(data, peer)


_Collector = tuple[socket.socket, list[tuple[bytes, float]], bool]


@contextlib.contextmanager
def _running(*targets: _Collector) -> Iterator[None]:
    """Collector threads for the duration of the block."""
    stop = threading.Event()
    threads = [threading.Thread(target=_collect, args=(sock, stop, got, echo), daemon=True)
               for sock, got, echo in targets]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def udp_probes(link: PacketLink, count: int, per_second: float, *, echo: bool = True,
               settle_s: float = 0.5, size: int = 64) -> Probes:
    """Send ``count`` probes of ``size`` payload bytes client -> server at ``per_second``;
    the server echoes each (``echo``). Waits ``settle_s`` after the last one for stragglers
    (make it longer than the round trip)."""
    at_server: list[tuple[bytes, float]] = []
    back: list[tuple[bytes, float]] = []
    server, client = _udp_pair(link)
    with server, client, _running((server, at_server, echo), (client, back, False)):
        target = server.getsockname()
        start = time.monotonic()
        for seq in range(count):
            _pace(start, seq, per_second)
            client.sendto(PROBE.pack(seq, time.monotonic()).ljust(size, b"."), target)
        time.sleep(settle_s)
    result = Probes(sent=count, at_server=[PROBE.unpack_from(d)[0] for d, _ in at_server])
    for data, arrived in back:
        seq, sent_at = PROBE.unpack_from(data)
        result.echoed.append(seq)
        result.rtts.append(arrived - sent_at)
    return result


def _received_kbps(arrivals: list[tuple[bytes, float]]) -> float:
    """Receive rate in kbit/s of IP bytes, from the first arrival to the last."""
    if len(arrivals) < 2:
        return 0.0
    ip_bytes = sum(len(data) + UDP_IP_OVERHEAD for data, _ in arrivals[1:])
    return ip_bytes * 8 / (arrivals[-1][1] - arrivals[0][1]) / 1000


def udp_rate_kbps(link: PacketLink, offered_kbps: float, seconds: float, *, upload: bool,
                  size: int = 1400, settle_s: float = 1.0) -> float:
    """Offer ``offered_kbps`` (IP level) of UDP for ``seconds`` in one direction; the rate
    (kbit/s, IP bytes) at which it arrived. Offer more than the link's rate to measure it."""
    got: list[tuple[bytes, float]] = []
    server, client = _udp_pair(link)
    with server, client:
        sender, receiver = (client, server) if upload else (server, client)
        target = receiver.getsockname()
        per_second = offered_kbps * 1000 / 8 / (size + UDP_IP_OVERHEAD)
        payload = b"\x00" * size
        with _running((receiver, got, False)):
            start = time.monotonic()
            for sent in range(int(per_second * seconds)):
                _pace(start, sent, per_second)
                sender.sendto(payload, target)
            time.sleep(settle_s)
    return _received_kbps(got)


def tcp_bulk_kbps(link: PacketLink, nbytes: int, *, upload: bool) -> float:
    """Goodput (kbit/s) of one TCP transfer of ``nbytes`` (``upload``: client -> server),
    measured at the receiver from its first byte to its last."""
    with link.server_socket() as listener, link.client_socket() as client:
        listener.bind((link.server_addr, 0))
        listener.listen(1)
        client.settimeout(_TCP_TIMEOUT_S)
        client.connect(listener.getsockname())
        accepted, _ = listener.accept()
        with accepted:
            accepted.settimeout(_TCP_TIMEOUT_S)
            sender, receiver = (client, accepted) if upload else (accepted, client)
            return _timed_transfer(sender, receiver, nbytes)


def _timed_transfer(sender: socket.socket, receiver: socket.socket, nbytes: int) -> float:
    def send() -> None:
        sender.sendall(b"\x00" * nbytes)
        sender.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    first = receiver.recv(1)  # returns as soon as the first byte is there
    started, received = time.monotonic(), 0
    while chunk := receiver.recv(1 << 16):
        received += len(chunk)
    elapsed = time.monotonic() - started
    thread.join()
    if len(first) + received != nbytes:
        raise ConnectionError(f"TCP transfer got {len(first) + received} of {nbytes} bytes")
    return received * 8 / elapsed / 1000
