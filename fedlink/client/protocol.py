"""One client's lifecycle as a sans-IO state machine: what it does next, from what it heard.

``ClientProtocol`` holds no connection, reads no clock and runs no trainer. A driver tells it
what happened (``heard``) and performs the action it answers, then tells it the result, and so
on. ``ClientSession`` (``fedlink.client.session``) drives it over gRPC on the real clock; the
virtual loop (``fedlink.sim.virtual.loop``) drives it on a manual clock, timing transfers and
training instead of doing them over a network. Every phase, and what follows each outcome of
a phase, is decided here once, so the two drivers agree by construction.

A training task::

    CheckIn --Task--> Download --ModelReceived--> Train --Trained--> Encode --Encoded-->
    Deliver --Accepted | Refused | Lost--> CheckIn

A training task of a secure run (``ProtocolSettings.secure``: the run's config says so) is
delivered through secure aggregation instead of ``Deliver``. Its first two phases (advertise
keys, share keys) need no update, so they run beside the download and the training: the
task's ``Download`` says so (``exchange_keys``) and the driver starts them then. The last two
follow the encoding, the masked upload once the key exchange has ended::

    ... Encode --Encoded--> MaskedUpload --PhaseDone--> Unmask
    --Accepted | Refused | Lost--> CheckIn

An evaluation task::

    CheckIn --Task--> Download --ModelReceived--> Evaluate --Scored--> Report
    --Accepted | Lost--> CheckIn   (nothing to report: CheckIn at once)

Between tasks: ``Wait`` answers ``WaitFor`` and, once ``Slept``, ``CheckIn``; ``Finished``
answers ``Stop``, as does reaching ``max_tasks``. A task lost in any phase (``Lost``, or
``Refused`` for a closed task) goes back to ``CheckIn``. Times are given to the protocol with
what it heard (``at``): a task's deadline is an instant on the driver's clock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fedlink.client.base import TrainPlan
from fedlink.errors import (
    DataLoss,
    NotFound,
    PermissionDenied,
    RemoteError,
    Unauthenticated,
    UpdateRefused,
)
from fedlink.messages import Finished, Task, TaskKind, TaskReply, Wait

__all__ = [
    "TASK_FAILURES",
    "Accepted",
    "Action",
    "CheckIn",
    "ClientProtocol",
    "Deliver",
    "Download",
    "Encode",
    "Encoded",
    "Evaluate",
    "Heard",
    "Lost",
    "MaskedUpload",
    "ModelReceived",
    "Offered",
    "Phase",
    "PhaseDone",
    "ProtocolError",
    "ProtocolSettings",
    "Refused",
    "Report",
    "Scored",
    "Slept",
    "Stop",
    "Train",
    "Trained",
    "Unmask",
    "WaitFor",
    "outcome_of",
    "plan_for",
    "travels_inline",
]

TASK_FAILURES = (DataLoss, NotFound, Unauthenticated, PermissionDenied)
"""Failures that lose one task but let the client go on: corrupted bytes, a task or client the
coordinator forgot (the next check-in joins again), a task that is no longer the client's."""


class ProtocolError(RuntimeError):
    """A driver told the protocol something that cannot happen in its current phase."""


# -- what a client hears ----------------------------------------------------------------------


@dataclass(frozen=True)
class Offered:
    """The coordinator's answer to a check-in (a task, wait, or the run is over), at ``at``."""

    reply: TaskReply
    at: float = 0.0


@dataclass(frozen=True)
class Slept:
    """A ``WaitFor`` is over."""


@dataclass(frozen=True)
class ModelReceived:
    """The task's model (version ``version``) is held, downloaded or already there."""

    version: int


@dataclass(frozen=True)
class Trained:
    """Local training ended at ``at`` (whatever work it did: the coordinator judges it)."""

    at: float = 0.0


@dataclass(frozen=True)
class Encoded:
    """The update went through the pipeline: ``num_bytes`` of payload, kept until answered."""

    num_bytes: int


