"""Liveness without connection churn, over real gRPC through fedlink's TCP proxy.

A transfer whose connection stalls (open, but carrying nothing) is told from its progress and
resumed on a fresh connection, however long the ping-ack timeout, or at once over the other
open connection when there is one; a link estimate that moves to another ping-ack timeout
opens no connection. Connections are counted at the proxy.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, run_async, target_of, wait_until

from fedlink.client import ClientOptions, ClientSession, RetryPolicy, SessionStats
from fedlink.client.liveness import LivenessConfig, Progress
from fedlink.client.transport import Transport
from fedlink.clock import RealClock
from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.messages import DownloadRequest, GetTaskRequest, HeartbeatRequest, JoinRequest, Task
from fedlink.netem.profile import LinkProfile
from fedlink.netem.proxy import TcpProxy

pytestmark = pytest.mark.timeout(120)

DIM = 400_000  # a 1.6 MB update: several chunks, long enough to stall in the middle
RETRY = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.5, max_attempts=20)


def upload_with_stalled_connections(coordinator: CoordinatorFactory, only: int | None,
                                    ) -> tuple[SessionStats, int, np.ndarray]:
    """One client's round whose connections (``only``: the first alone) stall for good well
    into its upload; its stats, the connections the proxy saw and the model. The ping-ack
    check alone would take 120 s to notice: only progress can tell in time."""
    liveness = LivenessConfig(min_ping_timeout_s=120.0, max_ping_timeout_s=120.0,
                              min_stall_s=1.0)
    config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, min_updates=1))

    async def main() -> tuple[SessionStats, int, np.ndarray]:
        async with coordinator(config, np.zeros(DIM, np.float32)) as server, \
                TcpProxy(LinkProfile(up_kbps=4_000.0), target_of(server)) as proxy:
            session = ClientSession(proxy.address, TowardTrainer(np.ones(DIM, np.float32)),
                                    ClientOptions(name="stalled", retry=RETRY,
                                                  liveness=liveness))
            running = asyncio.create_task(session.run())
            # well into the upload (the download runs the other way), stall what is open:
            # the first connection carries the upload, the second carried half the model
            await wait_until(lambda: proxy.counters.bytes_up > 400_000, timeout=60,
                             what="the upload under way")
            assert proxy.stall_connections(600.0, only=only) == (2 if only is None else 1)
            stats = await asyncio.wait_for(running, 90)
            await asyncio.wait_for(server.wait_finished(), 10)
            return stats, proxy.counters.connections, server.service.engine.model.copy()

    return run_async(main(), timeout=110)


def test_a_stalled_upload_is_resumed_on_a_fresh_connection(
        coordinator: CoordinatorFactory) -> None:
    stats, connections, model = upload_with_stalled_connections(coordinator, only=None)
    assert stats.accepted == 1
    # the upload first went on over the second connection, stalled as well
    assert stats.handovers == 1
    assert stats.stalls >= 1 and stats.channels_opened == 2 + stats.stalls
    assert stats.reconnects == stats.stalls  # a connection's first channel is not one
    assert connections == stats.channels_opened
    assert stats.resumed_bytes > 0  # the fresh connection went on from what was held
    np.testing.assert_allclose(model, np.full(DIM, 0.5))


def test_an_upload_whose_connection_stalls_goes_on_over_the_other_open_one(
        coordinator: CoordinatorFactory) -> None:
    stats, connections, model = upload_with_stalled_connections(coordinator, only=0)
    assert stats.accepted == 1
    assert stats.handovers == 1
    # no stall, no new connection: the stuck one was kept, not replaced
    assert stats.stalls == 0 and stats.reconnects == 0
    assert connections == stats.channels_opened == 2
    np.testing.assert_allclose(model, np.full(DIM, 0.5))


def test_a_stream_that_joins_a_striped_download_late_gets_a_stall_bound_of_its_own(
        coordinator: CoordinatorFactory) -> None:
    # a stream resumed on a fresh connection after every stream of the download stalled must
    # not be taken for stalled at once because the download as a whole has been idle
    async def main() -> None:
        async with coordinator(CoordinatorConfig(rounds=1), np.zeros(DIM, np.float32)) as server, \
                Transport(target_of(server)) as transport:
            joined = await transport.join(JoinRequest("late", instance_key="k" * 32))
            task = await transport.get_task(GetTaskRequest(joined.client_id))
            assert isinstance(task, Task)
            download = Progress(RealClock().now)
            download.last -= 10 * transport.link.stall_s()  # idle far beyond the bound
            request = DownloadRequest(joined.client_id, task.task_id)
            received = sum([len(c.data) async for c in transport.download(request, download)])
            assert received == task.model.num_bytes
            assert transport.stalls == 0

    run_async(main(), timeout=60)


def test_a_moving_estimate_opens_no_connection(coordinator: CoordinatorFactory) -> None:
    async def main() -> None:
        async with coordinator(CoordinatorConfig(), np.zeros(8, np.float32)) as server, \
                TcpProxy(LinkProfile(latency_ms=700.0), target_of(server)) as proxy, \
                Transport(proxy.address) as transport:
            opened_with = transport.ping_timeout_s
            joined = await transport.join(JoinRequest("steady", instance_key="k" * 32))
            asked = {transport.link.channel_ping_timeout_s()}
            for _ in range(3):  # a 1.4 s round trip asks for more than 5 s
                await transport.heartbeat(HeartbeatRequest(joined.client_id, ""))
                asked.add(transport.link.channel_ping_timeout_s())
            # the link asked for another ping-ack timeout than the channel was opened with
            assert asked - {opened_with}
            assert transport.channels_opened == 1
            assert proxy.counters.connections == 1

    run_async(main(), timeout=60)

