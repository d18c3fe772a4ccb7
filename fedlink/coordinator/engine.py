"""The round engine: issues tasks, folds in updates, and flushes them into new model versions.

One engine serves synchronous, elastic and asynchronous training: the mode is only the
``FlushRule`` it is given (see ``fedlink.coordinator.config.FlushRule`` and its presets
``sync``, ``elastic`` and ``async``). With ``continuous`` off a version's cohort is handed out
once, one task per client; with it on (FedBuff) tasks are issued whenever a place is free, on
the latest model. The engine is plain, synchronous Python with an injected clock: no gRPC,
no asyncio, no torch, so it is unit-testable with a fake clock and the servicer stays thin.

Memory: the accumulator holds one float64 vector of the model's length (``mean``/``fednova``;
the robust rules buffer a flush's updates), the server optimizer its state, and a flush
allocates one float32 model-sized array for the mean, which FedAvg turns into the new model
in place. Beside that the engine keeps the payloads of the versions a client may still
download (``max_staleness + 1``) and ``limits.delta_history`` raw versions.

A task holds a place in its version's cohort until it delivers or is *released*. Release
happens for two reasons, through one mechanism (``_release``): the deadline passed with fewer
than ``min_updates`` in (``poll``), or the task's client went silent for longer than its
silence bound (``release_silent``: ``limits.liveness_timeout_s``, or more for a client whose
link has shown long gaps, ``fedlink.coordinator.heartbeat``). A released task is not closed:
its client may still deliver while the update is within ``max_staleness``; the task only
stops keeping another client out.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from fedlink.aggregate import (
    ACCUMULATORS,
    FLUSH_HOOKS,
    SERVER_OPTIMIZERS,
    STALENESS_WEIGHTS,
    Accumulator,
    FlushHook,
    FlushInfo,
    NormBounded,
    UpdateInfo,
)
from fedlink.aggregate.adaptive import AdaptiveNormBound
from fedlink.aggregate.flushguard import FlushGuard, GuardRules, Limited
from fedlink.aggregate.guard import step_problem
from fedlink.aggregate.kinds import KindSplit, hooks_on_trainable, step_by_kind, trainable_mask
from fedlink.aggregate.robust import l2_norm
from fedlink.clock import RealClock, TimeSource, reader
from fedlink.compress import broadcast_codec
from fedlink.coordinator.client_metrics import event_fields
from fedlink.coordinator.config import CoordinatorConfig
from fedlink.coordinator.history import ModelHistory
from fedlink.coordinator.progress import RoundState
from fedlink.coordinator.records import ReceivedUpdate, SummedTask, TaskRecord
from fedlink.coordinator.state import Checkpoint, FlushRecord, NullStore, SavedState, StateStore
from fedlink.coordinator.tasks import TaskIds, TaskPace, TaskState
from fedlink.errors import ConfigError, InvalidArgument, NotFound, PermissionDenied, UpdateRefused
from fedlink.messages import Finished, Task, TaskReply, Wait
from fedlink.metrics import EventLog, kinds
from fedlink.params.base import ParamSpec
from fedlink.refusals import RefusalCode
from fedlink.wire import Payload


@dataclass(frozen=True)
class FlushOutcome:
    """A new model version, made from ``num_updates`` updates."""

    version: int
    model: np.ndarray
    num_updates: int
    total_weight: float
    round_seconds: float
    bytes_up: int
    finished: bool
    hook_report: Mapping[str, Any] = field(default_factory=dict)
    task_ids: tuple[str, ...] = ()

    def record(self) -> FlushRecord:
        """What the durable state keeps of this flush until its event is written."""
        return FlushRecord(self.version, self.num_updates, self.total_weight,
                           self.round_seconds, self.bytes_up, self.finished, self.task_ids,
                           dict(self.hook_report))


@dataclass(frozen=True)
class Acceptance:
    """An update was folded in (and maybe triggered a flush)."""

    model_version: int
    """The version after the update was handled (the flush's when it triggered one)."""
    staleness: int
    weight: float
    flush: FlushOutcome | None
    accepted_version: int = 0
    """The version current when the update was folded in, before any flush."""


def build_accumulator(config: CoordinatorConfig,
                      reference: Callable[[], float] = lambda: 0.0,
                      mask: np.ndarray | None = None) -> Accumulator:
    """The configured ``aggregator`` behind the flush guard (``[coordinator.robust]``), or,
    with the guard off, behind a streaming norm bound: ``norm_bound`` when it is set, else the
    adaptive bound (``norm_bound_adaptive``). ``reference()`` is the model's trainable norm;
    ``mask`` marks the trainable elements (``None``: all)."""
    if config.robust.enabled:
        return build_guard(config, reference, mask)
    accumulator = build_streaming(config, reference)
    return accumulator if mask is None else KindSplit(accumulator, mask)


def build_guard(config: CoordinatorConfig, reference: Callable[[], float],
                mask: np.ndarray | None) -> FlushGuard:
    """The flush guard with the rules ``config`` resolves to (docs/robust-aggregation.md)."""
    robust, plain = config.robust, config.plain_mean
    trim = robust.resolved_trim(config.aggregator, plain, sparse_uplink=False)
    if trim > 0:
        inner: Accumulator = ACCUMULATORS.create("trimmed_mean", trim=trim, weighted=True,
                                                 trim_by_count=True)
    else:
        inner = ACCUMULATORS.create(config.aggregator, **dict(config.aggregator_options))
    adaptive = config.norm_bound_adaptive and config.norm_bound == 0 and not plain
    rules = GuardRules(weight_cap=robust.weight_cap,
                       norm_multiple=config.norm_bound_multiple if adaptive else 0.0,
                       fixed_bound=config.norm_bound, drop_opposed=robust.resolved_drop(plain),
                       drop_min_updates=robust.drop_min_updates, warmup=robust.warmup,
                       window=robust.window)
    return FlushGuard(inner, rules, mask, reference)


def build_streaming(config: CoordinatorConfig,
                    reference: Callable[[], float] = lambda: 0.0) -> Accumulator:
    """The guard-off chain: the aggregator behind a per-update norm bound, in arrival order."""
    accumulator = ACCUMULATORS.create(config.aggregator, **dict(config.aggregator_options))
    if config.norm_bound > 0:
        return NormBounded(accumulator, config.norm_bound)
    if config.norm_bound_adaptive:
        return AdaptiveNormBound(accumulator, reference, config.norm_bound_multiple)
    return accumulator


HookT = TypeVar("HookT", bound=FlushHook)


def build_hooks(tables: tuple[Mapping[str, Any], ...]) -> list[FlushHook]:
    """Flush hooks from ``[[coordinator.hooks]]`` tables: ``name`` plus the hook's options."""
    hooks = []
    for table in tables:
        options = dict(table)
        hooks.append(FLUSH_HOOKS.create(str(options.pop("name", "")), **options))
    return hooks


class RoundEngine:
    """Task issuing, staleness checks, weighting, streaming aggregation and the flush rule."""

    def __init__(
        self,
        config: CoordinatorConfig,
        initial_model: np.ndarray,
        events: EventLog,
        clock: TimeSource | None = None,
        state: StateStore | None = None,
        spec: ParamSpec | None = None,
    ) -> None:
        self.config = config
        self._state = state if state is not None else NullStore()
        self.rule = config.flush
        self.events = events
        self._clock = reader(clock if clock is not None else RealClock())
        self._model = np.ascontiguousarray(initial_model, dtype=np.float32).reshape(-1)
        self._version = 0
        # Kinds (docs/model-state.md): without a spec every element is a trainable weight.
        self.spec = spec
        self._trainable = trainable_mask(spec, self._model.size)
        self._optimizer = SERVER_OPTIMIZERS.create(
            config.server_optimizer, **dict(config.server_optimizer_options))
        self._optimizer.bind(spec)
        self._staleness_weight = STALENESS_WEIGHTS.create(
            config.staleness_weight, **dict(config.staleness_weight_options))
        # robust rules and norm bounds see trainable weights only (docs/model-state.md)
        self._accumulator = build_accumulator(config, self._weights_norm, self._trainable)
        self._check_buffer()
        self._hooks = build_hooks(config.hooks + config.implied_hooks(self._model.size))
        # the hooks hear of the flush's updates at the flush, as aggregated (by task id)
        self._pending_infos: dict[str, UpdateInfo] = {}
        self._history = ModelHistory(broadcast_codec(config.downlink_codec),
                                     config.limits.delta_history)
        self._history.publish(0, self._model, oldest_served=0)
        self._tasks: dict[str, TaskRecord] = {}
        # Indexes over _tasks, so issuing a task costs O(the client's tasks), not O(all):
        # tasks by client, and tasks holding a place (not done, not expired) by version.
        self._by_client: dict[str, list[TaskRecord]] = {}
        self._holding: Counter[int] = Counter()
        self._next_task = 1
        self._ids = TaskIds()
        self._pace = TaskPace(config.limits.liveness_timeout, config.limits.task_quiet_multiple,
                              since=self._clock())
        self._pending_ids: list[str] = []
        # None until the run's first task: the wait for clients to start is not round 1's time
        self._round_started: float | None = None
        self._round_bytes_up = 0
        # updates refused since the last flush (partial, no work) that answered for a place
        self._dropped = 0
        self.finished_reason = ""

    def _weights_norm(self) -> float:
        """The L2 norm of the model's trainable weights (an adaptive norm bound's reference)."""
        if self._trainable is None:
            return l2_norm(self._model)
        return l2_norm(self._model[self._trainable])

    @property
    def _norm_bound(self) -> Accumulator:
        """The accumulator behind the kinds split (the one that may be an adaptive bound)."""
        accumulator = self._accumulator
        return accumulator.inner if isinstance(accumulator, KindSplit) else accumulator

    def _check_buffer(self) -> None:
        """The guard buffers a flush's updates: refuse a configuration they cannot fit."""
        if not isinstance(self._accumulator, FlushGuard):
            return
        need_mb = self.rule.goal * 4 * self._model.size / 2**20
        if need_mb > self.config.robust.max_buffer_mb:
            raise ConfigError(
                f"coordinator.robust: a flush of coordinator.flush.goal = {self.rule.goal} "
                f"updates of this model buffers {need_mb:.0f} MiB, over "
                f"coordinator.robust.max_buffer_mb = {self.config.robust.max_buffer_mb:g}; "
                "raise it, lower the goal, or set coordinator.robust.enabled = false "
                "(streaming, arrival-order aggregation)")

    def start(self) -> None:
        """Serve: the first round's clock (and deadline) starts at its first task, so that
        clients slow to start are not timed out, and round 1 does not include their start."""
        if self._version > 0:  # a resumed run: its round goes on from now
            self._round_started = self._clock()

    # -- durable state ----------------------------------------------------------------------

    def save_initial(self) -> None:
        """Checkpoint version 0 (a fresh run with a durable state store)."""
        self._state.save_initial(Checkpoint(self._version, self._model, self.engine_state()))

    def engine_state(self) -> dict[str, Any]:
        """The server optimizer's and flush hooks' ``state_dict``s, for a checkpoint."""
        state: dict[str, Any] = {"optimizer": self._optimizer.state_dict(),
                                 "hooks": [hook.state_dict() for hook in self._hooks]}
        if isinstance(self._norm_bound, AdaptiveNormBound | FlushGuard):
            state["recent_norms"] = self._norm_bound.state_dict()
        return state

    def restore(self, saved: SavedState) -> None:
        """Continue from ``saved``: the checkpoint, tasks, then the pending updates replayed.

        Replay folds the pending updates in their original order with their original weights,
        so the accumulator and the hooks end up exactly as they were; it emits no events (they
        were emitted when the updates were accepted).
        """
        current = saved.current
        self._version, self._model = current.version, current.model.copy()
        self._optimizer.load_state_dict(dict(current.engine_state["optimizer"]))
        for hook, hook_state in zip(self._hooks, current.engine_state["hooks"], strict=True):
            hook.load_state_dict(dict(hook_state))
        if isinstance(self._norm_bound, AdaptiveNormBound | FlushGuard):
            self._norm_bound.load_state_dict(list(current.engine_state.get("recent_norms", [])))
        self._history = ModelHistory(broadcast_codec(self.config.downlink_codec),
                                     self.config.limits.delta_history)
        oldest = self._version - self.rule.max_staleness
        for checkpoint in saved.checkpoints:
            self._history.publish(checkpoint.version, checkpoint.model, oldest_served=oldest)
        self._restore_tasks(saved.tasks, saved.next_task)
        for update in saved.pending:
            self._fold(self._tasks[update.task_id], update)
        self.finished_reason = saved.finished_reason
        self._round_started = self._clock()

    def _restore_tasks(self, tasks: list[TaskRecord], next_task: int) -> None:
        now = self._clock()
        self._tasks, self._by_client, self._holding = {}, {}, Counter()
        for task in tasks:
            self._index(dataclasses.replace(task, issued_at=now))
        self._ids = TaskIds.restored([(t.task_id, t.version) for t in tasks])
        # a refused answer of the current version came after the last flush; a continuous
        # buffer's refused answers of earlier versions are not told apart from those before
        # it, so after a restart it waits for as many more answers
        self._dropped = sum(1 for t in tasks
                            if t.state is TaskState.DROPPED and t.version == self._version)
        self._next_task = next_task

    def due_flush(self) -> FlushOutcome | None:
        """Flush now if the updates in already reach ``goal`` (after a restore)."""
        if not self.finished and self._accumulator.count + self._dropped >= self.rule.goal:
            return self._flush()
        return None

    # -- read-only views -------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The current global model version (0 is the initial model)."""
        return self._version

    @property
    def model(self) -> np.ndarray:
        """The current global model (do not modify)."""
        return self._model

    @property
    def finished(self) -> bool:
        """True once the run is over."""
        return bool(self.finished_reason)

    @property
    def num_parameters(self) -> int:
        """Length of the global model vector."""
        return int(self._model.size)

    def payload(self, version: int) -> Payload:
        """The encoded model of ``version`` (``UpdateRefused`` once it is no longer kept)."""
        payload = self._history.payload(version)
        if payload is None:
            raise UpdateRefused(f"model version {version} is no longer served "
                                f"(current version is {self._version})", RefusalCode.MODEL_GONE)
        return payload

    def delta_payload(self, record: TaskRecord) -> Payload:
        """The delta offered with ``record``'s task (``NotFound`` when there is none now).

        ``NotFound`` tells the client to download the full model instead.
        """
        if record.delta_base < 0:
            raise NotFound(f"task {record.task_id!r} was offered no delta: download the full "
                           "model")
        delta = self._history.delta(record.delta_base, record.version)
        if delta is None:
            raise NotFound(f"the delta from version {record.delta_base} is no longer kept: "
                           "download the full model")
        return delta

    def delta_between(self, held_version: int, version: int) -> Payload | None:
        """The delta payload from ``held_version`` to ``version`` when both are still kept
        (``None`` otherwise, or for ``held_version < 0``: nothing held)."""
        return self._history.delta(held_version, version) if held_version >= 0 else None

    def task(self, client_id: str, task_id: str) -> TaskRecord:
        """The task ``task_id``, which must belong to ``client_id``."""
        record = self._tasks.get(task_id)
        if record is None:
            # Tasks too old to ever be accepted are forgotten; say "too stale", not "unknown",
            # so a slow client drops its update instead of failing.
            issued = self._ids.version_of(task_id)
            if issued is None and self._ids.predates(task_id):  # forgotten before a restart
                issued = self._ids.first_version - 1
            if issued is not None and issued < self._version - self.rule.max_staleness:
                raise UpdateRefused(f"too stale: task {task_id!r} was for version "
                                    f"{issued}, current is {self._version} "
                                    f"(max_staleness {self.rule.max_staleness})",
                                    RefusalCode.TOO_STALE)
            raise NotFound(f"unknown task id {task_id!r}")
        if record.client_id != client_id:
            raise PermissionDenied(f"task {task_id!r} belongs to another client")
        return record

    def is_open(self, record: TaskRecord) -> bool:
        """Whether an update for ``record`` could still be accepted."""
        return (record.state.deliverable and not self.finished
                and self._version - record.version <= self.rule.max_staleness)

    # -- issuing tasks ---------------------------------------------------------------------

    def issue(self, client_id: str, held_version: int = -1) -> TaskReply:
        """A task for ``client_id``, or ``Wait``/``Finished``. Repeated calls are idempotent.

        ``held_version`` is the model version the client already holds (-1: none); when it is
        still kept, the task offers a delta from it (``Task.delta``).
        """
        self._check_hooks()
        if self.finished:
            return Finished(self.finished_reason)
        held = self._open_task_of(client_id)
        if held is not None:
            return self._task_message(held, held_version)
        if not self.rule.continuous and self._was_asked(client_id, self._version):
            return Wait(self.config.limits.retry_after_s,
                        f"already trained on version {self._version}; waiting for the next")
        waiting = next((r for r in (h.wait_reason() for h in self._hooks) if r), "")
        if waiting:
            return Wait(self.config.limits.retry_after_s, waiting)
        if self._free_slots() <= 0:
            return Wait(self.config.limits.retry_after_s,
                        f"cohort of version {self._version} is full")
        return self._task_message(self._new_task(client_id), held_version)

    def _was_asked(self, client_id: str, version: int) -> bool:
        """Whether ``client_id`` got a task for ``version`` that was not released since."""
        return any(t.version == version and t.state.asked
                   for t in self._by_client.get(client_id, ()))

    def has_open_task(self, client_id: str) -> bool:
        """Whether ``client_id`` holds a task an update could still be accepted for (its next
        check-in hands it back)."""
        return self._open_task_of(client_id) is not None

    def _open_task_of(self, client_id: str) -> TaskRecord | None:
        for record in self._by_client.get(client_id, ()):
            if self.is_open(record):
                return record
        return None

    def _index(self, record: TaskRecord) -> None:
        """Add ``record`` to ``_tasks`` and its indexes."""
        self._tasks[record.task_id] = record
        self._by_client.setdefault(record.client_id, []).append(record)
        if record.state.holds_place:
            self._holding[record.version] += 1

    def _move(self, record: TaskRecord, to: TaskState) -> None:
        """Move ``record`` to state ``to``, keeping the count of places held in step."""
        held = record.state.holds_place
        record.move(to)
        if held and not record.state.holds_place:
            self._holding[record.version] -= 1

    def free_places(self) -> int:
        """Tasks the current version could still hand out (the virtual-clock simulation
        selects that many clients from its population)."""
        return 0 if self.finished else max(0, self._free_slots())

    def _free_slots(self) -> int:
        """Places left: ``cohort`` minus tasks in flight and, in rounds, minus updates in."""
        oldest = self._version - self.rule.max_staleness
        in_flight = 0 if self.finished else sum(
            n for version, n in self._holding.items() if version >= oldest)
        delivered = 0 if self.rule.continuous else self._accumulator.count + self._dropped
        return self.rule.cohort - delivered - in_flight

    def _new_task(self, client_id: str) -> TaskRecord:
        record = TaskRecord(TaskIds.make(self._next_task, self._version), client_id,
                            self._version, self._clock())
        self._ids.issued(self._next_task, self._version)
        self._next_task += 1
        if self._round_started is None:
            self._round_started = record.issued_at
        self._index(record)
        self._save(record)
        self.events.emit(kinds.TaskIssued.build(client_id=client_id, task_id=record.task_id,
                                                model_version=record.version))
        return record

    def _task_message(self, record: TaskRecord, held_version: int) -> Task:
        training = self.config.training
        delta = self._history.delta(held_version, record.version) if held_version >= 0 else None
        delta_base = held_version if delta is not None else -1
        if delta_base != record.delta_base:
            record.delta_base = delta_base
            self._save(record)
        return Task(
            task_id=record.task_id,
            model_version=record.version,
            local_steps=training.local_steps,
            local_epochs=training.local_epochs,
            deadline_s=self._time_left(),
            model=self.payload(record.version).header,
            delta=None if delta is None else delta.header,
            delta_base_version=record.delta_base,
            options=self._task_options(),
        )

    def _task_options(self) -> dict[str, str]:
        options: dict[str, str] = {}
        for hook in self._hooks:
            options.update(hook.task_options())
        return options

    def _time_left(self) -> float:
        """Seconds until this version's deadline (0 means no deadline). In a secure run a
        task has the whole ``deadline_s`` from when it is handed out: a group is the next
        clients to start a task, whenever that is, and its masked phase waits ``deadline_s``
        for them (the version's deadline does not restart there, as no poll applies it, so
        a task handed out past it would get no time at all and complete no step)."""
        if self.rule.deadline_s is None:
            return 0.0
        if self.config.secure.enabled:
            return self.rule.deadline_s
        return max(0.001, self.rule.deadline_s - self._round_age())

    @property
    def round_started_at(self) -> float | None:
        """When this version's round started (``None`` before the run's first task)."""
        return self._round_started

    def round_age_s(self) -> float:
        """Seconds since this version's round started (0 before the run's first task)."""
        return self._round_age()

    def _round_age(self) -> float:
        """Seconds since this version's round started (0 before the run's first task)."""
        return 0.0 if self._round_started is None else self._clock() - self._round_started

    # -- receiving updates -----------------------------------------------------------------

    def submit(self, update: ReceivedUpdate) -> Acceptance:
        """Fold in ``update`` (``UpdateRefused``/``InvalidArgument`` leave the model unchanged)."""
        record = self.task(update.client_id, update.task_id)
        if update.base_version != record.version:
            raise InvalidArgument(f"base_version {update.base_version} does not match task "
                                  f"{record.task_id!r} (version {record.version})")
        if update.delta.shape != self._model.shape:
            raise InvalidArgument(f"update has {update.delta.size} values, "
                                  f"model has {self._model.size}")
        self._check_open(record)
        if update.steps_planned > 0 and update.steps_completed == 0:
            self._refuse_no_work(record, update)
        if self.config.drop_partial and update.steps_completed < update.steps_planned:
            self._drop(record, update)
        staleness, weight = self._fold(record, update)
        self._move(record, TaskState.DELIVERED)
        self._pace.delivered(record.task_id, record.issued_at, self._clock())
        self._save(record)
        self._state.save_pending(update)
        self.events.emit(kinds.UpdateAccepted.build(
            client_id=update.client_id, task_id=update.task_id, base_version=record.version,
            staleness=staleness, num_examples=update.num_examples,
            steps_completed=update.steps_completed, bytes_up=update.bytes_up, weight=weight,
            **event_fields(update.metrics)))
        answered = self._accumulator.count + self._dropped
        accepted_version = self._version
        flush = self._flush() if answered >= self.rule.goal else None
        return Acceptance(self._version, staleness, weight, flush, accepted_version)

    def submit_sum(self, tasks: Sequence[SummedTask], mean_delta: np.ndarray,
                   weight: float) -> FlushOutcome:
        """Flush a secure group's sum (``[coordinator.secure]``): ``mean_delta`` is the
        weighted mean of the updates of ``tasks``, which the coordinator never saw one by one
        (each member summed ``[w * update, w]`` with the staleness weight ``w`` it was told);
        it is folded as one aggregate of ``weight`` and makes the next version. Each task gets
        its ``update_accepted`` event (counts, bytes, staleness and weight).

        A group's members may have trained on older versions: their staleness was counted
        when the roster closed, so a member that grew staler while the group finished still
        counts (its update is in the sum), as does one the liveness check released meanwhile.
        """
        if self.finished:
            raise UpdateRefused(f"the run is over: {self.finished_reason}", RefusalCode.RUN_OVER)
        records = [self.task(t.client_id, t.task_id) for t in tasks]
        if mean_delta.shape != self._model.shape:
            raise InvalidArgument(f"a secure sum has {mean_delta.size} values, "
                                  f"model has {self._model.size}")
        self._accumulator.add(np.asarray(mean_delta, dtype=np.float32), float(weight), 0)
        for record, summed in zip(records, tasks, strict=True):
            self._round_bytes_up += summed.bytes_up
            self._pending_ids.append(record.task_id)
            if record.state.deliverable:
                self._move(record, TaskState.DELIVERED)
                self._save(record)
            self.events.emit(kinds.UpdateAccepted.build(
                client_id=summed.client_id, task_id=summed.task_id, base_version=record.version,
                staleness=summed.staleness, num_examples=summed.num_examples,
                steps_completed=summed.steps_completed, bytes_up=summed.bytes_up,
                weight=summed.weight))
        self._pending_infos["secure-group"] = UpdateInfo("secure-group", 0, float(weight),
                                                         len(records), {})
        return self._flush(summed=len(records))

    def hook_of(self, kind: type[HookT]) -> HookT | None:
        """The run's flush hook of type ``kind`` (``None`` when it has none)."""
        return next((h for h in self._hooks if isinstance(h, kind)), None)

    def staleness_weight(self, staleness: int) -> float:
        """The configured staleness weight of an update ``staleness`` versions behind."""
        return float(self._staleness_weight(staleness))

    def _fold(self, record: TaskRecord, update: ReceivedUpdate) -> tuple[int, float]:
        """Add ``update`` to the accumulator and tell the hooks; (staleness, weight).

        The caller moves the task to ``DELIVERED`` (a replay after a restart finds it there).
        """
        staleness = self._version - record.version
        weight = self._weight(update, staleness)
        if isinstance(self._accumulator, FlushGuard):
            self._accumulator.add(update.delta, weight, update.steps_completed,
                                  source=record.task_id, claim=update.num_examples,
                                  work=self._work(update))
        else:
            self._accumulator.add(update.delta, weight, update.steps_completed)
        self._round_bytes_up += update.bytes_up
        self._pending_ids.append(record.task_id)
        self._pending_infos[record.task_id] = UpdateInfo(
            update.client_id, staleness, weight, update.num_examples, dict(update.metrics))
        return staleness, weight

    def _save(self, record: TaskRecord) -> None:
        self._state.save_task(record, self._next_task)

    def _check_open(self, record: TaskRecord) -> None:
        if self.finished:
            raise UpdateRefused(f"the run is over: {self.finished_reason}", RefusalCode.RUN_OVER)
        if record.state is TaskState.DELIVERED:
            raise UpdateRefused(f"task {record.task_id!r} already has an accepted update",
                                RefusalCode.ALREADY_ACCEPTED)
        if not record.state.deliverable:
            raise UpdateRefused(f"task {record.task_id!r} is closed ({record.state.value}): "
                                "it takes no update", RefusalCode.TASK_CLOSED)
        staleness = self._version - record.version
        if staleness > self.rule.max_staleness:
            raise UpdateRefused(f"too stale: trained on version {record.version}, current is "
                                f"{self._version} (staleness {staleness} > max_staleness "
                                f"{self.rule.max_staleness})", RefusalCode.TOO_STALE)

    def _drop(self, record: TaskRecord, update: ReceivedUpdate) -> None:
        """``drop_partial``: refuse a partial update, which still answers for its place.

        The task is closed (the client is not asked again for this version); the flush that
        counts the drop happens at the next ``poll``, since this call raises.
        """
        self._close_answered(record)
        raise UpdateRefused(f"partial work dropped (drop_partial): {update.steps_completed} of "
                            f"{update.steps_planned} planned steps completed",
                            RefusalCode.PARTIAL_DROPPED)

    def _refuse_no_work(self, record: TaskRecord, update: ReceivedUpdate) -> None:
        """Refuse an update whose client planned steps but completed none: it carries nothing.

        Its task is closed as a dropped one is (``_drop``): the client ran out of time, and
        the same task again would run out again, so it answers for its place instead of being
        retried for ever, and a cohort that did no work still ends its round.
        """
        self._close_answered(record)
        raise UpdateRefused(f"no local work: 0 of {update.steps_planned} planned steps "
                            "completed before the deadline", RefusalCode.NO_WORK)

    def _close_answered(self, record: TaskRecord) -> None:
        """Close ``record`` for an update refused for what it carries; it still answers for its
        place (it counts towards ``goal``): in rounds when it is of the current version, and
        always in a continuous buffer, which counts answers whatever their version. Else a
        fleet whose every update is refused would be asked again for ever, never flushing."""
        if self.rule.continuous or record.version == self._version:
            self._dropped += 1
            self._move(record, TaskState.DROPPED)
        else:
            self._move(record, TaskState.CLOSED)
        self._save(record)

    def _weight(self, update: ReceivedUpdate, staleness: int) -> float:
        """``num_examples x staleness_weight(tau) x work_fraction`` (docs/design.md).

        ``work_fraction = min(1, steps_completed / steps_planned)`` (1 when the client planned
        no step count); it is left out for an aggregator that normalises work itself
        (``fednova``), which would otherwise count partial work twice.
        """
        return float(update.num_examples * self._staleness_weight(staleness) * self._work(update))

    def _work(self, update: ReceivedUpdate) -> float:
        """The work fraction in the weight (1 under an aggregator that normalises work)."""
        if update.steps_planned > 0 and not self._accumulator.normalises_work:
            return min(1.0, update.steps_completed / update.steps_planned)
        return 1.0

    # -- flushing ---------------------------------------------------------------------------

    def poll(self) -> FlushOutcome | None:
        """Apply the deadline part of the flush rule; call it periodically (not in secure runs,
        whose groups keep their own deadlines).

        Also flushes a version whose ``goal`` was reached only by counting refused updates that
        answered for their places (partial work under ``drop_partial``, no work at all), which
        ``submit`` could not flush as it refused them.
        """
        if self.finished:
            return None
        if self._dropped and self._accumulator.count + self._dropped >= self.rule.goal:
            return self._flush()
        if self.rule.deadline_s is None or self.config.secure.enabled:
            # a secure group's sum is flushed whole by SecureDesk, on its own phase deadlines;
            # its members' tasks are not late because the (always empty) accumulator is short
            return None
        if self._round_started is None or self._round_age() < self.rule.deadline_s:
            return None
        if self._accumulator.count >= self.rule.min_updates:
            return self._flush()
        self._release_late_tasks()
        return None

    def _release_late_tasks(self) -> None:
        """Deadline passed without ``min_updates``: give late clients' places to others."""
        reason = (f"deadline passed with {self._accumulator.count} of min_updates "
                  f"{self.rule.min_updates} updates in")
        for record in self._holding_places():
            if record.version == self._version:
                self._release(record, reason, cause="deadline")
        self._round_started = self._clock()

    def release_silent(self, last_seen: Callable[[str], float | None],
                       bound: Callable[[str], float | None] | None = None,
                       transferring: Callable[[str], bool] | None = None) -> list[TaskRecord]:
        """Release the tasks of clients silent for longer than their bound, tasks that show
        no progress for longer than ``TaskPace`` allows, and tasks not delivered
        ``limits.max_task_s`` after they were issued.

        ``last_seen(client_id)`` is when the client last made any call (None: the client is
        gone); ``bound(client_id)`` how long it may be silent (``None``: no check; default
        ``limits.liveness_timeout_s`` for all, see ``fedlink.coordinator.heartbeat``);
        ``transferring(client_id)``: whether a transfer stream of the client is open, which
        its silence bound already judges (a stream whose next bytes a lossy link holds up is
        not a stalled task). Returns the released tasks, so the caller can wake clients
        waiting for a place.
        """
        streaming = transferring or (lambda client_id: False)
        if self.finished:
            return []
        bound = bound or self._fixed_bound
        max_task_s = self.config.limits.max_task_s
        now = self._clock()
        released = []
        for record in self._holding_places():
            seen = last_seen(record.client_id)
            timeout = bound(record.client_id)
            if seen is None:
                self._release(record, "the client is no longer registered", cause="gone")
            elif timeout is not None and now - seen > timeout:
                self._release(record, f"no heartbeat for {now - seen:.1f} s",
                              cause="silent")
            elif self._quiet_too_long(record, now) and not streaming(record.client_id):
                # Heartbeats say a client is alive, not that it trains (TaskPace).
                self._release(record, f"no progress for "
                              f"{self._pace.quiet_for(record.task_id, record.issued_at, now):.1f}"
                              f" s (no bytes down or up; {self._pace.allowance():.1f} s "
                              "allowed)", ask_again=False, cause="stalled")
            elif max_task_s and now - record.issued_at > max_task_s:
                # Heartbeats alone must not hold a place forever (limits.max_task_s).
                self._release(record, f"not delivered {now - record.issued_at:.1f} s after "
                              "it was issued", ask_again=False, cause="overdue")
            else:
                continue
            released.append(record)
        return released

    def _fixed_bound(self, client_id: str) -> float | None:
        """Every client's silence bound when none is given: ``limits.liveness_timeout``."""
        return self.config.limits.liveness_timeout

    def deadline_at(self) -> float | None:
        """When this version's deadline passes (``None``: no deadline, or no round started).

        Also the instant a refused update that completed the cohort is flushed: now.
        """
        if self.finished:
            return None
        if self._dropped and self._accumulator.count + self._dropped >= self.rule.goal:
            return self._clock()
        if self.rule.deadline_s is None or self._round_started is None:
            return None
        return self._round_started + self.rule.deadline_s

    def holds_places(self) -> bool:
        """Whether an open task still holds a place in a cohort (``release_silent`` may yet
        free it)."""
        return bool(self._holding_places())

    def deadline_flushes(self) -> bool:
        """Whether this version's deadline makes a flush when it passes, as things stand
        (``min_updates`` are in; secure groups keep deadlines of their own): else it only
        releases the late tasks and starts the round's clock again."""
        return (not self.config.secure.enabled and self.rule.deadline_s is not None
                and self._accumulator.count >= self.rule.min_updates)

    def next_due(self, last_seen: Callable[[str], float | None],
                 bound: Callable[[str], float | None] | None = None) -> float | None:
        """The earliest instant ``poll`` or ``release_silent`` (with the same ``bound``) has
        something to do, as things stand (``None``: nothing, until the engine changes).
        O(tasks holding a place)."""
        due = [t for t in (self.deadline_at(),) if t is not None]
        if self.finished:
            return None
        bound = bound or self._fixed_bound
        max_task_s = self.config.limits.max_task_s
        for record in self._holding_places():
            seen = last_seen(record.client_id)
            timeout = bound(record.client_id)
            if seen is None:
                due.append(self._clock())
            elif timeout is not None:
                due.append(seen + timeout)
            if max_task_s:
                due.append(record.issued_at + max_task_s)
            quiet_due = self._pace.due(record.task_id, record.issued_at)
            if quiet_due is not None:
                due.append(quiet_due)
        return min(due, default=None)

    def progressed(self, client_id: str, task_id: str = "") -> None:
        """Bytes of ``task_id``'s model went down, or of ``client_id``'s update came up (an
        upload names no task: its client's open task): the task is making progress."""
        now = self._clock()
        if task_id:
            record = self._tasks.get(task_id)
            if record is not None and record.client_id == client_id:
                self._pace.progressed(task_id, record.issued_at, now)
            return
        held = self._open_task_of(client_id)
        if held is not None:
            self._pace.progressed(held.task_id, held.issued_at, now)

    def _quiet_too_long(self, record: TaskRecord, now: float) -> bool:
        """Whether ``record`` showed no progress for longer than ``TaskPace`` allows."""
        due = self._pace.due(record.task_id, record.issued_at)
        return due is not None and now > due

    def round_state(self) -> RoundState:
        """Where the current round stands (for the coordinator's stuck line)."""
        waiting = sorted({r.client_id for r in self._holding_places()
                          if r.version == self._version})
        return RoundState(self._version, self._round_age(), self._accumulator.count,
                          self.rule.goal, waiting)

    def _holding_places(self) -> list[TaskRecord]:
        """Open tasks that still hold a place in a cohort."""
        return [r for r in self._tasks.values() if r.state.holds_place and self.is_open(r)]

    def _release(self, record: TaskRecord, reason: str, ask_again: bool = True,
                 cause: str = "") -> None:
        """Stop ``record`` holding a place; it may still deliver while within staleness.

        ``ask_again=False``: its client is not offered another task for the same version (it
        held one for too long already). ``cause``: one word for the event (``silent``, ``stalled``,
        ``deadline``, ``overdue``, ``gone``).
        """
        self._move(record, TaskState.RELEASED if ask_again else TaskState.OVERDUE)
        self._pace.forget(record.task_id)
        self._save(record)
        self.events.emit(kinds.ClientTimeout.build(
            client_id=record.client_id, task_id=record.task_id, model_version=record.version,
            reason=reason, cause=cause or None))

    def _flush(self, summed: int | None = None) -> FlushOutcome:
        """Make the next version; ``summed``: the updates inside a secure sum (the
        accumulator then holds one aggregate)."""
        now = self._clock()
        outcome_updates = self._accumulator.count if summed is None else summed
        total_weight, guarded = 0.0, dict[str, Any]()
        if outcome_updates:  # none when every update of the cohort was refused (_close_answered)
            info, guarded = self._prepare()
            total_weight = info.total_weight
            self._model = self._checked_step(info)
        self._version += 1
        self._accumulator.reset()
        self._pending_infos = {}
        self._dropped = 0
        if self._version >= self.config.rounds:
            self.finished_reason = f"completed {self.config.rounds} rounds"
        outcome = FlushOutcome(self._version, self._model, outcome_updates, total_weight,
                               self._round_age(), self._round_bytes_up, self.finished,
                               {**guarded, **self._hook_report()}, tuple(self._pending_ids))
        self._state.save_flush(Checkpoint(self._version, self._model, self.engine_state()),
                               outcome.record(), keep_from=self._version - self._kept_versions())
        if self.finished:
            self._state.save_finished(self.finished_reason)
        self._publish()
        self._round_started = now
        self._round_bytes_up = 0
        self._pending_ids = []
        return outcome

    def _prepare(self) -> tuple[FlushInfo, dict[str, Any]]:
        """Plan the flush (the guard's caps, clips and drops, each an ``update_limited``
        event) and tell the hooks of each update it aggregates, in the flush's canonical order
        and with the weight it is folded with; the ``FlushInfo`` and the flush's counts."""
        accumulator = self._norm_bound
        if not isinstance(accumulator, FlushGuard):  # streaming: arrival order, raw weights
            if isinstance(accumulator, AdaptiveNormBound):
                accumulator.fold_held()  # a warm-up's held updates are clipped (and counted)
            heard = list(self._pending_infos.values())
            counts: dict[str, Any] = {"updates_clipped": int(getattr(accumulator, "clipped", 0))}
        else:
            bounds = [b for b in (h.update_bound() for h in self._hooks) if b is not None]
            accumulator.plan(min(bounds) if bounds else None)
            heard = [dataclasses.replace(self._pending_infos[source], weight=weight)
                     for source, weight in accumulator.kept()]
            report = accumulator.report
            for limited in report.limited:
                self._emit_limited(limited)
            counts = {**report.counts(), "norm_bound": report.norm_bound,
                      "weight_cap": report.weight_cap}
        for info in heard:
            for hook in self._hooks:
                hook.on_update(info)
        weight = float(sum(info.weight for info in heard))
        return FlushInfo(self._version + 1, len(heard), weight), counts

    def _emit_limited(self, limited: Limited) -> None:
        info = self._pending_infos[limited.source]
        self.events.emit(kinds.UpdateLimited.build(
            client_id=info.client_id, task_id=limited.source, model_version=self._version + 1,
            action=limited.action, reason=limited.reason, norm=limited.norm,
            bound=limited.bound, weight=limited.weight, limited_weight=limited.limited_weight,
            cosine=limited.cosine))

    def _checked_step(self, info: FlushInfo) -> np.ndarray:
        """The server optimizer's next model, or the current one when that step is refused.

        A non-finite or exploding step (``fedlink.aggregate.guard``) never becomes a version:
        the model and the optimizer's state stay as they were, and ``flush_refused`` says why.
        """
        before = self._optimizer.state_dict()
        mean_delta = self._mean_delta(info)
        with np.errstate(over="ignore", invalid="ignore"):
            new = step_by_kind(self._optimizer, self._model, mean_delta, self._trainable)
        problem = step_problem(self._model, new)
        if not problem:
            return new
        self._optimizer.load_state_dict(before)
        self.events.emit(kinds.FlushRefused.build(model_version=info.version,
                                                  num_updates=info.num_updates, reason=problem))
        return self._model

    def _kept_versions(self) -> int:
        """How many versions before the current one a restart needs (stale tasks, deltas)."""
        return max(self.rule.max_staleness, self.config.limits.delta_history - 1, 0)

    def _mean_delta(self, info: FlushInfo) -> np.ndarray:
        """The accumulator's aggregate, its trainable part post-processed by every hook in
        order (central noise is for weights; buffers stay the plain mean)."""
        mean_delta = self._accumulator.mean()
        for hook in self._hooks:
            mean_delta = hooks_on_trainable(mean_delta, self._trainable,
                                            functools.partial(hook.on_flush, flush=info))
        return mean_delta

    def privacy_record(self) -> dict[str, Any] | None:
        """The run's privacy guarantee as its hooks state it now (``None`` without one): at
        the run's end it may be ahead of the last flush's (distributed DP's sums withheld, or
        spent by a group lost after it was asked to unmask)."""
        record = self._hook_report().get("privacy")
        return dict(record) if isinstance(record, Mapping) else None

    def _hook_report(self) -> dict[str, Any]:
        report: dict[str, Any] = {}
        for hook in self._hooks:
            report.update(hook.report())
        return report

    def _publish(self) -> None:
        """Encode the new version once; keep only versions a client may still train from."""
        oldest = self._version - self.rule.max_staleness
        self._history.publish(self._version, self._model, oldest_served=oldest)
        forgotten = [k for k, t in self._tasks.items()
                     if self._version - t.version > self.rule.max_staleness + 1]
        for task_id in forgotten:
            record = self._tasks.pop(task_id)  # its version is below oldest: not counted
            self._by_client[record.client_id].remove(record)
            if not self._by_client[record.client_id]:
                del self._by_client[record.client_id]
        for version in [v for v in self._holding if v < oldest]:
            del self._holding[version]
        if forgotten:
            self._state.forget_tasks(forgotten)

    def _check_hooks(self) -> None:
        """End the run when a hook says so (a spent privacy budget, say)."""
        if self.finished:
            return
        for hook in self._hooks:
            reason = hook.stop_reason()
            if reason:
                self.finish(reason)
                return

    def close_task(self, client_id: str, task_id: str) -> None:
        """Close one open task (a secure group left it out): it stops holding a place, and its
        client is not offered another task of the same version."""
        record = self.task(client_id, task_id)
        if record.state.deliverable:
            self._move(record, TaskState.CLOSED)
            self._save(record)

    def release_client(self, client_id: str) -> None:
        """A client left: its open tasks stop holding places."""
        for record in self._by_client.get(client_id, ()):
            if record.state.deliverable:
                self._move(record, TaskState.CLOSED)
                self._save(record)

    def finish(self, reason: str, durable: bool = True) -> None:
        """End the run: no more tasks, no more updates.

        ``durable=False`` ends it for this process only (an operator's stop): a coordinator
        restarted on the same ``state_dir`` goes on with the run.
        """
        if not self.finished:
            self.finished_reason = reason
            if durable:
                self._state.save_finished(reason)