@dataclass(frozen=True)
class Scored:
    """An evaluation ended: its report, or its decline (no local examples, or scores that
    are not finite numbers), is to be sent."""


@dataclass(frozen=True)
class Accepted:
    """The coordinator took the task's update (or evaluation report)."""


@dataclass(frozen=True)
class Refused:
    """The coordinator refused the update (too stale, round full, run over): ``reason``."""

    reason: str


@dataclass(frozen=True)
class Lost:
    """The task was lost on the way (corrupted bytes, a forgotten task or client): ``reason``."""

    reason: str


@dataclass(frozen=True)
class PhaseDone:
    """A phase of secure aggregation closed with this client still in its group."""


Heard = (Offered | Slept | ModelReceived | Trained | Encoded | Scored | Accepted | Refused | Lost
         | PhaseDone)


# -- what a client does -----------------------------------------------------------------------


@dataclass(frozen=True)
class CheckIn:
    """Ask for a task, saying which model version the client holds (-1: none)."""

    held_version: int


@dataclass(frozen=True)
class WaitFor:
    """Ask again after ``seconds``; tell the protocol ``Slept`` then. ``declined``: the task
    the client declined (it cannot evaluate), which stays open at the coordinator."""

    seconds: float
    declined: Task | None = None


@dataclass(frozen=True)
class Stop:
    """The client is done: the run is over (``run_over``, the coordinator's ``reason``), or it
    did the tasks it was asked to."""

    reason: str
    run_over: bool = False


@dataclass(frozen=True)
class Download:
    """Fetch ``task``'s model; ``held_version`` is what the client holds (the same version:
    nothing to fetch; an older one: a delta may do). ``exchange_keys``: a secure training
    task, whose key exchange (advertise, share) starts now and runs beside the download and
    the training."""

    task: Task
    held_version: int
    exchange_keys: bool = False

    @property
    def needed(self) -> bool:
        """Whether any bytes must come: the client does not hold the task's version."""
        return self.held_version != self.task.model_version


@dataclass(frozen=True)
class Train:
    """Train on ``task``'s model, stopping early at ``deadline`` (``None``: none)."""

    task: Task
    deadline: float | None


@dataclass(frozen=True)
class Encode:
    """Turn the trained change into the task's update (privacy, compression) and keep it;
    ``time_left_s`` until the deadline lets the pipeline size it (``None``: no deadline)."""

    task: Task
    time_left_s: float | None


@dataclass(frozen=True)
class Deliver:
    """Send the update and commit it; ``inline``: it travels inside the commit (no upload)."""

    task: Task
    num_bytes: int
    inline: bool


@dataclass(frozen=True)
class Evaluate:
    """Score ``task``'s model on the local data."""

    task: Task


@dataclass(frozen=True)
class Report:
    """Send ``task``'s evaluation report."""

    task: Task


@dataclass(frozen=True)
class MaskedUpload:
    """Secure phase 3, once the key exchange the ``Download`` started has ended: send the
    masked update; who delivered and who dropped come back."""

    task: Task


@dataclass(frozen=True)
class Unmask:
    """Secure phase 4: send the shares that unmask the group's sum (then ``Accepted``)."""

    task: Task


Action = (CheckIn | WaitFor | Stop | Download | Train | Encode | Deliver | Evaluate | Report
          | MaskedUpload | Unmask)


# -- the machine ------------------------------------------------------------------------------


