"""Finding 3, what gRPC core buffers: the coordinator's HTTP/2 stream window stays fixed.

gRPC core accepts a stream's data up to the window it advertised before the application asks
for a message. With BDP probing on, the coordinator's window grew on a fast link to megabytes
per stream, so a flood of concurrent calls just under the message cap was buffered whole by
core before the budget of bytes in flight could refuse any of it (200 such calls on 2
connections: 250 to 400 MiB). Now the window the coordinator advertises never exceeds
``SERVER_STREAM_WINDOW_BYTES``, whatever an honest bulk upload or a flood does, so core holds
at most ``max_streams_per_connection`` x that window per connection of messages not asked for.

The evidence is what the coordinator itself tells clients on the wire: every HTTP/2 SETTINGS
frame it sends is read off a relay between client and coordinator. RSS figures are in
``benchmarks/edge_limits.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from _hostile import Answer, answer_of
from conftest import CoordinatorFactory, run_async

from fedlink.coordinator import CoordinatorConfig, LimitsConfig
from fedlink.errors import ConfigError
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire.options import SERVER_STREAM_WINDOW_BYTES

pytestmark = pytest.mark.timeout(120)

SETTINGS_FRAME = 0x4
ACK = 0x1
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
CHUNK = 1 << 20
UPLOAD_CHUNKS = 24
FLOOD = 40


class SettingsTap:
    """A TCP relay that records every SETTINGS parameter the server side sends."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.sent: dict[int, list[int]] = {}
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen on a free loopback port; the port."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and cut the relayed connections."""
        for pipe in self._pipes:
            pipe.cancel()
        if self._server is not None:
            self._server.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        for pipe in (self._copy(reader, up_writer), self._frames(up_reader, writer)):
            task = asyncio.ensure_future(pipe)
            self._pipes.add(task)

    @staticmethod
    async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Relay the server's frames one by one, noting its SETTINGS (it sends no preface)."""
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                header = await reader.readexactly(9)
                length = int.from_bytes(header[:3], "big")
                kind, flags = header[3], header[4]
                body = await reader.readexactly(length)
                if kind == SETTINGS_FRAME and not flags & ACK:
                    for offset in range(0, length, 6):
                        key, value = struct.unpack_from(">HI", body, offset)
                        self.sent.setdefault(key, []).append(value)
                writer.write(header + body)
                await writer.drain()
        writer.close()


async def upload(stub: pb_grpc.CoordinatorStub, client_id: str) -> Answer:
    """An honest bulk upload: ``UPLOAD_CHUNKS`` chunks of 1 MiB, back to back."""

    async def chunks() -> AsyncIterator[pb.UploadChunk]:
        for i in range(UPLOAD_CHUNKS):
            yield pb.UploadChunk(client_id=client_id, upload_id="bulk", offset=i * CHUNK,
                                 data=b"\x01" * CHUNK)

    return await answer_of(stub.Upload(chunks(), timeout=60))


def test_the_coordinators_stream_window_stays_fixed_under_uploads_and_a_flood(
        coordinator: CoordinatorFactory) -> None:
    limits = LimitsConfig(chunk_bytes=CHUNK, max_chunk_bytes=CHUNK, requests_per_s=0,
                          max_inflight_bytes=4 * (CHUNK + (64 << 10)),
                          max_inflight_bytes_per_connection=2 * (CHUNK + (64 << 10)))
    config = CoordinatorConfig(limits=limits)
    model = np.zeros(UPLOAD_CHUNKS * CHUNK // 4, np.float32)  # the upload fits the update cap
    pad = "x" * (CHUNK - (4 << 10))  # a Join just under the message cap

    async def scenario() -> tuple[SettingsTap, list[Answer], list[Answer], int]:
        async with coordinator(config, model) as server:
            tap = SettingsTap(server.port)
            port = await tap.start()
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
                        ("grpc.max_send_message_length", 16 << 20)]) as channel:
                    stub = pb_grpc.CoordinatorStub(channel)
                    joined = await stub.Join(pb.JoinRequest(client_name="u", num_examples=10),
                                             timeout=30)
                    uploads = [await upload(stub, joined.client_id) for _ in range(2)]
                    flood = await asyncio.gather(*(answer_of(stub.Join(pb.JoinRequest(
                        client_name=f"f{i}", num_examples=1, metadata={"pad": pad}),
                        timeout=60)) for i in range(FLOOD)))
                    uploads.append(await upload(stub, joined.client_id))
            finally:
                await tap.close()
            return tap, uploads, list(flood), server.inflight.refused

    tap, uploads, flood, refused = run_async(scenario(), timeout=100)
    assert [u.code for u in uploads] == ["OK"] * 3, uploads  # honest uploads still complete
    assert tap.sent.get(MAX_CONCURRENT_STREAMS) == [limits.max_streams_per_connection]
    windows = tap.sent.get(INITIAL_WINDOW_SIZE, [])
    assert windows, "the coordinator never advertised its stream window"
    assert max(windows) <= SERVER_STREAM_WINDOW_BYTES, windows  # BDP probing grew it
    # the flood was still answered: refused unread beyond the budget, with a retry hint
    assert {a.code for a in flood} <= {"RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"}, flood
    over = [a for a in flood if a.code == "RESOURCE_EXHAUSTED"]
    assert over, "40 concurrent cap-sized calls fit a budget of two"
    assert len(over) == refused and all(a.retry_delay is not None for a in over)


@pytest.mark.parametrize("window", [0, 256 << 10])
def test_the_stream_window_setting_takes_effect(coordinator: CoordinatorFactory,
                                                window: int) -> None:
    """``stream_window_bytes`` is the window advertised; 0 lets BDP probing grow it."""
    limits = LimitsConfig(chunk_bytes=CHUNK, max_chunk_bytes=CHUNK, requests_per_s=0,
                          stream_window_bytes=window)
    model = np.zeros(UPLOAD_CHUNKS * CHUNK // 4, np.float32)

    async def scenario() -> tuple[SettingsTap, list[Answer]]:
        async with coordinator(CoordinatorConfig(limits=limits), model) as server:
            tap = SettingsTap(server.port)
            port = await tap.start()
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    stub = pb_grpc.CoordinatorStub(channel)
                    joined = await stub.Join(pb.JoinRequest(client_name="u", num_examples=10),
                                             timeout=30)
                    uploads = [await upload(stub, joined.client_id) for _ in range(2)]
            finally:
                await tap.close()
            return tap, uploads

    tap, uploads = run_async(scenario(), timeout=100)
    assert [u.code for u in uploads] == ["OK"] * 2, uploads
    windows = tap.sent.get(INITIAL_WINDOW_SIZE, [])
    if window:
        assert windows and max(windows) == window, windows
    else:  # BDP probing on a loopback bulk upload grows the window past HTTP/2's default
        assert windows and max(windows) > SERVER_STREAM_WINDOW_BYTES, windows


def test_a_stream_window_below_16_kib_is_refused() -> None:
    with pytest.raises(ConfigError, match="stream_window_bytes"):
        LimitsConfig(stream_window_bytes=1000)
