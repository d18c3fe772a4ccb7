"""The client session loop: join, get a task, download, train, upload, commit, repeat.

What the client does next is decided by its lifecycle, ``fedlink.client.protocol`` (the same
state machine the virtual loop drives on a manual clock); the session performs each action it
answers over gRPC and tells it what came of it.

``ClientSession`` is the async core; ``run_client`` is the thin sync facade for scripts and
devices that do not run an event loop of their own. Training runs off the event loop (in a
thread, or the executor you pass), so heartbeats keep flowing while it trains; they flow for the
whole task (download, training, upload and commit, retries and backoff included), so that a long
delivery on a bad link does not look like a dead client to the coordinator.

Every encoded update is kept in the outbox before it is uploaded, until the coordinator
answers (``fedlink.client.delivery``). With ``ClientOptions.outbox_dir`` the outbox is a
directory: a client restarted with the same name and directory first delivers, or discards with
a logged reason, what its previous process left there.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from fedlink.aio import cancel_and_wait
from fedlink.client.base import AccountsPrivacy, Trainer, TrainResult
from fedlink.client.delivery import Courier
from fedlink.client.evaluation import capabilities, evaluator_of, report_or_decline
from fedlink.client.instance import (
    finished_before,
    forget_finished,
    instance_key,
    remember_finished,
)
from fedlink.client.liveness import LivenessConfig
from fedlink.client.outbox import PendingUpdate, open_outbox
from fedlink.client.pipeline import UpdatePipeline
from fedlink.client.protocol import (
    Accepted,
    Action,
    CheckIn,
    ClientProtocol,
    Deliver,
    Download,
    Encode,
    Encoded,
    Evaluate,
    Lost,
    MaskedUpload,
    ModelReceived,
    Offered,
    PhaseDone,
    ProtocolSettings,
    Refused,
    Report,
    Scored,
    Slept,
    Stop,
    Train,
    Trained,
    Unmask,
    WaitFor,
    outcome_of,
    plan_for,
    travels_inline,
)
from fedlink.client.retry import Caller, RetryPolicy, Sleep
from fedlink.client.stats import SessionStats
from fedlink.client.transfer import HeldModel, Transfers
from fedlink.client.transport import Lanes, Timeouts, TLSOptions, Transport
from fedlink.clock import Clock, RealClock, sleep_on
from fedlink.config import require
from fedlink.errors import (
    ConfigError,
    RemoteError,
    SecAggError,
    Unauthenticated,
    UpdateRefused,
    WrongRun,
)
from fedlink.messages import (
    EvaluationReport,
    GetTaskRequest,
    HeartbeatRequest,
    JoinRequest,
    LeaveRequest,
    RunConfig,
    SecureSettings,
    Task,
    TaskKind,
    TaskReply,
)
from fedlink.params.base import ParamSpec
from fedlink.privacy import NoPrivacy
from fedlink.refusals import RefusalCode
from fedlink.wire import unpack

if TYPE_CHECKING:
    from fedlink.client.secure import SecureDelivery

R = TypeVar("R")

__all__ = ["ClientOptions", "ClientSession", "SessionStats", "run_client"]

log = logging.getLogger(__name__)


@dataclass
class _TaskWork:
    """What one task's actions hand each other on the real client: the model it downloaded,
    the training's result, the encoded update, the evaluation's report."""

    model: np.ndarray | None = None
    result: TrainResult | None = None
    update: PendingUpdate | None = None
    report: EvaluationReport | None = None
    keys: asyncio.Task[SecureDelivery] | None = None
    """A secure training task's key exchange, started with its download."""
    secure: SecureDelivery | None = None

    def trained_from(self) -> np.ndarray:
        """The task's model (downloaded before training or evaluation start)."""
        assert self.model is not None
        return self.model


