"""Network namespaces, TUN devices and ownership markers for the packet tier (Linux, root).

Naming: a link with id ``1a2b3c4d`` (8 hex digits) lives in namespaces ``fl-1a2b3c4d-a``
(client side) and ``fl-1a2b3c4d-b`` (server side), each holding one TUN device named
``fl1a2b3c4da`` / ``fl1a2b3c4db``. Before a link creates anything it writes a marker,
``/run/fedlink-netem/<id>.json``, recording the owning process (pid and start time, so a
reused pid is not mistaken for the owner). ``cleanup_stale`` removes every ``fl-`` namespace
whose owner is gone, or that has no marker at all.

Namespaces are entered two ways: ``ip netns exec`` for subprocesses, and ``setns(2)`` in a
short-lived helper thread for work done in this process (creating a socket inside a namespace,
writing its sysctls). A socket stays in the namespace it was created in, whatever thread
later uses it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from fedlink.errors import FedlinkError

T = TypeVar("T")

NETNS_DIR = Path("/run/netns")
STATE_DIR = Path("/run/fedlink-netem")
TUN_PATH = "/dev/net/tun"
NAMESPACE_RE = re.compile(r"^fl-([0-9a-f]{8})-([ab])$")

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_CLONE_NEWNET = 0x40000000
_IP_TIMEOUT_S = 20.0
TXQUEUELEN = 10_000
"""Kernel queue in front of each TUN device, in packets: deep, so that a forwarder briefly
starved of CPU delays packets instead of dropping them (the link's own bottleneck queue, not
this one, is what drops)."""


class NamespaceError(FedlinkError):
    """Creating, configuring or entering a namespace or TUN device failed."""


@dataclass(frozen=True)
class LinkNames:
    """Every name and address one link uses, derived from its id."""

    link_id: str

    @classmethod
    def new(cls) -> LinkNames:
        """Names for a fresh link with a random id."""
        return cls(secrets.token_hex(4))

    @property
    def client_ns(self) -> str:
        """Client-side namespace."""
        return f"fl-{self.link_id}-a"

    @property
    def server_ns(self) -> str:
        """Server-side namespace."""
        return f"fl-{self.link_id}-b"

    @property
    def client_dev(self) -> str:
        """TUN device in the client namespace."""
        return f"fl{self.link_id}a"

    @property
    def server_dev(self) -> str:
        """TUN device in the server namespace."""
        return f"fl{self.link_id}b"

    def _subnet_base(self) -> int:
        """Base of a /30 inside 10.250.0.0/16 (cosmetic: the namespaces are isolated)."""
        return (int(self.link_id, 16) % 16384) * 4

    @property
    def client_addr(self) -> str:
        """Client address (``.1`` of the link's /30)."""
        base = self._subnet_base() + 1
        return f"10.250.{base // 256}.{base % 256}"

    @property
    def server_addr(self) -> str:
        """Server address (``.2`` of the link's /30)."""
        base = self._subnet_base() + 2
        return f"10.250.{base // 256}.{base % 256}"

    @property
    def marker(self) -> Path:
        """The ownership marker file."""
        return STATE_DIR / f"{self.link_id}.json"


# --- ip(8) and TUN ----------------------------------------------------------------------------


def ip(*args: str, batch: str | None = None) -> None:
    """Run ``ip ARGS`` (``ip ARGS -batch -`` fed ``batch`` when given); ``NamespaceError``
    carrying ip's message when it fails."""
    argv = ["ip", *args, *(["-batch", "-"] if batch is not None else [])]
    try:
        done = subprocess.run(argv, input=batch, capture_output=True, text=True,
                              timeout=_IP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NamespaceError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise NamespaceError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def ip_available() -> bool:
    """Whether iproute2's ``ip`` is on the PATH."""
    return shutil.which("ip") is not None


def open_tun(name: str) -> int:
    """Create TUN device ``name`` (IP packets, no packet-info header); its non-blocking fd.

    The device exists as long as the fd stays open (it is not persistent)."""
    fd = os.open(TUN_PATH, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except OSError as exc:
        os.close(fd)
        raise NamespaceError(f"cannot create TUN device {name}: {exc}") from exc
    return fd


def list_namespaces() -> list[str]:
    """Names of the named network namespaces (``ip netns list``)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def add_namespaces(*names: str) -> None:
    """Create the named network namespaces."""
    ip(batch="".join(f"netns add {name}\n" for name in names))


def delete_namespace(name: str) -> None:
    """Delete a named namespace (nothing happens when it does not exist)."""
    if (NETNS_DIR / name).exists():
        ip("netns", "delete", name)


def move_device(dev: str, namespace: str) -> None:
    """Move network device ``dev`` into ``namespace``."""
    ip("link", "set", "dev", dev, "netns", namespace)


def configure_side(namespace: str, dev: str, addr: str) -> None:
    """In ``namespace``: ``lo`` up, ``addr`` on ``dev`` with the link's /30, ``dev`` up with
    a ``TXQUEUELEN`` queue."""
    ip("-n", namespace, batch=(f"link set dev lo up\n"
                               f"addr add {addr}/30 dev {dev}\n"
                               f"link set dev {dev} txqueuelen {TXQUEUELEN} up\n"))


# --- entering a namespace from this process ---------------------------------------------------


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, _CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _enter_and_call(namespace: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` with this thread in ``namespace``; the thread goes back afterwards."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(NETNS_DIR / namespace, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            return fn()
        finally:
            _setns(home)
    finally:
        os.close(home)


def call_in_namespace(namespace: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a helper thread that has entered ``namespace``; its result or error.

    Other threads of this process never change namespace."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(_enter_and_call(namespace, fn))
        except BaseException as exc:  # handed to the caller's thread below
            error.append(exc)

    thread = threading.Thread(target=target, name=f"fedlink-setns-{namespace}", daemon=True)
    thread.start()
    thread.join()
    if error:
        if isinstance(error[0], OSError):
            raise NamespaceError(f"in namespace {namespace}: {error[0]}") from error[0]
        raise error[0]
    return result[0]


def socket_in(namespace: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM,
              proto: int = 0) -> socket.socket:
    """A socket created inside ``namespace`` (usable from any thread afterwards)."""
    return call_in_namespace(namespace, lambda: socket.socket(family, kind, proto))


def disable_ipv6_in(namespace: str) -> None:
    """Turn IPv6 off in ``namespace`` (devices moved in later stay silent: no router
    solicitations or MLD reports to disturb the link's packet counts). No-op without IPv6."""

    def write() -> None:
        for scope in ("all", "default"):
            path = Path(f"/proc/sys/net/ipv6/conf/{scope}/disable_ipv6")
            if path.exists():
                path.write_text("1\n")

    call_in_namespace(namespace, write)


# --- ownership markers and stale links --------------------------------------------------------


def process_start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (``None``: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19]) if fields[0] != "Z" else None  # field 22; zombies count as gone


def write_marker(names: LinkNames, **extra: int) -> None:
    """Record this process as the owner of ``names`` (plus ``extra`` fields, e.g. a pid)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    record = {"owner_pid": pid, "owner_start": process_start_ticks(pid), **extra}
    tmp = names.marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(names.marker)


def remove_marker(names: LinkNames) -> None:
    """Forget the ownership record of ``names``."""
    names.marker.unlink(missing_ok=True)


def _owner_alive(names: LinkNames) -> bool:
    try:
        record = json.loads(names.marker.read_text())
    except (OSError, ValueError):
        return False
    start = process_start_ticks(int(record.get("owner_pid", -1)))
    return start is not None and start == record.get("owner_start")


def _stale_ids() -> set[str]:
    ids = {m.group(1) for name in list_namespaces() if (m := NAMESPACE_RE.match(name))}
    if STATE_DIR.is_dir():
        ids |= {p.stem for p in STATE_DIR.glob("*.json") if re.fullmatch(r"[0-9a-f]{8}", p.stem)}
    return {link_id for link_id in ids if not _owner_alive(LinkNames(link_id))}


def cleanup_stale() -> list[str]:
    """Remove the namespaces and markers of links whose owning process is gone (a crash, a
    ``kill -9``); links of live processes are left alone. Returns the namespaces removed."""
    removed: list[str] = []
    for link_id in sorted(_stale_ids()):
        names = LinkNames(link_id)
        for namespace in (names.client_ns, names.server_ns):
            try:
                if (NETNS_DIR / namespace).exists():
                    delete_namespace(namespace)
                    removed.append(namespace)
            except NamespaceError:
                if (NETNS_DIR / namespace).exists():  # not a concurrent cleanup: real failure
                    raise
        remove_marker(names)
    return removed


def tun_usable() -> tuple[bool, str]:
    """Whether ``/dev/net/tun`` exists and can be opened (and why not)."""
    try:
        fd = os.open(TUN_PATH, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False, f"{TUN_PATH} does not exist (no TUN support in this kernel or container)"
    except OSError as exc:
        reason = "permission denied" if exc.errno in (errno.EACCES, errno.EPERM) else str(exc)
        return False, f"cannot open {TUN_PATH}: {reason}"
    os.close(fd)
    return True, ""
