"""Flush reporting: each new version is evaluated off the event loop and logged as one
``flush`` event, in version order, then handed to the run's lifecycle (its stop rules).

The reporter also counts the round's ``bytes_down``: every payload byte sent since the last
flush, as it was sent, and the same split into ``bytes_down_model``, ``bytes_down_delta`` and
``bytes_down_evaluation`` (``fedlink.coordinator.downloads``), which each flush event carries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedlink.coordinator.downloads import DELTA, EVALUATION, MODEL
from fedlink.coordinator.engine import FlushOutcome
from fedlink.coordinator.journal import Journal
from fedlink.coordinator.lifecycle import RunLifecycle
from fedlink.coordinator.progress import ProgressLog
from fedlink.coordinator.state import FlushRecord
from fedlink.metrics import EventLog, kinds

log = logging.getLogger(__name__)

KINDS = (MODEL, DELTA, EVALUATION)

Evaluator = Callable[[np.ndarray], Mapping[str, float]]


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
        self._flushes: asyncio.Queue[tuple[FlushOutcome, dict[str, int]]] = asyncio.Queue()
        self._round_down = _no_bytes_down()

    def sent(self, kind: str, num_bytes: int) -> None:
        """``num_bytes`` of a ``kind`` payload (model, delta, evaluation) were sent."""
        self._round_down["bytes_down"] += num_bytes
        self._round_down[f"bytes_down_{kind}"] += num_bytes

    def made(self, outcome: FlushOutcome) -> None:
        """A new version was made: report it (with this round's ``bytes_down``)."""
        self._flushes.put_nowait((outcome, self._round_down))
        self._round_down = _no_bytes_down()
        self._wake()

    def unreported(self, record: FlushRecord, model: np.ndarray) -> None:
        """A flush a previous process made and did not report (a restart)."""
        self._flushes.put_nowait((_outcome(record, model), _no_bytes_down()))

    async def run(self) -> None:
        """Evaluate each new version off the event loop and log its ``flush`` event.

        Runs as one background task so evaluation never delays a call, and flush events come
        out in version order.
        """
        while True:
            outcome, bytes_down = await self._flushes.get()
            if not self._lifecycle.reports(outcome.version):  # made after the run's last
                with self._journal.durably():
                    self._journal.state.mark_reported(outcome.version)
                continue
            metrics = await self._evaluate(outcome.model)
            fields = {"model_version": outcome.version, "num_updates": outcome.num_updates,
                      "total_weight": outcome.total_weight,
                      "round_seconds": outcome.round_seconds, "bytes_up": outcome.bytes_up,
                      **bytes_down, "updates": list(outcome.task_ids),
                      **dict(outcome.hook_report), **metrics}
            with self._journal.durably():
                self._events.emit(kinds.Flush.build(**fields))
                self._journal.state.mark_reported(outcome.version)
            await self._journal.state.sync()
            self._progress.flushed(outcome.version, outcome.num_updates,
                                   outcome.round_seconds, metrics)
            self._lifecycle.flush_reported(outcome.version, fields, outcome.model)

    async def _evaluate(self, model: np.ndarray) -> dict[str, Any]:
        if self._evaluator is None:
            return {}
        try:
            return dict(await asyncio.to_thread(self._evaluator, model))
        except Exception as exc:  # an evaluator bug must not stop training; it is recorded
            log.exception("evaluating the global model failed")
            return {kinds.EVALUATION_ERROR: f"{type(exc).__name__}: {exc}"}


def _no_bytes_down() -> dict[str, int]:
    """A round's ``bytes_down`` counters, all zero."""
    return dict.fromkeys(("bytes_down", *(f"bytes_down_{kind}" for kind in KINDS)), 0)


def _outcome(record: FlushRecord, model: np.ndarray) -> FlushOutcome:
    """A flush made by a previous process, to report now."""
    return FlushOutcome(record.version, model, record.num_updates, record.total_weight,
                        record.round_seconds, record.bytes_up, record.finished,
                        dict(record.hook_report), record.task_ids)
