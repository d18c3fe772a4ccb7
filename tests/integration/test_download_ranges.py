"""``DownloadRequest.end_offset`` on a real coordinator, and clients that stripe their
downloads over two connections (``ClientOptions.download_connections``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, gather_bounded, run_async, target_of

from fedlink.aggregate.flushguard import RobustConfig
from fedlink.client import ClientOptions, ClientSession, RetryPolicy, SessionStats
from fedlink.client.liveness import LivenessConfig
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.errors import ConfigError
from fedlink.messages import DataChunk, DownloadRequest
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.sim import ExperimentConfig

pytestmark = pytest.mark.timeout(60)

DIM = 100_000  # 400,000 bytes: above the size a client stripes
X0 = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)
LIMITS = LimitsConfig(chunk_bytes=16 << 10, long_poll_s=2.0, retry_after_s=0.05,
                      inline_bytes=0)


def test_a_range_stops_at_its_end_and_one_that_does_not_fit_is_refused(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, deadline_s=None),
                               limits=LIMITS)

    async def main() -> None:
        async with coordinator(config, X0) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            client_id = (await stub.Join(pb.JoinRequest(client_name="raw", num_examples=1),
                                         timeout=5)).client_id
            task = (await stub.GetTask(pb.GetTaskRequest(client_id=client_id,
                                                         held_version=-1), timeout=5)).task

            async def fetch(offset: int, end: int) -> bytes:
                request = pb.DownloadRequest(client_id=client_id, task_id=task.task_id,
                                             offset=offset, end_offset=end)
                return b"".join([c.data async for c in stub.Download(request, timeout=10)])

            whole = await fetch(0, 0)
            assert len(whole) == task.model.num_bytes
            assert await fetch(1000, 70_000) == whole[1000:70_000]  # across chunk bounds
            assert await fetch(5, 5) == b""
            for offset, end in ((0, len(whole) + 1), (10, 9)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await fetch(offset, end)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    run_async(main())


def striped_run(coordinator: CoordinatorFactory, connections: int
                ) -> tuple[np.ndarray, CoordinatorServer, list[SessionStats]]:
    """Two clients, three sync rounds, every client with ``connections`` download
    connections; the model, the coordinator and the clients' stats."""
    config = CoordinatorConfig(rounds=3, flush=FlushRule(goal=2, deadline_s=None),
                               limits=LIMITS, robust=RobustConfig(enabled=False))
    trainers = [TowardTrainer(np.full(DIM, float(i), np.float32)) for i in (1, 2)]
    retry = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)

    async def main() -> tuple[np.ndarray, CoordinatorServer, list[SessionStats]]:
        async with coordinator(config, X0) as server:
            stats = await gather_bounded(*(ClientSession(
                target_of(server), t, ClientOptions(name=f"c{i}", retry=retry, seed=i,
                                                    download_connections=connections)).run()
                for i, t in enumerate(trainers)))
            await asyncio.wait_for(server.wait_finished(), 10)
            return server.service.engine.model.copy(), server, stats

    return run_async(main())


