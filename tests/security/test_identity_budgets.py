"""Finding 4: identities from rotated addresses.

Twelve loopback source addresses registered 10,000 ids in seconds (a per-address Join budget
each) and locked an honest client out of ``max_clients``; an id that joined again got a fresh
request-rate bucket (1,043 heartbeats answered against an honest client's 105). New ids now
spend a global budget too, and the request rate belongs to the identity (the token, or the
address and name), so joining again inherits what was left.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from _hostile import Answer, Raw, answer_of
from conftest import CoordinatorFactory, run_async

from fedlink.coordinator import CoordinatorConfig, LimitsConfig
from fedlink.coordinator.auth import issue_token
from fedlink.coordinator.config import AuthConfig
from fedlink.proto.v1 import coordinator_pb2 as pb

pytestmark = pytest.mark.timeout(120)

X0 = np.zeros(8, np.float32)
SECRET = b"0123456789abcdef0123456789abcdef"
ROTATED = [f"127.0.0.{i}" for i in range(2, 14)]  # twelve source addresses
HONEST = "127.0.0.99"
REJOINS = 6  # within what one token may hold (max_ids_per_token, 8)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.CancelledError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, RuntimeError):
        writer.close()


@contextlib.asynccontextmanager
async def from_address(source: str, port: int) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to the coordinator on ``port`` whose connections come from ``source``.

    A relay on 127.0.0.1 opens the upstream connection bound to ``source``, so the coordinator
    sees that peer address: address rotation as an attacker on loopback (or with a block of
    addresses) does it.
    """
    pipes: set[asyncio.Task[None]] = set()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port,
                                                             local_addr=(source, 0))
        for task in (_pipe(reader, up_writer), _pipe(up_reader, writer)):
            pipes.add(asyncio.create_task(task))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    relay_port = server.sockets[0].getsockname()[1]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{relay_port}") as channel:
            yield channel
    finally:
        server.close()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


async def flood(port: int, source: str, joins: int) -> list[str]:
    """``joins`` Joins under fresh names from ``source``; the status of each."""
    async with from_address(source, port) as channel:
        raw = Raw(channel)
        return [(await raw.join(f"sybil-{source}-{i}")).code for i in range(joins)]


async def join_following_hints(raw: Raw, name: str, attempts: int = 5) -> Answer:
    """``Join`` as the SDK does: a refusal's retry hint is waited out, a few times."""
    answer = await raw.join(name)
    for _ in range(attempts - 1):
        if answer.code != "RESOURCE_EXHAUSTED" or answer.retry_delay is None:
            break
        await asyncio.sleep(answer.retry_delay)  # the server's own hint, as the SDK does
        answer = await raw.join(name)
    return answer


def test_rotated_addresses_cannot_fill_the_registry_and_lock_out_an_honest_join(
        coordinator: CoordinatorFactory) -> None:
    """The defaults but a smaller server (1,500 places), flooded with 1,560 Joins."""
    config = CoordinatorConfig(limits=LimitsConfig(max_clients=1500))

    async def scenario() -> tuple[list[str], int, Answer]:
        async with coordinator(config, X0) as server:
            codes = await asyncio.gather(*(flood(server.port, source, 130)
                                           for source in ROTATED))
            registered = len(server.service.registry)
            async with from_address(HONEST, server.port) as channel:
                honest = await join_following_hints(Raw(channel), "honest")
            return [c for per_source in codes for c in per_source], registered, honest

    codes, registered, honest = run_async(scenario())
    # the global budget (burst 1,000, then 20/s), not twelve per-address ones (1,000 each),
    # bounds what the flood registered: the places are not all taken ...
    assert codes.count("RESOURCE_EXHAUSTED") > 0
    assert registered == codes.count("OK") < 1500
    # ... and an honest client that follows the retry hints gets one
    assert honest.code == "OK", honest


def test_devices_with_their_own_tokens_behind_one_address_are_not_throttled_together(
        coordinator: CoordinatorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under per-client tokens the token is the identity: one NAT address, five devices."""
    monkeypatch.setenv("FEDLINK_TEST_SECRET", SECRET.decode())
    config = CoordinatorConfig(auth=AuthConfig(secret_env="FEDLINK_TEST_SECRET"),
                               limits=LimitsConfig(join_burst_per_peer=2,
                                                   join_per_peer_per_s=0.01))

    async def scenario() -> list[str]:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            stub = Raw(channel).stub
            codes = []
            for device in range(5):
                bearer = (("authorization",
                           f"Bearer {issue_token(SECRET, f'edge-{device}', 600)}"),)
                answer = await answer_of(stub.Join(pb.JoinRequest(num_examples=1),
                                                   metadata=bearer, timeout=10))
                codes.append(answer.code)
            return codes
    assert run_async(scenario()) == ["OK"] * 5


@pytest.mark.parametrize("with_tokens", [False, True], ids=["address", "token"])
def test_an_id_joined_again_inherits_its_identity_rate_budget(
        coordinator: CoordinatorFactory, monkeypatch: pytest.MonkeyPatch,
        with_tokens: bool) -> None:
    """A client heartbeats until refused, then joins again (a fresh id) and carries on."""
    burst, rate = 20, 0.1
    limits = LimitsConfig(request_burst=burst, requests_per_s=rate)
    config = CoordinatorConfig(limits=limits)
    metadata: tuple[tuple[str, str], ...] = ()
    if with_tokens:
        monkeypatch.setenv("FEDLINK_TEST_SECRET", SECRET.decode())
        config = CoordinatorConfig(limits=limits,
                                   auth=AuthConfig(secret_env="FEDLINK_TEST_SECRET"))
        metadata = (("authorization", f"Bearer {issue_token(SECRET, 'greedy', 600)}"),)

    async def join(raw: Raw) -> str:
        answer = await answer_of(raw.stub.Join(pb.JoinRequest(client_name="greedy",
                                                               num_examples=1),
                                               metadata=metadata, timeout=10))
        assert answer.code == "OK", answer
        return str(answer.reply.client_id)  # type: ignore[attr-defined]

    async def scenario() -> tuple[int, int, float]:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            started = time.monotonic()
            client_id, answered, joins = await join(raw), 0, 1
            while joins < REJOINS:
                beat = await answer_of(raw.stub.Heartbeat(
                    pb.HeartbeatRequest(client_id=client_id), metadata=metadata, timeout=10))
                if beat.code == "OK":
                    answered += 1
                else:
                    assert beat.code == "RESOURCE_EXHAUSTED", beat
                    client_id, joins = await join(raw), joins + 1
            return answered, joins, time.monotonic() - started

    answered, joins, elapsed = run_async(scenario())
    assert joins > 1  # it did join again, and was let in
    # one identity's budget: its burst and what refilled meanwhile, however many ids it took
    assert answered <= burst + rate * elapsed + 1
