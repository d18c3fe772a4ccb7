"""Finding 9: loud when insecure; malformed bodies and idle connections handled by fedlink.

``serve`` beyond loopback without TLS and auth started without a word; a malformed protobuf
body answered ``UNKNOWN`` naming a Python exception class; idle HTTP/2 connections were held
forever.
"""

from __future__ import annotations

import logging

import grpc
import numpy as np
import pytest
from _hostile import answer_of
from conftest import CoordinatorFactory, run_async, wait_until

from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, LimitsConfig
from fedlink.coordinator.edge import insecurity_warnings
from fedlink.metrics import EventLog

pytestmark = pytest.mark.timeout(60)

X0 = np.zeros(8, np.float32)


def test_serving_beyond_loopback_in_plaintext_warns_with_the_keys_that_fix_it(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    bound: list[str] = []

    def patch_loopback_only() -> None:
        # grpc.aio.server() needs a running loop; its concrete class is not the abstract base
        implementation = type(grpc.aio.server())
        bind = implementation.add_insecure_port

        def loopback_only(server: grpc.aio.Server, address: str) -> int:
            # the coordinator is told 0.0.0.0 (and warns); the socket stays on 127.0.0.1
            bound.append(address.replace("0.0.0.0", "127.0.0.1"))
            return bind(server, bound[-1])

        monkeypatch.setattr(implementation, "add_insecure_port", loopback_only)

    async def scenario() -> None:
        patch_loopback_only()
        server = CoordinatorServer(CoordinatorConfig(), X0, EventLog(None),
                                   address="0.0.0.0:0")
        async with server:
            pass
    with caplog.at_level(logging.WARNING):
        run_async(scenario())
    assert bound == ["127.0.0.1:0"]
    assert "INSECURE" in caplog.text and "[coordinator.tls]" in caplog.text
    assert "[coordinator.auth]" in caplog.text
    tokens = insecurity_warnings(CoordinatorConfig(join_token="t" * 20), "10.0.0.1:50051")
    assert any("tokens travel in the clear" in w for w in tokens)
    assert insecurity_warnings(CoordinatorConfig(), "127.0.0.1:50051") == []


def test_a_malformed_body_is_invalid_argument_in_fedlinks_words(
        coordinator: CoordinatorFactory) -> None:
    async def scenario() -> tuple[str, str]:
        async with (coordinator(CoordinatorConfig(), X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            join = channel.unary_unary("/fedlink.v1.Coordinator/Join",
                                       request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            answer = await answer_of(join(b"\xff\xff\xff\xff", timeout=10))
            return answer.code, answer.detail
    code, detail = run_async(scenario())
    assert code == "INVALID_ARGUMENT"
    assert detail.startswith("malformed request") and "Exception" not in detail


def test_an_idle_connection_is_closed(coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(limits=LimitsConfig(connection_idle_s=0.5))

    async def scenario() -> None:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            await channel.channel_ready()
            assert channel.get_state() == grpc.ChannelConnectivity.READY
            await wait_until(lambda: channel.get_state() != grpc.ChannelConnectivity.READY,
                             what="the server to close the idle connection")
    run_async(scenario())