class Phase(enum.Enum):
    """Where a client is in its lifecycle (what it waits to hear)."""

    CHECKING_IN = "checking_in"
    WAITING = "waiting"
    DOWNLOADING = "downloading"
    TRAINING = "training"
    ENCODING = "encoding"
    DELIVERING = "delivering"
    EVALUATING = "evaluating"
    REPORTING = "reporting"
    MASKING = "masking"
    UNMASKING = "unmasking"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ProtocolSettings:
    """What the run (``RunConfig``) and the client say about its lifecycle.

    ``inline_bytes``: an update of at most this many bytes travels inside its commit (0:
    never). ``can_evaluate``: the client has an evaluator (a task to evaluate without one is
    declined: the client waits ``decline_wait_s`` before it asks again, as the task stays open
    at the coordinator). ``max_tasks``: stop after this many training tasks (``None``: go on
    until the run is over). ``secure``: training tasks deliver through secure aggregation.
    """

    inline_bytes: int = 0
    can_evaluate: bool = True
    decline_wait_s: float = 5.0
    max_tasks: int | None = None
    secure: bool = False


@dataclass
class ClientProtocol:
    """One client's lifecycle (module docstring); ``held_version`` is the model version it
    holds (-1: none), kept across tasks."""

    settings: ProtocolSettings = field(default_factory=ProtocolSettings)
    held_version: int = -1
    phase: Phase = Phase.CHECKING_IN
    task: Task | None = None
    started: float = 0.0
    """When the current task was offered (on the driver's clock)."""
    tasks: int = 0
    """Training tasks started so far."""
    outcome: Heard | None = None
    """How the last task ended (``Accepted``, ``Refused`` or ``Lost``; ``None`` before)."""

    def start(self) -> Action:
        """The first action: check in (or stop at once when ``max_tasks`` is 0)."""
        return self._next_task()

    @property
    def deadline(self) -> float | None:
        """The current task's deadline on the driver's clock (``None``: it has none)."""
        task = self._current()
        return self.started + task.deadline_s if task.deadline_s > 0 else None

    def heard(self, event: Heard) -> Action:
        """What to do now that ``event`` happened (``ProtocolError`` if it cannot, now)."""
        if isinstance(event, Lost | Refused) and self.phase in _TASK_PHASES:
            return self._ended(event)
        handler = _HANDLERS.get((self.phase, type(event)))
        if handler is None:
            raise ProtocolError(f"{type(event).__name__} heard while {self.phase.value}")
        return handler(self, event)

    # -- transitions (one per phase and what it heard) ---------------------------------------

    def _offered(self, event: Offered) -> Action:
        reply = event.reply
        if isinstance(reply, Finished):
            return self._stop(reply.reason or "run finished", run_over=True)
        if isinstance(reply, Wait):
            self.phase = Phase.WAITING
            return WaitFor(reply.retry_after_s)
        if reply.kind is TaskKind.EVALUATE and not self.settings.can_evaluate:
            self.phase = Phase.WAITING  # the task stays open there: do not ask again at once
            return WaitFor(self.settings.decline_wait_s, declined=reply)
        if reply.kind is TaskKind.TRAIN:
            self.tasks += 1
        self.task, self.started, self.outcome = reply, event.at, None
        self.phase = Phase.DOWNLOADING
        return Download(reply, self.held_version,
                        exchange_keys=self.settings.secure and reply.kind is TaskKind.TRAIN)

    def _slept(self, event: Slept) -> Action:
        return self._check_in()

    def _received(self, event: ModelReceived) -> Action:
        task = self._current()
        if event.version != task.model_version:
            raise ProtocolError(f"model version {event.version} received for a task of "
                                f"version {task.model_version}")
        self.held_version = event.version
        if task.kind is TaskKind.EVALUATE:
            self.phase = Phase.EVALUATING
            return Evaluate(task)
        self.phase = Phase.TRAINING
        return Train(task, self.deadline)

    def _trained(self, event: Trained) -> Action:
        deadline = self.deadline
        self.phase = Phase.ENCODING
        return Encode(self._current(), None if deadline is None else deadline - event.at)

    def _encoded(self, event: Encoded) -> Action:
        if self.settings.secure:
            self.phase = Phase.MASKING
            return MaskedUpload(self._current())
        self.phase = Phase.DELIVERING
        return Deliver(self._current(), event.num_bytes,
                       travels_inline(event.num_bytes, self.settings.inline_bytes))

    def _phase_done(self, event: PhaseDone) -> Action:
        phase, action = _SECURE_NEXT[self.phase]
        self.phase = phase
        return action(self._current())

    def _scored(self, event: Scored) -> Action:
        self.phase = Phase.REPORTING
        return Report(self._current())

    def _accepted(self, event: Accepted) -> Action:
        return self._ended(event)

    # -- helpers ------------------------------------------------------------------------------

    def _ended(self, outcome: Heard | None) -> Action:
        """The task is over (``outcome``: how; ``None``: nothing was sent): the next one."""
        self.task, self.outcome = None, outcome
        return self._next_task()

    def _next_task(self) -> Action:
        limit = self.settings.max_tasks
        if limit is not None and self.tasks >= limit:
            return self._stop(f"did the {limit} tasks asked for")
        return self._check_in()

    def _check_in(self) -> Action:
        self.phase = Phase.CHECKING_IN
        return CheckIn(self.held_version)

    def _stop(self, reason: str, run_over: bool = False) -> Action:
        self.phase = Phase.STOPPED
        return Stop(reason, run_over)

    def _current(self) -> Task:
        if self.task is None:
            raise ProtocolError(f"no task while {self.phase.value}")
        return self.task


