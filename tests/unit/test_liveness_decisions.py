"""When the client changes connections, and when a transfer counts as stalled: the decisions
of ``fedlink.client.liveness`` and ``Transport``, with a manual clock and no network."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from fedlink.client.liveness import (
    RTT_WINDOW,
    LinkEstimate,
    LivenessConfig,
    Progress,
    reopen_reason,
)
from fedlink.client.transport import Transport
from fedlink.errors import ConfigError
from fedlink.messages import UploadChunk

CFG = LivenessConfig(min_ping_timeout_s=5.0, max_ping_timeout_s=120.0, rtt_multiple=4.0,
                     widen_factor=3.0, min_stall_s=10.0)
NOWHERE = "127.0.0.1:9"  # never dialled: no call is made in these tests


class ManualClock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def test_a_live_channel_is_kept_whatever_the_estimate_says() -> None:
    assert reopen_reason(5.0, 40.0, dead=False, stalled=False) is None
    assert reopen_reason(40.0, 5.0, dead=False, stalled=False) is None


def test_a_dead_channel_is_replaced_only_to_take_up_another_timeout() -> None:
    assert reopen_reason(5.0, 5.0, dead=True, stalled=False) is None  # gRPC reconnects it
    assert "5.0 s -> 20.0 s" in (reopen_reason(5.0, 20.0, dead=True, stalled=False) or "")
    assert reopen_reason(80.0, 120.0, dead=True, stalled=False) is None  # not worth one
    assert reopen_reason(80.0, 40.0, dead=True, stalled=False) is None
    assert "80.0 s -> 20.0 s" in (reopen_reason(80.0, 20.0, dead=True, stalled=False) or "")


def test_a_stalled_channel_is_always_replaced() -> None:
    assert reopen_reason(20.0, 20.0, dead=False, stalled=True) == "a transfer stalled"


def test_progress_is_judged_on_the_clock_it_is_given() -> None:
    clock = ManualClock()
    progress = Progress(clock)
    clock.t += 9.0
    assert not progress.stalled(10.0)
    progress.moved()  # a chunk went through: the watch starts again
    clock.t += 9.0
    assert not progress.stalled(10.0) and progress.idle_s() == 9.0
    clock.t += 1.5
    assert progress.stalled(10.0) and progress.events == 1


def test_the_stall_window_follows_the_link_within_its_bounds() -> None:
    link = LinkEstimate(CFG, queued_bytes=1 << 20)
    assert link.stall_s() == 10.0  # nothing learned: the floor
    link.observe_rtt(5.0)
    assert link.stall_s() == 20.0  # four round trips
    # progress comes in chunks sized to arrive within the floor: neither the bytes queued on
    # the link nor calls without reply stretch the wait on a stalled connection
    link.observe_transfer(1 << 20, 8.0)
    link.no_reply()
    assert link.stall_s() == 20.0
    for _ in range(20):
        link.observe_rtt(60.0)
    assert link.stall_s() == 120.0  # capped at max_ping_timeout_s
    with pytest.raises(ConfigError, match="min_stall_s"):
        LivenessConfig(min_stall_s=0.0)
    with pytest.raises(ConfigError, match="min_stall_s"):
        LivenessConfig(max_ping_timeout_s=60.0, min_stall_s=61.0)


def test_download_chunks_are_asked_small_enough_to_show_progress_within_the_stall_bound() -> None:
    link = LinkEstimate(CFG)
    assert link.progress_chunk_bytes(1 << 20) == 128 << 10  # no goodput measured yet
    link.observe_transfer(1 << 20, 25.0)  # 40 kB/s: a MiB chunk would take 25 s > 10 s
    assert link.progress_chunk_bytes(1 << 20) == int((1 << 20) / 25.0 * 10.0 / 4)
    for _ in range(RTT_WINDOW - 1):  # fast transfers between slow ones: the slow one counts
        link.observe_transfer(1 << 20, 0.4)
    assert link.progress_chunk_bytes(1 << 20) == int((1 << 20) / 25.0 * 10.0 / 4)
    link.observe_transfer(1 << 20, 0.4)  # the slow one has left the window
    assert link.progress_chunk_bytes(1 << 20) == 1 << 20  # the ceiling wins
    assert link.progress_chunk_bytes(0) > 1 << 20  # 0: no ceiling asked
    link.observe_transfer(1 << 20, 25.0)  # a slow one counts at once
    assert link.progress_chunk_bytes(1 << 20) == int((1 << 20) / 25.0 * 10.0 / 4)
    slow = LinkEstimate(CFG)
    slow.observe_transfer(64 << 10, 600.0)
    assert slow.progress_chunk_bytes(1 << 20) == 16 << 10  # never below the floor


def test_only_a_stall_of_a_connection_that_moved_nothing_doubles_the_stall_floor() -> None:
    link = LinkEstimate(CFG)
    assert link.stall_s() == 10.0
    link.stalled(fresh_one_too=False)  # a connection that had carried transfers
    assert link.stall_s() == 10.0 and link.stalls == 1
    link.stalled(fresh_one_too=True)  # the fresh one stalled too: the link is at fault
    assert link.stall_floor_s() == 20.0 and link.stall_s() == 20.0
    link.stalled(fresh_one_too=True)
    assert link.stall_s() == 40.0
    for _ in range(10):
        link.stalled(fresh_one_too=True)
    assert link.stall_s() == 120.0  # capped at max_ping_timeout_s


def test_a_ping_timeout_that_killed_a_connection_is_not_taken_up_again() -> None:
    link = LinkEstimate(CFG)
    assert link.channel_ping_timeout_s() == 5.0
    link.ping_died(5.0)  # acks waited longer than 5 s behind a lossy upload
    for _ in range(10):
        link.succeeded()  # the widening goes back ...
    assert link.widen == 1.0
    assert link.channel_ping_timeout_s() == 20.0  # ... but not below 3 x 5 s, rounded up
    assert reopen_reason(5.0, link.channel_ping_timeout_s(), dead=True, stalled=False)


def test_a_ping_timeout_of_many_round_trips_that_killed_a_connection_is_kept() -> None:
    link = LinkEstimate(CFG)
    for rtt in (0.02, 1.5, 0.03):  # a 20 ms link; one call queued behind a lossy transfer
        link.observe_rtt(rtt)
    assert link.channel_ping_timeout_s() == 5.0
    # 5 s is over a hundred of the link's round trips: the ping was lost, not slow
    assert not link.ping_died(5.0)
    assert link.widen == 1.0 and link.channel_ping_timeout_s() == 5.0
    # gRPC brings the channel back with it: no channel of fedlink's own
    assert reopen_reason(5.0, link.channel_ping_timeout_s(), dead=True, stalled=False) is None
    # a link whose round trips explain the death still asks for longer timeouts
    far = LinkEstimate(CFG)
    far.observe_rtt(2.0)
    assert far.ping_died(5.0) and far.channel_ping_timeout_s() > 5.0


def test_a_death_before_any_round_trip_raises_the_floor_until_round_trips_are_known() -> None:
    short = LinkEstimate(CFG)
    assert short.ping_died(5.0)  # the first Join died: the link may be that long
    assert short.channel_ping_timeout_s() == 20.0
    for rtt in (1.2, 0.03, 0.5):  # then the link shows 30 ms round trips under loss
        short.observe_rtt(rtt)
        short.succeeded()
    # 5 s is over a hundred of them: that death was a spell of loss, and the floor lapses
    assert short.channel_ping_timeout_s() == 5.0
    assert reopen_reason(20.0, short.channel_ping_timeout_s(), dead=True, stalled=False)
    # a link whose round trips do explain the death keeps it
    far = LinkEstimate(CFG)
    assert far.ping_died(5.0)
    for _ in range(8):
        far.observe_rtt(1.5)  # 4 x 1.5 s > 5 s: acks were slow, not lost
        far.succeeded()
    assert far.channel_ping_timeout_s() == 20.0  # 4 x 1.5 s alone would ask for 10 s


def test_a_transfer_split_for_progress_keeps_its_bytes_and_offsets() -> None:
    async def main() -> None:
        async with Transport(NOWHERE, liveness=CFG) as transport:
            transport.link.observe_transfer(1 << 20, 25.0)  # 40 kB/s: ~100 kB per piece
            chunk = UploadChunk("c", "u", 1000, bytes(range(256)) * 2048)
            pieces = list(transport._progress_pieces(chunk))
            step = transport.link.progress_chunk_bytes(len(chunk.data))
            assert len(pieces) > 1 and all(len(p.data) <= step for p in pieces)
            assert b"".join(p.data for p in pieces) == chunk.data
            assert [p.offset for p in pieces] == [1000 + i * step for i in range(len(pieces))]

    asyncio.run(main())


def test_the_transport_opens_no_connection_when_the_estimate_moves() -> None:
    async def main() -> None:
        async with Transport(NOWHERE, liveness=CFG) as transport:
            for rtt in (0.5, 3.0, 9.0, 0.2, 25.0):  # across several power-of-two steps
                transport.link.observe_rtt(rtt)
                transport._fit_channel()
            assert transport.link.channel_ping_timeout_s() != transport.ping_timeout_s
            assert transport.channels_opened == 1
            assert transport.ping_timeout_s == 5.0

    asyncio.run(main())


def test_the_transport_takes_up_a_new_timeout_when_the_connection_died() -> None:
    async def main() -> None:
        async with Transport(NOWHERE, liveness=CFG) as transport:
            # a deadline missed: no reply, the timeouts widen, but the connection may be fine
            transport._failed(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
                              transport._fit_channel())
            transport._fit_channel()
            assert transport.channels_opened == 1
            transport._failed(rpc_error(grpc.StatusCode.UNAVAILABLE,
                                        "Stream removed (ping timeout)"),
                              transport._fit_channel())
            transport._fit_channel()
            assert transport.channels_opened == 2
            assert transport.ping_timeout_s == 80.0  # widened twice: 45 s, rounded up
            transport._fit_channel()  # a working channel stays
            assert transport.channels_opened == 2

    asyncio.run(main())


def test_a_connection_that_a_spell_of_loss_killed_keeps_its_channel() -> None:
    async def main() -> None:
        async with Transport(NOWHERE, liveness=CFG) as transport:
            for _ in range(3):
                transport.link.observe_rtt(0.02)
            transport.link.observe_rtt(1.5)  # a call queued behind a lossy transfer
            # pings may wait behind 2 MiB at 400 kB/s: the link asks for more than 5 s now
            transport.link.queued_bytes = 2 << 20
            transport.link.observe_transfer(1 << 20, 2.5)
            assert transport.link.channel_ping_timeout_s() >= 10.0
            transport._failed(rpc_error(grpc.StatusCode.UNAVAILABLE,
                                        "Stream removed (ping timeout)"),
                              transport._fit_channel())
            transport._fit_channel()
            # gRPC reconnects the channel itself, with the same 5 s: fedlink opens none
            assert transport.channels_opened == 1 and transport.ping_timeout_s == 5.0

    asyncio.run(main())


def test_a_stall_moves_the_next_call_to_a_connection_of_its_own() -> None:
    async def main() -> None:
        async with Transport(NOWHERE, liveness=CFG) as transport:
            err = transport._stall("upload", 12.0, transport._fit_channel())
            assert err.retryable and "no progress for 12.0 s" in err.detail
            transport._fit_channel()
            assert transport.channels_opened == 2 and transport.stalls == 1
            assert transport.link.widen == 1.0  # a stall is not a call without reply
            assert transport.link.stall_floor_s() == 20.0  # the first carried nothing either
            transport._fit_channel()  # a working channel stays
            assert transport.channels_opened == 2

    asyncio.run(main())
