"""Federated evaluation tasks: which clients score which global model, and their reports.

``[coordinator.evaluation] fraction, every`` (``EvaluationConfig``): on every version that is
a multiple of ``every``, and on the run's final version whatever ``every`` says, the same
number of clients evaluate: ``evaluators(n, fraction)`` of the ``n`` joined clients that
advertised the ``evaluate`` capability at ``Join`` (when the version's first check-in comes),
those with the smallest coins seeded by the run's seed, the client's *name* and the version
(ids are random; names are the client's choice, so the same run and fleet pick the same
clients). A picked client gets one evaluation task for that version at its next ``GetTask``,
ahead of any training task; a client that never advertised the capability (an SDK before
0.3, the edge client) is never sent one.

The final version: when the run's rounds are done, its picked clients still get their
evaluation task (the others hear ``Finished``), and the run's end (``run_finished``) waits
until each has reported, left, or ``limits.max_task_s`` has passed since the end
(``final_pending``), so ``final_federated_accuracy`` is the final model's.

An evaluation task (``TaskKind.EVALUATE``, ids ``e<number>-v<version>``) takes no place in the
cohort, never counts toward a flush and carries no update: its client downloads the model as
for training (the same resumable ``Download``, a delta from the version it holds when one is
kept), scores it on its data and answers with ``ReportEvaluation``. The task expires like a
training task, ``limits.max_task_s`` after it was issued or when its client leaves; its report
is accepted once (a repeat gets the same answer, ``duplicate`` set, and counts nothing) and
logged as one ``evaluation_reported`` event, which ``fedlink.metrics.federated`` weights by
examples. Its states are ``EVALUATING -> EVALUATED | CLOSED`` (``fedlink.coordinator.tasks``).

Memory is O(clients): a client holds at most one evaluation task at a time, and only its latest
is kept (a lost acknowledgement is retried before the client asks for its next task). What a
client can do survives a restart with its registration (``CAPABILITIES_KEY`` in the metadata the
registry keeps); the evaluation tasks themselves are not durable: a restarted coordinator has
forgotten them (their reports are refused ``NOT_FOUND``, counted nowhere).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from fedlink.coordinator.commits import bounded_examples
from fedlink.coordinator.config import CoordinatorConfig, EvaluationConfig
from fedlink.coordinator.engine import RoundEngine
from fedlink.coordinator.records import ClientRecord, TaskRecord
from fedlink.coordinator.tasks import TaskState
from fedlink.errors import InvalidArgument, NotFound, PermissionDenied, UpdateRefused
from fedlink.messages import (
    EVALUATE_CAPABILITY,
    EvaluationAck,
    EvaluationReport,
    Task,
    TaskKind,
)
from fedlink.metrics import EventLog, kinds
from fedlink.refusals import RefusalCode

ID_PREFIX = "e"
"""Evaluation task ids are ``e<number>-v<version>``; training tasks' start with ``t``."""

CAPABILITIES_KEY = "\x00capabilities"
"""The entry of a client's registered metadata that keeps its ``JoinRequest.capabilities`` (a
NUL-led name like the state store's instance key: durable with the client's row, no schema
change)."""


def with_capabilities(metadata: Mapping[str, str],
                      capabilities: Iterable[str]) -> dict[str, str]:
    """``metadata`` to register, keeping ``capabilities`` (what the client says in its own
    metadata under ``CAPABILITIES_KEY`` is replaced: only the capabilities field counts)."""
    return {**metadata, CAPABILITIES_KEY: ",".join(sorted(set(capabilities)))}


def evaluators(capable: int, fraction: float) -> int:
    """How many of ``capable`` clients evaluate a due version: ``fraction`` of them rounded,
    at least one while ``fraction > 0`` (the same count every version)."""
    if fraction <= 0 or capable <= 0:
        return 0
    return min(capable, max(1, round(fraction * capable)))