_TASK_PHASES = frozenset({Phase.DOWNLOADING, Phase.TRAINING, Phase.ENCODING, Phase.DELIVERING,
                          Phase.EVALUATING, Phase.REPORTING, Phase.MASKING, Phase.UNMASKING})

_SECURE_NEXT: dict[Phase, tuple[Phase, Callable[[Task], Action]]] = {
    Phase.MASKING: (Phase.UNMASKING, Unmask),
}
"""The secure phase that follows each one that closed, and its action."""

_HANDLERS: dict[tuple[Phase, type], Callable[[ClientProtocol, Any], Action]] = {
    (Phase.CHECKING_IN, Offered): ClientProtocol._offered,
    (Phase.WAITING, Slept): ClientProtocol._slept,
    (Phase.DOWNLOADING, ModelReceived): ClientProtocol._received,
    (Phase.TRAINING, Trained): ClientProtocol._trained,
    (Phase.ENCODING, Encoded): ClientProtocol._encoded,
    (Phase.EVALUATING, Scored): ClientProtocol._scored,
    (Phase.DELIVERING, Accepted): ClientProtocol._accepted,
    (Phase.REPORTING, Accepted): ClientProtocol._accepted,
    (Phase.MASKING, PhaseDone): ClientProtocol._phase_done,
    (Phase.UNMASKING, Accepted): ClientProtocol._accepted,
}
"""Which transition handles what a client hears in each phase (anything else is refused)."""


# -- shared rules -----------------------------------------------------------------------------


def travels_inline(num_bytes: int, inline_bytes: int) -> bool:
    """Whether an update of ``num_bytes`` travels inside its commit (the run's
    ``inline_bytes``: at most that many; 0 turns it off)."""
    return 0 < num_bytes <= inline_bytes


def outcome_of(err: RemoteError) -> Refused | Lost | None:
    """How a task ends on ``err``: refused, lost, or ``None`` when the error must stop the
    client (it is neither a refusal nor a failure of this task alone)."""
    if isinstance(err, UpdateRefused):
        return Refused(err.detail)
    if isinstance(err, TASK_FAILURES):
        return Lost(str(err))
    return None


def plan_for(task: Task, batch_size: int, learning_rate: float,
             options: Mapping[str, str], seed: int,
             deadline: float | None = None) -> TrainPlan:
    """The local training a training ``task`` asks for, with the run's batch size, learning
    rate and trainer ``options``, the client's ``seed`` and the task's ``deadline``."""
    return TrainPlan(local_steps=task.local_steps, local_epochs=task.local_epochs,
                     batch_size=batch_size, learning_rate=learning_rate, deadline=deadline,
                     seed=seed, options=dict(options), model_version=task.model_version)
