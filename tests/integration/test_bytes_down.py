"""``bytes_down`` is what the coordinator sent, counted as it sends it, by kind, with the part
no accepted result used as ``bytes_down_wasted`` (``fedlink.coordinator.downloads``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, run_async, target_of, wait_until

from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.messages import CommitRequest
from fedlink.metrics import summarize
from fedlink.metrics.events import EventLog, read_events
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.sim import ExperimentConfig
from fedlink.sim.runner import run_simulation
from fedlink.wire import pack, to_proto

pytestmark = pytest.mark.timeout(60)


def config(inline_bytes: int) -> CoordinatorConfig:
    return CoordinatorConfig(rounds=3, flush=FlushRule(goal=1, deadline_s=None),
                             limits=LimitsConfig(chunk_bytes=16 << 10, long_poll_s=0.2,
                                                 inline_bytes=inline_bytes))


async def join(channel: grpc.aio.Channel) -> tuple[pb_grpc.CoordinatorStub, str, pb.Task]:
    stub = pb_grpc.CoordinatorStub(channel)
    client_id = (await stub.Join(pb.JoinRequest(client_name="raw", num_examples=1),
                                 timeout=5)).client_id
    reply = await stub.GetTask(pb.GetTaskRequest(client_id=client_id, held_version=-1),
                               timeout=5)
    return stub, client_id, reply.task


async def download(stub: pb_grpc.CoordinatorStub, client_id: str, task: pb.Task,
                   offset: int = 0) -> bytes:
    request = pb.DownloadRequest(client_id=client_id, task_id=task.task_id, offset=offset)
    return b"".join([c.data async for c in stub.Download(request, timeout=10)])


def sent(server: CoordinatorServer) -> list[int]:
    return [e["bytes"] for e in server.events.of_kind("download_finished")]


def test_an_inline_model_and_two_downloads_left_unused_are_all_counted_and_all_wasted(
        coordinator: CoordinatorFactory) -> None:
    x0 = np.linspace(-1.0, 1.0, 650, dtype=np.float32)  # 2,600 bytes: inline

    async def main() -> CoordinatorServer:
        async with coordinator(config(inline_bytes=64 << 10), x0) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            stub, client_id, task = await join(channel)
            assert len(task.model_data) == 2600
            for _ in range(2):
                assert len(await download(stub, client_id, task)) == 2600
            await stub.Leave(pb.LeaveRequest(client_id=client_id, reason="done"), timeout=5)
            await wait_until(lambda: len(sent(server)) == 3, what="three downloads counted")
            return server

    server = run_async(main())
    summary = summarize(server.events.events, {})
    assert sent(server) == [2600, 2600, 2600]
    assert summary["bytes_down"] == summary["bytes_down_model"] == 7800
    assert summary["bytes_down_delta"] == summary["bytes_down_evaluation"] == 0
    assert summary["bytes_down_wasted"] == 7800  # no commit used any of it
    assert server.events.of_kind("download_used") == []


def test_a_cut_a_resume_and_a_second_download_count_every_byte_sent(
        coordinator: CoordinatorFactory) -> None:
    x0 = np.random.default_rng(1).normal(size=85_002).astype(np.float32)  # 340,008 bytes
    total = 4 * x0.size

    async def main() -> tuple[CoordinatorServer, int]:
        async with coordinator(config(inline_bytes=0), x0) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            stub, client_id, task = await join(channel)
            assert task.model.num_bytes == total and not task.model_data
            call = stub.Download(pb.DownloadRequest(client_id=client_id,
                                                    task_id=task.task_id), timeout=10)
            received = len((await call.read()).data)
            call.cancel()  # the link broke after the first chunk arrived
            await wait_until(lambda: len(sent(server)) == 1, what="the cut stream counted")
            rest = await download(stub, client_id, task, offset=received)
            assert received + len(rest) == total
            assert len(await download(stub, client_id, task)) == total  # a second, whole one
            update = pack(np.zeros(x0.size, np.float32), get_codec("fp32"))
            upload_id = f"{client_id}-u1"
            await stub.Upload(iter([pb.UploadChunk(client_id=client_id, upload_id=upload_id,
                                                   offset=0, data=update.data)]), timeout=10)
            await stub.Commit(to_proto(CommitRequest(
                client_id=client_id, upload_id=upload_id, task_id=task.task_id,
                base_version=0, num_examples=1, steps_completed=1, steps_planned=1,
                update=update.header)), timeout=10)
            await wait_until(lambda: bool(server.events.of_kind("flush")), what="the flush")
            return server, received

    server, received = run_async(main())
    cut, resumed, again = sent(server)
    assert received <= cut <= total  # what gRPC took before the cut, delivered or not
    assert (resumed, again) == (total - received, total)
    summary = summarize(server.events.events, {})
    assert summary["bytes_down"] == summary["bytes_down_model"] == cut + resumed + again
    (used,) = server.events.of_kind("download_used")
    assert used["bytes"] == total and used["wasted"] == cut + resumed + again - total
    assert summary["bytes_down_wasted"] == used["wasted"] >= total
    (flush,) = server.events.of_kind("flush")  # the round's count is the same bytes
    assert flush["bytes_down"] == flush["bytes_down_model"] == summary["bytes_down"]


def tiny_run(mode: str, tmp_path: Path) -> dict[str, Any]:
    """Four digits clients, two rounds of four, an evaluation task for every version."""
    config = ExperimentConfig.from_dict({
        "run": {"name": "bytes-down", "seed": 3, "mode": mode},
        "data": {"dataset": "digits", "clients": 4},
        "coordinator": {"rounds": 2, "flush": {"goal": 4, "min_updates": 4},
                        "evaluation": {"fraction": 1.0}},
    })
    return run_simulation(config, tmp_path / mode, progress=False).summary


@pytest.mark.timeout(240)
def test_virtual_mode_counts_bytes_down_by_kind_and_waste_as_a_real_run_does(
        tmp_path: Path) -> None:
    runs = {mode: tiny_run(mode, tmp_path) for mode in ("virtual", "grpc")}
    for mode, summary in runs.items():
        parts = [summary[f"bytes_down_{kind}"] for kind in ("model", "delta", "evaluation")]
        assert sum(parts) == summary["bytes_down"] > 0, mode
        assert summary["bytes_down_evaluation"] > 0, mode  # evaluation tasks were sent
        assert 0 <= summary["bytes_down_wasted"] <= summary["bytes_down"], mode
    virtual = runs["virtual"]
    # a virtual evaluation task takes the whole model, and each training task here is of a
    # version its client holds from evaluating it: no delta
    assert virtual["bytes_down_delta"] == 0
    # (seeded) every training task and evaluation task was answered in time: no waste
    assert virtual["updates_accepted"] == virtual["tasks_issued"]
    assert virtual["bytes_down_wasted"] == 0
    # the compression ratios are figures of both modes (a virtual run had None for both):
    # fp32 updates up in each, whole fp32 models down in a virtual one
    for summary in runs.values():
        assert summary["uplink_compression_ratio"] == pytest.approx(1.0, rel=0.01)
    assert virtual["downlink_compression_ratio"] == pytest.approx(1.0, rel=0.01)
    assert runs["grpc"]["downlink_compression_ratio"] >= 1.0
    # and the partition is recorded alike (a virtual run had no label_distribution)
    assert virtual["label_distribution"] == runs["grpc"]["label_distribution"] is not None


@pytest.mark.timeout(240)
def test_a_virtual_client_is_not_sent_a_version_it_holds(tmp_path: Path) -> None:
    # Four clients, versions 0-2, every client evaluating every version and training on the
    # first two: each (client, version) pair is downloaded once, for training or evaluation,
    # never twice (a real client that holds the version says so and is sent nothing).
    summary = tiny_run("virtual", tmp_path)
    model_bytes = 4 * np.load(tmp_path / "virtual" / "bytes-down" / "model.npy").size  # fp32
    assert summary["bytes_down"] == 4 * 3 * model_bytes
    assert summary["bytes_down_wasted"] == 0


def test_a_model_downloaded_before_a_restart_and_used_after_it_is_not_counted_wasted(
        tmp_path: Path) -> None:
    """The coordinator stops after a client downloaded its task's model and restarts from its
    ``state_dir``; the client's update is accepted by the new process. The model it trained
    on was used, not wasted, although another process sent it."""
    x0 = np.random.default_rng(2).normal(size=20_000).astype(np.float32)
    total = 4 * x0.size
    settings = dataclasses.replace(config(inline_bytes=0), state_dir=str(tmp_path / "state"))
    path = tmp_path / "events.jsonl"

    async def first() -> tuple[str, str]:
        with EventLog(path) as events:
            async with CoordinatorServer(settings, x0, events, address="127.0.0.1:0") as server, \
                    grpc.aio.insecure_channel(target_of(server)) as channel:
                stub, client_id, task = await join(channel)
                assert len(await download(stub, client_id, task)) == total
                await wait_until(lambda: len(sent(server)) == 1, what="the download counted")
        return client_id, task.task_id

    async def second(client_id: str, task_id: str) -> None:
        with EventLog(path) as events:
            async with CoordinatorServer(settings, x0, events, address="127.0.0.1:0") as server, \
                    grpc.aio.insecure_channel(target_of(server)) as channel:
                stub = pb_grpc.CoordinatorStub(channel)
                update = pack(np.zeros(x0.size, np.float32), get_codec("fp32"))
                upload_id = f"{client_id}-u1"
                await stub.Upload(iter([pb.UploadChunk(client_id=client_id, upload_id=upload_id,
                                                       offset=0, data=update.data)]), timeout=10)
                reply = await stub.Commit(to_proto(CommitRequest(
                    client_id=client_id, upload_id=upload_id, task_id=task_id, base_version=0,
                    num_examples=1, steps_completed=1, steps_planned=1,
                    update=update.header)), timeout=10)
                assert reply.HasField("accepted_version")
                await wait_until(lambda: bool(server.events.of_kind("flush")), what="the flush")

    client_id, task_id = run_async(first())
    run_async(second(client_id, task_id))
    events = read_events(path)
    (used,) = [e for e in events if e.kind == "download_used"]
    assert (used["task_id"], used["bytes"], used["wasted"]) == (task_id, total, 0)
    summary = summarize(events, {})
    assert summary["bytes_down"] == total and summary["bytes_down_wasted"] == 0