@dataclass(frozen=True)
class ClientOptions:
    """How a client behaves; every field has a sensible default.

    ``outbox_dir``: where pending updates are kept across restarts (one client per directory);
    ``None`` keeps them in memory only.

    ``token``: the coordinator's shared join token, or this client's own token from
    ``fedlink token issue`` (sent at ``Join`` and as ``authorization`` metadata on every call).
    ``tls``: connect over TLS with these CA / client certificate files (``None``: plaintext).
    ``liveness``: bounds of the ping-ack timeout, TCP user timeout and call deadlines that
    follow the measured link (``fedlink.client.liveness``). ``download_connections``: how many
    connections a large download is striped over (``fedlink.client.transfer.Transfers``; the
    ones beyond the first open with the first such download). Under heavy loss, one TCP
    connection spends long spells in retransmission backoff; a second one, taking over what
    the first has left, carries the bytes meanwhile. 1 turns striping off.

    ``seed``: the seed of the client's own randomness: its minibatch order, stochastic
    rounding and random-k, and its privacy noise (the pipeline's noise stage, DP-SGD, its
    share of distributed-DP noise). ``None`` (the default) draws fresh entropy from the
    operating system, so no two clients, and no one who knows the run's settings, can predict
    a client's noise. A fixed seed makes the client reproducible, noise included: whoever
    knows it can take the noise out again, so fixed seeds are for simulations, and two
    clients given the same seed add the same noise.
    """

    name: str = ""
    token: str = ""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    seed: int | None = None
    max_tasks: int | None = None
    outbox_dir: Path | None = None
    tls: TLSOptions | None = None
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    download_connections: int = 2

    def __post_init__(self) -> None:
        require(self.download_connections >= 1, "client.download_connections",
                f"must be >= 1, got {self.download_connections}")


def plan_seed_bound(seed: int | None) -> int:
    """The bound of a task's ``TrainPlan.seed`` for a client seeded with ``seed``.

    A seeded client (an experiment) draws 31 bits, as virtual mode does, so that the same
    seeds train alike in both. An unseeded one (a device) draws 63: DP-SGD's noise comes
    from (trainer seed, plan seed), a trainer seed derived from a run's config is no secret,
    and 31 unknown bits can be searched.
    """
    return 2**31 if seed is not None else 2**63


