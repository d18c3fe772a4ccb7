"""Protocol behaviours an implementer in another language relies on (``docs/protocol.md``).

Each test drives a real coordinator on loopback through raw gRPC stubs, as a non-Python client
would, and checks what goes over the wire: a delta-rebuilt model verifies with SHA-256 over
float32 bytes alone (no re-encoding), a cut ``Upload`` stream is durable at once, an early
commit is not counted as a refusal, ``CommitReply`` says which version it speaks of, and the
limits a client must respect arrive in ``RunConfig``.
"""

from __future__ import annotations

import asyncio
import hashlib
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, run_async, wait_until

from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.coordinator.transfers import Transfers
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import pack, to_proto

pytestmark = pytest.mark.timeout(60)

DIM = 3000
X0 = np.random.default_rng(5).normal(scale=0.1, size=DIM).astype(np.float32)


def config(goal: int = 1, rounds: int = 3, state_dir: str = "",
           downlink_codec: str = "fp32", inline_bytes: int = 0) -> CoordinatorConfig:
    return CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=goal, deadline_s=None),
                             downlink_codec=downlink_codec, state_dir=state_dir,
                             limits=LimitsConfig(long_poll_s=1.0, inline_bytes=inline_bytes))


def sha256_of_float32(values: np.ndarray) -> str:
    """What any language computes: SHA-256 over the values as little-endian float32 bytes."""
    return "sha256:" + hashlib.sha256(values.astype("<f4").tobytes()).hexdigest()


async def join(stub: pb_grpc.CoordinatorStub, name: str = "raw") -> pb.JoinReply:
    reply: pb.JoinReply = await stub.Join(pb.JoinRequest(client_name=name, num_examples=5),
                                          timeout=10)
    return reply


async def download(stub: pb_grpc.CoordinatorStub, client_id: str, task: pb.Task,
                   delta: bool) -> bytes:
    request = pb.DownloadRequest(client_id=client_id, task_id=task.task_id, delta=delta)
    return b"".join([c.data async for c in stub.Download(request, timeout=10)])


async def commit_fp32(stub: pb_grpc.CoordinatorStub, client_id: str, task: pb.Task,
                      upload_id: str, update: np.ndarray) -> pb.CommitReply:
    payload = pack(update, get_codec("fp32"))
    await stub.Upload(iter([pb.UploadChunk(client_id=client_id, upload_id=upload_id,
                                           data=payload.data)]), timeout=10)
    reply: pb.CommitReply = await stub.Commit(pb.CommitRequest(
        client_id=client_id, upload_id=upload_id, task_id=task.task_id,
        base_version=task.model_version, num_examples=5, steps_completed=1, steps_planned=1,
        update=to_proto(payload.header)), timeout=10)
    return reply


