"""Flush reporting: each new version is evaluated off the event loop and logged as one
``flush`` event, in version order, then handed to the run's lifecycle (its stop rules).

The reporter also counts the round's ``bytes_down``: every payload byte sent since the last
flush, as it was sent, and the same split into ``bytes_down_model``, ``bytes_down_delta`` and
``bytes_down_evaluation`` (``fedlink.coordinator.downloads``), which each flush event carries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from fedlink.coordinator.engine import FlushOutcome
from fedlink.coordinator.journal import Journal
from fedlink.coordinator.lifecycle import RunLifecycle
from fedlink.coordinator.outcomes import (
    Evaluator,
    RoundBytesDown,
    central_metrics,
    flush_fields,
)
from fedlink.coordinator.progress import ProgressLog
from fedlink.coordinator.state import FlushRecord
from fedlink.metrics import EventLog, kinds

__all__ = ["Evaluator", "FlushReporter"]


class FlushReporter:
    """Queues flushes as they are made (``made``) and reports them (``run``, a background
    task); ``wake()`` wakes long-polling clients at each new version."""

    def __init__(self, journal: Journal, events: EventLog, progress: ProgressLog,
                 lifecycle: RunLifecycle, evaluator: Evaluator | None,
                 wake: Callable[[], None]) -> None:
        self._journal = journal
        self._events = events
        self._progress = progress
        self._lifecycle = lifecycle
        self._evaluator = evaluator
        self._wake = wake
        self._flushes: asyncio.Queue[tuple[FlushOutcome, dict[str, int], float | None]] = \
            asyncio.Queue()
        self._round_down = RoundBytesDown()

    def sent(self, kind: str, num_bytes: int) -> None:
        """``num_bytes`` of a ``kind`` payload (model, delta, evaluation) were sent."""
        self._round_down.sent(kind, num_bytes)

    def made(self, outcome: FlushOutcome) -> None:
        """A new version was made: report it (with this round's ``bytes_down``)."""
        self._flushes.put_nowait((outcome, self._round_down.take(), self._events.elapsed()))
        self._wake()

    def unreported(self, record: FlushRecord, model: np.ndarray) -> None:
        """A flush a previous process made and did not report (a restart)."""
        self._flushes.put_nowait((_outcome(record, model), RoundBytesDown().take(), None))

    async def run(self) -> None:
        """Evaluate each new version off the event loop and log its ``flush`` event.

        Runs as one background task so evaluation never delays a call, and flush events come
        out in version order.
        """
        while True:
            outcome, bytes_down, made = await self._flushes.get()
            if not self._lifecycle.reports(outcome.version):  # made after the run's last
                with self._journal.durably():
                    self._journal.state.mark_reported(outcome.version)
                continue
            metrics = await asyncio.to_thread(central_metrics, self._evaluator, outcome.model)
            fields = {**flush_fields(outcome, bytes_down, metrics), "made_elapsed": made}
            with self._journal.durably():
                self._events.emit(kinds.Flush.build(**fields))
                self._journal.state.mark_reported(outcome.version)
            await self._journal.state.sync()
            self._progress.flushed(outcome.version, outcome.num_updates,
                                   outcome.round_seconds, metrics)
            self._lifecycle.flush_reported(outcome.version, fields, outcome.model)


def _outcome(record: FlushRecord, model: np.ndarray) -> FlushOutcome:
    """A flush made by a previous process, to report now."""
    return FlushOutcome(record.version, model, record.num_updates, record.total_weight,
                        record.round_seconds, record.bytes_up, record.finished,
                        dict(record.hook_report), record.task_ids)
