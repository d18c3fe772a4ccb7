"""A ``Join`` whose reply the proxy drops is retried, and the coordinator counts one client.

The retried ``Join`` carries the same instance key, so the coordinator answers it with the id it
gave the first one instead of registering a second client (without the key, 10 processes
behind flaky links once made 34 ``client_joined`` events).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, run_async, target_of, wait_until

from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.client.liveness import LivenessConfig
from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.messages import JoinRequest
from fedlink.metrics import summarize
from fedlink.netem.profile import LinkProfile
from fedlink.netem.proxy import TcpProxy

pytestmark = pytest.mark.timeout(120)

DIM = 8
X0 = np.zeros(DIM, dtype=np.float32)
# the Join's reply spends a second on the way back: time to freeze the link under it
ONE_WAY_MS = 1_000.0
LIVENESS = LivenessConfig(keepalive_time_s=0.5, min_ping_timeout_s=3.0, max_ping_timeout_s=30.0)


def test_a_join_whose_reply_was_dropped_yields_one_client(
        coordinator: CoordinatorFactory) -> None:
    async def main() -> None:
        config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, deadline_s=None))
        async with coordinator(config, X0) as server:
            proxy = TcpProxy(LinkProfile(latency_ms=ONE_WAY_MS), target_of(server))
            await proxy.start()
            try:
                session = ClientSession(
                    proxy.address, TowardTrainer(np.ones(DIM, np.float32)),
                    ClientOptions(name="dup", liveness=LIVENESS,
                                  retry=RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0)))
                running = asyncio.ensure_future(session.run())
                # the Join reached the coordinator; its reply is still on the way back: the
                # link goes silent under it, the client's ping times out, the reply is lost
                await wait_until(lambda: server.events.of_kind("client_joined"), 20,
                                 "the first Join")
                proxy.force_blackout(6.0)
                stats = await asyncio.wait_for(running, 90)
                connections = proxy.counters.connections
            finally:
                await proxy.stop()
        (joined,) = server.events.of_kind("client_joined")
        assert joined["client_id"] == session.client_id
        assert stats.retries >= 1 and connections >= 2  # the Join was sent again
        assert stats.accepted == 1 and stats.finished
        assert summarize(server.events.events, {})["clients"] == 1

    run_async(main(), timeout=110)


def test_join_is_idempotent_by_name_and_instance_key(coordinator: CoordinatorFactory) -> None:
    async def main() -> None:
        async with coordinator(CoordinatorConfig(), X0) as server:
            service = server.service
            first = await service.join(JoinRequest("a", instance_key="1" * 32))
            again = await service.join(JoinRequest("a", instance_key="1" * 32))
            other_key = await service.join(JoinRequest("a", instance_key="2" * 32))
            other_name = await service.join(JoinRequest("b", instance_key="1" * 32))
            keyless = [await service.join(JoinRequest("c")) for _ in range(2)]
        assert again.client_id == first.client_id
        ids = {first.client_id, other_key.client_id, other_name.client_id,
               *(k.client_id for k in keyless)}
        assert len(ids) == 5  # a key is one instance of one name; no key, no idempotence
        assert len(server.events.of_kind("client_joined")) == 5

    run_async(main())
