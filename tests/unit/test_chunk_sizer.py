"""ChunkSizer, and uploads that use it: smaller chunks after a break, larger after clean sends,
a lazily generated stream, and resumption from the offset the coordinator reports.

The link is a fake: no network, and retries never sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from fedlink.client import ChunkSizer, RetryPolicy, SessionStats
from fedlink.client.liveness import Progress
from fedlink.client.retry import Caller
from fedlink.client.transfer import (
    MAX_CHUNK_BYTES,
    MIN_CHUNK_BYTES,
    LinkBreaks,
    SegmentSizer,
    Transfers,
)
from fedlink.errors import ConfigError, Unavailable
from fedlink.messages import (
    DataChunk,
    DownloadRequest,
    TensorHeader,
    UploadChunk,
    UploadReply,
    UploadStatusRequest,
)

pytestmark = pytest.mark.timeout(30)
KiB = 1 << 10


def test_halves_after_failures_down_to_the_minimum() -> None:
    sizer = ChunkSizer(256 * KiB, minimum=16 * KiB, maximum=1024 * KiB)
    sizes = []
    for _ in range(6):
        sizer.failed()
        sizes.append(sizer.size // KiB)
    assert sizes == [128, 64, 32, 16, 16, 16]


def test_doubles_after_clean_transfers_up_to_the_maximum() -> None:
    sizer = ChunkSizer(16 * KiB, minimum=16 * KiB, maximum=256 * KiB)
    sizes = []
    for _ in range(6):
        sizer.succeeded()
        sizes.append(sizer.size // KiB)
    assert sizes == [32, 64, 128, 256, 256, 256]


def test_recovers_after_the_link_heals() -> None:
    sizer = ChunkSizer(64 * KiB, minimum=16 * KiB, maximum=64 * KiB)
    sizer.failed()
    sizer.failed()
    assert sizer.size == 16 * KiB
    sizer.succeeded()
    sizer.succeeded()
    assert sizer.size == 64 * KiB


@pytest.mark.parametrize(("start", "expected"), [(1, 16 * KiB), (8 << 20, 1024 * KiB)])
def test_start_is_clamped_into_the_bounds(start: int, expected: int) -> None:
    assert ChunkSizer(start).size == expected


def test_for_server_starts_at_and_never_exceeds_the_servers_chunk_size() -> None:
    sizer = ChunkSizer.for_server(256 * KiB)
    assert (sizer.size, sizer.minimum, sizer.maximum) == (256 * KiB, MIN_CHUNK_BYTES, 256 * KiB)
    sizer.succeeded()
    assert sizer.size == 256 * KiB
    big = ChunkSizer.for_server(3 << 20)  # above our own cap
    assert big.size == big.maximum == MAX_CHUNK_BYTES
    tiny = ChunkSizer.for_server(100)  # below our minimum: the server's size wins
    tiny.failed()
    assert (tiny.size, tiny.minimum, tiny.maximum) == (100, 100, 100)
    unset = ChunkSizer.for_server(0)  # a coordinator that names no size
    assert unset.size == unset.maximum == MAX_CHUNK_BYTES


@pytest.mark.parametrize(("minimum", "maximum"), [(0, 10), (20, 10)])
def test_invalid_bounds_are_config_errors(minimum: int, maximum: int) -> None:
    with pytest.raises(ConfigError):
        ChunkSizer(10, minimum=minimum, maximum=maximum)


# -- uploads through a fake link --------------------------------------------------------------


class FakeLink:
    """Holds uploaded bytes like the coordinator; the first uploads break after some chunks."""

    def __init__(self, breaks_after: list[int]) -> None:
        self.breaks_after = list(breaks_after)  # chunks accepted before each break
        self.held = bytearray()
        self.pulled: list[int] = []  # chunk sizes the stream produced, per attempt
        self.attempt_sizes: list[list[int]] = []
        self.status_calls = 0

    async def upload(self, chunks: Iterator[UploadChunk], patience: float = 1.0) -> UploadReply:
        limit = self.breaks_after.pop(0) if self.breaks_after else None
        sizes: list[int] = []
        self.attempt_sizes.append(sizes)
        for n, chunk in enumerate(chunks):
            if limit is not None and n == limit:
                raise Unavailable("connection reset")
            assert chunk.offset == len(self.held)
            self.held += chunk.data
            sizes.append(len(chunk.data))
        return UploadReply("u", len(self.held))

    async def upload_status(self, request: UploadStatusRequest) -> UploadReply:
        self.status_calls += 1
        return UploadReply(request.upload_id, len(self.held))

    def download(self, request: DownloadRequest,
                 progress: Progress | None = None) -> AsyncIterator[DataChunk]:
        raise NotImplementedError


async def no_sleep(_: float) -> None:
    return None


def transfers(link: FakeLink, chunk_bytes: int) -> tuple[Transfers, SessionStats]:
    stats = SessionStats()
    caller = Caller(RetryPolicy(max_attempts=10), stats, sleep=no_sleep)
    return Transfers(link, caller, stats, chunk_bytes), stats


def test_upload_shrinks_chunks_after_breaks_and_resumes_where_the_server_is() -> None:
    data = bytes(range(256)) * 1024  # 256 KiB
    link = FakeLink(breaks_after=[2, 2])
    t, stats = transfers(link, chunk_bytes=64 * KiB)
    asyncio.run(t.upload("c1", "u", data, resume=False))
    assert bytes(link.held) == data
    # after a break, chunks shrink to a quarter of the (shrunk) segment a stream carries
    assert [s[0] // KiB for s in link.attempt_sizes if s] == [64, 16, 16, 16]
    assert link.status_calls == 2  # only the retries ask where to resume
    assert stats.retries == 2
    assert stats.resumed_bytes == 128 * KiB + (128 + 32) * KiB
    # each attempt started where the server was: only the chunk in flight at each reset
    # (64 KiB, then 16 KiB) was sent twice
    assert stats.bytes_up == len(data) + 64 * KiB + 16 * KiB
    assert t.up.size == 64 * KiB  # two clean segments since the last break


def test_upload_stream_is_generated_lazily() -> None:
    """A reset after the first chunk has not made (or counted) the chunks after it."""
    data = bytes(1 << 20)
    link = FakeLink(breaks_after=[1])
    t, stats = transfers(link, chunk_bytes=16 * KiB)
    made: list[int] = []
    original = t._chunks

    def counting(*args: object) -> Iterator[UploadChunk]:
        for chunk in original(*args):  # type: ignore[arg-type]
            made.append(chunk.offset)
            yield chunk

    t._chunks = counting  # type: ignore[method-assign,assignment]
    asyncio.run(t.upload("c1", "u", data, resume=False))
    # first attempt: 1 chunk taken, the 2nd made when the link broke; no pre-built list
    assert made[:3] == [0, 16 * KiB, 16 * KiB]
    assert stats.bytes_up == len(data) + 16 * KiB  # the chunk lost to the reset counts as sent


def test_resumed_upload_asks_first_and_sends_nothing_when_all_is_held() -> None:
    data = b"x" * 1000
    link = FakeLink(breaks_after=[])
    link.held += data
    t, stats = transfers(link, chunk_bytes=100)
    asyncio.run(t.upload("c1", "u", data, resume=True))
    assert link.status_calls == 1
    assert link.attempt_sizes == []
    assert (stats.resumed_bytes, stats.bytes_up) == (1000, 0)


# -- SegmentSizer: how much one Upload stream carries ------------------------------------------


def test_segment_grows_without_breaks_and_settles_under_the_bytes_between_breaks() -> None:
    sizer = SegmentSizer(start=1 << 20, minimum=64 * KiB, maximum=64 << 20)
    for _ in range(10):  # a clean link: doubling up to the maximum
        sizer.succeeded(sizer.size)
    assert sizer.size == 64 << 20
    for _ in range(20):  # a link that breaks after about 1 MiB confirmed, again and again
        confirmed = 0
        while confirmed < 1 << 20:
            confirmed += sizer.size
            sizer.succeeded(sizer.size)
        sizer.failed()
    # a segment stays at most about a quarter of the bytes the link carries between breaks
    assert 64 * KiB <= sizer.size <= 512 * KiB
    for _ in range(30):  # the link heals: the current run raises the cap again
        sizer.succeeded(sizer.size)
    assert sizer.size == 64 << 20


def test_breaks_seen_by_a_download_size_the_first_upload_segment() -> None:
    """The model download and the upload share a link: a link that broke under the download
    starts the upload with segments of about a quarter of what it carried between breaks."""
    breaks = LinkBreaks()
    sizer = SegmentSizer(start=1 << 20, minimum=64 * KiB, maximum=64 << 20, breaks=breaks)
    assert sizer.size == 1 << 20  # nothing known about the link
    for _ in range(3):  # the download breaks after about 400 KiB, three times
        breaks.carried(400 * KiB)
        breaks.broke()
    assert sizer.size == 100 * KiB
    breaks.carried(4 << 20)  # a long clean run (the current one) raises the cap again
    assert sizer.size == 1 << 20


class BreakingDownloads(FakeLink):
    """A link whose downloads break after ``break_after`` bytes, resuming from any offset."""

    def __init__(self, model: bytes, break_after: int) -> None:
        super().__init__(breaks_after=[])
        self.model = model
        self.break_after = break_after

    async def _stream(self, request: DownloadRequest) -> AsyncIterator[DataChunk]:
        end = min(len(self.model), request.offset + self.break_after)
        for offset in range(request.offset, end, 16 * KiB):
            yield DataChunk(offset, self.model[offset:min(offset + 16 * KiB, end)])
        if end < len(self.model):
            raise Unavailable("connection reset")

    def download(self, request: DownloadRequest,
                 progress: Progress | None = None) -> AsyncIterator[DataChunk]:
        return self._stream(request)


def test_an_upload_after_a_breaking_download_sends_small_segments_from_the_start() -> None:
    model = bytes(2 << 20)
    link = BreakingDownloads(model, break_after=512 * KiB)
    t, _ = transfers(link, chunk_bytes=1 << 20)
    header = TensorHeader(encoding="fp32", shape=(len(model) // 4,), dtype="float32",
                          num_bytes=len(model), checksum="")
    assert asyncio.run(t._download("c1", "t1", header, delta=False)) == model
    asyncio.run(t.upload("c1", "u", bytes(1 << 20), resume=False))
    # segments of a quarter of the 512 KiB the link carried between breaks, chunks of a
    # quarter of a segment: a reset in the first segment could only have lost 128 KiB
    assert link.attempt_sizes[0] == [32 * KiB] * 4


def test_segment_bounds_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        SegmentSizer(start=10, minimum=20, maximum=30)


def test_an_upload_that_keeps_moving_outlasts_its_retry_policy() -> None:
    """Seven breaks against a policy of three attempts: each attempt moved the upload on, so a
    fresh policy follows; one that moves nothing gives up as before."""
    data = bytes(range(256)) * 1024  # 256 KiB in 16 KiB chunks
    link = FakeLink(breaks_after=[2] * 7)
    stats = SessionStats()
    caller = Caller(RetryPolicy(max_attempts=3), stats, sleep=no_sleep)
    t = Transfers(link, caller, stats, chunk_bytes=16 * KiB)
    asyncio.run(t.upload("c1", "u", data, resume=False))
    assert bytes(link.held) == data and stats.retries == 7

    stuck = FakeLink(breaks_after=[0] * 7)  # every attempt breaks before its first chunk
    t = Transfers(stuck, Caller(RetryPolicy(max_attempts=3), SessionStats(), sleep=no_sleep),
                  SessionStats(), chunk_bytes=16 * KiB)
    with pytest.raises(Unavailable):
        asyncio.run(t.upload("c1", "u", data, resume=False))
    assert len(stuck.attempt_sizes) == 3
