"""What the kernel knows about a TCP connection: ``ss -tin`` on Linux, when it is installed.

Only the connections a netcheck opened are reported: the caller takes the set of connections
to the target before it dials (``connections_to``) and asks for the others afterwards
(``tcp_stats``). Where ``ss`` is missing or fails, there is simply nothing to report.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from dataclasses import dataclass

SS_TIMEOUT_S = 5.0
_FIELD = re.compile(r"\b(rtt|cwnd|retrans|bytes_retrans|lost|mss):([\d./]+)")


@dataclass(frozen=True)
class TcpStats:
    """One connection as the kernel sees it: its smoothed RTT, congestion window (segments),
    retransmitted segments and bytes in all, and lost segments now."""

    local: str
    peer: str
    rtt_ms: float | None
    cwnd: int | None
    retransmits: int
    bytes_retransmitted: int
    lost: int


def _address(target: str) -> tuple[str, int]:
    """``host:port`` resolved to an IPv4/IPv6 address string and port."""
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    try:
        info = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return host, int(port) if port.isdigit() else 0
    return str(info[0][4][0]), int(port)


def _ss(target: str) -> list[tuple[str, str, str]]:
    """``(local, peer, details)`` of established connections to ``target`` (empty without ss)."""
    binary = shutil.which("ss")
    if binary is None:
        return []
    host, port = _address(target)
    peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        out = subprocess.run([binary, "-tinH", "state", "established", "dst", peer],
                             capture_output=True, text=True, timeout=SS_TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    rows: list[tuple[str, str, str]] = []
    lines = out.stdout.splitlines()
    for head, details in zip(lines[::2], lines[1::2], strict=False):
        parts = head.split()
        if len(parts) >= 4:
            rows.append((parts[-2], parts[-1], details))
    return rows


def connections_to(target: str) -> frozenset[tuple[str, str]]:
    """The ``(local, peer)`` pairs of the connections to ``target`` open now."""
    return frozenset((local, peer) for local, peer, _ in _ss(target))


def tcp_stats(target: str, exclude: frozenset[tuple[str, str]] = frozenset()
              ) -> tuple[TcpStats, ...]:
    """Kernel figures of each connection to ``target`` not in ``exclude``."""
    return tuple(_parse(local, peer, details) for local, peer, details in _ss(target)
                 if (local, peer) not in exclude)


def _parse(local: str, peer: str, details: str) -> TcpStats:
    """One ``ss -i`` detail line as ``TcpStats``."""
    fields = dict(_FIELD.findall(details))
    rtt = fields.get("rtt")
    retrans = fields.get("retrans", "0/0").split("/")[-1]
    return TcpStats(local=local, peer=peer,
                    rtt_ms=float(rtt.split("/")[0]) if rtt else None,
                    cwnd=int(fields["cwnd"]) if "cwnd" in fields else None,
                    retransmits=int(retrans or 0),
                    bytes_retransmitted=int(fields.get("bytes_retrans", 0)),
                    lost=int(fields.get("lost", 0)))
