"""The retry hint travels as ``google.rpc.RetryInfo`` in gRPC's rich status, and the SDK
decides retryability by status code and that detail only, never by the message text."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, run_async
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fedlink.client.retry import is_retryable
from fedlink.client.transport import transfer_failure, translate
from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.coordinator.config import LimitsConfig
from fedlink.errors import ResourceExhausted, Unavailable
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire.status import retry_delay, rich_status


def failed(code: str, detail: str, retry_after_s: float | None = None,
           status_code: str | None = None) -> grpc.aio.AioRpcError:
    """A failed call as the client sees it, its rich status built as the coordinator does."""
    trailing = grpc.aio.Metadata()
    if retry_after_s is not None:
        status = rich_status(status_code or code, detail, retry_after_s=retry_after_s)
        trailing = grpc.aio.Metadata(*status.trailing_metadata)
    return grpc.aio.AioRpcError(grpc.StatusCode[code], grpc.aio.Metadata(), trailing, detail)


def test_rich_status_round_trips_the_delay() -> None:
    assert retry_delay(failed("RESOURCE_EXHAUSTED", "busy", 2.5)) == pytest.approx(2.5)
    assert retry_delay(failed("UNAVAILABLE", "draining", 0.25)) == pytest.approx(0.25)
    assert retry_delay(failed("RESOURCE_EXHAUSTED", "too large")) is None
    # a zero delay is sent as 1 ms: "retry at once" is never the coordinator's advice
    assert retry_delay(failed("RESOURCE_EXHAUSTED", "busy", 0.0)) == pytest.approx(0.001)


def test_a_rich_status_that_does_not_match_the_call_is_ignored() -> None:
    assert retry_delay(failed("RESOURCE_EXHAUSTED", "busy", 2.0,
                              status_code="UNAVAILABLE")) is None


def test_retryability_follows_the_code_and_retry_info() -> None:
    overloaded = translate(failed("RESOURCE_EXHAUSTED", "busy", 1.5))
    assert isinstance(overloaded, ResourceExhausted) and is_retryable(overloaded)
    assert overloaded.retry_after_s == pytest.approx(1.5)
    too_large = translate(failed("RESOURCE_EXHAUSTED", "update of 9 GB"))
    assert not is_retryable(too_large)
    down = translate(failed("UNAVAILABLE", "Socket closed"))
    assert isinstance(down, Unavailable) and is_retryable(down)
    assert down.retry_after_s is None
    assert translate(failed("UNAVAILABLE", "draining", 3.0)).retry_after_s == pytest.approx(3.0)
    # INTERNAL on a short call is not retried, whatever its text says; under a streaming
    # transfer (resumable at the coordinator's offset) it is: a reset link ends one so
    for text in ("Internal error from Core", "internal error in Commit"):
        assert not is_retryable(translate(failed("INTERNAL", text)))
        assert is_retryable(transfer_failure(translate(failed("INTERNAL", text))))
    assert transfer_failure(too_large) is too_large


def test_an_overloaded_coordinator_answers_with_retry_info_any_grpc_client_reads(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, deadline_s=None),
                               limits=LimitsConfig(long_poll_s=0.0, max_clients=1,
                                                   retry_after_s=4.0))

    async def scenario() -> None:
        async with coordinator(config, np.zeros(4, np.float32)) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            await stub.Join(pb.JoinRequest(num_examples=1))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Join(pb.JoinRequest(num_examples=1))
        error = refused.value
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        status = rpc_status.from_call(error)  # the standard decoding, not fedlink's helper
        assert status is not None and status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        infos = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
        assert len(infos) == 1
        info = error_details_pb2.RetryInfo()
        infos[0].Unpack(info)
        assert info.retry_delay.ToNanoseconds() == 4_000_000_000
        assert "retry-after-ms" not in dict(error.trailing_metadata() or ())

    run_async(scenario())
