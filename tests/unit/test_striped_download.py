"""Striped downloads (``fedlink.client.transfer``): a payload fetched in ranges over several
connections, an idle connection taking over from a busy one."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from conftest import run_async

from fedlink.client.liveness import Progress
from fedlink.client.stats import SessionStats
from fedlink.client.transfer import Stripe, StripedPayload, Transfers
from fedlink.errors import DataLoss
from fedlink.messages import DataChunk, DownloadRequest, TensorHeader
from fedlink.wire import checksum

CHUNK = 16 << 10
PAYLOAD = np.random.default_rng(3).bytes(1 << 20)


def payload(total: int, ways: int) -> StripedPayload:
    return StripedPayload(total, ways, DownloadRequest("c", "t"))


def test_a_payload_starts_as_contiguous_ranges_that_cover_it() -> None:
    assert [(s.next, s.end) for s in payload(10, 3).stripes] == [(0, 3), (3, 6), (6, 10)]


def test_an_idle_connection_takes_the_upper_half_of_the_largest_range_left() -> None:
    striped = payload(1000, 2)
    striped.stripes[0].next = 100  # 400 left; the second range: 500
    taken = striped.steal(minimum=10)
    assert taken is not None and (taken.next, taken.end) == (750, 1000)
    assert (striped.stripes[1].next, striped.stripes[1].end) == (500, 750)
    assert striped.left == 400 + 250 + 250


def test_a_range_too_small_to_split_is_taken_whole_once() -> None:
    striped = payload(1000, 2)
    striped.stripes[0].next = 500  # done
    striped.stripes[1].next = 990  # 10 left: under 2 x 8
    taken = striped.steal(minimum=8)
    assert taken == Stripe(990, 1000, whole=True)
    assert striped.stripes[1].left == 0
    # the connection it was taken from finds nothing to take back
    assert striped.steal(minimum=8) is None


class Link:
    """A fake link serving ``PAYLOAD``'s ranges in ``CHUNK`` pieces; ``hang_after`` chunks
    into its first stream, it stops sending (a connection deep in TCP backoff)."""

    def __init__(self, hang_after: int | None = None, honours_end: bool = True) -> None:
        self.hang_after = hang_after
        self.honours_end = honours_end
        self.requests: list[DownloadRequest] = []
        self.closed = 0
        self.can_take_over = True
        self.gave_connection_to: list[Link] = []

    def exchange(self, other: Link, why: str) -> None:
        self.gave_connection_to.append(other)

    async def download(self, request: DownloadRequest,
                 progress: Progress | None = None) -> AsyncGenerator[DataChunk, None]:
        self.requests.append(request)
        end = request.end_offset if self.honours_end and request.end_offset else len(PAYLOAD)
        try:
            for n, offset in enumerate(range(request.offset, end, CHUNK)):
                if n == self.hang_after and len(self.requests) == 1:
                    await asyncio.Event().wait()
                await asyncio.sleep(0)  # the other connection's turn
                yield DataChunk(offset, PAYLOAD[offset:min(offset + CHUNK, end)])
        finally:
            self.closed += 1


async def no_retry(fn: Callable[[], Awaitable[Any]], what: str, transfer: bool = False) -> Any:
    return await fn()


def header() -> TensorHeader:
    return TensorHeader("fp32", (len(PAYLOAD) // 4,), "float32", len(PAYLOAD),
                        checksum(PAYLOAD))


def download(first: Link, *lanes: Link) -> bytes:
    transfers = Transfers(first, no_retry, SessionStats(), CHUNK, lanes=lambda: lanes)
    return run_async(transfers._download("c", "t", header(), delta=False))


def test_a_striped_download_fetches_disjoint_ranges_over_each_connection() -> None:
    first, second = Link(), Link()
    assert download(first, second) == PAYLOAD
    assert (first.requests[0].offset, first.requests[0].end_offset) == (0, len(PAYLOAD) // 2)
    # the last range runs to the payload's end: 0, as a download on one connection asks
    assert (second.requests[0].offset, second.requests[0].end_offset) == (len(PAYLOAD) // 2, 0)


def test_a_connection_that_stops_sending_is_overtaken_and_its_stream_closed() -> None:
    stuck, moving = Link(hang_after=1), Link()
    assert download(stuck, moving) == PAYLOAD  # no stall bound needed: nothing waits on it
    assert len(stuck.requests) == 1 and stuck.closed == 1
    # the first connection's calls go on over the one that moved
    assert stuck.gave_connection_to == [moving] and not moving.gave_connection_to
    # the moving connection took the stuck one's range over, by halves and then whole
    taken = [(r.offset, r.end_offset) for r in moving.requests[1:]]
    assert taken[0] == (CHUNK + (len(PAYLOAD) // 2 - CHUNK) // 2, len(PAYLOAD) // 2)
    assert taken[-1][0] == CHUNK


def test_a_coordinator_that_streams_to_the_end_is_read_only_as_far_as_the_range() -> None:
    # a coordinator before protocol 1.1 ignores end_offset
    first, second = Link(honours_end=False), Link(honours_end=False)
    assert download(first, second) == PAYLOAD


def test_a_chunk_out_of_place_is_data_loss() -> None:
    class Shifted(Link):
        async def download(self, request: DownloadRequest,
                 progress: Progress | None = None) -> AsyncGenerator[DataChunk, None]:
            yield DataChunk(request.offset + 1, b"x")

    with pytest.raises(DataLoss):
        download(Shifted(), Link())


class Short(Link):
    """A link whose every stream ends after its first chunk."""

    async def download(self, request: DownloadRequest,
                       progress: Progress | None = None) -> AsyncGenerator[DataChunk, None]:
        yield DataChunk(request.offset, PAYLOAD[request.offset:request.offset + CHUNK])


@pytest.mark.parametrize("ways", [1, 2])
def test_a_stream_that_ends_before_its_range_is_data_loss(ways: int) -> None:
    links = [Short() for _ in range(ways)]
    with pytest.raises(DataLoss, match="short of offset"):
        download(links[0], *links[1:])


def test_connections_failing_together_leave_no_failure_unheard(
        caplog: pytest.LogCaptureFixture) -> None:
    """Both stripes fail in the same turn: the download fails with one of them, and the other's
    failure is taken too, not left to be reported as an exception nobody retrieved."""
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with pytest.raises(DataLoss, match="short of offset"):
            download(Short(), Short())
        gc.collect()  # an unretrieved task exception is reported when the task is collected
    assert not [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
