"""The discrete-event loop: the coordinator's ``RoundEngine`` and a population of clients,
with no sockets, on a ``ManualClock``.

Each selected client lives through timed events, driven by the same lifecycle as
``ClientSession`` over gRPC (``fedlink.client.protocol``: the loop performs the actions it
answers, on the manual clock): it checks in (one ``GetTask`` round trip), downloads the task's
model (its encoded payload, decoded with ``fedlink.wire.unpack`` as the real client does;
nothing when it holds that version; the coordinator's exact delta from the version it holds,
timed at the delta's bytes, when the engine offers one, as it offers a real client that
names its version at check-in), trains (the real trainer;
model time is ``steps x step_cost_s x speed``), runs the real ``UpdatePipeline`` (privacy,
codec, error feedback), uploads and commits (inline when the protocol says so: the engine takes
the update when the commit's request reaches it, and the client checks in again once the
answer is back, a one-way latency later, as over gRPC). The training
and the pipeline, a device's own work, run in a ``TrainingBackend``
(``fedlink.sim.virtual.backends``): handed over when the download ends, the encoded update
taken when training ends in model time, so worker processes work for several clients at
once. Transfers are timed by ``fedlink.sim.virtual.timing``; work pauses
while the client is offline (``fedlink.sim.virtual.availability``). The arrival calls the
engine's own ``submit`` (staleness, weighting, the flush rule, server optimizer and hooks),
with the example count bounded by the coordinator's ``bounded_examples``; the engine's ``poll``
and ``release_silent`` run every ``poll_s`` of model time, as the server's poll loop calls
them.

The ``update_refused`` and ``flush`` events, a round's ``bytes_down`` and the central
evaluation come from ``fedlink.coordinator.outcomes``, as the gRPC service's do. Selection: a
client that checks in again (the protocol's next action after a task, or after a wait) goes
back among the idle; whenever the engine has free places the loop offers them to idle online
clients, drawn at random (seeded) from the population, so cost follows the cohort; a client
told to wait is not drawn again before ``retry_after_s`` (pace steering in model time).

Per-client state kept across tasks: the model version it holds (one int32 a client; a client's
``ClientProtocol`` lives only while it is selected); only for clients that have trained at
least once, the client's random generator (plan seeds, codec noise; about 2 KB each, in a
dict) and, with a biased codec, its error-feedback residual (one float32 model vector) in a
``ResidualStore`` (``fedlink.sim.virtual.residuals``: in memory up to a budget, spilled to
disk beyond it).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedlink.client import Trainer
from fedlink.client.base import planned_steps, steps_that_fit
from fedlink.client.pipeline import UpdatePipeline
from fedlink.client.protocol import (
    Accepted,
    ClientProtocol,
    Deliver,
    Download,
    Encoded,
    Lost,
    MaskedUpload,
    ModelReceived,
    Offered,
    ProtocolSettings,
    Refused,
    Train,
    Trained,
    WaitFor,
    outcome_of,
    plan_for,
)
from fedlink.clock import ManualClock
from fedlink.coordinator.commits import bounded_examples
from fedlink.coordinator.config import CoordinatorConfig
from fedlink.coordinator.downloads import DELTA, EVALUATION, MODEL
from fedlink.coordinator.engine import FlushOutcome, RoundEngine
from fedlink.coordinator.lifecycle import target_accuracy
from fedlink.coordinator.outcomes import (
    RoundBytesDown,
    central_metrics,
    flush_fields,
    update_refused,
)
from fedlink.coordinator.records import ReceivedUpdate
from fedlink.errors import RemoteError
from fedlink.messages import Task
from fedlink.metrics import EventLog, kinds
from fedlink.metrics.summary import STALLED
from fedlink.params.base import ParamSpec
from fedlink.sim.virtual.availability import AlwaysOnline, Availability, finish
from fedlink.sim.virtual.backends import (
    ClientJob,
    ClientUpload,
    InlineTraining,
    TrainingBackend,
    TrainingTask,
)
from fedlink.sim.virtual.evaluations import VirtualEvaluations, VirtualWorld
from fedlink.sim.virtual.population import Population
from fedlink.sim.virtual.residuals import ResidualStore
from fedlink.sim.virtual.timing import DOWN, UP, check_in_time, leg_time, transfer_time
from fedlink.wire import unpack

Evaluate = Callable[[np.ndarray], Mapping[str, float]]


@dataclass(frozen=True)
class LoopOptions:
    """How the loop times clients (see ``VirtualSection`` for the config keys)."""

    step_cost_s: float = 0.05
    poll_s: float = 1.0
    deterministic: bool = False
    seed: int = 0
    max_model_s: float = math.inf
    target_accuracy: float = 0.0
    """End the run on the first flush whose central accuracy reaches it (0: off)."""


@dataclass
class _Busy:
    """A selected client's task in progress (exists only while it is selected)."""

    index: int
    task: Task
    started: float
    protocol: ClientProtocol
    trainer: Trainer | None = None
    seen: float = 0.0
    network_s: float = 0.0
    answer_s: float = 0.0  # the commit's answer on its way back
    compute_s: float = 0.0
    bytes_down: int = 0
    bytes_saved: int = 0
    """What its delta download saved against the whole model (0: a whole model)."""
    rows: tuple[dict[str, float], ...] = ()
    """The task's rows of ``LoopTotals.per_profile`` and ``per_round`` (found at its first
    charge: a task is charged several times)."""