def coin(seed: int, name: str, version: int) -> float:
    """The draw in [0, 1) of the client called ``name`` for ``version``, seeded by the run."""
    name_key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return float(np.random.default_rng([seed & (2**63 - 1), version, name_key]).random())


def chosen(config: EvaluationConfig, seed: int, names: Iterable[str], version: int,
           final: bool = False) -> frozenset[str]:
    """The clients (by name) of ``names`` that evaluate ``version``: none unless it is a
    multiple of ``every`` (or the ``final`` one); else the ``evaluators(len(names),
    fraction)`` with the smallest coins."""
    if not config.enabled or version < 0 or (version % config.every and not final):
        return frozenset()
    ranked = sorted(set(names), key=lambda name: (coin(seed, name, version), name))
    return frozenset(ranked[:evaluators(len(ranked), config.fraction)])


class EvaluationDesk:
    """Issues evaluation tasks and takes their reports (see the module docstring).

    ``name_of(client_id)`` is the registered name of a client (the coin's key);
    ``declared_examples(client_id)`` what it declared at ``Join`` (bounds a report's weight);
    ``clock()`` the coordinator's time; ``on_final_change`` is called when the final
    version's evaluations may have ended (a report, a departure; the service re-checks the
    run's end), and ``call_at(when, callback)`` (a ``Clock``'s) calls it once more when their
    time is up.
    """

    def __init__(self, config: CoordinatorConfig, engine: RoundEngine, events: EventLog,
                 name_of: Callable[[str], str], declared_examples: Callable[[str], int],
                 clock: Callable[[], float],
                 call_at: Callable[[float, Callable[[], None]], object] | None = None) -> None:
        self.config = config.evaluation
        self._seed = config.seed
        self._limits = config.limits
        self.engine = engine
        self._events = events
        self._name_of = name_of
        self._declared = declared_examples
        self._clock = clock
        self._capable: set[str] = set()
        self._latest: dict[str, TaskRecord] = {}  # client id -> its latest evaluation task
        self._by_id: dict[str, TaskRecord] = {}  # the same records, by task id
        self._drawn: dict[str, int] = {}  # client id -> the last version its coin was drawn for
        self._chosen: tuple[int, frozenset[str]] = (-1, frozenset())  # version, client ids
        self._final_since: float | None = None  # when the final version's evaluations began
        self._declined: set[str] = set()  # the kept tasks' ids their clients declined
        self._call_at = call_at
        self.on_final_change: Callable[[], None] = lambda: None
        self.final_evaluations = True
        """Whether the final version is evaluated (off for a run restarted after its end)."""
        self._next = 1

    # -- who evaluates ---------------------------------------------------------------------

    def joined(self, client_id: str, capabilities: Iterable[str]) -> None:
        """A client joined (or joined again) advertising ``capabilities``."""
        if EVALUATE_CAPABILITY in capabilities:
            self._capable.add(client_id)
        else:
            self._capable.discard(client_id)

    def restore(self, clients: Iterable[ClientRecord]) -> None:
        """After a restart: what the registered ``clients`` can do (``CAPABILITIES_KEY``)."""
        for record in clients:
            self.joined(record.client_id,
                        record.metadata.get(CAPABILITIES_KEY, "").split(","))

    def forget_client(self, client_id: str) -> None:
        """The client left or expired: its open evaluation task closes."""
        self._capable.discard(client_id)
        self._drawn.pop(client_id, None)
        record = self._latest.pop(client_id, None)
        if record is not None:
            del self._by_id[record.task_id]
            self._declined.discard(record.task_id)
            if record.state is TaskState.EVALUATING:
                record.move(TaskState.CLOSED)
        if self._final_since is not None:
            self.on_final_change()

    def due(self, client_id: str) -> bool:
        """Whether ``client_id`` is to evaluate the current version and was not asked yet."""
        version = self.engine.version
        if self.engine.finished and not self._final_window():
            return False
        if (client_id not in self._capable
                or self._drawn.get(client_id, -1) >= version):  # once per client and version
            return False
        self._drawn[client_id] = version
        return client_id in self._chosen_for(version)

    def _chosen_for(self, version: int) -> frozenset[str]:
        """The client ids picked for ``version``, drawn once among the capable clients
        joined at its first check-in."""
        if self._chosen[0] != version:
            ids = {self._name_of(c): c for c in self._capable}
            names = chosen(self.config, self._seed, ids, version, final=self.engine.finished)
            self._chosen = (version, frozenset(ids[n] for n in names))
        return self._chosen[1]

    def _final_window(self) -> bool:
        """Whether the final version's evaluations are still under way (the run's end
        waits ``limits.max_task_s`` for them at most); starts them on the first call."""
        if not self.config.enabled or not self.final_evaluations:
            return False
        now = self._clock()
        if self._final_since is None:
            self._final_since = now
            version = self.engine.version
            if version % self.config.every:  # not due while it was current: draw it afresh
                self._chosen = (-1, frozenset())
                self._drawn = {c: v for c, v in self._drawn.items() if v != version}
            if self._call_at is not None:
                self._call_at(now + self._limits.max_task_s, self.on_final_change)
        return now - self._final_since <= self._limits.max_task_s

    def final_pending(self) -> bool:
        """Whether the run's end waits for evaluations of its final version: a picked client
        has neither reported, nor left, nor run out of time (``limits.max_task_s`` after the
        end). ``False`` while the run goes on."""
        if not self.engine.finished or not self._final_window():
            return False
        version = self.engine.version
        for client_id in self._chosen_for(version):
            record = self._latest.get(client_id)
            waiting = record is None or record.version != version or self.is_open(record)
            if waiting and client_id in self._capable:  # not reported, closed, nor gone
                return True
        return False

    # -- issuing ---------------------------------------------------------------------------

    def offer(self, client_id: str, held_version: int) -> Task | None:
        """The client's open evaluation task, a new one when it is due, else ``None``.

        A client asks again while its task is open when it lost the reply, or the task (a
        failed download): it gets the same task back, unless the task's model is no longer
        served, when the task closes (it could never be done).
        """
        record = self._latest.get(client_id)
        if record is not None and self.is_open(record):
            if self._served(record.version):
                return self._message(record, held_version)
            record.move(TaskState.CLOSED)
        if not self.due(client_id):
            return None
        return self._message(self._issue(client_id), held_version)

    def _served(self, version: int) -> bool:
        """Whether the model of ``version`` can still be downloaded."""
        try:
            self.engine.payload(version)
        except UpdateRefused:
            return False
        return True

    def _issue(self, client_id: str) -> TaskRecord:
        version = self.engine.version
        record = TaskRecord(f"{ID_PREFIX}{self._next}-v{version}", client_id, version,
                            self._clock(), TaskState.EVALUATING)
        self._next += 1
        previous = self._latest.get(client_id)
        if previous is not None:  # ended (one open task per client): its id is forgotten
            del self._by_id[previous.task_id]
            self._declined.discard(previous.task_id)
        self._latest[client_id] = self._by_id[record.task_id] = record
        self._events.emit(kinds.EvaluationIssued.build(client_id=client_id,
                                                       task_id=record.task_id,
                                                       model_version=version))
        return record

    def _message(self, record: TaskRecord, held_version: int) -> Task:
        delta = self.engine.delta_between(held_version, record.version)
        record.delta_base = held_version if delta is not None else -1
        return Task(task_id=record.task_id, model_version=record.version, local_steps=0,
                    local_epochs=0, deadline_s=self._time_left(record),
                    model=self.engine.payload(record.version).header,
                    delta=None if delta is None else delta.header,
                    delta_base_version=record.delta_base, kind=TaskKind.EVALUATE)

    def _time_left(self, record: TaskRecord) -> float:
        """Seconds until the task expires (``max_task_s`` after it was issued)."""
        return max(0.001, self._limits.max_task_s - (self._clock() - record.issued_at))

    # -- looking tasks up ------------------------------------------------------------------

    def is_open(self, record: TaskRecord) -> bool:
        """Whether a report for ``record`` could still be accepted (closes an expired one)."""
        if record.state is not TaskState.EVALUATING:
            return False
        final = (self.engine.finished and record.version == self.engine.version
                 and self._final_window())
        if (self.engine.finished and not final) \
                or self._clock() - record.issued_at > self._limits.max_task_s:
            record.move(TaskState.CLOSED)
            return False
        return True

    def find(self, client_id: str, task_id: str) -> TaskRecord | None:
        """The evaluation task ``task_id`` of ``client_id``; ``None`` when the id is not an
        evaluation task's (``NotFound``: one this desk does not keep)."""
        if not task_id.startswith(ID_PREFIX):
            return None
        record = self._by_id.get(task_id)
        if record is None:
            raise NotFound(f"unknown evaluation task id {task_id!r}")
        if record.client_id != client_id:
            raise PermissionDenied(f"task {task_id!r} belongs to another client")
        return record

    def lookup(self, client_id: str, task_id: str) -> tuple[TaskRecord, bool]:
        """Any task of ``client_id`` (evaluation or training) and whether it is open."""
        record = self.find(client_id, task_id)
        if record is not None:
            return record, self.is_open(record)
        record = self.engine.task(client_id, task_id)
        return record, self.engine.is_open(record)

    # -- reports ---------------------------------------------------------------------------

    def report(self, request: EvaluationReport) -> EvaluationAck:
        """Accept an evaluation task's report, once; a repeat changes nothing."""
        record = self.find(request.client_id, request.task_id)
        if record is None:
            raise InvalidArgument(f"task {request.task_id!r} is not an evaluation task")
        if record.state is TaskState.EVALUATED:
            return EvaluationAck(request.task_id, duplicate=True)
        if request.task_id in self._declined:
            return EvaluationAck(request.task_id, duplicate=True)
        if not self.is_open(record):
            raise UpdateRefused(f"evaluation task {request.task_id!r} is closed",
                                RefusalCode.TASK_CLOSED)
        if request.declines and request.model_version == record.version:
            return self._decline(record)
        metrics = checked_scores(request, record)
        examples = bounded_examples(request.num_examples, self._declared(request.client_id),
                                    self._limits.max_examples_per_update)
        record.move(TaskState.EVALUATED)
        self._events.emit(kinds.EvaluationReported.build(
            client_id=request.client_id, task_id=request.task_id, model_version=record.version,
            num_examples=examples, loss=metrics.get("loss"), accuracy=metrics.get("accuracy"),
            metrics=metrics))
        if self.engine.finished:
            self.on_final_change()
        return EvaluationAck(request.task_id)

    def _decline(self, record: TaskRecord) -> EvaluationAck:
        """The client cannot score the model: the task closes without a score (a repeat of
        the decline is answered as a duplicate)."""
        record.move(TaskState.CLOSED)
        self._declined.add(record.task_id)
        self._events.emit(kinds.EvaluationDeclined.build(
            client_id=record.client_id, task_id=record.task_id, model_version=record.version))
        if self.engine.finished:
            self.on_final_change()
        return EvaluationAck(record.task_id)


def checked_scores(request: EvaluationReport, record: TaskRecord) -> dict[str, float]:
    """The report's metrics, once its fields agree with its task (``InvalidArgument``)."""
    if request.model_version != record.version:
        raise InvalidArgument(f"model_version {request.model_version} does not match task "
                              f"{record.task_id!r} (version {record.version})")
    if request.num_examples < 1:
        raise InvalidArgument(f"num_examples must be >= 1, got {request.num_examples}")
    bad = sorted(k for k, v in request.metrics.items() if not math.isfinite(v))
    if bad:
        raise InvalidArgument(f"non-finite evaluation metrics {bad}")
    accuracy = request.metrics.get("accuracy")
    if accuracy is not None and not 0.0 <= accuracy <= 1.0:
        raise InvalidArgument(f"accuracy must be in [0, 1], got {accuracy}")
    return dict(request.metrics)