class ClientSession:
    """One client taking part in a run, from ``Join`` to ``Finished``.

    Training runs on ``executor`` (default: asyncio's thread pool) so that heartbeats go on
    meanwhile. ``inline_training=True`` trains on the event loop's own thread instead: for many
    simulated clients with small models in one process this avoids contention for the GIL
    between the loop and the training threads (about 3x less time per update on 2 cores), at
    the price of no heartbeats during training.

    ``clock`` (``fedlink.clock``; ``RealClock`` by default) is the session's time: task
    deadlines (``TrainPlan.deadline`` is an instant on it: give the trainer the same clock),
    the time counters in ``stats``, and the heartbeat interval. A bare function returning
    seconds also works (a test's hand-moved fake): then it only reads the time, and waits are
    real. ``sleep`` waits out retries' backoff and the coordinator's "come back later"
    (default: on ``clock``); tests pass a fake so that nothing sleeps for real.
    """

    def __init__(self, target: str, trainer: Trainer, options: ClientOptions | None = None,
                 pipeline: UpdatePipeline | None = None, executor: Executor | None = None,
                 sleep: Sleep | None = None, inline_training: bool = False,
                 clock: Clock | Callable[[], float] | None = None) -> None:
        self.target = target
        self.trainer = trainer
        self.options = options or ClientOptions()
        self.pipeline = pipeline or UpdatePipeline()
        self.stats = SessionStats()
        self.client_id = ""
        self.config: RunConfig | None = None
        self.outbox = open_outbox(self.options.outbox_dir)
        self.instance_key = instance_key(self.options.outbox_dir)
        if self.options.outbox_dir is not None:  # error feedback survives restarts beside it
            self.pipeline.attach_state(self.options.outbox_dir)
        self._executor = executor
        self._inline_training = inline_training
        clock = RealClock() if clock is None else clock
        # what waits (heartbeats): the clock itself, or real time beside a bare time function
        self._timer: Clock = clock if isinstance(clock, Clock) else RealClock()
        self._clock: Callable[[], float] = clock.now if isinstance(clock, Clock) else clock
        self._sleep: Sleep = sleep or self._sleep_on_clock
        self._call = Caller(self.options.retry, self.stats, self._sleep, self._clock)
        self._rng = np.random.default_rng(self.options.seed)
        # group random-k's error feedback: what this client's summed updates kept back (in
        # memory: a restarted client starts without it, as a fresh one would)
        self._secure_residual: np.ndarray | None = None
        self._transport: Transport | None = None
        self._courier: Courier | None = None
        self._held: HeldModel | None = None
        self._protocol = ClientProtocol()  # its settings come with the run's config

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> SessionStats:
        """Take part until the coordinator says the run is over (or ``max_tasks`` are done)."""
        async with Transport(self.target, self.options.timeouts, self.options.tls,
                             self.options.token, self.options.liveness) as transport:
            lanes = Lanes(transport, self.options.download_connections - 1)
            self._transport = transport
            try:
                try:
                    config = await self._join()
                except RemoteError as err:
                    if not self._over_before(err):
                        raise
                    return self.stats
                transfers = Transfers(transport, self._call, self.stats, config.chunk_bytes,
                                      lanes=lanes)
                self._courier = Courier(transport, transfers, self._call, self.stats,
                                        self.outbox, config, self._clock)
                await self._courier.recover(self.target, self.options.name, self.client_id)
                await self._work()
                await self._leave("run finished")
            finally:
                await lanes.close()
                self._count_connections(lanes.all)
                self._transport = self._courier = None
        return self.stats

    def _count_connections(self, connections: tuple[Transport, ...]) -> None:
        """The channels ``connections`` opened, and their stalls, into ``stats``."""
        self.stats.channels_opened = sum(t.channels_opened for t in connections)
        self.stats.reconnects = self.stats.channels_opened - len(connections)
        self.stats.stalls = sum(t.stalls for t in connections)
        self.stats.handovers = sum(t.handovers for t in connections)

    async def _work(self) -> None:
        """Drive the client's lifecycle (``fedlink.client.protocol``) over gRPC until it stops."""
        self._protocol.settings = self._protocol_settings()
        action = self._protocol.start()
        while isinstance(action, CheckIn):  # GetTask says the version it holds
            action = await self._answer(await self._next_task())
        assert isinstance(action, Stop)
        if action.run_over:
            await self._finished(action.reason)

    async def _answer(self, reply: TaskReply) -> Action:
        """Act on the coordinator's answer to a check-in until the protocol checks in again
        or stops: wait, or do the task offered."""
        protocol = self._protocol
        protocol.settings = self._protocol_settings()  # a new join may have changed them
        action = protocol.heard(Offered(reply, self._clock()))
        if isinstance(action, WaitFor):
            if action.declined is not None:  # never advertised: a coordinator's mistake
                log.warning("%s: declining evaluation task %s: the trainer has no evaluate "
                            "method", self.client_id, action.declined.task_id)
            await self._sleep(action.seconds)
            return protocol.heard(Slept())
        if protocol.task is not None:
            return await self._do_task(protocol, action)
        return action

    async def _finished(self, reason: str) -> None:
        """The coordinator said the run is over: remember it (a later start is then done)."""
        log.info("%s: run finished: %s", self.client_id, reason)
        self.stats.finished = reason
        assert self.config is not None
        await asyncio.to_thread(remember_finished, self.options.outbox_dir, self.target,
                                self.config.run_name, self.stats.finished)

    def _protocol_settings(self) -> ProtocolSettings:
        assert self.config is not None
        return ProtocolSettings(inline_bytes=self.config.inline_bytes,
                                can_evaluate=evaluator_of(self.trainer) is not None,
                                decline_wait_s=self.config.heartbeat_interval_s,
                                max_tasks=self.options.max_tasks,
                                secure=self.config.secure is not None)

    async def _do_task(self, protocol: ClientProtocol, action: Action) -> Action:
        """Perform one task's actions until the protocol leaves the task; the next action."""
        task = protocol.task
        assert task is not None
        if task.kind is TaskKind.TRAIN:
            self.stats.tasks += 1
        # heartbeats for the whole task (download, training, delivery): a long upload or a
        # backoff must not look like a dead client to the coordinator's liveness check
        beating = asyncio.create_task(self._heartbeat(task))
        work = _TaskWork()
        try:
            while protocol.task is task:
                try:
                    step: Callable[..., Awaitable[Action]] = getattr(
                        self, self._STEPS[type(action)])
                    action = await step(action, work, protocol)
                except RemoteError as err:
                    # the task may close before the download (its round flushed meanwhile) as
                    # well as before the commit: either way the coordinator refuses, and the
                    # client moves on
                    action = protocol.heard(self._lost(task.task_id, err))
                except SecAggError as err:
                    action = protocol.heard(self._left_group(task.task_id, err))
        finally:
            beating.cancel()
            if work.keys is not None:  # a key exchange the task ended before is cancelled
                work.keys.cancel()
            await cancel_and_wait(beating)
            if work.keys is not None:
                with contextlib.suppress(RemoteError, SecAggError):
                    await cancel_and_wait(work.keys)  # its outcome is the task's, already heard
        return action

    # -- the task's actions (each performs one, tells the protocol what came of it) ----------

    async def _download(self, action: Download, work: _TaskWork,
                        protocol: ClientProtocol) -> Action:
        task = action.task
        if action.exchange_keys:  # secure phases 1 and 2 need no update: they go on meanwhile
            work.keys = asyncio.create_task(self._exchange_keys(task))
        with self._network_clock():
            work.model = await self.courier.transfers.fetch_model(self.client_id, task,
                                                                  self._held)
        self._held = HeldModel(task.model_version, work.model, task.model.checksum)
        return protocol.heard(ModelReceived(task.model_version))

    async def _train_step(self, action: Train, work: _TaskWork,
                          protocol: ClientProtocol) -> Action:
        work.result = await self._train(action.task, work.trained_from(), action.deadline)
        return protocol.heard(Trained(self._clock()))

    async def _encode(self, action: Encode, work: _TaskWork,
                      protocol: ClientProtocol) -> Action:
        assert work.result is not None
        work.update = self._pending_update(action.task, work.result, work.trained_from(),
                                           action.time_left_s)
        if self._secure_settings() is not None:  # masked in its group, never kept or sent plain
            _check_secure_codec(work.update)  # refused now, not after the key exchange
            return protocol.heard(Encoded(work.update.payload.header.num_bytes))
        await self.courier.keep(work.update)
        if self.pipeline.saves_state:  # the error-feedback residual, to disk
            await asyncio.to_thread(self.pipeline.save_state)
        return protocol.heard(Encoded(work.update.payload.header.num_bytes))

    async def _deliver(self, action: Deliver, work: _TaskWork,
                       protocol: ClientProtocol) -> Action:
        assert work.update is not None
        with self._network_clock():
            sending = self._clock()
            await self.courier.deliver(work.update)  # inline or not: the same rule as action's
            self.pipeline.observe_upload(action.num_bytes, self._clock() - sending)
        return protocol.heard(Accepted())

    async def _evaluate(self, action: Evaluate, work: _TaskWork,
                        protocol: ClientProtocol) -> Action:
        evaluator = evaluator_of(self.trainer)
        assert evaluator is not None  # the protocol declines evaluations without one
        scores = await self._off_loop(evaluator.evaluate, work.trained_from())
        work.report = self._scored(action.task, scores)
        return protocol.heard(Scored())

    async def _report(self, action: Report, work: _TaskWork,
                      protocol: ClientProtocol) -> Action:
        report = work.report
        assert report is not None
        with self._network_clock():
            await self._call(lambda: self.transport.report_evaluation(report),
                             "ReportEvaluation")
        self.stats.evaluations += 0 if report.declines else 1
        return protocol.heard(Accepted())

    # -- secure aggregation's phases (``fedlink.client.secure``) --------------------------

    async def _exchange_keys(self, task: Task) -> SecureDelivery:
        """Secure phases 1 and 2 of ``task``, beside its download and training: its keys
        advertised, the roster heard, its secrets shared. A group that goes on without the
        task before its masked update (``NEW_KEYS``: lost, its shares came too late, or a
        roster short of members asks again) is followed by fresh keys for the next group,
        while the client trains or with the update it trained: training the task again
        would waste the work, and past the task's deadline would complete no step, which a
        secure sum weighs as much as any other update."""
        while True:
            secure = self._secure_delivery(task)
            try:
                await self._advertise(secure)
                await self._share_keys(secure)
            except UpdateRefused as err:
                if err.reason is not RefusalCode.NEW_KEYS:
                    raise
                log.info("%s: %s; advertising fresh keys", self.client_id, err.detail)
                continue
            return secure

    async def _advertise(self, secure: SecureDelivery) -> None:
        # not network time: it overlaps the download and the training
        secure.roster(await self._secure_call("Advertise", secure.advertise(), timed=False))

    async def _share_keys(self, secure: SecureDelivery) -> None:
        secure.shared(await self._secure_call("Share", secure.share(), timed=False))

    async def _masked_upload(self, action: MaskedUpload, work: _TaskWork,
                             protocol: ClientProtocol) -> Action:
        assert work.keys is not None and work.update is not None and self.config is not None
        with self._network_clock():  # what is left of the key exchange holds the upload up
            secure = work.secure = await work.keys  # its refusal is the task's
        update = work.update
        secure.trained(self._secure_delta(update), update.num_examples, update.steps_completed,
                       update.steps_planned, residual=self._secure_residual)
        # its own stream (spawning leaves the client's as it was): the rounding and noise
        # draws do not move the next training plans off those of the same plain run
        request = secure.masked(self._rng.spawn(1)[0])
        self._count_clipped(secure)
        if not travels_inline(len(request.values), self.config.inline_bytes):
            # a large masked update rides the resumable upload; the call then names it
            upload_id = f"{self.client_id}-{action.task.task_id}-masked-{uuid.uuid4().hex[:12]}"
            with self._network_clock():
                await self.courier.transfers.upload(self.client_id, upload_id, request.values,
                                                    resume=False)
            request = dataclasses.replace(request, values=b"", upload_id=upload_id)
        else:
            self.stats.bytes_up += len(request.values)  # as an inline commit counts its update
        secure.heard(await self._secure_call("Masked", request))
        return protocol.heard(PhaseDone())

    def _count_clipped(self, secure: SecureDelivery) -> None:
        """Count the values the ring's clip cut from this update, warning at the first: the
        coordinator sees only sums, so this client is the one to say its update was cut."""
        if not secure.values_clipped:
            return
        if not self.stats.secure_values_clipped:
            log.warning("%d values of this update lay beyond the secure ring's clip (+-%g) and "
                        "were clipped (without group random-k, that part of the update is "
                        "lost): raise [coordinator.secure] clip; later ones are counted in "
                        "secure_values_clipped", secure.values_clipped, secure.config.clip)
        self.stats.secure_values_clipped += secure.values_clipped

    async def _unmask(self, action: Unmask, work: _TaskWork,
                      protocol: ClientProtocol) -> Action:
        secure = work.secure
        assert secure is not None
        await self._secure_call("Unmask", secure.unmask())
        # the update is in a flushed sum: what it kept back joins the next one
        self._secure_residual = secure.next_residual
        work.secure = None  # the task's secrets go with it
        self.stats.accepted += 1
        return protocol.heard(Accepted())

    async def _secure_call(self, name: str, request: object, timed: bool = True) -> Any:
        settings = self._secure_settings()
        assert settings is not None
        with self._network_clock() if timed else contextlib.nullcontext():
            return await self._call(
                lambda: self.transport.secure(name, request, 2 * settings.phase_s),
                f"Secure{name}")

    def _secure_settings(self) -> SecureSettings | None:
        return None if self.config is None else self.config.secure

    def _secure_delivery(self, task: Task) -> SecureDelivery:
        """A secure delivery for ``task``, with fresh keys (its update comes once trained)."""
        from fedlink.client.secure import SecureDelivery  # needs the secagg extra

        settings = self._secure_settings()
        assert settings is not None and self.config is not None
        return SecureDelivery(self.client_id, task, settings, self.config.num_parameters)

    def _secure_delta(self, update: PendingUpdate) -> np.ndarray:
        """The update the pipeline made (privacy applied), as a vector to mask."""
        assert self.config is not None
        _check_secure_codec(update)
        return unpack(update.payload.header, update.payload.data, self.config.num_parameters)

    _STEPS: ClassVar[Mapping[type, str]] = {
        Download: "_download", Train: "_train_step", Encode: "_encode", Deliver: "_deliver",
        Evaluate: "_evaluate", Report: "_report", MaskedUpload: "_masked_upload",
        Unmask: "_unmask"}
    """The method that performs each action (by name: a subclass may perform one its way)."""

    def _scored(self, task: Task, scores: Mapping[str, float]) -> EvaluationReport:
        """The report of the trainer's ``scores``, or the task's decline (logged) when there
        is no score to send: no local examples, or a score that is not a finite number."""
        report, why = report_or_decline(self.client_id, task, self.trainer, scores)
        if why:
            log.warning("%s: declining evaluation task %s: %s", self.client_id, task.task_id,
                        why)
        return report

    def _left_group(self, task_id: str, err: SecAggError) -> Lost:
        """A roster or share this client cannot use (a neighbour's share that does not
        decrypt): it leaves the group, which unmasks around it as around any dropout, and
        checks in again (fresh keys for a later group) instead of ending the session."""
        self.stats.failed += 1
        log.warning("%s: task %s left its secure group: %s", self.client_id, task_id, err)
        return Lost(f"secure aggregation: {err}")

    def _lost(self, task_id: str, err: RemoteError) -> Refused | Lost:
        """Count a task lost to ``err`` (re-raised when it must stop the session)."""
        outcome = outcome_of(err)
        if isinstance(outcome, Refused):
            self.stats.refused += 1
            self.stats.refusals.append(err.detail)
            # A refusal (too stale, round already full, run over) is a normal outcome of
            # elastic rounds: logged, counted, and in the coordinator's report, not a warning.
            log.info("%s: update for %s refused: %s", self.client_id, task_id, err.detail)
        elif isinstance(outcome, Lost):
            self.stats.failed += 1
            log.warning("%s: task %s failed: %s", self.client_id, task_id, err)
        else:
            raise err
        return outcome

    @contextlib.contextmanager
    def _network_clock(self) -> Iterator[None]:
        """Adds the time spent in the block to ``stats.network_seconds`` (even on failure)."""
        started = self._clock()
        try:
            yield
        finally:
            self.stats.network_seconds += self._clock() - started

    # -- delivery -------------------------------------------------------------------------------

    def _pending_update(self, task: Task, result: TrainResult, model: np.ndarray,
                        time_left_s: float | None = None) -> PendingUpdate:
        """Encode the trained update, with what its commit needs (for the outbox);
        ``time_left_s`` (to the task's deadline) lets the pipeline size the upload."""
        assert self.config is not None
        self.pipeline.configure(task.options)  # e.g. the coordinator's current clip norm
        if self.pipeline.spec is None:  # privacy by kind: the trainer's spec, once it has one
            self.pipeline.bind(getattr(self.trainer, "spec", None))
        payload = self.pipeline.process(result.params - model, self._rng, time_left_s)
        metrics = {**result.metrics, **self.pipeline.privacy_metrics}
        return PendingUpdate(
            target=self.target, run_name=self.config.run_name, client_name=self.options.name,
            client_id=self.client_id,
            upload_id=f"{self.client_id}-{task.task_id}-{uuid.uuid4().hex[:12]}",
            task_id=task.task_id, base_version=task.model_version,
            num_examples=result.num_examples, steps_completed=result.steps_completed,
            steps_planned=result.steps_planned, payload=payload, metrics=metrics,
            created_at=time.time())

    # -- calls ----------------------------------------------------------------------------------

    @property
    def transport(self) -> Transport:
        """The open transport (only inside ``run``)."""
        if self._transport is None:
            raise RuntimeError("the session is not running")
        return self._transport

    @property
    def courier(self) -> Courier:
        """Transfers and deliveries over the open transport (only inside ``run``)."""
        if self._courier is None:
            raise RuntimeError("the session is not running")
        return self._courier

    async def _join(self) -> RunConfig:
        reply = await self._call(
            lambda: self.transport.join(JoinRequest(
                client_name=self.options.name, token=self.options.token,
                num_examples=self.trainer.num_examples(), metadata={"sdk": "fedlink"},
                instance_key=self.instance_key, capabilities=capabilities(self.trainer))),
            "Join")
        same_run(self.config, reply.config, self.trainer, self.target)
        if reply.config.secure is not None:
            _check_secure_privacy(self.pipeline, self.trainer)
        self.client_id = reply.client_id
        if self.config is None:  # a running run: an earlier "run over" no longer holds
            forget_finished(self.options.outbox_dir)
        self.config = reply.config
        # a ping's ack may queue behind the chunks in flight (one each way)
        self.transport.link.queued_bytes = 2 * reply.config.chunk_bytes
        log.info("joined as %s (%d parameters)", self.client_id, reply.config.num_parameters)
        return reply.config

    def _over_before(self, err: RemoteError) -> bool:
        """Whether a client that cannot reach the coordinator was told earlier (a kept answer
        in its state dir) that the run there is over: then it is done, not failed."""
        reason = finished_before(self.options.outbox_dir, self.target) if err.retryable \
            else None
        if reason is None:
            return False
        log.info("coordinator unreachable (%s); it said earlier that the run is over: %s",
                 err, reason)
        self.stats.finished = reason
        return True

    async def _leave(self, reason: str) -> None:
        """Leave, reporting the counters no ``Commit`` carried (the last one's retries...)."""
        unreported = self.stats.since(self.courier.reported)
        with contextlib.suppress(RemoteError):
            await self.transport.leave(LeaveRequest(self.client_id, reason, unreported))

    async def _next_task(self) -> TaskReply:
        """``GetTask``, joining again (once) if the coordinator has forgotten this client."""
        try:
            return await self._call(self._get_task, "GetTask")
        except Unauthenticated:
            log.info("%s: coordinator does not know us; joining again", self.client_id)
            await self._join()
            return await self._call(self._get_task, "GetTask")

    async def _get_task(self) -> TaskReply:
        """``GetTask``, saying which model version the client holds (the protocol's)."""
        held = self._protocol.held_version
        return await self.transport.get_task(GetTaskRequest(self.client_id, held))

    # -- training -------------------------------------------------------------------------------

    async def _train(self, task: Task, model: np.ndarray,
                     deadline: float | None) -> TrainResult:
        """Train off the event loop (unless inline), so that heartbeats go on meanwhile."""
        config = self.config
        assert config is not None
        plan = plan_for(task, config.batch_size, config.learning_rate, config.trainer_options,
                        int(self._rng.integers(plan_seed_bound(self.options.seed))),
                        deadline)
        result = await self._off_loop(self.trainer.train, model, plan)
        self.stats.train_seconds += float(result.metrics.get("train_seconds", 0.0))
        return result

    async def _off_loop(self, work: Callable[..., R], *args: object) -> R:
        """``work(*args)`` on the executor, or on the loop's thread with ``inline_training``."""
        if self._inline_training:
            return work(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)

    async def _sleep_on_clock(self, seconds: float) -> None:
        await sleep_on(self._timer, seconds)

    async def _heartbeat(self, task: Task) -> None:
        """Tell the coordinator every ``heartbeat_interval_s`` that this task's client lives."""
        assert self.config is not None
        while True:
            # on the session's clock, not the injectable ``sleep`` (which serves retries and
            # which tests fake): the coordinator's liveness check counts in the same time
            await sleep_on(self._timer, self.config.heartbeat_interval_s)
            with contextlib.suppress(RemoteError):
                await self.transport.heartbeat(HeartbeatRequest(self.client_id, task.task_id))