@dataclass(frozen=True)
class _Training:
    """A client's job handed to the backend, and what its update needs when it ends."""

    result: Future[ClientUpload]
    steps: int
    fits: int
    num_examples: int


def _row() -> dict[str, float]:
    """An empty row of ``LoopTotals.per_profile`` / ``per_round``."""
    return {"tasks": 0, "network_s": 0.0, "compute_s": 0.0}


@dataclass
class LoopTotals:
    """What the loop measured: model seconds per phase and the simulation's wall time.

    ``per_profile`` (by link profile name) and ``per_round`` (by the model version a task
    trained on) split ``network_s`` and ``compute_s`` among the tasks, each entry
    ``{"tasks", "network_s", "compute_s"}``: both add up to the totals, tasks lost or still in
    flight at the end included (an evaluation task's network time is in its client's profile
    and its version's round, and not counted as a task).
    """

    network_s: float = 0.0
    compute_s: float = 0.0
    resent_bytes: int = 0
    resets: int = 0
    tasks: int = 0
    wall_s: float = 0.0
    model_s: float = 0.0
    bytes_down: int = 0
    """Every model download's bytes (training and evaluation tasks), sent when the task
    starts: the real run's ``bytes_down`` (a virtual link never cuts a download)."""
    downloads: int = 0
    """The tasks whose model was sent (the rest held its version already)."""
    bytes_down_evaluation: int = 0
    """The evaluation tasks' part of ``bytes_down`` (whole models: evaluation tasks take no
    delta in virtual mode)."""
    bytes_down_delta: int = 0
    """The training tasks' delta downloads' part of ``bytes_down``."""
    delta_bytes_saved: int = 0
    """What the delta downloads of tasks whose update was accepted saved against whole
    models: the real run's ``delta_bytes_saved``."""
    bytes_down_used: int = 0
    """The downloads of tasks whose update or evaluation report was accepted; the rest of
    ``bytes_down`` is the real run's ``bytes_down_wasted``."""
    clients: int = 0
    """Distinct clients that checked in with the coordinator (asked for a task): the real
    run's ``clients`` (distinct clients joined)."""
    per_profile: dict[str, dict[str, float]] = field(default_factory=dict)
    per_round: dict[int, dict[str, float]] = field(default_factory=dict)