def test_fp32_zlib_delta_verifies_by_a_checksum_over_decoded_values(
        coordinator: CoordinatorFactory) -> None:
    """The Node.js case: a client whose zlib deflates differently still verifies the model."""

    async def main() -> tuple[pb.Task, bytes, np.ndarray]:
        async with coordinator(config(downlink_codec="fp32-zlib"), X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            client_id = (await join(stub)).client_id
            first = (await stub.GetTask(pb.GetTaskRequest(client_id=client_id,
                                                          held_version=-1), timeout=10)).task
            held = np.frombuffer(zlib.decompress(await download(stub, client_id, first, False)),
                                 np.uint8).reshape(4, DIM).T.copy().view("<f4").reshape(-1)
            assert sha256_of_float32(held) == first.model.values_checksum
            await commit_fp32(stub, client_id, first, "u-1", np.full(DIM, 0.01, np.float32))
            second = (await stub.GetTask(pb.GetTaskRequest(
                client_id=client_id, held_version=first.model_version), timeout=10)).task
            assert second.delta.encoding == "xor-zlib"
            assert second.delta_base_version == first.model_version
            return second, await download(stub, client_id, second, True), held

    task, delta, held = run_async(main())
    assert "sha256:" + hashlib.sha256(delta).hexdigest() == task.delta.checksum
    xor = np.frombuffer(zlib.decompress(delta), "<u4")
    rebuilt = (held.view("<u4") ^ xor).view("<f4")
    assert sha256_of_float32(rebuilt) == task.model.values_checksum
    assert task.delta.values_checksum == task.model.values_checksum
    # Why the encoded-bytes checksum could not serve: another deflate of the same planes
    # (here: another level, as another zlib build) gives other bytes for the same values.
    planes = np.ascontiguousarray(rebuilt.view(np.uint8).reshape(-1, 4).T).tobytes()
    other = zlib.compress(planes, 9)
    assert "sha256:" + hashlib.sha256(other).hexdigest() != task.model.checksum


async def _cut_stream(server: CoordinatorServer, stub: pb_grpc.CoordinatorStub, client_id: str,
                      how: str) -> None:
    """Send 1024 bytes of an upload, then cut the stream (``cancel`` or ``deadline``)."""

    async def chunks() -> AsyncIterator[pb.UploadChunk]:
        yield pb.UploadChunk(client_id=client_id, upload_id="cut-1", offset=0,
                             data=b"\x01" * 1024)
        await asyncio.Event().wait()  # the stream stays open until it is cut

    call = stub.Upload(chunks(), timeout=1.0 if how == "deadline" else 30.0)
    sessions = server.service.uploads._sessions
    key = (client_id, "cut-1")
    await wait_until(lambda: key in sessions and sessions[key].received >= 1024,
                     what="the coordinator received the chunk")
    if how == "cancel":
        call.cancel()
    with pytest.raises((grpc.aio.AioRpcError, asyncio.CancelledError)):
        await call


def hold_the_cut_streams_own_sync(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Make the cut stream's own end-of-stream fsync wait until the returned event is set.

    On a loaded machine the handler of a cut stream runs its ``finally`` late (the integrator
    saw ``UploadStatus`` answer 0 in 3 of 4 tries); holding it makes that case certain.
    """
    release = asyncio.Event()
    original = Transfers.make_durable
    calls = 0

    async def held(transfers: Transfers, client_id: str, upload_id: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first caller is the stream's own ``finally``
            await release.wait()
        await original(transfers, client_id, upload_id)

    monkeypatch.setattr(Transfers, "make_durable", held)
    return release


@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_a_cut_upload_stream_is_durable_at_the_next_upload_status(
        coordinator: CoordinatorFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    async def main() -> tuple[int, int]:
        release = hold_the_cut_streams_own_sync(monkeypatch)
        async with coordinator(config(state_dir=str(tmp_path / "state")), X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            client_id = (await join(stub)).client_id
            await _cut_stream(server, stub, client_id, how)
            status = await stub.UploadStatus(pb.UploadStatusRequest(
                client_id=client_id, upload_id="cut-1"), timeout=10)
            spool = server.service.uploads._sessions[client_id, "cut-1"].spool
            release.set()
            return status.committed_offset, spool.durable

    reported, durable = run_async(main())
    assert reported == 1024  # the first status query after the cut, not some later one
    assert durable == 1024


def test_an_early_commit_that_later_succeeds_is_not_counted_as_refused(
        coordinator: CoordinatorFactory) -> None:
    payload = pack(np.full(DIM, 0.5, np.float32), get_codec("fp32"))

    async def main() -> tuple[grpc.StatusCode, pb.CommitReply, CoordinatorServer]:
        async with coordinator(config(), X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            client_id = (await join(stub)).client_id
            task = (await stub.GetTask(pb.GetTaskRequest(client_id=client_id,
                                                         held_version=-1), timeout=10)).task
            request = pb.CommitRequest(
                client_id=client_id, upload_id="early-1", task_id=task.task_id,
                base_version=task.model_version, num_examples=5, steps_completed=1,
                steps_planned=1, update=to_proto(payload.header))
            chunk = pb.UploadChunk(client_id=client_id, upload_id="early-1",
                                   data=payload.data[:1024])
            await stub.Upload(iter([chunk]), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as early:
                await stub.Commit(request, timeout=10)
            rest = pb.UploadChunk(client_id=client_id, upload_id="early-1", offset=1024,
                                  data=payload.data[1024:])
            await stub.Upload(iter([rest]), timeout=10)
            return early.value.code(), await stub.Commit(request, timeout=10), server

    code, reply, server = run_async(main())
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert reply.upload_id == "early-1"
    assert len(server.events.of_kind("update_accepted")) == 1
    assert server.events.of_kind("update_refused") == []


def test_commit_reply_says_the_version_accepted_at_and_the_version_it_flushed(
        coordinator: CoordinatorFactory) -> None:
    async def main() -> list[pb.CommitReply]:
        async with coordinator(config(goal=2), X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            replies = []
            for name in ("a", "b"):
                client_id = (await join(stub, name)).client_id
                task = (await stub.GetTask(pb.GetTaskRequest(client_id=client_id,
                                                             held_version=-1), timeout=10)).task
                replies.append(await commit_fp32(stub, client_id, task, f"up-{name}",
                                                 np.full(DIM, 0.01, np.float32)))
            return replies

    no_flush, flushed = run_async(main())
    assert (no_flush.accepted_version, no_flush.flushed_version, no_flush.model_version) \
        == (0, 0, 0)
    assert (flushed.accepted_version, flushed.flushed_version, flushed.model_version) \
        == (0, 1, 1)
    # protocol 1.1: version 0 is said explicitly, not left as the unset default
    assert no_flush.HasField("accepted_version") and flushed.HasField("accepted_version")


def test_run_config_carries_every_limit_a_client_must_respect(
        coordinator: CoordinatorFactory) -> None:
    async def main() -> tuple[pb.RunConfig, int]:
        async with coordinator(config(), X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            reply = await join(stub)
            status = await stub.UploadStatus(pb.UploadStatusRequest(
                client_id=reply.client_id, upload_id="never-used"), timeout=10)
            return reply.config, status.committed_offset

    run_config, unknown_offset = run_async(main())
    limits = LimitsConfig(long_poll_s=1.0, inline_bytes=0)
    assert run_config.max_chunk_bytes == limits.max_chunk_bytes
    assert run_config.long_poll_s == 1.0
    # the bound in force for this model (0 in the config: derived from the model's size)
    assert run_config.max_update_bytes == limits.update_bytes_for(X0.size) > 0
    assert run_config.max_string_bytes == limits.max_string_bytes
    assert run_config.max_metadata_entries == limits.max_metadata_entries
    assert run_config.max_uploads_per_client == limits.max_uploads_per_client
    assert run_config.requests_per_s == limits.requests_per_s
    assert run_config.request_burst == limits.request_burst
    assert run_config.max_metadata_bytes == limits.max_metadata_bytes
    assert run_config.max_examples_per_update == limits.max_examples_per_update
    assert run_config.max_open_uploads_per_client == limits.max_open_uploads_per_client
    assert unknown_offset == 0  # documented: an id never used holds nothing (errors.py)


def test_after_data_loss_the_upload_id_is_spent_and_a_new_one_commits(
        coordinator: CoordinatorFactory) -> None:
    """Section 8: an answered upload id takes no more bytes; the update goes again under a new
    id. (Re-uploading to the refused id used to fail with nothing in the spec saying why.)"""
    update = np.full(DIM, 0.01, np.float32)
    payload = pack(update, get_codec("fp32"))
    corrupted = bytes([payload.data[0] ^ 1]) + payload.data[1:]

    def chunk(client_id: str, data: bytes) -> pb.UploadChunk:
        return pb.UploadChunk(client_id=client_id, upload_id="u-bad", data=data)

    async def main() -> tuple[list[tuple[grpc.StatusCode, str]], pb.CommitReply]:
        async with coordinator(config(), X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            client_id = (await join(stub)).client_id
            task = (await stub.GetTask(pb.GetTaskRequest(client_id=client_id,
                                                         held_version=-1), timeout=10)).task
            await stub.Upload(iter([chunk(client_id, corrupted)]), timeout=10)
            request = pb.CommitRequest(
                client_id=client_id, upload_id="u-bad", task_id=task.task_id,
                base_version=task.model_version, num_examples=5, steps_completed=1,
                steps_planned=1, update=to_proto(payload.header))
            answers = []
            for call in (lambda: stub.Commit(request, timeout=10),
                         lambda: stub.Upload(iter([chunk(client_id, payload.data)]), timeout=10),
                         lambda: stub.Commit(request, timeout=10)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call()
                answers.append((refused.value.code(), refused.value.details() or ""))
            fresh = await commit_fp32(stub, client_id, task, "u-new", update)
            return answers, fresh

    answers, fresh = run_async(main())
    (commit, _), (upload, upload_details), (repeat, _) = answers
    # the commit refused, the spent id refuses bytes, a repeated commit replays the answer
    assert (commit, upload, repeat) == (grpc.StatusCode.DATA_LOSS,
                                        grpc.StatusCode.INVALID_ARGUMENT,
                                        grpc.StatusCode.DATA_LOSS)
    assert "new upload id" in upload_details
    assert fresh.upload_id == "u-new" and fresh.HasField("accepted_version")
