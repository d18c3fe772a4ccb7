"""Real packet loss (root): 25% random loss each way on fedlink's own packet link, kernel TCP at
both ends, a 1.2 MB model, 5 clients, 5 sync rounds.

What it shows: no connection is aborted by a TCP user timeout (the kernel's
``TCPAbortOnTimeout`` in the clients' namespace stays 0: the sockets' ``TCP_USER_TIMEOUT`` no
longer equals the 5 s ping timeout), no update is refused, the summary's retries and offline
seconds equal what the clients counted, and its bytes down are what the clients received plus
what cut downloads lost in flight. The clients' TCP
connections (reconnects) are printed. Skips with the reason unless run as root with TUN.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedlink.metrics import read_events, summarize
from fedlink.netem.packet import PacketLink, packet_tier_available
from fedlink.netem.profile import LinkProfile

AVAILABLE, REASON = packet_tier_available()
# the packet tier's xdist group: a link's start cleans up stale links, which would race with
# test_netem_packet's check of what cleanup_stale removes
pytestmark = [pytest.mark.skipif(not AVAILABLE, reason=REASON), pytest.mark.timeout(420),
              pytest.mark.xdist_group("packet-tier")]

DIM = 300_000  # 1.2 MB of float32
CLIENTS, ROUNDS = 5, 5
LOSS = 0.25

SERVER = textwrap.dedent(f"""
    import asyncio, sys
    import numpy as np
    from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule
    from fedlink.coordinator.server import serve_until_done
    from pathlib import Path
    from fedlink.metrics import EventLog

    config = CoordinatorConfig(rounds={ROUNDS}, flush=FlushRule(
        goal={CLIENTS}, min_updates={CLIENTS}, deadline_s=None))

    async def main() -> None:
        with EventLog(Path(sys.argv[2])) as events:
            server = CoordinatorServer(config, np.zeros({DIM}, np.float32), events,
                                       address=sys.argv[1] + ":0")
            await serve_until_done(server, lambda port: print("port", port, flush=True))

    asyncio.run(main())
""")

CLIENT_FLEET = textwrap.dedent(f"""
    import asyncio, dataclasses, json, sys
    import numpy as np
    from fedlink.client import ClientOptions, ClientSession, TrainResult

    class Toward:
        def __init__(self, i):
            self.target = np.full({DIM}, float(i + 1), np.float32)
        def num_examples(self):
            return 10
        def train(self, params, plan):
            new = (params + 0.5 * (self.target - params)).astype(np.float32)
            return TrainResult(new, 10, 1, 1, {{}})

    async def main() -> None:
        sessions = [ClientSession(sys.argv[1], Toward(i), ClientOptions(name=f"c{{i}}"))
                    for i in range({CLIENTS})]
        stats = await asyncio.gather(*(s.run() for s in sessions))
        print("STATS " + json.dumps([dataclasses.asdict(s) for s in stats]), flush=True)

    asyncio.run(main())
""")


def kernel_counters(link: PacketLink) -> dict[str, int]:
    """TcpExt and Tcp counters of the clients' namespace (``/proc/net/{netstat,snmp}``)."""
    found: dict[str, int] = {}
    for table in ("/proc/net/netstat", "/proc/net/snmp"):
        text = link.run_in_client(["cat", table], capture_output=True, text=True,
                                  check=True).stdout.splitlines()
        for names, values in zip(text[::2], text[1::2], strict=True):
            prefix, *keys = names.split()
            _, *numbers = values.split()
            found.update({f"{prefix}{k}": int(v) for k, v in zip(keys, numbers, strict=True)})
    return found


def test_25_percent_loss_both_ways_aborts_nothing_and_counts_honestly(tmp_path: Path) -> None:
    events_path = tmp_path / "events.jsonl"
    with PacketLink(LinkProfile(loss_up=LOSS, loss_down=LOSS, seed=7)) as link:
        before = kernel_counters(link)
        server = link.popen_in_server([sys.executable, "-c", SERVER, link.server_addr,
                                       str(events_path)], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        fleet = link.run_in_client([sys.executable, "-c", CLIENT_FLEET,
                                    f"{link.server_addr}:{port}"], capture_output=True,
                                   text=True, timeout=360)
        assert fleet.returncode == 0, fleet.stderr[-4000:]
        assert server.wait(timeout=60) == 0
        after = kernel_counters(link)
    (line,) = [x for x in fleet.stdout.splitlines() if x.startswith("STATS ")]
    stats = json.loads(line.removeprefix("STATS "))
    summary = summarize(read_events(events_path), {})
    aborted = after["TcpExt:TCPAbortOnTimeout"] - before["TcpExt:TCPAbortOnTimeout"]
    connections = after["Tcp:ActiveOpens"] - before["Tcp:ActiveOpens"]
    retransmitted = after["Tcp:RetransSegs"] - before["Tcp:RetransSegs"]
    print(f"25% loss: {connections} client TCP connections, {aborted} aborted on timeout, "
          f"{retransmitted} segments retransmitted, retries "
          f"{summary['client_retries_reported']}, offline {summary['offline_seconds']:.1f} s, "
          f"down {summary['bytes_down']} B, up {summary['bytes_up']} B, "
          f"wall {summary['wall_seconds']:.1f} s")
    assert aborted == 0
    assert summary["rounds"] == ROUNDS and summary["updates_refused"] == 0
    assert [s["accepted"] for s in stats] == [ROUNDS] * CLIENTS
    assert summary["client_retries_reported"] == sum(s["retries"] for s in stats)
    assert summary["offline_seconds"] == pytest.approx(sum(s["offline_seconds"] for s in stats))
    assert summary["resumed_bytes"] == sum(s["resumed_bytes"] for s in stats)
    # the coordinator counts what it handed to gRPC, the clients what arrived: a download stream
    # cut by the loss loses what it had in flight, which the resume sends again, and so does one
    # a client cut short because its other connection took the rest of the range over; the two
    # agree but for cut downloads (exact counting of a cut: tests/integration/test_bytes_down.py)
    received = sum(s["bytes_down"] for s in stats)
    assert summary["bytes_down"] >= received
    if summary["bytes_down"] > received:
        assert sum(s["retries"] + s["stalls"] + s["ranges_taken"] for s in stats) > 0