def _check_secure_codec(update: PendingUpdate) -> None:
    """Refuse an uplink codec other than ``fp32`` in a secure run: masks destroy what it
    would save."""
    encoding = update.payload.header.encoding
    if encoding != "fp32":
        raise ConfigError(f"client compression {encoding!r} cannot be used in a secure run "
                          f"(masked updates are integers in Z_m): use 'fp32'")


def _check_secure_privacy(pipeline: UpdatePipeline, trainer: Trainer) -> None:
    """Refuse a client privacy stage or a DP-SGD trainer in a secure run: each reports its
    clipping and noise to a coordinator hook that reads each update, and a secure coordinator
    sees only sums, so the noise would go unaccounted (distributed DP is the secure run's
    own)."""
    if not isinstance(pipeline.privacy, NoPrivacy):
        what = f"client privacy {pipeline.privacy.name!r}"
    elif isinstance(trainer, AccountsPrivacy):
        what = f"a trainer that accounts its own privacy ({type(trainer).__name__})"
    else:
        return
    raise ConfigError(f"{what} cannot be used in a secure run: a secure coordinator sees only "
                      f"sums and accounts no client's noise; unset it (the run's distributed "
                      f"DP, [coordinator.secure] noise_multiplier, is what adds and accounts "
                      f"noise)")


