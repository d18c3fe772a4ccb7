"""The packet tier's forwarder process: moves IP packets between two TUN devices.

``PacketLink`` (``fedlink.netem.packet``) creates the TUN devices, moves them into the client
and server namespaces, and starts ``python -m fedlink.netem.packet_forwarder`` in the root
namespace with both TUN file descriptors (a TUN fd keeps working after its device moves to
another namespace) and a shared-memory counter block. The process then runs one
single-threaded ``select`` loop:

- read every packet waiting on either TUN fd and hand it to that direction's
  ``DirectionShaper`` (client TUN -> "up", server TUN -> "down");
- write the packets whose release time has come to the other TUN fd;
- sleep until the next release is due or a packet arrives (``select`` rather than
  ``epoll``: its timeout has microsecond resolution, where ``epoll``'s rounds up to the next
  millisecond; with three fds it costs the same);
- publish the counters into shared memory after each round.

It stops on SIGTERM, and on its own when its parent process is gone (it checks its parent
pid several times a second), so a crashed owner never leaves a forwarder running. It writes
``ready`` on stdout once it is forwarding.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import mmap
import os
import select
import signal
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fedlink.errors import ConfigError
from fedlink.netem.packet_shaper import (
    DROP_CAUSES,
    DirectionShaper,
    LinkShapers,
    build_shapers,
)
from fedlink.netem.profile import LinkProfile

COUNTER_FIELDS: tuple[str, ...] = (
    "packets_up", "bytes_up", "dropped_up", "offered_up",
    "packets_down", "bytes_down", "dropped_down", "offered_down",
    "blackouts", "stalled_us",
    *(f"{cause}_up" for cause in DROP_CAUSES),
    *(f"{cause}_down" for cause in DROP_CAUSES),
)
"""Order of the int64 slots in the shared counter block."""

COUNTER_FORMAT = f"<{len(COUNTER_FIELDS)}q"
COUNTER_BYTES = struct.calcsize(COUNTER_FORMAT)

MAX_READS_PER_ROUND = 256
"""Packets read from one TUN fd per loop round before serving the other side."""

MAX_SLEEP_S = 0.2
"""Longest sleep between checks that the parent process is still alive."""

READ_SIZE = 65536


def read_counters(block: mmap.mmap) -> dict[str, int]:
    """The counters a forwarder last published into ``block``."""
    return dict(zip(COUNTER_FIELDS, struct.unpack_from(COUNTER_FORMAT, block), strict=True))


def _direction_values(shaper: DirectionShaper) -> list[int]:
    stats = shaper.stats
    return [stats.packets, stats.bytes, stats.dropped, stats.offered]


class Forwarder:
    """The forwarding loop over two non-blocking TUN fds (see the module docstring)."""

    def __init__(self, client_fd: int, server_fd: int, shapers: LinkShapers,
                 counters: mmap.mmap, parent_pid: int) -> None:
        self._shapers = shapers
        self._route: dict[int, tuple[DirectionShaper, Callable[[bytes], int]]] = {
            client_fd: (shapers.up, functools.partial(os.write, server_fd)),
            server_fd: (shapers.down, functools.partial(os.write, client_fd)),
        }
        self._counters = counters
        self._parent_pid = parent_pid
        self._stopping = False
        self._watched = [client_fd, server_fd]
        for fd in self._watched:
            os.set_blocking(fd, False)

    def stop(self) -> None:
        """Ask the loop to end after its current round."""
        self._stopping = True

    def watch(self, fd: int) -> None:
        """Wake the loop when ``fd`` becomes readable (the signal wakeup pipe)."""
        self._watched.append(fd)

    def run(self) -> None:
        """Forward until stopped or orphaned."""
        watched = self._watched
        while not self._stopping and os.getppid() == self._parent_pid:
            readable, _, _ = select.select(watched, [], [], self._sleep_s(time.monotonic()))
            for fd in readable:
                self._read_from(fd, time.monotonic())
            self._deliver(time.monotonic())
            self.publish(time.monotonic())

    def _sleep_s(self, now: float) -> float:
        due = [t for t in (self._shapers.up.next_due(), self._shapers.down.next_due())
               if t is not None]
        return max(0.0, min([MAX_SLEEP_S, *(t - now for t in due)]))

    def _read_from(self, fd: int, now: float) -> None:
        route = self._route.get(fd)
        if route is None:  # the signal wakeup pipe: empty it; the handler has run
            os.read(fd, READ_SIZE)
            return
        shaper = route[0]
        for _ in range(MAX_READS_PER_ROUND):
            try:
                packet = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return
            shaper.offer(packet, now)

    def _deliver(self, now: float) -> None:
        for shaper, write in self._route.values():
            shaper.deliver(now, write)

    def publish(self, now: float) -> None:
        """Write the current counters into the shared block."""
        up, down = self._shapers.up, self._shapers.down
        blackouts, stalled_s = self._shapers.outages.summary(now)
        values = [*_direction_values(up), *_direction_values(down),
                  blackouts, int(stalled_s * 1e6),
                  *(up.stats.drops[c] for c in DROP_CAUSES),
                  *(down.stats.drops[c] for c in DROP_CAUSES)]
        struct.pack_into(COUNTER_FORMAT, self._counters, 0, *values)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fedlink.netem.packet_forwarder",
                                     description="fedlink packet-tier forwarder (internal)")
    parser.add_argument("--client-fd", type=int, required=True, help="TUN fd, client side")
    parser.add_argument("--server-fd", type=int, required=True, help="TUN fd, server side")
    parser.add_argument("--counters-fd", type=int, required=True,
                        help=f"shared memory fd of at least {COUNTER_BYTES} bytes")
    parser.add_argument("--profile", required=True, help="LinkProfile as a JSON object")
    parser.add_argument("--queue-bytes", type=int, default=None)
    parser.add_argument("--parent-pid", type=int, required=True)
    return parser.parse_args(argv)


def _install_stop_handler(forwarder: Forwarder) -> None:
    """SIGTERM stops the loop; the wakeup pipe interrupts its sleep. SIGINT is ignored (the
    owner decides when the link ends)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    signal.signal(signal.SIGTERM, lambda *_: forwarder.stop())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    forwarder.watch(read_end)


def _tighten_timer_slack() -> None:
    """Ask for 1 us timer slack (default 50 us): releases are timed by ``select`` timeouts."""
    with contextlib.suppress(OSError):
        Path("/proc/self/timerslack_ns").write_text("1000")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the forwarder process."""
    args = _parse_args(argv)
    try:
        profile = LinkProfile.from_dict(json.loads(args.profile))
        shapers = build_shapers(profile, time.monotonic(), args.queue_bytes)
    except (ConfigError, ValueError) as exc:
        print(f"packet forwarder: {exc}", file=sys.stderr)
        return 2
    counters = mmap.mmap(args.counters_fd, COUNTER_BYTES)
    _tighten_timer_slack()
    forwarder = Forwarder(args.client_fd, args.server_fd, shapers, counters, args.parent_pid)
    _install_stop_handler(forwarder)
    print("ready", flush=True)
    forwarder.run()
    forwarder.publish(time.monotonic())
    counters.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
