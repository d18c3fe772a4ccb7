"""Finding 3: upload bytes a client never commits are bounded and do not stay forever.

``max_update_bytes`` defaults to a small multiple of the model's fp32 size; uploads go when
their client leaves, expires or leaves them idle; a client holds at most a few uploads and a
bounded number of bytes; all uploads together stay under ``max_spool_bytes``
(``RESOURCE_EXHAUSTED`` with a retry hint beyond).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from _hostile import Raw
from conftest import CoordinatorFactory, run_async, wait_until

from fedlink.coordinator import CoordinatorConfig, LimitsConfig
from fedlink.proto.v1 import coordinator_pb2 as pb

pytestmark = pytest.mark.timeout(60)

DIM = 32
X0 = np.zeros(DIM, np.float32)


def spools(state_dir: Path) -> list[Path]:
    return sorted(state_dir.glob("uploads/*/*.spool"))


def test_the_default_update_size_limit_follows_the_model(
        coordinator: CoordinatorFactory) -> None:
    async def scenario() -> str:
        async with (coordinator(CoordinatorConfig(), X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            client = await raw.client()
            held = b""
            for _ in range(3):  # 3 x 30 KB: past 3 x 128 B + 64 KiB, far under 1 GiB
                answer = await raw.upload(client, "big", b"\0" * 30_000, offset=len(held))
                if answer.code != "OK":
                    return answer.code
                held += b"\0" * 30_000
            return "OK"
    assert run_async(scenario()) == "RESOURCE_EXHAUSTED"


def test_leave_drops_a_clients_uploads_and_their_spool_files(
        coordinator: CoordinatorFactory, tmp_path: Path) -> None:
    config = CoordinatorConfig(state_dir=str(tmp_path / "state"))

    async def scenario() -> None:
        async with coordinator(config, X0) as server:
            uploads = server.service.uploads
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                raw = Raw(channel)
                client = await raw.client()
                for i in range(3):
                    assert (await raw.upload(client, f"u{i}", b"x" * 5000)).code == "OK"
                assert uploads.held_bytes() == 15_000 and len(spools(tmp_path / "state")) == 3
                await raw.stub.Leave(pb.LeaveRequest(client_id=client), timeout=10)
                assert uploads.held_bytes() == 0 and uploads.open_uploads() == 0
                assert spools(tmp_path / "state") == []
    run_async(scenario())


def test_an_idle_upload_expires(coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(limits=LimitsConfig(upload_idle_s=0.5))

    async def scenario() -> None:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            client = await raw.client()
            assert (await raw.upload(client, "idle", b"x" * 5000)).code == "OK"
            await wait_until(lambda: server.service.uploads.open_uploads() == 0,
                             what="the idle upload to expire")
            assert server.service.uploads.held_bytes() == 0
    run_async(scenario())


def test_a_client_holds_few_uploads_and_all_together_are_capped(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(limits=LimitsConfig(max_open_uploads_per_client=2,
                                                   max_spool_bytes=12_000))

    async def scenario() -> None:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            hoarder = await raw.client("hoarder")
            for i in range(2):
                assert (await raw.upload(hoarder, f"h{i}", b"x" * 5000)).code == "OK"
            third = await raw.upload(hoarder, "h2", b"x" * 10)  # evicts its own h0
            assert third.code == "OK" and server.service.uploads.open_uploads() == 2
            assert server.service.uploads.held_by(hoarder) == 5010
            other = await raw.client("other")
            full = await raw.upload(other, "o1", b"x" * 7500)  # 5010 + 7500 > 12000
            assert full.code == "RESOURCE_EXHAUSTED", full
            assert "retry later" in full.detail
            assert full.retry_delay
            assert server.service.uploads.held_bytes() == 5010
    run_async(scenario())
