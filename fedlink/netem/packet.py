"""The packet tier: a user-space impaired link between two network namespaces (Linux, root).

Mahimahi-style: the client and the server each get their own network namespace with one TUN
device on a point-to-point /30 (client ``10.250.X.1``, server ``10.250.X.2``), and a forwarder
process in the root namespace moves IP packets between the two TUN devices, applying the
profile per direction (up = client -> server): outages, random and Gilbert-Elliott loss, a
rate limit or a Mahimahi delivery trace with a drop-tail queue, then delay and jitter. Kernel
TCP on both ends therefore sees genuine loss, queueing and reordering-free delay. The exact
per-packet semantics are in ``fedlink.netem.packet_shaper``; the forwarding loop in
``fedlink.netem.packet_forwarder``; names, namespaces and crash cleanup in
``fedlink.netem.packet_ns``.

Usage::

    with PacketLink(LinkProfile(latency_ms=50, loss_up=0.05, up_kbps=1000)) as link:
        server = link.popen_in_server(["python", "-m", "http.server", "8000"])
        link.run_in_client(["curl", f"http://{link.server_addr}:8000/"])
        print(link.counters)

``client_socket`` / ``server_socket`` create sockets inside a namespace from this process,
which is handy for tests and probes. Creating a link removes what crashed links left behind
first (``cleanup_stale``). Requirements: Linux, root, ``/dev/net/tun`` and iproute2's ``ip``;
``packet_tier_available()`` says whether they are met and why not.

Connection-level impairments (``reset_every_kb``, ``reset_every_s``, ``limit_data_kb``) belong
to the TCP proxy tier: the packet tier sees packets, not connections, and ignores them with a
warning.

The forwarder is Python: about 5 us of CPU per packet, so it forwards on the order of a
Gbit/s of full-size packets on an idle core, and it adds about 0.2-0.5 ms to a round trip
(wake-up and copy); ``benchmarks/netem_packet.py`` measures both.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import mmap
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import fedlink
from fedlink.errors import ConfigError
from fedlink.netem.base import LinkCounters
from fedlink.netem.packet_forwarder import COUNTER_BYTES, read_counters
from fedlink.netem.packet_ns import (
    LinkNames,
    NamespaceError,
    add_namespaces,
    cleanup_stale,
    configure_side,
    delete_namespace,
    disable_ipv6_in,
    ip,
    ip_available,
    open_tun,
    remove_marker,
    socket_in,
    tun_usable,
    write_marker,
)
from fedlink.netem.packet_trace import DeliveryTrace, load_trace
from fedlink.netem.profile import LinkProfile

__all__ = [
    "NamespaceError",
    "PacketLink",
    "PacketTierUnavailable",
    "cleanup_stale",
    "load_trace",
    "packet_tier_available",
]

CONNECTION_FIELDS = ("reset_every_kb", "reset_every_s", "limit_data_kb")
"""Profile fields the packet tier cannot apply (they act on connections)."""

STOP_TIMEOUT_S = 3.0
"""How long ``close`` waits for the forwarder and helper processes after SIGTERM."""

_LIVE: weakref.WeakSet[PacketLink] = weakref.WeakSet()
_log = logging.getLogger(__name__)


class PacketTierUnavailable(ConfigError):
    """The packet tier cannot run here (not Linux, not root, no TUN, no ``ip``)."""


def packet_tier_available() -> tuple[bool, str]:
    """``(True, "")`` when this machine can run ``PacketLink``, else ``(False, reason)``."""
    if not sys.platform.startswith("linux"):
        return False, "the packet tier needs Linux (network namespaces and TUN devices)"
    if os.geteuid() != 0:
        return False, ("the packet tier needs root to create network namespaces and TUN "
                       "devices (use the TCP proxy tier, fedlink.netem.proxy, without root)")
    usable, reason = tun_usable()
    if not usable:
        return False, reason
    if not ip_available():
        return False, "the packet tier needs iproute2's `ip` command on the PATH"
    return True, ""


def _require_packet_tier() -> None:
    available, reason = packet_tier_available()
    if not available:
        raise PacketTierUnavailable(f"packet tier unavailable: {reason}")


def _load_traces(profile: LinkProfile) -> tuple[LinkProfile, dict[str, DeliveryTrace]]:
    """Validate the profile's traces now (one clear ``ConfigError`` naming file and line) and
    make their paths absolute for the forwarder."""
    traces: dict[str, DeliveryTrace] = {}
    absolute: dict[str, str] = {}
    for field in ("trace_up", "trace_down"):
        path = getattr(profile, field)
        if path is not None:
            traces[field] = load_trace(path)
            absolute[field] = str(Path(path).resolve())
    return profile.replace(**absolute), traces


def _forwarder_env() -> dict[str, str]:
    """The environment of the forwarder: this one, with fedlink importable."""
    env = dict(os.environ)
    root = str(Path(fedlink.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


class PacketLink:
    """An impaired link between a client namespace and a server namespace.

    Use as a context manager (or call ``start`` and ``close``). Attributes: ``profile``,
    ``client_ns`` / ``server_ns``, ``client_addr`` / ``server_addr``, ``client_dev`` /
    ``server_dev``, ``counters`` (a fresh ``LinkCounters`` snapshot on each access: packets
    and bytes delivered and packets dropped each way, outages begun and seconds spent in
    them), ``stats()`` (the same plus drops by cause), ``forwarder_pid``.

    Per direction (up = client -> server), in this order: outages drop packets (a real link
    drops rather than holds; TCP stays up and retransmits), random then Gilbert-Elliott loss,
    a drop-tail bottleneck drained at ``up_kbps`` / ``down_kbps`` or by a delivery trace
    (a trace replaces the rate of its direction), then latency plus jitter with packet order
    kept. Details: ``fedlink.netem.packet_shaper``.

    ``queue_bytes`` overrides the bottleneck's drop-tail limit (both directions); by default
    it is a quarter-second of the direction's rate, at least 32 KiB.
    """

    def __init__(self, profile: LinkProfile, *, queue_bytes: int | None = None,
                 start_timeout_s: float = 10.0) -> None:
        if queue_bytes is not None and queue_bytes < 1500:
            raise ConfigError(f"queue_bytes: must be >= 1500 (one packet), got {queue_bytes}")
        self.profile, self.traces = _load_traces(profile)
        ignored = [f for f in CONNECTION_FIELDS if getattr(profile, f) is not None]
        if ignored:
            _log.warning("packet tier: profile %r sets %s, which only the TCP proxy tier "
                         "applies; ignored here", profile.name, ", ".join(ignored))
        self._queue_bytes = queue_bytes
        self._start_timeout_s = start_timeout_s
        self._names = LinkNames.new()
        self._tun_fds: list[int] = []
        self._block: mmap.mmap | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._children: list[subprocess.Popen[Any]] = []
        self._last: dict[str, int] = {}
        self._started = False

    # --- names ------------------------------------------------------------------------------

    @property
    def link_id(self) -> str:
        """The 8-hex-digit id that every name of this link carries."""
        return self._names.link_id

    @property
    def client_ns(self) -> str:
        """The client-side network namespace (``fl-<id>-a``)."""
        return self._names.client_ns

    @property
    def server_ns(self) -> str:
        """The server-side network namespace (``fl-<id>-b``)."""
        return self._names.server_ns

    @property
    def client_addr(self) -> str:
        """The client's IPv4 address (in ``client_ns``)."""
        return self._names.client_addr

    @property
    def server_addr(self) -> str:
        """The server's IPv4 address (in ``server_ns``)."""
        return self._names.server_addr

    @property
    def client_dev(self) -> str:
        """The TUN device in ``client_ns``."""
        return self._names.client_dev

    @property
    def server_dev(self) -> str:
        """The TUN device in ``server_ns``."""
        return self._names.server_dev

    @property
    def forwarder_pid(self) -> int | None:
        """Pid of the forwarder process (once started)."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """Whether the link is open and its forwarder alive."""
        return (self._block is not None and self._process is not None
                and self._process.poll() is None)

    # --- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> PacketLink:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> PacketLink:
        """Remove stale links, create the namespaces and devices, start forwarding."""
        if self._started:
            raise RuntimeError("this PacketLink has already been started")
        _require_packet_tier()
        self._started = True
        cleanup_stale()
        write_marker(self._names)
        try:
            self._create_devices()
            self._start_forwarder()
            write_marker(self._names, forwarder_pid=self.forwarder_pid or 0)
        except BaseException:
            self.close()
            raise
        _LIVE.add(self)
        return self

    def _create_devices(self) -> None:
        names = self._names
        self._tun_fds = [open_tun(names.client_dev), open_tun(names.server_dev)]
        add_namespaces(names.client_ns, names.server_ns)
        for namespace in (names.client_ns, names.server_ns):
            disable_ipv6_in(namespace)
        ip(batch=(f"link set dev {names.client_dev} netns {names.client_ns}\n"
                  f"link set dev {names.server_dev} netns {names.server_ns}\n"))
        configure_side(names.client_ns, names.client_dev, names.client_addr)
        configure_side(names.server_ns, names.server_dev, names.server_addr)

    def _forwarder_argv(self, counters_fd: int) -> list[str]:
        client_fd, server_fd = self._tun_fds
        argv = [sys.executable, "-m", "fedlink.netem.packet_forwarder",
                "--client-fd", str(client_fd), "--server-fd", str(server_fd),
                "--counters-fd", str(counters_fd), "--parent-pid", str(os.getpid()),
                "--profile", json.dumps(self.profile.to_dict())]
        if self._queue_bytes is not None:
            argv += ["--queue-bytes", str(self._queue_bytes)]
        return argv

    def _start_forwarder(self) -> None:
        counters_fd = os.memfd_create("fedlink-netem-counters", os.MFD_CLOEXEC)
        try:
            os.ftruncate(counters_fd, COUNTER_BYTES)
            self._block = mmap.mmap(counters_fd, COUNTER_BYTES)
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the link)
            self._process = subprocess.Popen(
                self._forwarder_argv(counters_fd), pass_fds=(*self._tun_fds, counters_fd),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr,
                start_new_session=True, env=_forwarder_env())
        finally:
            os.close(counters_fd)
        for fd in self._tun_fds:  # the forwarder owns the devices now: they die with it
            os.close(fd)
        self._tun_fds = []
        self._wait_ready()

    def _forwarder_error(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace").strip()[-2000:]

    def _wait_ready(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], self._start_timeout_s)
        line = self._process.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self._process.poll()
            raise NamespaceError(f"the packet forwarder did not start (exit code "
                                 f"{self._process.returncode}): {self._forwarder_error()}")

    def close(self) -> None:
        """Stop the forwarder and helper processes, delete the namespaces (and with them the
        devices). Safe to call more than once, and after a failed ``start``."""
        _LIVE.discard(self)
        for child in self._children:
            _stop_process(child)
        self._children = []
        if self._process is not None:
            _stop_process(self._process)
            if self._process.stdout is not None:
                self._process.stdout.close()
        self._keep_final_counters()
        for fd in self._tun_fds:
            os.close(fd)
        self._tun_fds = []
        if self._started:
            for namespace in (self.client_ns, self.server_ns):
                delete_namespace(namespace)
            remove_marker(self._names)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _keep_final_counters(self) -> None:
        if self._block is not None:
            self._last = read_counters(self._block)
            self._block.close()
            self._block = None

    # --- counters -----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Every counter of the forwarder (``fedlink.netem.packet_forwarder.COUNTER_FIELDS``):
        delivered packets and bytes, packets offered and dropped each way, drops by cause
        (``loss_up``, ``burst_down``, ``queue_up``, ``outage_down``, ...), outages begun,
        microseconds spent in outages. The last values are kept after ``close``."""
        if self._block is not None:
            self._last = read_counters(self._block)
        return dict(self._last)

    @property
    def counters(self) -> LinkCounters:
        """A snapshot of the link's ``LinkCounters`` (``connections`` and ``resets`` stay 0:
        the packet tier does not see connections)."""
        stats = self.stats()
        if not stats:
            return LinkCounters()
        names = {f.name for f in dataclasses.fields(LinkCounters)} & set(stats)
        counters = LinkCounters(**{name: stats[name] for name in names})
        counters.stalled_s = stats["stalled_us"] / 1e6
        return counters

    # --- running things inside the namespaces -------------------------------------------------

    def _exec_argv(self, namespace: str, argv: Sequence[str]) -> list[str]:
        if not self._started or self._process is None:
            raise RuntimeError("the PacketLink is not running")
        return ["ip", "netns", "exec", namespace, *argv]

    def run_in_client(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run(argv, **kwargs)`` inside the client namespace."""
        return subprocess.run(self._exec_argv(self.client_ns, argv), **kwargs)

    def run_in_server(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run(argv, **kwargs)`` inside the server namespace."""
        return subprocess.run(self._exec_argv(self.server_ns, argv), **kwargs)

    def popen_in_client(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` inside the client namespace; stopped by ``close`` if still
        running."""
        return self._track(subprocess.Popen(self._exec_argv(self.client_ns, argv), **kwargs))

    def popen_in_server(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` inside the server namespace; stopped by ``close`` if still
        running."""
        return self._track(subprocess.Popen(self._exec_argv(self.server_ns, argv), **kwargs))

    def _track(self, process: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
        self._children.append(process)
        return process

    def client_socket(self, family: int = socket.AF_INET,
                      kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A new socket inside the client namespace (connect it to ``server_addr``)."""
        return socket_in(self.client_ns, family, kind)

    def server_socket(self, family: int = socket.AF_INET,
                      kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A new socket inside the server namespace (bind it to ``server_addr``)."""
        return socket_in(self.server_ns, family, kind)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (f"PacketLink({self.profile.name!r}, {self.client_ns} {self.client_addr} <-> "
                f"{self.server_ns} {self.server_addr}, {state})")


def _stop_process(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, wait a little, then SIGKILL; reaps the process."""
    if process.poll() is not None:
        return
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@atexit.register
def _close_live_links() -> None:
    """Close links the program forgot to close, so a normal exit leaves nothing behind."""
    for link in list(_LIVE):
        link.close()

