"""A task's life: its states and the legal moves between them, written in one place.

::

    ISSUED ──► RELEASED ──┐        (deadline passed below min_updates, client went silent:
      │  └───► OVERDUE ───┤         its place goes to another client, it may still deliver)
      │                   ▼
      └──────────► DELIVERED │ DROPPED │ CLOSED

    EVALUATING ──► EVALUATED │ CLOSED       (evaluation tasks: ``fedlink.coordinator.evaluations``)

An ``ISSUED`` task holds a place in its version's cohort. ``RELEASED`` and ``OVERDUE`` tasks
hold none but may still deliver while within ``max_staleness``; a ``RELEASED`` task's client
may be asked again for the same version, an ``OVERDUE`` one's (not delivered ``max_task_s``
after it was issued) may not. An evaluation task (``EVALUATING``) holds no place and delivers
no update: it ends ``EVALUATED`` when its report is accepted, or ``CLOSED`` when it expired or
its client left. The training tasks' three ends: ``DELIVERED`` (its update was accepted),
``DROPPED`` (its update was refused for what it carries, partial work under
``drop_partial`` or no work at all, and still answers for its place) and ``CLOSED`` (its
client left, or such an update of an earlier round, which answers for nothing).

Task ids are written by ``TaskIds`` alone; the engine reads a task's version from its record,
and the version of a task it no longer keeps from the table of the task numbers each version
started at, never from the text of the id.
"""

from __future__ import annotations

import bisect
import enum


class TaskState(enum.Enum):
    """Where one task stands (see the module docstring)."""

    ISSUED = "issued"
    RELEASED = "released"
    OVERDUE = "overdue"
    DELIVERED = "delivered"
    DROPPED = "dropped"
    CLOSED = "closed"
    EVALUATING = "evaluating"
    EVALUATED = "evaluated"

    @property
    def holds_place(self) -> bool:
        """Whether the task keeps another client out of its version's cohort."""
        return self is TaskState.ISSUED

    @property
    def deliverable(self) -> bool:
        """Whether an update for the task may still come (staleness permitting)."""
        return self in _DELIVERABLE

    @property
    def asked(self) -> bool:
        """Whether the task counts as "its client was asked for this version" (rounds: one
        task per client per version). A released task does not: its client may be asked
        again, and it keeps the task it was given (the engine hands back an open task)."""
        return self is not TaskState.RELEASED

    @property
    def evaluation(self) -> bool:
        """Whether the state is one of an evaluation task's (which holds no place and
        delivers no update)."""
        return self in (TaskState.EVALUATING, TaskState.EVALUATED)


_DELIVERABLE = frozenset({TaskState.ISSUED, TaskState.RELEASED, TaskState.OVERDUE})
_ENDS = frozenset({TaskState.DELIVERED, TaskState.DROPPED, TaskState.CLOSED})

TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.ISSUED: frozenset({TaskState.RELEASED, TaskState.OVERDUE}) | _ENDS,
    TaskState.RELEASED: _ENDS,
    TaskState.OVERDUE: _ENDS,
    TaskState.DELIVERED: frozenset(),
    TaskState.DROPPED: frozenset(),
    TaskState.CLOSED: frozenset(),
    TaskState.EVALUATING: frozenset({TaskState.EVALUATED, TaskState.CLOSED}),
    TaskState.EVALUATED: frozenset(),
}
"""Every legal move; anything else is a bug in the engine (``IllegalTransition``)."""


class IllegalTransition(RuntimeError):
    """A task was asked to move where its state machine does not go."""


def checked_move(task_id: str, current: TaskState, to: TaskState) -> TaskState:
    """``to``, when ``current -> to`` is in ``TRANSITIONS``."""
    if to not in TRANSITIONS[current]:
        raise IllegalTransition(f"task {task_id!r} cannot go from {current.value} to "
                                f"{to.value}")
    return to