def run_client(target: str, trainer: Trainer, options: ClientOptions | None = None,
               pipeline: UpdatePipeline | None = None) -> SessionStats:
    """Sync facade: run one client session to the end of the run."""
    return asyncio.run(ClientSession(target, trainer, options, pipeline).run())


def same_run(joined: RunConfig | None, offered: RunConfig, trainer: Trainer,
             target: str) -> None:
    """``WrongRun`` unless the run ``offered`` at ``Join`` is one this client can take part in:
    its model has as many parameters as ``trainer``'s (when the trainer says: a ``ParamSpec``
    as ``spec``, as ``TorchTrainer`` has), and, joining again, it is the run the client
    ``joined`` (same name and model size)."""
    spec = getattr(trainer, "spec", None)
    size = spec.size if isinstance(spec, ParamSpec) else None
    if size is not None and size != offered.num_parameters:
        raise WrongRun(f"the coordinator at {target} runs {offered.run_name!r} with a model of "
                       f"{offered.num_parameters} parameters; this client's trainer holds "
                       f"{size}")
    if joined is not None and (joined.run_name, joined.num_parameters) != (
            offered.run_name, offered.num_parameters):
        raise WrongRun(f"the coordinator at {target} now runs {offered.run_name!r} "
                       f"({offered.num_parameters} parameters), not {joined.run_name!r} "
                       f"({joined.num_parameters} parameters), which this client joined")
