"""Small payloads travel inline: a model (or delta) inside its ``Task``, an update inside its
``Commit``. A run of a small model makes no ``Download`` or ``Upload`` call at all, computes the
same model, and a repeated inline commit still counts once."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, gather_bounded, run_async, target_of

from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.coordinator.service import CoordinatorService
from fedlink.messages import CommitRequest
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import pack, to_proto

pytestmark = pytest.mark.timeout(60)

DIM = 500  # a 2 KB model and update
X0 = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)


def config(rounds: int, inline_bytes: int = 64 << 10) -> CoordinatorConfig:
    return CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=2, deadline_s=None),
                             limits=LimitsConfig(long_poll_s=2.0, retry_after_s=0.05,
                                                 inline_bytes=inline_bytes))


class CallCounts:
    """How many ``Download`` and ``Upload`` calls the coordinator served."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.downloads = self.uploads = 0
        download, upload = CoordinatorService.download, CoordinatorService.upload

        def counted_download(service: CoordinatorService, request: object) -> object:
            self.downloads += 1
            return download(service, request)  # type: ignore[arg-type]

        async def counted_upload(service: CoordinatorService, chunks: object) -> object:
            self.uploads += 1
            return await upload(service, chunks)  # type: ignore[arg-type]

        monkeypatch.setattr(CoordinatorService, "download", counted_download)
        monkeypatch.setattr(CoordinatorService, "upload", counted_upload)


def two_clients_for(coordinator: CoordinatorFactory, cfg: CoordinatorConfig
                    ) -> tuple[CoordinatorServer, list[ClientSession], list[TowardTrainer]]:
    rng = np.random.default_rng(3)
    trainers = [TowardTrainer(rng.normal(size=DIM).astype(np.float32), examples=n)
                for n in (10, 30)]

    async def main() -> tuple[CoordinatorServer, list[ClientSession]]:
        async with coordinator(cfg, X0) as server:
            sessions = [ClientSession(target_of(server), t,
                                      ClientOptions(name=f"dev{i}", retry=FAST_RETRY))
                        for i, t in enumerate(trainers)]
            await gather_bounded(*(s.run() for s in sessions))
            await asyncio.wait_for(server.wait_finished(), 10)
        return server, sessions

    server, sessions = run_async(main())
    return server, sessions, trainers


def test_a_small_model_run_makes_no_download_or_upload_call(
        coordinator: CoordinatorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = CallCounts(monkeypatch)
    inline, sessions, _ = two_clients_for(coordinator, config(rounds=3))
    assert (counts.downloads, counts.uploads) == (0, 0)
    for session in sessions:
        assert session.stats.accepted == 3
        assert session.stats.bytes_up == 3 * 4 * DIM  # each update sent once, in its Commit
    downloads = inline.events.of_kind("download_finished")
    assert len(downloads) == 6 and all(e["inline"] for e in downloads)
    assert sum(e["delta"] for e in downloads) >= 2  # later versions came as inline deltas

    # the same run with nothing inline: the calls are back, the model is the same
    counts.downloads = counts.uploads = 0
    chunked, _, _ = two_clients_for(coordinator, config(rounds=3, inline_bytes=0))
    assert counts.downloads >= 6 and counts.uploads == 6
    np.testing.assert_array_equal(inline.service.engine.model, chunked.service.engine.model)


async def _raw_task(server: CoordinatorServer, channel: grpc.aio.Channel
                    ) -> tuple[pb_grpc.CoordinatorStub, str, pb.Task]:
    stub = pb_grpc.CoordinatorStub(channel)
    joined = await stub.Join(pb.JoinRequest(client_name="raw", num_examples=10), timeout=10)
    assert joined.config.inline_bytes == 64 << 10
    reply = await stub.GetTask(pb.GetTaskRequest(client_id=joined.client_id, held_version=-1),
                               timeout=10)
    assert len(reply.task.model_data) == 4 * DIM  # the model came with the task
    return stub, joined.client_id, reply.task


def _commit(client_id: str, task: pb.Task, upload_id: str, data: bytes,
            header: object) -> pb.CommitRequest:
    return to_proto(CommitRequest(  # type: ignore[return-value]
        client_id=client_id, upload_id=upload_id, task_id=task.task_id, base_version=0,
        num_examples=10, steps_completed=1, steps_planned=1, update=header,  # type: ignore[arg-type]
        update_data=data))


def test_a_repeated_inline_commit_gets_the_same_answer_and_counts_once(
        coordinator: CoordinatorFactory) -> None:
    payload = pack(np.ones(DIM, dtype=np.float32), get_codec("fp32"))

    async def main() -> list[pb.CommitReply]:
        async with coordinator(config(rounds=1), X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub, client_id, task = await _raw_task(server, channel)
            request = _commit(client_id, task, "u1", payload.data, payload.header)
            replies = [await stub.Commit(request, timeout=10) for _ in range(3)]
            assert len(server.events.of_kind("update_accepted")) == 1
            return replies

    replies = run_async(main())
    assert replies[0] == replies[1] == replies[2]


def test_an_inline_update_over_the_limit_is_resource_exhausted(
        coordinator: CoordinatorFactory) -> None:
    big = pack(np.ones(20_000, dtype=np.float32), get_codec("fp32"))  # 80 KB > 64 KiB

    async def main() -> grpc.StatusCode:
        async with coordinator(config(rounds=1), X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub, client_id, task = await _raw_task(server, channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Commit(_commit(client_id, task, "u1", big.data, big.header),
                                  timeout=10)
            assert "inline limit" in (err.value.details() or "")
            assert server.events.of_kind("update_accepted") == []
            return err.value.code()

    assert run_async(main()) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_an_inline_update_shorter_than_its_header_is_invalid_argument(
        coordinator: CoordinatorFactory) -> None:
    payload = pack(np.ones(DIM, dtype=np.float32), get_codec("fp32"))

    async def main() -> tuple[grpc.StatusCode, grpc.StatusCode]:
        async with coordinator(config(rounds=1), X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub, client_id, task = await _raw_task(server, channel)
            with pytest.raises(grpc.aio.AioRpcError) as short:
                await stub.Commit(_commit(client_id, task, "u1", payload.data[:-4],
                                          payload.header), timeout=10)
            assert "header claims" in (short.value.details() or "")
            # nothing was held under that id: the whole update commits under it afterwards
            reply = await stub.Commit(_commit(client_id, task, "u1", payload.data,
                                              payload.header), timeout=10)
            assert reply.upload_id == "u1"
            # a new update under the answered id is refused, and says to take a new id
            with pytest.raises(grpc.aio.AioRpcError) as reused:
                await stub.Upload(iter([pb.UploadChunk(client_id=client_id, upload_id="u1",
                                                       offset=0, data=b"x")]), timeout=10)
            assert "new upload id" in (reused.value.details() or "")
            return short.value.code(), reused.value.code()

    assert run_async(main()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                 grpc.StatusCode.INVALID_ARGUMENT)
