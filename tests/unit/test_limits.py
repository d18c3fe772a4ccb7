"""Overload limits: request rate, concurrent uploads, connected clients, and the retry-after hint.

The limiter is tested with a fake clock; the wire behaviour (``RESOURCE_EXHAUSTED`` with the
``google.rpc.RetryInfo`` in the rich status, translated by the SDK's transport) on a real loopback
coordinator; the retry policy with a fake sleep (nothing sleeps for real).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, FakeClock, run_async

from fedlink.client.retry import RetryPolicy, is_retryable
from fedlink.client.transport import Transport
from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.coordinator.config import LimitsConfig
from fedlink.coordinator.limits import Limiter
from fedlink.errors import ConfigError, ResourceExhausted, remote_error
from fedlink.messages import HeartbeatRequest, JoinRequest, LeaveRequest
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire.status import retry_delay

pytestmark = pytest.mark.timeout(60)


def limits(**options: object) -> LimitsConfig:
    return LimitsConfig(**options)  # type: ignore[arg-type]


# -- the limiter ----------------------------------------------------------------------------------

def test_rate_limit_allows_a_burst_then_refuses_with_the_time_to_the_next_token() -> None:
    clock = FakeClock()
    limiter = Limiter(limits(requests_per_s=2.0, request_burst=3), clock=clock)
    for _ in range(3):
        limiter.admit("a")
    with pytest.raises(ResourceExhausted) as refused:
        limiter.admit("a")
    assert refused.value.retry_after_s == pytest.approx(0.5)
    assert refused.value.retryable
    limiter.admit("b")  # buckets are per client
    clock.advance(0.5)
    limiter.admit("a")
    with pytest.raises(ResourceExhausted):
        limiter.admit("a")


def test_rate_limit_zero_means_unlimited() -> None:
    limiter = Limiter(limits(requests_per_s=0.0), clock=FakeClock())
    for _ in range(10_000):
        limiter.admit("a")


def test_a_client_that_leaves_starts_over_with_a_full_bucket() -> None:
    limiter = Limiter(limits(requests_per_s=1.0, request_burst=1), clock=FakeClock())
    limiter.admit("a")
    limiter.forget("a")
    limiter.admit("a")


def test_join_is_refused_beyond_max_clients() -> None:
    limiter = Limiter(limits(max_clients=2, retry_after_s=3.0))
    limiter.check_join(1)
    with pytest.raises(ResourceExhausted) as refused:
        limiter.check_join(2)
    assert refused.value.retry_after_s == 3.0
    Limiter(limits(max_clients=0)).check_join(10**6)


def test_concurrent_uploads_are_capped_per_client_and_released() -> None:
    limiter = Limiter(limits(max_uploads_per_client=2))
    with limiter.upload_slot("a", "u1"), limiter.upload_slot("a", "u2"):
        assert limiter.uploads_in_progress("a") == 2
        with pytest.raises(ResourceExhausted), limiter.upload_slot("a", "u3"):
            pass
        with limiter.upload_slot("b", "u1"):
            pass
    assert limiter.uploads_in_progress("a") == 0
    with limiter.upload_slot("a", "u3"):
        pass


def test_a_resumed_upload_shares_the_place_of_its_stream_on_a_dead_connection() -> None:
    limiter = Limiter(limits(max_uploads_per_client=2))
    # two uploads whose streams the coordinator still thinks alive (their connections died)
    with limiter.upload_slot("a", "u1"), limiter.upload_slot("a", "u2"):
        with limiter.upload_slot("a", "u1"):  # u1 resumes on a new connection: allowed
            assert limiter.uploads_in_progress("a") == 2
        assert limiter.uploads_in_progress("a") == 2  # the old u1 stream still holds it
    assert limiter.uploads_in_progress("a") == 0


@pytest.mark.parametrize("options", [{"max_clients": -1}, {"requests_per_s": -1.0},
                                     {"max_uploads_per_client": -2},
                                     {"requests_per_s": 1.0, "request_burst": 0},
                                     {"max_string_bytes": 8}])
def test_bad_limits_are_config_errors(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        limits(**options)


# -- on the wire ----------------------------------------------------------------------------------

def config(**options: object) -> CoordinatorConfig:
    return CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, deadline_s=None),
                             limits=limits(long_poll_s=0.0, **options))


def hint_ms(exc: grpc.aio.AioRpcError) -> float:
    delay = retry_delay(exc)  # google.rpc.RetryInfo in the rich status
    assert delay is not None, exc.trailing_metadata()
    return delay * 1000


def test_rate_limit_on_the_wire_carries_a_hint_the_transport_reads(
        coordinator: CoordinatorFactory) -> None:
    async def scenario() -> None:
        async with coordinator(config(requests_per_s=0.5, request_burst=2),
                               np.zeros(4, np.float32)) as server:
            target = f"127.0.0.1:{server.port}"
            async with grpc.aio.insecure_channel(target) as channel:
                stub = pb_grpc.CoordinatorStub(channel)
                client_id = (await stub.Join(pb.JoinRequest(num_examples=1))).client_id
                for _ in range(2):
                    await stub.Heartbeat(pb.HeartbeatRequest(client_id=client_id))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Heartbeat(pb.HeartbeatRequest(client_id=client_id))
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert 1000 <= hint_ms(refused.value) <= 2000
            async with Transport(target) as transport:
                with pytest.raises(ResourceExhausted) as translated:
                    await transport.heartbeat(HeartbeatRequest(client_id=client_id))
                hint = translated.value.retry_after_s
                assert hint is not None and 1.0 <= hint <= 2.0
                assert is_retryable(translated.value)

    run_async(scenario())


def test_join_beyond_max_clients_is_refused_until_one_leaves(
        coordinator: CoordinatorFactory) -> None:
    async def scenario() -> None:
        server = coordinator(config(max_clients=2, retry_after_s=2.5), np.zeros(4, np.float32))
        await server.start()
        try:
            async with Transport(f"127.0.0.1:{server.port}") as transport:
                first = await transport.join(JoinRequest("a", "", 1))
                await transport.join(JoinRequest("b", "", 1))
                with pytest.raises(ResourceExhausted) as refused:
                    await transport.join(JoinRequest("c", "", 1))
                assert refused.value.retry_after_s == pytest.approx(2.5)
                await transport.leave(LeaveRequest(first.client_id, "done"))
                await transport.join(JoinRequest("c", "", 1))
        finally:
            await server.stop()

    run_async(scenario())


def test_concurrent_uploads_beyond_the_limit_are_refused(
        coordinator: CoordinatorFactory) -> None:
    async def scenario() -> None:
        server = coordinator(config(max_uploads_per_client=1), np.zeros(4, np.float32))
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = pb_grpc.CoordinatorStub(channel)
                client_id = (await stub.Join(pb.JoinRequest(num_examples=1))).client_id
                release = asyncio.Event()

                async def slow() -> AsyncIterator[pb.UploadChunk]:
                    yield pb.UploadChunk(client_id=client_id, upload_id="u1", data=b"ab")
                    await release.wait()

                first = stub.Upload(slow(), timeout=10)
                service = server.service
                while service.limiter.uploads_in_progress(client_id) == 0:
                    await asyncio.sleep(0.01)
                second = [pb.UploadChunk(client_id=client_id, upload_id="u2", data=b"cd")]
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Upload(iter(second), timeout=10)
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert hint_ms(refused.value) > 0
                release.set()
                assert (await first).committed_offset == 2
                assert (await stub.Upload(iter(second), timeout=10)).committed_offset == 2
        finally:
            await server.stop()

    run_async(scenario())


# -- the SDK honours the hint ---------------------------------------------------------------------

def test_retry_policy_waits_at_least_the_hint() -> None:
    slept: list[float] = []
    attempts = 0

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    async def overloaded() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise remote_error("RESOURCE_EXHAUSTED", "busy", retry_after_s=7.5)
        return "ok"

    policy = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.02)
    assert run_async(policy.call(overloaded, sleep=fake_sleep)) == "ok"
    assert len(slept) == 2 and all(s >= 7.5 for s in slept)


def test_resource_exhausted_without_a_hint_is_not_retried() -> None:
    attempts = 0

    async def too_large() -> None:
        nonlocal attempts
        attempts += 1
        raise ResourceExhausted("update too large")

    async def fake_sleep(seconds: float) -> None:
        raise AssertionError("must not retry")

    with pytest.raises(ResourceExhausted):
        run_async(RetryPolicy().call(too_large, sleep=fake_sleep))
    assert attempts == 1