class TaskIds:
    """Writes task ids (``t<number>-v<version>``, as on the wire) and remembers, per version,
    the first task number issued for it, so that the version of a task the engine no longer
    keeps comes from data. One int per version."""

    def __init__(self) -> None:
        self._starts: list[int] = []  # first task number of each version, ascending
        self._versions: list[int] = []

    @classmethod
    def restored(cls, tasks: list[tuple[str, int]]) -> TaskIds:
        """The table rebuilt from the ``(task_id, version)`` of the tasks a restart took back
        (versions before the oldest of them are forgotten: ``predates``)."""
        ids = cls()
        numbered = sorted((n, v) for n, v in ((_number(t), v) for t, v in tasks) if n is not None)
        for number, version in numbered:
            ids.issued(number, version)
        return ids

    @property
    def first_version(self) -> int:
        """The oldest version the table knows (0 for a fresh engine)."""
        return self._versions[0] if self._versions else 0

    def predates(self, task_id: str) -> bool:
        """Whether ``task_id`` looks like an id from before the oldest version the table knows
        (a restarted engine does not know the versions of tasks it had forgotten)."""
        number = _number(task_id)
        return (number is not None and self.first_version > 0
                and number < self._starts[0])

    @staticmethod
    def make(number: int, version: int) -> str:
        """The id of task ``number``, issued for ``version``."""
        return f"t{number}-v{version}"

    def issued(self, number: int, version: int) -> None:
        """Task ``number`` was issued for ``version`` (numbers only grow)."""
        if not self._versions or version > self._versions[-1]:
            self._starts.append(number)
            self._versions.append(version)

    def version_of(self, task_id: str) -> int | None:
        """The version an id this engine wrote was issued for (``None``: not one of its ids,
        or older than anything the table knows, as after a restart)."""
        number = _number(task_id)
        if number is None:
            return None
        at = bisect.bisect_right(self._starts, number) - 1
        if at < 0:
            return None
        version = self._versions[at]
        return version if self.make(number, version) == task_id else None


def _number(task_id: str) -> int | None:
    """The sequence number at the front of an id ``TaskIds.make`` wrote."""
    head, dash, _ = task_id.partition("-")
    digits = head[1:]
    if not dash or head[:1] != "t" or not digits.isdigit() or not digits.isascii():
        return None
    return int(digits)


class TaskPace:
    """How long an open task may show no progress before it stops holding its cohort place.

    Progress is what the coordinator sees a task do: it is issued, bytes of its model go
    down, bytes of its update come up, its update is committed. A task quiet for longer than
    ``allowance`` loses its place (it may still deliver, like any released task), whatever
    heartbeats its client sends: heartbeats say a client is alive, not that it trains.

    The allowance comes from the link and the task, not a fixed half hour: while bytes move,
    a transfer is progress however slow the link; the quiet part of a task is its training,
    bounded by ``multiple`` times the median of the longest quiet stretch of the tasks this
    run saw delivered (the last ``keep``), and never below ``stall_s`` (the liveness timeout,
    what the link allows for silence). Before any task was delivered: ``multiple x stall_s``.
    """

    def __init__(self, stall_s: float | None, multiple: float, since: float,
                 keep: int = 32) -> None:
        self.stall_s = stall_s
        self.multiple = multiple
        self._since = since  # tasks restored from an earlier process count from here
        self._last: dict[str, float] = {}  # task id -> its last progress
        self._quietest: dict[str, float] = {}  # task id -> its longest quiet stretch so far
        self._delivered: list[float] = []  # longest quiet stretch of recent delivered tasks
        self._keep = keep

    @property
    def enabled(self) -> bool:
        """Whether quiet tasks lose their place at all (``multiple`` and ``stall_s`` set)."""
        return bool(self.multiple and self.stall_s)

    def allowance(self) -> float | None:
        """How long a task may be quiet now (``None``: no bound)."""
        if not self.enabled:
            return None
        assert self.stall_s is not None
        if not self._delivered:
            return self.multiple * self.stall_s
        ordered = sorted(self._delivered)
        median = ordered[len(ordered) // 2]
        return max(self.stall_s, self.multiple * median)

    def progressed(self, task_id: str, issued_at: float, now: float) -> None:
        """``task_id`` (issued at ``issued_at``) made progress at ``now``."""
        quiet = now - self._last_progress(task_id, issued_at)
        self._quietest[task_id] = max(self._quietest.get(task_id, 0.0), quiet)
        self._last[task_id] = now

    def delivered(self, task_id: str, issued_at: float, now: float) -> None:
        """``task_id``'s update was accepted at ``now``: its quiet stretch is a measure."""
        self.progressed(task_id, issued_at, now)
        self._delivered.append(self._quietest.pop(task_id, 0.0))
        del self._delivered[:-self._keep]
        self._last.pop(task_id, None)

    def forget(self, task_id: str) -> None:
        """``task_id`` ended otherwise (released, closed): nothing more to time."""
        self._last.pop(task_id, None)
        self._quietest.pop(task_id, None)

    def due(self, task_id: str, issued_at: float) -> float | None:
        """When ``task_id`` loses its place unless it progresses (``None``: never)."""
        allowance = self.allowance()
        if allowance is None:
            return None
        return self._last_progress(task_id, issued_at) + allowance

    def quiet_for(self, task_id: str, issued_at: float, now: float) -> float:
        """Seconds since ``task_id`` last made progress."""
        return now - self._last_progress(task_id, issued_at)

    def _last_progress(self, task_id: str, issued_at: float) -> float:
        return self._last.get(task_id, max(issued_at, self._since))
