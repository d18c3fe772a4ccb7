"""Finding 3: bytes of messages in flight are bounded per connection and in all.

200 concurrent 7.9 MiB ``Join`` calls on 2 connections grew the coordinator by 1,073 MiB (and
1,290 MiB stayed held): gRPC read every message whole before fedlink saw it. Now no message
over the largest chunk is read at all, and before a message is read its worst case is
reserved from a per-connection and a global budget; calls that do not fit are refused
``RESOURCE_EXHAUSTED`` with a retry hint, unread, and everything is given back when calls end.
The evidence here is the budget's own record (refusals, the most it ever reserved), not RSS:
``benchmarks/edge_limits.py`` measures that.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from _hostile import Answer, Raw, answer_of
from conftest import CoordinatorFactory, run_async, wait_until

from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, LimitsConfig
from fedlink.errors import ConfigError
from fedlink.metrics import EventLog
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(120)

CHUNK = 1 << 20
CAP = CHUNK + (64 << 10)  # the largest message read: the largest chunk plus room for fields


def limits() -> LimitsConfig:
    return LimitsConfig(chunk_bytes=CHUNK, max_chunk_bytes=CHUNK, max_inflight_bytes=4 * CAP,
                        max_inflight_bytes_per_connection=2 * CAP, requests_per_s=0)


async def hold_upload(stub: pb_grpc.CoordinatorStub, client_id: str, upload_id: str,
                      release: asyncio.Event) -> Answer:
    """An Upload stream that sends one chunk, then waits (its next read stays reserved)."""

    async def chunks() -> AsyncIterator[pb.UploadChunk]:
        yield pb.UploadChunk(client_id=client_id, upload_id=upload_id, offset=0,
                             data=b"\x01" * 1024)
        await release.wait()

    return await answer_of(stub.Upload(chunks(), timeout=60))


def test_reads_beyond_a_connections_or_the_global_budget_are_refused_unread(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(limits=limits())

    async def scenario() -> dict[str, object]:
        seen: dict[str, object] = {}
        async with coordinator(config, np.zeros(8, np.float32)) as server:
            budget = server.inflight
            address = f"127.0.0.1:{server.port}"
            channels = [grpc.aio.insecure_channel(address, options=[
                ("grpc.max_send_message_length", 16 << 20), ("x.connection", i)])
                for i in range(3)]  # three connections
            stubs = [pb_grpc.CoordinatorStub(c) for c in channels]
            raws = [Raw(c) for c in channels]
            clients = [[await raws[c].client(f"c{c}-{i}") for i in range(2)] for c in range(2)]
            release = asyncio.Event()
            holds = [asyncio.ensure_future(hold_upload(stubs[0], clients[0][i], f"u{i}", release))
                     for i in range(2)]
            await wait_until(lambda: budget.held >= 2 * CAP, what="connection 0's reads")
            seen["connection_full"] = await raws[0].join("more")
            seen["other_connection"] = await raws[1].join("fine")
            holds += [asyncio.ensure_future(hold_upload(stubs[1], clients[1][i], f"v{i}",
                                                        release)) for i in range(2)]
            await wait_until(lambda: budget.held >= 4 * CAP, what="connection 1's reads")
            seen["global_full"] = await raws[2].join("more")
            seen["peak"] = budget.peak
            release.set()
            seen["holds"] = [await h for h in holds]
            await wait_until(lambda: budget.held == 0, what="everything given back")
            seen["after"] = await raws[0].join("after")
            seen["too_big"] = await answer_of(stubs[2].Join(pb.JoinRequest(
                client_name="x", metadata={"pad": "x" * int(7.9 * (1 << 20))}), timeout=60))
            seen["refused"] = budget.refused
            for channel in channels:
                await channel.close()
        return seen

    seen = run_async(scenario(), timeout=100)
    for key, which in (("connection_full", "this connection"), ("global_full", "coordinator")):
        answer = seen[key]
        assert isinstance(answer, Answer) and answer.code == "RESOURCE_EXHAUSTED", answer
        assert which in answer.detail and answer.retry_delay is not None, answer
    assert seen["refused"] == 2
    assert seen["peak"] <= 4 * CAP  # never more reserved than the global budget
    for key in ("other_connection", "after"):
        assert isinstance(seen[key], Answer) and seen[key].code == "OK", seen[key]
    too_big = seen["too_big"]
    assert isinstance(too_big, Answer) and too_big.code == "RESOURCE_EXHAUSTED"  # never read


def test_a_budget_that_cannot_hold_one_message_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="max_inflight_bytes_per_connection"):
        CoordinatorConfig(limits=LimitsConfig(max_inflight_bytes_per_connection=1 << 20))


def test_a_refused_message_is_not_kept_alive_after_its_call() -> None:
    """A unary call's request stream is closed once its message is read: gRPC's reader kept
    the message it last yielded, and each refused cap-sized Join stayed in memory with its
    call's frames (100 of them, read one at a time, grew the coordinator by 348 MiB)."""
    pad = "x" * (CAP - (4 << 10))  # over max_metadata_bytes: refused after it is read
    calls = 12

    async def scenario() -> tuple[set[str], int]:
        codes: set[str] = set()
        with EventLog(None) as events:
            async with CoordinatorServer(CoordinatorConfig(limits=limits()),
                                         np.zeros(8, np.float32), events) as server, \
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=[
                        ("grpc.max_send_message_length", 16 << 20)]) as channel:
                stub = pb_grpc.CoordinatorStub(channel)
                for i in range(calls):
                    request = pb.JoinRequest(client_name=f"p{i}", num_examples=1,
                                             metadata={"pad": pad})
                    codes.add((await answer_of(stub.Join(request, timeout=30))).code)
                del request
                gc.collect()
                alive = sum(1 for o in gc.get_objects()
                            if isinstance(o, pb.JoinRequest) and o.ByteSize() > CHUNK)
        return codes, alive

    codes, alive = run_async(scenario(), timeout=110)
    assert codes == {"INVALID_ARGUMENT"}
    assert alive <= 1  # at most the last call's, while its frames unwind