class VirtualLoop:
    """Runs one virtual-clock simulation to the end of the run (``run``)."""

    def __init__(self, config: CoordinatorConfig, initial_model: np.ndarray,
                 population: Population, pipeline: Callable[[], UpdatePipeline],
                 events: EventLog, clock: ManualClock, options: LoopOptions,
                 availability: Availability | None = None, evaluate: Evaluate | None = None,
                 profile_name: Callable[[int], str] = lambda i: "ideal",
                 on_flush: Callable[[FlushOutcome, float], None] | None = None,
                 training: TrainingBackend | None = None,
                 residuals: ResidualStore | None = None,
                 spec: ParamSpec | None = None) -> None:
        self.config = config
        self.clock = clock
        self.events = events
        self.engine = RoundEngine(config, initial_model, events, clock=clock.now, spec=spec)
        self.population = population
        self.options = options
        self.availability = availability or AlwaysOnline()
        self._evaluate = evaluate
        self._profile_name = profile_name
        self._on_flush = on_flush
        self._training = training or InlineTraining(population, pipeline)
        self._busy: dict[int, _Busy] = {}
        self._rngs: dict[int, np.random.Generator] = {}
        self.residuals = residuals or ResidualStore(math.inf)
        self._trainer_states: dict[int, Any] = {}  # a client's trainer state between tasks
        # told to wait (and when): they ask again after retry_after_s
        self._waiting: dict[int, float] = {}
        self._quiet_since: float | None = None  # since when nothing can happen (``_stalled``)
        self._evaluations = VirtualEvaluations(config, VirtualWorld(
            self.engine, population, clock, self.availability, events, options.deterministic,
            options.step_cost_s, self._count_evaluation_network, self._count_download,
            self.count_used, lambda index: int(self._held[index])))
        self._select = np.random.default_rng([options.seed, 0x5E1EC7])
        self.timing = None if options.deterministic else np.random.default_rng(
            [options.seed, 0x714E])
        self.totals = LoopTotals()
        self._round_down = RoundBytesDown()  # since the last flush, as the servicer counts it
        # what the run says about a client's lifecycle (training tasks only: evaluations are
        # drawn by ``VirtualEvaluations``)
        self._lifecycle = ProtocolSettings(inline_bytes=config.limits.inline_limit,
                                           secure=config.secure.enabled)
        self.secure = None if not config.secure.enabled else _secure_phases(self)
        self._checked_in = np.zeros(population.size, dtype=bool)  # 1 byte a client
        # the model version each client holds (-1: none), from its last download
        self._held = np.full(population.size, -1, dtype=np.int32)
        self._model: tuple[int, np.ndarray] | None = None  # the last version decoded

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> LoopTotals:
        """Process events until the engine finishes (or ``max_model_s`` passes), then until
        the final version's evaluation tasks have reported (``[coordinator.evaluation]``)."""
        started = time.perf_counter()
        self.engine.start()
        # as a coordinator's: the config that runs, and the model's size (the summary's
        # compression ratios count fp32 vectors of it)
        self.events.emit(kinds.RunStarted.build(config=self.config.to_dict(),
                                                num_parameters=self.engine.num_parameters))
        self.clock.call_at(self.clock.now(), self._fill)
        self.clock.call_at(self.clock.now(),
                           lambda: self._evaluations.published(self.engine.version))
        self.clock.call_later(self.options.poll_s, self._poll)
        with setup_frozen():
            while not self.engine.finished and self._run_next_within_limit():
                pass
            if not self.engine.finished:  # no event left: no client can take a task
                self.engine.finish("nothing left to simulate: no client can take a task")
            # the training tasks still out end unheard (a real client's commit is refused)
            while self._evaluations.pending and self.clock.run_next():
                pass
        self.events.emit(kinds.RunFinished.build(reason=self.engine.finished_reason,
                                                 model_version=self.engine.version,
                                                 privacy=self.engine.privacy_record()))
        self.totals.wall_s = time.perf_counter() - started
        self.totals.model_s = self.clock.now()
        self.totals.clients = int(np.count_nonzero(self._checked_in))
        return self.totals

    def _run_next_within_limit(self) -> bool:
        """Run the next event unless it falls after ``max_model_s``: then the run ends at the
        limit itself, with nothing after it done (``False`` when no event is left)."""
        due = self.clock.next_time()
        if due is None:
            return False
        limit = self.options.max_model_s
        if due > limit:
            self.clock.advance(limit - self.clock.now())
            self.engine.finish(f"model time limit {limit:g} s reached")
            return False
        return self.clock.run_next()

    def client_id(self, index: int) -> str:
        """The id the engine knows client ``index`` by (the real run's names)."""
        return f"sim-{index}"

    # -- selection ---------------------------------------------------------------------------

    def _fill(self) -> None:
        """Offer the engine's free places to idle online clients (seeded random draw)."""
        free = self.engine.free_places()
        tries = 4 * free + 16
        while free > 0 and tries > 0 and not self.engine.finished:
            tries -= 1
            index = self._candidate()
            if index is None:
                return
            if self._check_in(index):
                free = self.engine.free_places()

    def _candidate(self) -> int | None:
        size = self.population.size
        if len(self._busy) + len(self._waiting) >= size:
            return None
        if size <= 4096:  # small: an exact draw among the idle, in index order
            idle = np.ones(size, dtype=bool)
            idle[list(self._busy)] = False
            idle[list(self._waiting)] = False
            free = np.flatnonzero(idle)
            if not len(free):
                return None
            return int(free[int(self._select.integers(len(free)))])
        for _ in range(64):
            index = int(self._select.integers(size))
            if index not in self._busy and index not in self._waiting:
                return index
        return None

    def _check_in(self, index: int) -> bool:
        """``GetTask`` for ``index``: start a task, or wait and come back later."""
        now = self.clock.now()
        if not self.availability.online(index, now):
            return False
        self._checked_in[index] = True
        held = int(self._held[index])
        protocol = ClientProtocol(self._lifecycle, held)
        protocol.start()  # a check-in naming the version it holds: a delta may be offered
        action = protocol.heard(Offered(self.engine.issue(self.client_id(index), held), now))
        if isinstance(action, WaitFor):
            self._waiting[index] = now
            self.clock.call_later(action.seconds, functools.partial(self._end_wait, index))
            return False
        if not isinstance(action, Download):  # the run is over
            return False
        busy = _Busy(index, action.task, now, protocol, seen=now)
        self._busy[index] = busy
        self._charge(busy, tasks=1)
        task_s, down = check_in_time(self.population.profile(index), self._download(busy, action),
                                     self.config.limits.inline_limit, self.timing)
        self.count_network(busy, down.seconds, down)
        if action.exchange_keys:  # secure phases 1 and 2, beside the download and training
            assert self.secure is not None
            secure = self.secure
            # as a real client, once it has the task (before _downloaded, at the same time)
            self.clock.call_at(finish(self.availability, index, now, task_s),
                               lambda: secure.begin(busy) if self._busy.get(index) is busy
                               else None)
        done = finish(self.availability, index, now, down.seconds)
        self.clock.call_at(done, lambda: self._downloaded(busy))
        return True

    def _answered(self, index: int) -> None:
        """The commit's answer reached client ``index``: it checks in again (may be drawn)."""
        self._end_wait(index)
        self._fill()

    def _end_wait(self, index: int) -> None:
        """Client ``index`` waited as it was told: it may be drawn again."""
        self._waiting.pop(index, None)

    def _download(self, busy: _Busy, action: Download) -> int:
        """Count the task's model download's bytes; returns them (0 when the client holds the
        task's version, having just evaluated it, and as a real client that says so in
        ``GetTask`` is sent nothing). The task's delta when it offers one from the version the
        client holds (``Task.delta_from``, the real client's rule), else the whole model."""
        if not action.needed:
            return 0
        task = action.task
        self._held[busy.index] = task.model_version
        whole = task.model.num_bytes
        delta = task.delta_from(action.held_version)
        if delta is not None:
            num_bytes = delta.num_bytes
            self._round_down.sent(DELTA, num_bytes)
            self.totals.bytes_down_delta += num_bytes
            busy.bytes_saved = whole - num_bytes
        else:
            num_bytes = whole
            self._round_down.sent(MODEL, num_bytes)
        self.totals.bytes_down += num_bytes
        self.totals.downloads += 1
        busy.bytes_down = num_bytes
        return num_bytes

    # -- a client's task -------------------------------------------------------------------

    def _downloaded(self, busy: _Busy) -> None:
        """The download ended: train, unless the task was lost meanwhile."""
        task = busy.task
        busy.seen = self.clock.now()
        if self.engine.finished:  # the run ended while it downloaded: nothing to train for
            self._lost(busy, "the run is over")
            return
        try:
            payload = self.engine.payload(task.model_version)
        except RemoteError as err:  # the version is no longer served: the task is lost
            self._lost(busy, err.detail)
            return
        action = busy.protocol.heard(ModelReceived(task.model_version))
        assert isinstance(action, Train)
        self._train(busy, action, self._decoded(task.model_version, payload))

    def _train(self, busy: _Busy, action: Train, model: np.ndarray) -> None:
        """Hand the client's job to the backend; take its upload when training ends."""
        task, index = busy.task, busy.index
        examples = self.population.num_examples(index)
        rng = self._client_rng(index)
        training = self.config.training
        # no deadline for the trainer: model time does not pass while it trains, so the loop
        # stops it at the deadline by giving it only the steps that fit
        plan = plan_for(task, training.batch_size, training.learning_rate,
                        training.trainer_options, int(rng.integers(2**31)))
        steps = planned_steps(plan, examples)
        step_s = self.options.step_cost_s * self.population.speed(index)
        fits = steps_that_fit(action.deadline, self.clock.now(), steps, step_s)
        # model time follows the plan, known now; the result is needed only when it ends
        compute = fits * step_s
        trained = finish(self.availability, index, self.clock.now(), compute)
        # a secure run's pipeline has no feedback stage: the residual is its group random-k's
        # (``fedlink.sim.virtual.secure``), taken when the masked update is made
        residual = None if self.secure is not None else self.residuals.take(index)
        job = ClientJob(index, plan if fits == steps else replace(plan, local_steps=max(fits, 1)),
                        rng, dict(task.options), residual, self._trainer_states.get(index))
        result = self._training.submit(TrainingTask(job, task.model_version, model, due=trained))
        self._charge(busy, compute_s=compute)
        work = _Training(result, steps, fits, examples)
        self.clock.call_at(trained, lambda: self._trained(busy, work))

    def _trained(self, busy: _Busy, work: _Training) -> None:
        """Training ended (model time): upload the client's encoded update."""
        task, index = busy.task, busy.index
        upload = work.result.result()
        self._rngs[index] = upload.rng  # as the job left it (a worker's copy comes back)
        if self.secure is None:  # a secure run's residuals are its group random-k's
            self.residuals.put(index, upload.residual)
        if upload.trainer_state is not None:
            self._trainer_states[index] = upload.trainer_state
        completed = upload.steps_completed if work.fits == work.steps else work.fits
        encoded = upload.payload
        busy.protocol.heard(Trained(self.clock.now()))
        # the job ran the pipeline with the training (in the backend): the update is encoded
        action = busy.protocol.heard(Encoded(encoded.header.num_bytes))
        delta = unpack(encoded.header, encoded.data, self.engine.num_parameters,
                       verify=False)  # packed just now: no wire to check
        examples = bounded_examples(upload.num_examples, work.num_examples,
                                    self.config.limits.max_examples_per_update)
        if self.secure is not None:  # masked in its group, once its keys are exchanged
            assert isinstance(action, MaskedUpload)
            self.secure.start(busy, delta, examples, completed, work.steps, rng=upload.rng)
            return
        assert isinstance(action, Deliver)
        update = ReceivedUpdate(
            client_id=self.client_id(index), task_id=task.task_id,
            base_version=task.model_version, delta=delta, num_examples=examples,
            steps_completed=completed, steps_planned=work.steps,
            bytes_up=encoded.header.num_bytes, metrics=dict(upload.privacy))
        self._upload(busy, update, action)

    def _decoded(self, version: int, payload: Any) -> np.ndarray:
        """``payload`` (model ``version``) decoded as the client does, once per version: every
        download of a version is the same bytes; read-only, as trainers must leave it."""
        if self._model is None or self._model[0] != version:
            vector = unpack(payload.header, payload.data, self.engine.num_parameters,
                            verify=False)  # the engine's own bytes
            vector.flags.writeable = False
            self._model = (version, vector)
        return self._model[1]

    def _client_rng(self, index: int) -> np.random.Generator:
        """Client ``index``'s own generator (plan seeds, codec noise), kept across its tasks."""
        rng = self._rngs.get(index)
        if rng is None:  # built only once: a generator costs as much as a small update
            rng = self._rngs[index] = np.random.default_rng(self.options.seed * 1_000_003 + index)
        return rng

    def _upload(self, busy: _Busy, update: ReceivedUpdate, action: Deliver) -> None:
        """Time the upload and commit (one call when the update travels inline): the commit
        reaches the coordinator after its request's leg (the one-way latency and, inline, the
        update's bytes; else after a resumable upload of its own, round trip included), and
        its answer reaches the client one one-way latency later (``_arrive``)."""
        index = busy.index
        profile = self.population.profile(index)
        if action.inline:
            up = leg_time(profile, update.bytes_up, UP, self.timing)
            seconds = up.seconds
        else:
            up = transfer_time(profile, update.bytes_up, UP, self.timing)
            seconds = up.seconds + leg_time(profile, 0, UP, self.timing).seconds
        busy.answer_s = leg_time(profile, 0, DOWN, self.timing).seconds
        self.count_network(busy, seconds, up)
        arrives = finish(self.availability, index, self.clock.now(), seconds)
        if arrives <= self.clock.now():
            # an upload that takes no model time (an ideal link) arrives at once, before the
            # other clients' events due at this instant: the order among simultaneous events
            # is arbitrary, and this one lets the engine's work on the update overlap the
            # training of the clients that finish at the same instant, instead of waiting for
            # the slowest of them to be trained
            self._arrive(busy, update)
            return
        self.clock.call_at(arrives, lambda: self._arrive(busy, update))

    def _arrive(self, busy: _Busy, update: ReceivedUpdate) -> None:
        """The commit reaches the coordinator: the engine accepts or refuses it, with the
        task's model time reported as a real client reports its own (``train_seconds``,
        ``network_seconds``, ``offline_seconds``): the task ends here, as its events say. The
        client checks in again once the answer reached it."""
        metrics = {**update.metrics, **self._task_times(busy)}
        self._done(busy)
        if busy.answer_s > 0:  # not drawn before the answer reached it
            self._waiting[busy.index] = self.clock.now()
            self.clock.call_later(busy.answer_s, functools.partial(self._answered, busy.index))
        if self.engine.finished:  # after the end (the final evaluations): refused unheard
            return
        update = replace(update, metrics=metrics)
        try:
            acceptance = self.engine.submit(update)
        except RemoteError as err:
            self.events.emit(update_refused(update.client_id, update.task_id, err,
                                            update.bytes_up, update.metrics))
            busy.protocol.heard(outcome_of(err) or Refused(err.detail))
            self._poll_if_due()  # a refused answer may have completed its cohort
        else:
            busy.protocol.heard(Accepted())
            self.count_used(busy.bytes_down, busy.bytes_saved)
            if acceptance.flush is not None:
                self.flushed(acceptance.flush)
        self._fill()

    def _task_times(self, busy: _Busy) -> dict[str, float]:
        """The task's model seconds on the network, training, and paused offline."""
        waited = self.clock.now() - busy.started - busy.network_s - busy.compute_s
        return {"train_seconds": busy.compute_s, "network_seconds": busy.network_s,
                "offline_seconds": max(0.0, waited)}

    def _done(self, busy: _Busy) -> None:
        """The task is over: the client goes back among the idle (its next check-in)."""
        self._busy.pop(busy.index, None)
        self.totals.tasks += 1

    def ended(self, busy: _Busy, outcome: Accepted | Refused | Lost | None = None) -> None:
        """A secure delivery ended (``fedlink.sim.virtual.secure``) with ``outcome`` (``None``:
        unheard, after the run's end): the client goes back among the idle."""
        if outcome is not None:
            busy.protocol.heard(outcome)
        self._done(busy)
        if self.engine.finished:
            return
        if self.engine.has_open_task(self.client_id(busy.index)):  # its group was lost late
            self._check_in(busy.index)  # at once, as a real client: its open task comes back
        self._fill()

    def busy_of(self, client_id: str) -> _Busy | None:
        """The task in progress of the client the engine knows as ``client_id``."""
        return self._busy.get(int(client_id.rsplit("-", 1)[1]))

    def _lost(self, busy: _Busy, reason: str) -> None:
        if self.secure is not None:
            self.secure.forget(busy)
        busy.protocol.heard(Lost(reason))
        self._done(busy)

    # -- the coordinator's periodic work ----------------------------------------------------

    def _poll_if_due(self) -> None:
        """Apply the flush rule now when it is due now, as a server's timekeeper wakes at
        ``deadline_at`` (not at the next ``poll_s``)."""
        due = self.engine.deadline_at()
        if due is not None and due <= self.clock.now():
            self._apply_flush_rule()

    def _apply_flush_rule(self) -> None:
        """The engine's deadline part of the flush rule (``RoundEngine.poll``), and its
        flush, if it makes one."""
        outcome = self.engine.poll()
        if outcome is not None:
            self.flushed(outcome)

    def _poll(self) -> None:
        """The deadline rule and the liveness check, as the server's poll loop runs them;
        the run ends here once it has stalled (``_stalled``)."""
        if self.engine.finished:
            return
        released = self.engine.release_silent(self._last_seen)
        self._apply_flush_rule()
        self._fill()
        if self.engine.finished:
            return
        if self._stalled(bool(released)):
            self.engine.finish(self._stall_reason())
            return
        self.clock.call_later(self.options.poll_s, self._poll)

    # -- a run that can no longer move ------------------------------------------------------

    def _stalled(self, released: bool) -> bool:
        """Whether nothing can happen any more, for a whole poll (a served coordinator waits
        for clients that may yet come; a simulation's fleet is all there is): no client work,
        transfer, timer or deadline is ahead, no task holds a place the liveness check could
        still free (``released``: it just freed one), no offline client ever comes back, and
        every online client is busy, or was told to wait since the run went quiet and so
        would be told again (when places are free). Such a run would poll for ever."""
        now = self.clock.now()
        if released or not self._nothing_ahead(now):
            self._quiet_since = None
            return False
        if self._quiet_since is None:
            self._quiet_since = now
            return False
        return self._fleet_spent(now, self._quiet_since)

    def _nothing_ahead(self, now: float) -> bool:
        """No flush at a deadline ahead, no call scheduled at a finite time but polls and
        the ends of waits, and no open task that still holds a place."""
        due = self.engine.deadline_at()
        if due is not None and due > now and self.engine.deadline_flushes():
            return False
        if any(when < math.inf and not self._housekeeping(callback)
               for when, callback in self.clock.scheduled()):
            return False
        return not self.engine.holds_places()

    def _housekeeping(self, callback: Callable[[], None]) -> bool:
        """Whether ``callback`` is the loop's own poll or the end of a client's wait."""
        return callback == self._poll or (isinstance(callback, functools.partial)
                                          and callback.func == self._end_wait)

    def _fleet_spent(self, now: float, quiet_since: float) -> bool:
        """No offline client comes back, and (when places are free) every online idle client
        was told to wait since ``quiet_since``."""
        free = self.engine.free_places() > 0
        for index in range(self.population.size):
            if not self.availability.online(index, now):
                if self.availability.next_online(index, now) < math.inf:
                    return False
            elif free and index not in self._busy and self._waiting.get(
                    index, -math.inf) < quiet_since:
                return False
        return True

    def _stall_reason(self) -> str:
        """The run's finish reason when it stalled."""
        now = self.clock.now()
        gone = sum(1 for index in range(self.population.size)
                   if not self.availability.online(index, now))
        short = "" if self.secure is None else self.secure.desk.short_roster()
        return (f"{STALLED} at version {self.engine.version}: no client left can take or "
                f"finish a task ({gone} of {self.population.size} clients offline for good"
                f"{'; ' + short if short else ''})")

    def _last_seen(self, client_id: str) -> float | None:
        """Now for a busy client online (its heartbeats), else when it went offline."""
        index = int(client_id.rsplit("-", 1)[1])
        now = self.clock.now()
        busy = self._busy.get(index)
        if busy is None or self.availability.online(index, now):
            return now
        return max(busy.seen, now - self._offline_for(index, now))

    def _offline_for(self, index: int, now: float) -> float:
        """How long client ``index`` has been offline at ``now`` (searching back by poll_s)."""
        t = now
        while t > 0 and not self.availability.online(index, t - self.options.poll_s):
            t -= self.options.poll_s
        return now - t

    def flushed(self, outcome: FlushOutcome) -> None:
        """Report a new version as the service's reporter does, in model time."""
        metrics = central_metrics(self._evaluate, outcome.model)
        wall = time.perf_counter()
        self.events.emit(kinds.Flush.build(
            **flush_fields(outcome, self._round_down.take(), metrics),
            model_seconds=self.clock.now()))
        reached = (target_accuracy(self.options.target_accuracy)(metrics)
                   if self.options.target_accuracy > 0 else "")
        if reached and not self.engine.finished:  # the run ends on exactly this flush
            self.engine.finish(reached)
        if self._on_flush is not None:
            self._on_flush(outcome, wall)
        self._evaluations.published(outcome.version)

    # -- bookkeeping -------------------------------------------------------------------------

    def _count_download(self, index: int, version: int, num_bytes: int) -> None:
        """A download outside a training task (client ``index``'s evaluation of ``version``):
        in the next flush's count; the client holds that version from now on."""
        self._held[index] = version
        self._round_down.sent(EVALUATION, num_bytes)
        self.totals.bytes_down += num_bytes
        self.totals.downloads += 1
        self.totals.bytes_down_evaluation += num_bytes

    def count_used(self, num_bytes: int, bytes_saved: int = 0) -> None:
        """A task's download was used: its update or evaluation report was accepted
        (``bytes_saved``: what it saved as a delta)."""
        self.totals.bytes_down_used += num_bytes
        self.totals.delta_bytes_saved += bytes_saved

    def _count_evaluation_network(self, index: int, version: int, seconds: float,
                                  transfer: Any) -> None:
        """An evaluation task's network time: in the totals, and in its client's profile
        and the evaluated version's round (not as a task: those count training tasks), so
        that each table adds up to the totals."""
        self.totals.network_s += seconds
        for row in (self.totals.per_profile.setdefault(self._profile_name(index), _row()),
                    self.totals.per_round.setdefault(version, _row())):
            row["network_s"] += seconds
        if transfer is not None:  # None: the client held the model, nothing was sent
            self._count_resends(transfer)

    def count_network(self, busy: _Busy, seconds: float, transfer: Any,
                      timed: bool = True) -> None:
        """Charge ``busy``'s task ``seconds`` on the network (``transfer``: its resends;
        ``timed=False``: a transfer beside others, whose resends alone count, as a real client
        leaves its secure key exchange out of its network time)."""
        self._count_resends(transfer)
        if timed:
            self._charge(busy, network_s=seconds)

    def _count_resends(self, transfer: Any) -> None:
        self.totals.resent_bytes += transfer.resent_bytes
        self.totals.resets += transfer.resets

    def _charge(self, busy: _Busy, tasks: int = 0, network_s: float = 0.0,
                compute_s: float = 0.0) -> None:
        """Count a task's model seconds for it, the totals, its link profile and its round."""
        self.totals.network_s += network_s
        self.totals.compute_s += compute_s
        busy.network_s += network_s
        busy.compute_s += compute_s
        if not busy.rows:
            busy.rows = (
                self.totals.per_profile.setdefault(self._profile_name(busy.index), _row()),
                self.totals.per_round.setdefault(busy.task.model_version, _row()))
        for row in busy.rows:
            row["tasks"] += tasks
            row["network_s"] += network_s
            row["compute_s"] += compute_s

    @property
    def kept_state_clients(self) -> int:
        """Clients whose generator is kept (they trained at least once)."""
        return len(self._rngs)


@contextlib.contextmanager
def setup_frozen() -> Iterator[None]:
    """Leave the objects alive on entry out of the cyclic collector's passes until the block
    ends (``gc.freeze``, undone on exit), unless something froze objects already (then its
    freeze is left as it is).

    A run's set-up (torch, the model, the data, the population) is a few hundred thousand
    long-lived objects. Every full collection the loop's allocations trigger would walk them
    all again, about 3% of a small model's simulation, to find no garbage among them. Cycles
    that become garbage inside the block are still collected, those among the frozen objects
    once it ends.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _secure_phases(loop: VirtualLoop) -> Any:
    """The secure phases' carrier (imported here: secure aggregation needs the ``secagg``
    extra, ``cryptography``)."""
    from fedlink.sim.virtual.secure import VirtualSecure

    return VirtualSecure(loop)
