"""The durable-commit context the coordinator's pieces share.

Each call that changes state does so inside ``durably()``, which journals the change to the
``StateStore`` together with the events it emitted; the events reach the event log once the
store has made both durable, and the call awaits ``state.sync()`` before it answers (a group
commit shared with the calls waiting at the same moment).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from fedlink.coordinator.state import StateStore
from fedlink.metrics import EventLog


class Journal:
    """``durably()`` for one coordinator; ``after_each`` hooks run when a block ends."""

    def __init__(self, state: StateStore, events: EventLog) -> None:
        self.state = state
        self._events = events
        self._after: list[Callable[[], None]] = []

    def after_each(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` at the end of every ``durably()`` block (the time rules re-arm)."""
        self._after.append(hook)

    @contextlib.contextmanager
    def durably(self) -> Iterator[None]:
        """Journal the state changed inside together with the events it emitted."""
        with self._events.captured() as held:
            try:
                yield
            finally:
                self.state.save_events(held)
                self.state.on_durable(functools.partial(self._write_events, held))
                for hook in self._after:
                    hook()

    def _write_events(self, held: list[dict[str, Any]]) -> None:
        self._events.write_captured(held)
        self.state.events_written(held)
