"""Following a simulated run from its flush events: the progress bar and the target stop.

:class:`FlushWatch` is an ``EventLog.on_flush`` subscriber: it is told of each new model
version as its ``flush`` event is written, so the bar moves and a target accuracy is noticed on
the flush that reached it, with nothing polling the log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fedlink.metrics.kinds import Flush


class ProgressBar(Protocol):
    """What the watch draws on (``fedlink.metrics.console.RunProgress``)."""

    def update(self, round: int, accuracy: float | None, bytes_up: int,
               bytes_down: int) -> None:
        """Show ``round`` flushes done, the latest accuracy and the traffic so far."""


class FlushWatch:
    """Counts flushes and traffic for ``bar``; calls ``on_target`` once, with the first flush
    whose accuracy reaches ``target_accuracy`` (0: no target).

    Runs on the log writer's thread under its lock: ``on_target`` must only hand the news on
    (``loop.call_soon_threadsafe``), never end the run itself.
    """

    def __init__(self, bar: ProgressBar, target_accuracy: float = 0.0,
                 on_target: Callable[[Flush], None] | None = None) -> None:
        self._bar = bar
        self._target = target_accuracy
        self._on_target = on_target
        self.rounds = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.reached: Flush | None = None
        """The first flush that reached the target, once one has."""

    def __call__(self, flush: Flush) -> None:
        self.rounds += 1
        self.bytes_up += int(flush.bytes_up or 0)
        self.bytes_down += int(flush.bytes_down or 0)
        self._bar.update(self.rounds, flush.accuracy, self.bytes_up, self.bytes_down)
        if (self._target > 0 and self.reached is None
                and (flush.accuracy or 0.0) >= self._target):
            self.reached = flush
            if self._on_target is not None:
                self._on_target(flush)
