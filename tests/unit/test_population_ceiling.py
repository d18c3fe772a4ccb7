"""A real-gRPC simulation's client that gives up on a retried call drops out and the run goes
on; only when every client ended before the run did is there an error, naming the event
loop's ceiling for a large population (and the virtual mode) or, below it, the clients' retry
budget. Errors that are not retried still stop the run, unchanged. Once the run is over, a
client still on the network after the end grace is cut off."""

from __future__ import annotations

import asyncio

import pytest
from conftest import run_async

from fedlink.client import SessionStats
from fedlink.errors import Cancelled, InvalidArgument, RemoteError, Unavailable
from fedlink.metrics import EventLog
from fedlink.sim.runner import (
    CEILING_HINT_CLIENTS,
    CUT_OFF,
    GAVE_UP,
    ClientsGaveUp,
    PopulationCeiling,
    _run_sessions,
)


class GivesUp:
    """A session whose retry policy gave up with ``error`` (or one that finishes cleanly)."""

    def __init__(self, error: RemoteError | None = None) -> None:
        self.error = error
        self.stats = SessionStats()

    async def run(self) -> SessionStats:
        if self.error is not None:
            raise self.error
        self.stats.finished = "rounds done"
        return self.stats


class Lifecycle:
    def __init__(self, finished: bool) -> None:
        self.finished = asyncio.Event()
        if finished:
            self.finished.set()


class Server:
    """A coordinator whose run finished (the clients that stayed saw it through) or not."""

    def __init__(self, finished: bool) -> None:
        self.finished = finished

    @property
    def lifecycle(self) -> Lifecycle:
        return Lifecycle(self.finished)

    async def wait_finished(self) -> None:
        if not self.finished:
            await asyncio.Event().wait()  # never: run_async's bound fails the test


class StillOnTheNetwork(GivesUp):
    """A session stuck in a call that never returns (a link down past the run's end)."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = False

    async def run(self) -> SessionStats:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return self.stats


def _run(sessions: list[GivesUp], finished: bool = True) -> list[SessionStats]:
    return run_async(_run_sessions(sessions, Server(finished), EventLog(None),  # type: ignore[arg-type]
                                   rounds=1, progress=False, end_grace_s=0.05))


def test_a_client_that_gives_up_drops_out_and_the_run_goes_on() -> None:
    sessions = [GivesUp(), GivesUp(Unavailable("link down")), GivesUp()]
    stats = _run(sessions)
    assert [s.finished for s in stats] == ["rounds done", f"{GAVE_UP}UNAVAILABLE: link down",
                                           "rounds done"]


def test_every_client_ended_before_the_run_in_a_large_population_names_the_ceiling() -> None:
    sessions = [GivesUp(Cancelled("CANCELLED")) for _ in range(CEILING_HINT_CLIENTS)]
    with pytest.raises(PopulationCeiling) as caught:
        _run(sessions, finished=False)
    message = str(caught.value)
    assert f"{CEILING_HINT_CLIENTS:,} clients" in message
    assert 'mode = "virtual"' in message and "CANCELLED" in message
    assert isinstance(caught.value.cause, Cancelled)


def test_below_the_ceiling_the_error_names_the_retry_budget() -> None:
    with pytest.raises(ClientsGaveUp, match=r"2 of them giving up .*\[client\.retry\]"):
        _run([GivesUp(), GivesUp(Cancelled("x")), GivesUp(Unavailable("y"))], finished=False)


def test_errors_that_are_not_retried_go_through_unchanged() -> None:
    with pytest.raises(InvalidArgument):
        _run([GivesUp(), GivesUp(InvalidArgument("bad"))])
    big = [GivesUp() for _ in range(CEILING_HINT_CLIENTS)]
    with pytest.raises(InvalidArgument):
        _run([*big, GivesUp(InvalidArgument("bad"))])


def test_a_client_still_on_the_network_after_the_end_grace_is_cut_off() -> None:
    stuck = StillOnTheNetwork()
    stats = _run([GivesUp(), stuck])
    assert [s.finished for s in stats] == ["rounds done", CUT_OFF]
    assert stuck.cancelled  # its session was stopped, not left running
