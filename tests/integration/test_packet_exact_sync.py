"""Exact sync rounds over real packet loss (root): two runs whose updates arrive in different
orders end at the bit-identical model.

Both runs are the same sync run (4 clients, 4 rounds, a 120 kB model, numpy clients moving half
way toward a target of their own; one client's target is far out, so that the default adaptive
norm bound clips it) through fedlink's packet link with 5% loss each way. What differs is when
each client finishes training: in the first run client ``i`` takes ``i`` seconds, in the second
``3 - i``, so the coordinator receives each round's updates in another order (checked from the
event logs: a run in which the orders happened to agree proves nothing and fails). A flush's
result must not depend on that order: the two final models are compared byte for byte.
Skips with the reason unless run as root with TUN.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fedlink.metrics import read_events
from fedlink.netem.packet import PacketLink, packet_tier_available
from fedlink.netem.profile import LinkProfile

AVAILABLE, REASON = packet_tier_available()
# the packet tier's xdist group: a link's start cleans up stale links, which would race with
# test_netem_packet's check of what cleanup_stale removes
pytestmark = [pytest.mark.skipif(not AVAILABLE, reason=REASON), pytest.mark.timeout(420),
              pytest.mark.xdist_group("packet-tier")]

DIM = 30_000  # 120 kB of float32: uploaded in chunks, not inline
CLIENTS, ROUNDS = 4, 4
PROFILE = LinkProfile(latency_ms=5, loss_up=0.05, loss_down=0.05, seed=3)

SERVER = textwrap.dedent(f"""
    import asyncio, sys
    from pathlib import Path
    import numpy as np
    from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule
    from fedlink.coordinator.server import serve_until_done
    from fedlink.metrics import EventLog

    config = CoordinatorConfig(rounds={ROUNDS}, flush=FlushRule(
        goal={CLIENTS}, min_updates={CLIENTS}, deadline_s=None))

    async def main() -> None:
        with EventLog(Path(sys.argv[2])) as events:
            server = CoordinatorServer(config, np.zeros({DIM}, np.float32), events,
                                       address=sys.argv[1] + ":0")
            await serve_until_done(server, lambda port: print("port", port, flush=True))
            np.save(sys.argv[3], server.service.engine.model)

    asyncio.run(main())
""")

FLEET = textwrap.dedent(f"""
    import asyncio, json, sys, time
    import numpy as np
    from fedlink.client import ClientOptions, ClientSession, TrainResult

    delays = json.loads(sys.argv[2])

    class Toward:
        def __init__(self, i):
            scale = 20.0 if i == 0 else 1.0  # far out: the adaptive norm bound clips it
            rng = np.random.default_rng(i)
            self.target = (scale * rng.standard_normal({DIM})).astype(np.float32)
            self.examples, self.delay = 10 + i, delays[i]
        def num_examples(self):
            return self.examples
        def train(self, params, plan):
            time.sleep(self.delay)  # when this client's update arrives in the round
            new = (params + 0.5 * (self.target - params)).astype(np.float32)
            return TrainResult(new, self.examples, 1, 1, {{}})

    async def main() -> None:
        sessions = [ClientSession(sys.argv[1], Toward(i), ClientOptions(name=f"c{{i}}"))
                    for i in range({CLIENTS})]
        stats = await asyncio.gather(*(s.run() for s in sessions))
        print("ACCEPTED", [s.accepted for s in stats], flush=True)

    asyncio.run(main())
""")


def sync_run(tmp_path: Path, label: str, delays: list[float]) -> tuple[bytes, list[list[str]]]:
    """One sync run through the lossy link: the final model's bytes and, per round, the
    names of the clients in the order their updates were accepted."""
    events_path, model_path = tmp_path / f"{label}.jsonl", tmp_path / f"{label}.npy"
    with PacketLink(PROFILE) as link:
        server = link.popen_in_server([sys.executable, "-c", SERVER, link.server_addr,
                                       str(events_path), str(model_path)],
                                      stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        fleet = link.run_in_client([sys.executable, "-c", FLEET, f"{link.server_addr}:{port}",
                                    json.dumps(delays)], capture_output=True, text=True,
                                   timeout=300)
        assert fleet.returncode == 0, fleet.stderr[-4000:]
        assert server.wait(timeout=60) == 0
    return model_path.read_bytes(), arrival_orders(read_events(events_path))


def arrival_orders(events: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Per model version, the names of the clients whose updates it folded, in order."""
    names = {e["client_id"]: e["name"] for e in events if e["kind"] == "client_joined"}
    orders: dict[int, list[str]] = {}
    for event in events:
        if event["kind"] == "update_accepted":
            orders.setdefault(int(event["base_version"]), []).append(names[event["client_id"]])
    assert len(orders) == ROUNDS and all(len(o) == CLIENTS for o in orders.values()), orders
    return [orders[v] for v in sorted(orders)]


def test_two_sync_runs_with_different_arrival_orders_end_at_the_same_model(
        tmp_path: Path) -> None:
    first_model, first_orders = sync_run(tmp_path, "first", [1.0 * i for i in range(CLIENTS)])
    second_model, second_orders = sync_run(tmp_path, "second",
                                           [1.0 * (CLIENTS - 1 - i) for i in range(CLIENTS)])
    print("arrival orders:", first_orders, second_orders)
    assert first_orders != second_orders, "the runs' arrival orders agreed: nothing was tested"
    assert first_model == second_model