def big_requests_listed() -> int:
    """How many cap-sized ``JoinRequest``s the collector lists (listing does not collect)."""
    return sum(1 for o in gc.get_objects()
               if isinstance(o, pb.JoinRequest) and o.ByteSize() > CHUNK)


def test_a_refused_message_is_freed_without_waiting_for_a_collection() -> None:
    """The exception that ends a refused call keeps the call's frames, the request among
    them, in a reference cycle: 12 refused cap-sized Joins stayed in memory until the next
    full collection (in a flood, tens of MiB between two). The budget clears those frames'
    locals, so each request is freed when its call ends, collector or not."""
    pad = "x" * (CAP - (4 << 10))  # over max_metadata_bytes: refused after it is read
    roomy = LimitsConfig(chunk_bytes=CHUNK, max_chunk_bytes=CHUNK, requests_per_s=0,
                         max_inflight_bytes=64 * CAP, max_inflight_bytes_per_connection=64 * CAP)

    async def scenario() -> tuple[set[str], int]:
        codes: set[str] = set()
        with EventLog(None) as events:
            async with CoordinatorServer(CoordinatorConfig(limits=roomy),
                                         np.zeros(8, np.float32), events) as server, \
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=[
                        ("grpc.max_send_message_length", 16 << 20)]) as channel:
                stub = pb_grpc.CoordinatorStub(channel)
                for i in range(12):
                    request = pb.JoinRequest(client_name=f"p{i}", num_examples=1,
                                             metadata={"pad": pad})
                    codes.add((await answer_of(stub.Join(request, timeout=30))).code)
                del request
                # The client can read the last answer before the server's frames unwind; a
                # request kept by a cycle would stay listed however long we wait.
                await wait_until(lambda: big_requests_listed() == 0, timeout=60,
                                 what="the refused requests to be freed, collector off")
                alive = big_requests_listed()
                assert server.inflight.freed.trims == 0  # no hand-back collected them
        return codes, alive

    collecting = gc.isenabled()
    gc.disable()
    try:
        codes, alive = run_async(scenario(), timeout=110)
    finally:
        if collecting:
            gc.enable()
    assert codes == {"INVALID_ARGUMENT"}
    assert alive == 0
