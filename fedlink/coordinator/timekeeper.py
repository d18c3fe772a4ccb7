"""The coordinator's time rules, applied when they fall due: a round's deadline, releasing
silent clients' tasks (each client judged against its own link: ``silence_bound``),
forgetting silent clients and idle uploads, the stuck line.

The alarm (``fedlink.coordinator.timers.Alarm``) rings from ``Clock.call_at`` at the earliest
instant a rule can have something to do; after each change it is re-armed with an O(1)
bound, and after each ring with the exact next instant (a scan of tasks, clients, uploads).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from fedlink.clock import Clock
from fedlink.coordinator.config import LimitsConfig
from fedlink.coordinator.engine import FlushOutcome, RoundEngine
from fedlink.coordinator.heartbeat import silence_bound
from fedlink.coordinator.journal import Journal
from fedlink.coordinator.progress import ProgressLog
from fedlink.coordinator.registry import ClientRegistry
from fedlink.coordinator.timers import Alarm, strictly_after
from fedlink.coordinator.uploads import UploadStore
from fedlink.metrics import EventLog, kinds


class TimeKeeper:
    """Applies the time rules (``poll``) each time one falls due (``keep_time``).

    ``forget(client_id)`` forgets an expired client everywhere; ``on_flush`` is told a flush
    the deadline made; ``wake()`` wakes long-polling clients.
    """

    def __init__(self, limits: LimitsConfig, clock: Clock, engine: RoundEngine,
                 registry: ClientRegistry, uploads: UploadStore, progress: ProgressLog,
                 journal: Journal, events: EventLog, forget: Callable[[str], None],
                 on_flush: Callable[[FlushOutcome], None], wake: Callable[[], None]) -> None:
        self.limits = limits
        self._clock = clock
        self.engine = engine
        self.registry = registry
        self.uploads = uploads
        self.progress = progress
        self._journal = journal
        self._events = events
        self._forget = forget
        self._on_flush = on_flush
        self._wake = wake
        self._alarm = Alarm(clock)
        journal.after_each(self.changed)
        registry.after_stream(self.changed)  # a client's bound falls back when it ends

    def changed(self) -> None:
        """Something changed: ring by the soonest instant a rule may now fall due (at once
        when the run is over: ``keep_time`` journals the end and stops)."""
        self._alarm.arm(self._clock.now() if self.engine.finished else self._soonest_new_due())

    async def keep_time(self) -> None:
        """Apply the time rules each time one falls due, until the run ends (a background
        task of the server): the alarm rings from ``Clock.call_at``, never from a poll."""
        self._alarm.start(asyncio.get_running_loop())
        try:
            while not self.engine.finished:
                await self._alarm.wait()
                self.poll()
                await self._journal.state.sync()  # what poll changed (or an end) is journaled
        finally:
            self._alarm.stop()

    def poll(self) -> None:
        """Apply the deadline rule and the liveness check (when one falls due, ``keep_time``).

        Places released by either are offered at once to clients waiting in ``GetTask``.
        """
        with self._journal.durably():
            expired = self._expire()
            released = self.engine.release_silent(
                self.registry.last_seen, self.silence_bound,
                self.registry.gaps.transferring) or expired
            outcome = self.engine.poll()
        if outcome is not None:
            self._on_flush(outcome)
        elif released or self.engine.rule.deadline_s is not None:
            self._wake()
        if not self.engine.finished and self.progress.due(self.engine.version,
                                                          self.engine.round_age_s()):
            self.progress.stuck(self.engine.round_state())
        due = self.next_due()
        if due is not None:  # what was due now was just done: the next wake is after now
            self._alarm.arm(strictly_after(self._clock.now(), due))

    def next_due(self) -> float | None:
        """The earliest instant a time rule (deadline, liveness, expiry, stuck line) has
        something to do, as things stand; a scan of tasks, clients and uploads."""
        due = [self.engine.next_due(self.registry.last_seen, self.silence_bound),
               self._stuck_due()]
        oldest_seen = self.registry.oldest_seen()
        if self.limits.client_ttl_s and oldest_seen is not None:
            due.append(oldest_seen + self.limits.client_ttl_s)
        due.append(self.uploads.next_expiry())
        return min((t for t in due if t is not None), default=None)

    def silence_bound(self, client_id: str) -> float | None:
        """How long ``client_id`` may be silent while holding a task (``None``: the check is
        off): ``limits.liveness_timeout``, or a multiple of the p99 gap between its signs of
        life when its link has shown longer ones, or ``limits.max_liveness_timeout`` while one
        of its transfer streams is open (``fedlink.coordinator.heartbeat``)."""
        base, most = self.limits.liveness_timeout, self.limits.max_liveness_timeout
        if base is None or most is None:
            return None
        if self.registry.gaps.transferring(client_id):
            return most  # a stream of its own is open: its connection answers keepalives
        return silence_bound(self.registry.gaps.p99(client_id), base,
                             self.limits.liveness_gap_multiple, most)

    def _soonest_new_due(self) -> float | None:
        """A bound on when a rule can fall due after a change, in O(1): the round's deadline
        and stuck line exactly, and for the rules counted from a client's last activity
        (liveness, task age, expiry) the shortest of their periods from now (no client's
        silence bound is below ``liveness_timeout``). ``keep_time``
        computes the exact instant once woken."""
        limits, now = self.limits, self._clock.now()
        periods = [p for p in (limits.liveness_timeout, limits.max_task_s, limits.client_ttl_s,
                               limits.upload_idle_s) if p]
        due = [t for t in (self.engine.deadline_at(), self._stuck_due()) if t is not None]
        due += [now + p for p in periods]
        return min(due, default=None)

    def _stuck_due(self) -> float | None:
        """When the current round is to be reported stuck (``None``: never, or it was)."""
        started = self.engine.round_started_at
        if started is None or self.engine.finished or not self.progress.due(
                self.engine.version, math.inf):
            return None
        return started + self.progress.stuck_after_s

    def _expire(self) -> bool:
        """Forget clients silent for ``client_ttl_s`` and uploads idle for ``upload_idle_s``.

        Returns whether a client went (its cohort place may have freed).
        """
        self.uploads.expire_idle()
        ttl = self.limits.client_ttl_s
        if not ttl:
            return False
        silent = self.registry.silent_since(self._clock.now() - ttl)
        for client_id in silent:
            self._forget(client_id)
            self._events.emit(kinds.ClientExpired.build(
                client_id=client_id,
                reason=f"silent for more than {ttl:g} s (limits.client_ttl_s)"))
        return bool(silent)
