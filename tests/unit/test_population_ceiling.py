"""A real-gRPC simulation whose population saturates its one event loop stops with an error
naming that ceiling (and the virtual mode), not a bare gRPC status; below the ceiling's size,
and for errors that are not retried, the client's own error goes through unchanged."""

from __future__ import annotations

import pytest
from conftest import run_async

from fedlink.errors import Cancelled, InvalidArgument, RemoteError
from fedlink.metrics import EventLog
from fedlink.sim.runner import CEILING_HINT_CLIENTS, PopulationCeiling, _run_sessions


class GivesUp:
    """A session whose retry policy gave up with ``error`` (or one that finishes cleanly)."""

    def __init__(self, error: RemoteError | None = None) -> None:
        self.error = error

    async def run(self) -> object:
        if self.error is not None:
            raise self.error
        return object()


class Finished:
    async def wait_finished(self) -> None:
        return None


def _run(sessions: list[GivesUp]) -> None:
    run_async(_run_sessions(sessions, Finished(), EventLog(None), rounds=1,  # type: ignore[arg-type]
                            progress=False))


def test_a_retried_call_given_up_in_a_large_population_names_the_ceiling() -> None:
    sessions = [GivesUp() for _ in range(CEILING_HINT_CLIENTS - 1)]
    sessions.append(GivesUp(Cancelled("CANCELLED")))
    with pytest.raises(PopulationCeiling) as caught:
        _run(sessions)
    message = str(caught.value)
    assert f"{CEILING_HINT_CLIENTS:,} clients" in message
    assert 'mode = "virtual"' in message and "CANCELLED" in message
    assert isinstance(caught.value.cause, Cancelled)


def test_small_populations_and_errors_that_are_not_retried_go_through_unchanged() -> None:
    with pytest.raises(Cancelled):
        _run([GivesUp(), GivesUp(Cancelled("CANCELLED"))])
    big = [GivesUp() for _ in range(CEILING_HINT_CLIENTS)]
    with pytest.raises(InvalidArgument):
        _run([*big, GivesUp(InvalidArgument("bad"))])
