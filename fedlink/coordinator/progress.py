"""What the coordinator is doing, in its log: one line per flush, and a line when stuck.

``fedlink serve -v`` printed nothing between "listening" and the end of the run, even when a
``sync`` round had waited ten minutes for clients that could not get through. Now every flush
is logged (version, updates, refusals since the last flush, accuracy, round time), and a round
that has waited ``limits.stuck_after_s`` without a flush is logged once, naming the clients it
waits for and the settings that would let it move on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("fedlink.coordinator")

MAX_NAMED = 10
"""Clients named in a stuck line (the rest are counted)."""


@dataclass
class RoundState:
    """Where the current round stands, as the engine sees it."""

    version: int
    age_s: float
    updates_in: int
    goal: int
    waiting_for: Sequence[str]


class ProgressLog:
    """Writes the flush and stuck lines; ``stuck_after_s = 0`` never writes a stuck line."""

    def __init__(self, stuck_after_s: float) -> None:
        self.stuck_after_s = stuck_after_s
        self.refused_since_flush = 0
        self._stuck_reported: int | None = None

    def refused(self) -> None:
        """An update was refused (counted into the next flush line)."""
        self.refused_since_flush += 1

    def flushed(self, version: int, num_updates: int, round_seconds: float,
                metrics: Mapping[str, Any]) -> None:
        """Log one flush."""
        accuracy = metrics.get("accuracy")
        shown = f"{accuracy:.4f}" if isinstance(accuracy, int | float) else "n/a"
        log.info("flush: version %d from %d updates (%d refused since the last flush), "
                 "accuracy %s, round %.1f s", version, num_updates, self.refused_since_flush,
                 shown, round_seconds)
        self.refused_since_flush = 0

    def due(self, version: int, age_s: float) -> bool:
        """Whether the round of ``version``, ``age_s`` old, should be reported stuck now
        (cheap: the caller gathers the ``RoundState`` only then)."""
        return bool(self.stuck_after_s) and age_s >= self.stuck_after_s \
            and self._stuck_reported != version

    def stuck(self, state: RoundState) -> None:
        """Log the stuck line for ``state`` (once per version)."""
        self._stuck_reported = state.version
        named = ", ".join(sorted(state.waiting_for)[:MAX_NAMED]) or "no client holds a task"
        more = len(state.waiting_for) - MAX_NAMED
        log.warning("stuck: the round of version %d has waited %.0f s with %d of goal %d "
                    "updates in; waiting for %s%s. To move on without them set "
                    "[coordinator.flush] deadline_s with min_updates below goal, or a shorter "
                    "[coordinator.limits] liveness_timeout_s", state.version, state.age_s,
                    state.updates_in, state.goal, named, f" and {more} more" if more > 0 else "")
