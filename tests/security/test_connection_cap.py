"""``limits.max_connections``: the coordinator holds at most that many HTTP/2 connections.

A connection over the cap is closed as soon as it is accepted (its calls fail ``UNAVAILABLE``
and the client retries); once a held connection closes, a new one is served. With the
per-connection stream and window bounds this caps what gRPC core buffers for calls that no
budget has admitted yet.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, run_async
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedlink.coordinator import CoordinatorConfig, LimitsConfig
from fedlink.coordinator.edge import connection_options
from fedlink.errors import ConfigError
from fedlink.sim.capacity import for_population

pytestmark = pytest.mark.timeout(60)

# a channel of its own: gRPC otherwise gives channels to one target one shared connection
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


async def _served(channel: grpc.aio.Channel, timeout_s: float = 20.0) -> bool:
    """Whether a health check on ``channel`` is answered (False: the connection was refused)."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        return False
    return True


def test_connections_over_the_cap_are_refused_until_one_closes(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(limits=LimitsConfig(max_connections=2))

    async def main() -> None:
        async with coordinator(config, np.zeros(4, np.float32)) as server:
            target = f"127.0.0.1:{server.port}"
            held = [grpc.aio.insecure_channel(target, options=OWN_CONNECTION) for _ in range(2)]
            extra = grpc.aio.insecure_channel(target, options=OWN_CONNECTION)
            try:
                assert all([await _served(channel) for channel in held])
                assert not await _served(extra, timeout_s=2.0)
                await held.pop().close()
                # the freed place: the extra channel's tries (each a new connection) are
                # refused until the server has seen the held one close, then served
                give_up = asyncio.get_running_loop().time() + 30.0
                while not await _served(extra):
                    assert asyncio.get_running_loop().time() < give_up, \
                        "no connection was served after one closed"
                    await asyncio.sleep(0.05)  # a pause between tries, not the evidence
                assert await _served(held[0])  # the one still held is untouched
            finally:
                for channel in (*held, extra):
                    await channel.close()

    run_async(main())


def test_the_cap_is_a_server_option_and_simulations_raise_it_for_their_population() -> None:
    assert ("grpc.max_allowed_incoming_connections", 8) in connection_options(
        LimitsConfig(max_connections=8))
    assert not any(name == "grpc.max_allowed_incoming_connections"
                   for name, _ in connection_options(LimitsConfig()))  # 0: no cap
    raised = for_population(CoordinatorConfig(limits=LimitsConfig(max_connections=8)), 50)
    assert raised.limits.max_connections >= 2 * 50
    untouched = for_population(CoordinatorConfig(), 50)
    assert untouched.limits.max_connections == 0
    with pytest.raises(ConfigError, match="max_connections"):
        LimitsConfig(max_connections=-1)
