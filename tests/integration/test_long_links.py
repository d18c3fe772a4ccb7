"""Long round trips over real gRPC, through fedlink's TCP proxy: liveness that fits the link.

Clients behind a 10 s RTT (5,000 ms one-way each direction) join, train and deliver: the
ping-ack timeout and call deadlines follow the measured round trip instead of killing every
call at a fixed 5 s. A ``sync`` run waits for them; an ``elastic`` run flushes without them
and still takes their late updates. On a short link, silence is still noticed fast. These
tests are slow by nature (each slow call costs 10 s), so they use the fewest rounds and
clients the behaviour needs, and wait on events, never on the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, block_until, run_async, target_of

from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.client.liveness import LivenessConfig
from fedlink.client.transport import Transport
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule
from fedlink.errors import Unavailable
from fedlink.messages import HeartbeatRequest, JoinRequest
from fedlink.metrics import summarize
from fedlink.netem.profile import LinkProfile
from fedlink.netem.proxy import TcpProxy

pytestmark = pytest.mark.timeout(400)

DIM = 16
X0 = np.zeros(DIM, dtype=np.float32)
ONE_WAY_MS = 5_000.0
SLOW, FAST = 2, 3


@contextlib.asynccontextmanager
async def proxied(server: CoordinatorServer, latency_ms: float) -> AsyncIterator[TcpProxy]:
    """A TCP proxy with ``latency_ms`` each way in front of ``server``."""
    proxy = TcpProxy(LinkProfile(latency_ms=latency_ms), target_of(server))
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def sessions(server: CoordinatorServer, slow: list[TcpProxy], fast_gate: object = None
             ) -> tuple[list[ClientSession], list[ClientSession]]:
    """``SLOW`` sessions through the ``slow`` proxies and ``FAST`` direct ones."""
    retry = RetryPolicy(initial_backoff_s=0.2, max_backoff_s=2.0, max_attempts=50,
                        budget_s=300.0)
    slow_sessions = [ClientSession(proxy.address, TowardTrainer(np.full(DIM, 1.0, np.float32)),
                                   ClientOptions(name=f"slow-{i}", retry=retry))
                     for i, proxy in enumerate(slow)]
    fast_sessions = [ClientSession(target_of(server),
                                   TowardTrainer(np.full(DIM, -1.0, np.float32),
                                                 before_train=fast_gate),  # type: ignore[arg-type]
                                   ClientOptions(name=f"fast-{i}", retry=retry))
                     for i in range(FAST)]
    return slow_sessions, fast_sessions


def clients_joined(server: CoordinatorServer) -> int:
    return len({e["client_id"] for e in server.events.of_kind("client_joined")})


async def sync_run(coordinator: CoordinatorFactory) -> None:
    """Sync, 3 rounds, every client in every round: the two slow ones are waited for."""
    config = CoordinatorConfig(rounds=3, flush=FlushRule(goal=SLOW + FAST, min_updates=SLOW + FAST,
                                                         deadline_s=None))
    async with coordinator(config, X0) as server, \
            proxied(server, ONE_WAY_MS) as p0, proxied(server, ONE_WAY_MS) as p1:
        slow, fast = sessions(server, [p0, p1])
        stats = await asyncio.gather(*(s.run() for s in slow + fast))
        await asyncio.wait_for(server.wait_finished(), 60)
    flushes = server.events.of_kind("flush")
    assert [f["num_updates"] for f in flushes] == [SLOW + FAST] * 3
    assert [s.accepted for s in stats] == [3] * (SLOW + FAST)
    assert all(s.finished == "completed 3 rounds" for s in stats)
    # a Join whose reply was lost (the first attempts died before it came back) counted once
    assert clients_joined(server) == SLOW + FAST
    assert summarize(server.events.events, {})["clients"] == SLOW + FAST


async def elastic_run(coordinator: CoordinatorFactory) -> None:
    """Elastic: five asked per version, goal three, two versions of staleness allowed.

    The fast clients hold their second task until the slow updates (of version 0) are in:
    version 1 was flushed without the slow clients, and their late updates still count.
    """
    config = CoordinatorConfig(rounds=3, flush=FlushRule(
        goal=FAST, min_updates=1, deadline_s=None, over_selection=(SLOW + FAST) / FAST,
        max_staleness=2))
    async with coordinator(config, X0) as server, \
            proxied(server, ONE_WAY_MS) as p0, proxied(server, ONE_WAY_MS) as p1:
        slow_names = {"slow-0", "slow-1"}

        def slow_accepted() -> int:
            ids = {e["client_id"] for e in server.events.of_kind("client_joined")
                   if e["name"] in slow_names}
            return sum(e["client_id"] in ids for e in server.events.of_kind("update_accepted"))

        def gate(call: int) -> None:
            if call == 0:  # version 0 waits until the slow clients hold their tasks too
                block_until(lambda: len(server.events.of_kind("task_issued")) >= SLOW + FAST,
                            300, "five tasks of version 0")
            elif call == 1:
                block_until(lambda: slow_accepted() >= SLOW, 300, "the slow updates")

        slow, fast = sessions(server, [p0, p1], gate)
        stats = await asyncio.gather(*(s.run() for s in slow + fast))
        await asyncio.wait_for(server.wait_finished(), 60)
    flushes = server.events.of_kind("flush")
    assert len(flushes) == 3
    slow_ids = {s.client_id for s in slow}
    accepted = server.events.of_kind("update_accepted")
    first_flush_tasks = set(flushes[0]["updates"])
    slow_updates = [e for e in accepted if e["client_id"] in slow_ids]
    assert len(slow_updates) >= SLOW
    # version 1 did not wait for them; their version-0 updates came in late and counted
    assert not first_flush_tasks & {e["task_id"] for e in slow_updates}
    assert all(e["staleness"] >= 1 for e in slow_updates[:SLOW])
    assert [s.accepted >= 1 for s in stats] == [True] * (SLOW + FAST)
    assert clients_joined(server) == SLOW + FAST


def test_slow_clients_behind_a_10s_rtt_complete_sync_and_elastic_runs(
        coordinator: CoordinatorFactory) -> None:
    async def main() -> None:  # both runs at once: the time is in the waiting
        await asyncio.gather(sync_run(coordinator), elastic_run(coordinator))

    run_async(main(), timeout=380)


def test_a_silent_short_link_is_still_noticed_within_10_s(
        coordinator: CoordinatorFactory) -> None:
    async def main() -> float:
        async with coordinator(CoordinatorConfig(), X0) as server, \
                proxied(server, 25.0) as proxy, Transport(proxy.address) as transport:
            joined = await transport.join(JoinRequest("quiet", instance_key="k" * 32))
            for _ in range(3):  # a few calls teach the link's 50 ms round trip
                await transport.heartbeat(HeartbeatRequest(joined.client_id, ""))
            assert transport.ping_timeout_s == LivenessConfig().min_ping_timeout_s
            proxy.force_blackout(60.0)  # silent: no reset, TCP stays up, nothing passes
            started = time.monotonic()
            with pytest.raises(Unavailable, match="ping timeout"):
                await transport.heartbeat(HeartbeatRequest(joined.client_id, ""))
            return time.monotonic() - started

    assert run_async(main(), timeout=60) < 10.0