def test_clients_striping_downloads_over_two_connections_train_the_same_model(
        coordinator: CoordinatorFactory) -> None:
    striped, server, stats = striped_run(coordinator, connections=2)
    single, _, _ = striped_run(coordinator, connections=1)
    np.testing.assert_array_equal(striped, single)
    assert [s.channels_opened for s in stats] == [2, 2]
    # each client's first model came in two ranges: from 0 and from the middle
    total = 4 * DIM
    first_tasks = {e["task_id"] for e in server.events.of_kind("task_issued")
                   if e["model_version"] == 0}
    starts = sorted(e["offset"] for e in server.events.of_kind("download_finished")
                    if e["task_id"] in first_tasks)
    assert starts.count(0) == 2 and starts.count(total // 2) == 2


@pytest.mark.parametrize(("min_stall_s", "pace_s"), [(120.0, 0.0), (1.0, 0.2)],
                         ids=["stall-bound-beyond-the-test", "other-streams-slower-than-it"])
def test_a_range_whose_connection_stops_sending_is_taken_over_by_the_other(
        coordinator: CoordinatorFactory, min_stall_s: float, pace_s: float) -> None:
    # the first half's stream sends one chunk, then nothing (a connection deep in TCP
    # backoff). With a stall bound far beyond the test's timeout, only the other connection
    # taking over that range can finish the download in time. With a short one, the other
    # streams send a chunk every ``pace_s`` and take five times the bound to finish: the
    # stuck stream must not be stalled (nor its connection replaced) while they move
    config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, deadline_s=None),
                               limits=LIMITS, robust=RobustConfig(enabled=False))
    liveness = LivenessConfig(min_stall_s=min_stall_s, min_ping_timeout_s=120.0,
                              max_ping_timeout_s=120.0)
    trainer = TowardTrainer(np.full(DIM, 3.0, np.float32))

    async def main() -> tuple[CoordinatorServer, SessionStats]:
        async with coordinator(config, X0) as server:
            serve = server.service.transfers.download
            ranges: list[DownloadRequest] = []

            async def stuck_first_range(request: DownloadRequest) -> AsyncIterator[DataChunk]:
                # the first half's range (the first connection's), whichever arrives first
                stuck = request.end_offset and request.offset == 0 and not any(
                    r.end_offset and r.offset == 0 for r in ranges)
                ranges.append(request)
                async for n, chunk in _numbered(serve(request)):
                    if stuck and n == 1:
                        await asyncio.Event().wait()
                    await asyncio.sleep(pace_s)  # the pace of the moving streams
                    yield chunk

            server.service.transfers.download = stuck_first_range  # type: ignore[method-assign]
            stats = await ClientSession(target_of(server), trainer, ClientOptions(
                name="c", retry=RetryPolicy(max_attempts=2), liveness=liveness)).run()
            await asyncio.wait_for(server.wait_finished(), 10)
            return server, stats

    server, stats = run_async(main(), timeout=50)
    np.testing.assert_allclose(server.service.engine.model, (X0 + 3.0) / 2, rtol=1e-6)
    assert (stats.accepted, stats.stalls, stats.reconnects) == (1, 0, 0)
    assert stats.ranges_taken >= 1
    # the first connection was the one overtaken: the calls after the download went on
    # over the other one
    assert stats.handovers == 1
    # the stuck stream ended (cancelled once the rest had come) after its one chunk
    assert any(e["offset"] == 0 and e["bytes"] <= 2 * LIMITS.chunk_bytes
               for e in server.events.of_kind("download_finished"))


async def _numbered(chunks: AsyncIterator[DataChunk]) -> AsyncIterator[tuple[int, DataChunk]]:
    n = 0
    async for chunk in chunks:
        yield n, chunk
        n += 1


def test_download_connections_below_one_are_refused() -> None:
    with pytest.raises(ConfigError, match="download_connections"):
        ClientOptions(download_connections=0)


@pytest.mark.parametrize(("mode", "network"), [("grpc", None), ("grpc", {"preset": "lan"}),
                                              ("virtual", None)])
def test_only_virtual_mode_refuses_striping(mode: str, network: dict[str, str] | None) -> None:
    # an emulated link's connections share its bandwidth; virtual mode times one transfer
    table: dict[str, object] = {"run": {"mode": mode},
                                "client": {"download_connections": 2}}
    if network is not None:
        table["network"] = network
    if mode == "grpc":
        assert ExperimentConfig.from_dict(table).client.download_connections == 2
        return
    with pytest.raises(ConfigError, match=r"download_connections > 1 .*virtual"):
        ExperimentConfig.from_dict(table)
    table["client"] = {"download_connections": 1}
    assert ExperimentConfig.from_dict(table).client.download_connections == 1
