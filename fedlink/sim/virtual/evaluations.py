"""Evaluation tasks in virtual-clock mode: ``[coordinator.evaluation]`` as timed events.

The real coordinator (``fedlink.coordinator.evaluations``) asks ``evaluators(n, fraction)``
of the ``n`` joined clients that can evaluate, the same number for every version. A virtual
population is lazy (10^6 clients, none "joined"), so here the same count of the population is
drawn at once: when a due version is published (a multiple of ``every``, and the run's final
version whatever ``every`` says), that many distinct clients are drawn from a generator seeded
by the run's seed and the version. The run goes on after its last flush until the final
version's reports are in (``pending``), as a real coordinator waits for them. Each lives
through the real client's steps in model time, in the order the client's lifecycle
(``fedlink.client.protocol``) gives them: a check-in round trip, the model's download (none
when the client holds that version), one forward pass over its examples
(``ceil(examples / batch_size)`` steps at ``step_cost_s x speed``: a simplification, the same
per-batch cost as a training step), the report's round trip (a decline's, when it scored no
example or a score is not a finite number: an ``evaluation_declined`` event), all paused
while the client is offline. The score itself is the client trainer's
real ``evaluate`` on the decoded model (run inline, on the loop's thread); a trainer without
``evaluate`` does not evaluate, as a real client does not advertise the capability. The
report becomes one ``evaluation_reported`` event (example count bounded as the coordinator
bounds it), read by
``fedlink.metrics.federated`` exactly as a real run's.

Simplifications, said: a client drawn to evaluate while it trains does both at once (a real
one evaluates before its next task); a report of an earlier version that arrives after the
run's end is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedlink.client.evaluation import evaluator_of, report_or_decline
from fedlink.client.protocol import (
    Accepted,
    ClientProtocol,
    Download,
    Lost,
    ModelReceived,
    Offered,
    Report,
    Scored,
)
from fedlink.clock import ManualClock
from fedlink.coordinator.commits import bounded_examples
from fedlink.coordinator.config import CoordinatorConfig
from fedlink.coordinator.engine import RoundEngine
from fedlink.coordinator.evaluations import evaluators
from fedlink.errors import RemoteError
from fedlink.messages import EvaluationReport, Task, TaskKind
from fedlink.metrics import EventLog, kinds
from fedlink.sim.virtual.availability import Availability, finish
from fedlink.sim.virtual.population import Population
from fedlink.sim.virtual.timing import UP, check_in_time, leg_time
from fedlink.wire import unpack

_STREAM = 0xE7A1  # this module's generator stream, apart from selection and timing


@dataclass(frozen=True)
class VirtualWorld:
    """What the evaluations share with the loop: its engine, clients, clock and counters.

    ``deterministic``: no random timing (jitter, resets), as the loop's option says; else
    evaluations draw their timing from a generator of their own, so that turning them on
    leaves the training tasks' timing as it was. ``count_network(index, version, seconds,
    transfer)`` and ``count_download(index, version, bytes)`` add to the loop's totals and to
    the next flush's ``bytes_down``, as the real coordinator counts an evaluation task's
    download (and the client holds that version after it);
    ``count_used(bytes)``: a download whose report was accepted; ``held(index)``: the version
    a client holds from its last download (a client that holds the task's version is sent
    nothing; ``count_network``'s transfer is then None).
    """

    engine: RoundEngine
    population: Population
    clock: ManualClock
    availability: Availability
    events: EventLog
    deterministic: bool
    step_cost_s: float
    count_network: Callable[[int, int, float, Any], None]
    count_download: Callable[[int, int, int], None]
    count_used: Callable[[int], None] = lambda num_bytes: None
    held: Callable[[int], int] = lambda index: -1
    """The model version client ``index`` holds from its last download (-1: none)."""


class VirtualEvaluations:
    """Draws and times the evaluation tasks of each due version (module docstring)."""

    def __init__(self, config: CoordinatorConfig, world: VirtualWorld) -> None:
        self.config = config.evaluation
        self._seed = config.seed
        self._batch = config.training.batch_size
        self._max_examples = config.limits.max_examples_per_update
        self._inline_limit = config.limits.inline_limit
        self.world = world
        self._timing = None if world.deterministic else np.random.default_rng(
            [self._seed & (2**63 - 1), _STREAM])
        self._next = 1
        self._final: set[str] = set()  # the final version's tasks not yet reported or lost
        self._sent: dict[str, int] = {}  # each open task's download bytes (0: it held the model)

    @property
    def pending(self) -> bool:
        """Whether evaluation tasks of the run's final version are still under way."""
        return bool(self._final)

    def published(self, version: int) -> None:
        """Version ``version`` is out: start the evaluation tasks it is due for (the run's
        final version always is)."""
        final = self.world.engine.finished
        if not self.config.enabled or (version % self.config.every and not final):
            return
        size = self.world.population.size
        rng = np.random.default_rng([self._seed & (2**63 - 1), version, _STREAM])
        count = evaluators(size, self.config.fraction)
        for index in sorted(int(i) for i in rng.choice(size, count, replace=False)):
            task_id = self._check_in(index, version)
            if final:
                self._final.add(task_id)

    def _check_in(self, index: int, version: int) -> str:
        """Start client ``index``'s evaluation of ``version``; its task id."""
        world = self.world
        task_id = f"e{self._next}-v{version}"
        self._next += 1
        header = world.engine.payload(version).header
        world.events.emit(kinds.EvaluationIssued.build(client_id=f"sim-{index}",
                                                       task_id=task_id, model_version=version))
        profile = world.population.profile(index)
        # the task ends when the report reaches the coordinator, after its request's leg
        report = leg_time(profile, 0, UP, self._timing).seconds
        task = Task(task_id, version, 0, 0, 0.0, header, kind=TaskKind.EVALUATE)
        protocol = ClientProtocol(held_version=world.held(index))
        protocol.start()
        download = protocol.heard(Offered(task, world.clock.now()))
        assert isinstance(download, Download)
        # a client that holds the model is sent nothing, as a real client
        self._sent[task_id] = header.num_bytes if download.needed else 0
        if download.needed:
            world.count_download(index, version, header.num_bytes)
        _, down = check_in_time(profile, self._sent[task_id], self._inline_limit, self._timing)
        world.count_network(index, version, down.seconds + report,
                            down if download.needed else None)
        done = finish(world.availability, index, world.clock.now(), down.seconds)
        world.clock.call_at(done, lambda: self._score(index, protocol, report))
        return task_id

    def _score(self, index: int, protocol: ClientProtocol, report_s: float) -> None:
        """Downloaded: score the model with the client's trainer; report after the pass."""
        world = self.world
        task = protocol.task
        assert task is not None
        try:
            payload = world.engine.payload(task.model_version)
        except RemoteError as err:  # no longer served: the task is lost, as a real client's is
            self._lost(protocol, task, err.detail)
            return
        protocol.heard(ModelReceived(task.model_version))
        trainer = world.population.trainer(index)
        evaluator = evaluator_of(trainer)
        if evaluator is None:
            self._lost(protocol, task, "the trainer has no evaluate method")
            return
        model = unpack(payload.header, payload.data, world.engine.num_parameters,
                       verify=False)  # the engine's own bytes
        # no local example, or a score that is not a finite number: declined, as a real
        # client does (``report_or_decline``)
        report, _ = report_or_decline(f"sim-{index}", task, trainer, evaluator.evaluate(model))
        # a decline for a score that is not a finite number came after a whole pass
        scored = world.population.num_examples(index) if report.declines else report.num_examples
        passes = math.ceil(scored / self._batch)
        compute = passes * world.step_cost_s * world.population.speed(index)
        action = protocol.heard(Scored())
        assert isinstance(action, Report)
        arrives = finish(world.availability, index, world.clock.now(), compute + report_s)
        examples = bounded_examples(report.num_examples, world.population.num_examples(index),
                                    self._max_examples)
        world.clock.call_at(arrives, lambda: self._arrive(protocol, task, index, examples,
                                                          report))

    def _lost(self, protocol: ClientProtocol, task: Task, reason: str) -> None:
        protocol.heard(Lost(reason))
        self._ended(task)

    def _ended(self, task: Task) -> None:
        """``task`` is over, reported or not."""
        self._final.discard(task.task_id)
        self._sent.pop(task.task_id, None)

    def _arrive(self, protocol: ClientProtocol, task: Task, index: int, examples: int,
                report: EvaluationReport) -> None:
        """The report, or the decline, reaches the coordinator (once the run is over, only
        the final version's are taken); a decline used none of the bytes it was sent."""
        final = task.task_id in self._final
        sent = self._sent.get(task.task_id, 0)
        self._ended(task)
        if self.world.engine.finished and not final:
            return
        protocol.heard(Accepted())
        client_id, metrics = f"sim-{index}", dict(report.metrics)
        if report.declines:
            self.world.events.emit(kinds.EvaluationDeclined.build(
                client_id=client_id, task_id=task.task_id, model_version=task.model_version))
            return
        self.world.events.emit(kinds.EvaluationReported.build(
            client_id=client_id, task_id=task.task_id, model_version=task.model_version,
            num_examples=examples, loss=metrics.get("loss"), accuracy=metrics.get("accuracy"),
            metrics=metrics))
        self.world.count_used(sent)
