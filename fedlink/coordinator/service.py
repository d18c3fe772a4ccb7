"""The coordinator's call handlers, in plain async Python over fedlink's own messages.

The gRPC servicer (``servicer.py``) only converts messages and status codes; everything a call
means is here: checking the caller, validating input at the edge, and handing off to the
``RoundEngine``. Handlers raise ``fedlink.errors.RemoteError`` subclasses for every refusal.

Durability of uploads: chunks are appended to the upload's spool as they arrive and made
durable once per ``Upload`` call, when the stream ends *or breaks* (a ``finally``), before the
reply reports them; ``UploadStatus`` reports only durable bytes. ``Commit`` first makes the
upload durable, then checks for a remembered answer, accepts and remembers the new answer with
no ``await`` in between, so concurrent duplicate commits cannot both reach the engine.

Durability of everything else (with a ``state_dir``): each call that changes state does so
inside ``_durably()``, which journals the change to the ``StateStore`` with the events it
emitted; every call awaits ``state.sync()`` before it answers (a group commit shared with the
calls waiting at the same moment), and the events reach the event log once durable. A new
service restores what a previous process left in the ``state_dir``
(``fedlink.coordinator.state``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hmac
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fedlink.clock import Clock, RealClock
from fedlink.compress import CODECS
from fedlink.coordinator.admission import JoinGate
from fedlink.coordinator.auth import caller_name
from fedlink.coordinator.config import CoordinatorConfig, LimitsConfig
from fedlink.coordinator.downloads import DownloadLedger
from fedlink.coordinator.engine import FlushOutcome, ReceivedUpdate, RoundEngine, TaskRecord
from fedlink.coordinator.faults import NO_FAULTS, FaultPlan
from fedlink.coordinator.lifecycle import RunLifecycle, StopRule
from fedlink.coordinator.limits import Limiter
from fedlink.coordinator.progress import ProgressLog
from fedlink.coordinator.registry import ClientRegistry
from fedlink.coordinator.state import FlushRecord, SavedState, open_store
from fedlink.coordinator.timers import Alarm, strictly_after
from fedlink.coordinator.uploads import UploadBounds, UploadSession, UploadStore
from fedlink.errors import (
    InvalidArgument,
    RemoteError,
    ResourceExhausted,
    Unauthenticated,
    UpdateRefused,
    UploadIncomplete,
)
from fedlink.messages import (
    CommitReply,
    CommitRequest,
    DataChunk,
    DownloadRequest,
    Finished,
    GetTaskRequest,
    HeartbeatReply,
    HeartbeatRequest,
    JoinReply,
    JoinRequest,
    LeaveReply,
    LeaveRequest,
    RunConfig,
    Task,
    TaskReply,
    TensorHeader,
    UploadChunk,
    UploadReply,
    UploadStatusRequest,
)
from fedlink.metrics import EventLog
from fedlink.wire import Payload, iter_chunks, unpack

log = logging.getLogger(__name__)

Evaluator = Callable[[np.ndarray], Mapping[str, float]]
MAX_SHAPE_DIMS = 32


class CoordinatorService:
    """Implements every call of ``fedlink.v1.Coordinator`` on top of a ``RoundEngine``."""

    def __init__(self, config: CoordinatorConfig, initial_model: np.ndarray, events: EventLog,
                 evaluator: Evaluator | None = None, clock: Clock | None = None,
                 stop_rules: Sequence[StopRule] = (), faults: FaultPlan = NO_FAULTS) -> None:
        self.config = config
        self._faults = faults
        self.events = events
        self._clock = clock if clock is not None else RealClock()
        self._alarm = Alarm(self._clock)  # when the next time rule falls due (keep_time)
        self.state = open_store(config.state_dir, faults)
        self.engine = RoundEngine(config, initial_model, events, clock=self._clock,
                                  state=self.state)
        self.registry = ClientRegistry(clock=self._clock.now)
        self.uploads = UploadStore(*upload_limits(config, self.engine.num_parameters),
                                   config.state_dir, self.state,
                                   upload_bounds(config, self.engine.num_parameters),
                                   self._clock.now)
        # Real time, not ``clock``: a test's frozen clock must not starve the token buckets.
        self.limiter = Limiter(config.limits)
        self.join_gate = JoinGate(config.limits)
        self._evaluator = evaluator
        self._changed = asyncio.Event()
        self._flushes: asyncio.Queue[tuple[FlushOutcome, int]] = asyncio.Queue()
        self._round_bytes_down = 0
        self.downloads = DownloadLedger()
        self.progress = ProgressLog(config.limits.stuck_after_s)
        self._told_finished: set[str] = set()
        self.lifecycle = RunLifecycle(self.engine, events, self._durably, self._notify,
                                      stop_rules)
        self.restored_version: int | None = None
        self._restore()

    # -- durable state ------------------------------------------------------------------------

    def _restore(self) -> None:
        """Continue the run a previous process left in ``state_dir``, or checkpoint a new one."""
        saved = self.state.load(self.engine.num_parameters)
        for event in saved.unwritten_events if saved else ():
            self.events.replay(event)  # durable, maybe never written: now they are
        with self._durably():
            if saved is None:
                self.engine.save_initial()
            else:
                self._take_back(saved)
        self.state.sync_now()  # before the first call is served

    def _take_back(self, saved: SavedState) -> None:
        """Restore engine, registry and uploads from ``saved``; queue its unreported flushes."""
        self.engine.restore(saved)
        self.registry.restore(saved.clients)
        self.uploads.restore(saved.settled)
        self.restored_version = self.engine.version
        models = {c.version: c.model for c in saved.checkpoints}
        for record in saved.unreported:
            self._flushes.put_nowait((_outcome(record, models.get(record.version,
                                                                  self.engine.model)), 0))
        self.lifecycle.resume(saved.unreported[0].version - 1 if saved.unreported
                              else self.engine.version)
        log.info("restored from %s: version %d, %d clients, %d tasks, %d pending updates",
                 self.config.state_dir, self.engine.version, len(saved.clients),
                 len(saved.tasks), len(saved.pending))
        self.events.emit("coordinator_restored", model_version=self.engine.version,
                         clients=len(saved.clients), tasks=len(saved.tasks),
                         pending_updates=len(saved.pending),
                         settled_uploads=len(saved.settled),
                         unreported_flushes=len(saved.unreported))
        outcome = self.engine.due_flush()
        if outcome is not None:
            self._on_flush(outcome)

    @contextlib.contextmanager
    def _durably(self) -> Iterator[None]:
        """Journal the state changed inside together with the events it emitted.

        The events reach the event log once the store has made both durable; the call then
        awaits ``state.sync()`` before it answers.
        """
        with self.events.captured() as held:
            try:
                yield
            finally:
                self.state.save_events(held)
                self.state.on_durable(functools.partial(self._write_events, held))
                # a finished run rings at once: keep_time journals the end and stops
                self._alarm.arm(self._clock.now() if self.engine.finished
                                else self._soonest_new_due())

    def _write_events(self, held: list[dict[str, Any]]) -> None:
        self.events.write_captured(held)
        self.state.events_written(held)

    # -- calls --------------------------------------------------------------------------------

    async def join(self, request: JoinRequest) -> JoinReply:
        """Register a client; answer with its id and the run configuration."""
        self._check_strings(client_name=request.client_name, token=request.token)
        self._check_mapping("metadata", request.metadata)
        self._check_strings(instance_key=request.instance_key)
        if self.config.join_token and not hmac.compare_digest(
                request.token.encode(), self.config.join_token.encode()):
            raise Unauthenticated("join token is missing or wrong")
        # With per-client tokens the id is bound to the token's name, whatever the request says.
        name = caller_name() or request.client_name
        known = self.registry.rejoin(name, request.instance_key)
        if known is not None:  # a repeated Join (its reply lost): the same client
            await self.state.sync()  # its first Join's record may still be on its way
            return JoinReply(known.client_id, self.run_config())
        self.join_gate.admit(caller_name(), self.registry.live_ids_of)
        self.limiter.check_join(len(self.registry))
        with self._durably():
            record = self.registry.join(name, request.num_examples, request.metadata,
                                        request.instance_key)
            self.state.save_client(record)
            self.events.emit("client_joined", client_id=record.client_id, name=record.name,
                             num_examples=record.num_examples)
        await self.state.sync()
        return JoinReply(record.client_id, self.run_config())

    def run_config(self) -> RunConfig:
        """What every client is told at ``Join``."""
        training, limits = self.config.training, self.config.limits
        return RunConfig(
            run_name=self.config.run_name,
            num_parameters=self.engine.num_parameters,
            local_steps=training.local_steps,
            local_epochs=training.local_epochs,
            batch_size=training.batch_size,
            learning_rate=training.learning_rate,
            chunk_bytes=limits.chunk_bytes,
            heartbeat_interval_s=limits.heartbeat_interval_s,
            max_staleness=self.config.flush.max_staleness,
            accepted_encodings=CODECS.names(),
            trainer_options=dict(training.trainer_options),
            inline_bytes=limits.inline_limit,
            **announced_limits(limits, self.engine.num_parameters),
        )

    async def get_task(self, request: GetTaskRequest) -> TaskReply:
        """A task, or ``Wait``/``Finished``; waits up to ``long_poll_s`` for one to free up.

        Long polling keeps an idle client from hammering the coordinator, and hands out the
        next version's tasks the moment it is published instead of at the next poll.
        """
        self._admit(request.client_id)
        if not -1 <= request.held_version <= self.engine.version:
            raise InvalidArgument(f"held_version {request.held_version} is not a version this "
                                  f"coordinator published (current {self.engine.version}; "
                                  "-1 = none held)")
        reply = await self._next_task(request.client_id, request.held_version)
        if isinstance(reply, Task | Finished):  # a new task, or the run's end, was journaled
            await self.state.sync()
        if isinstance(reply, Task):
            reply = self._with_inline_payload(request.client_id, reply)
        self.lifecycle.check()  # a flush hook may have ended the run
        if isinstance(reply, Finished):
            self._told_finished.add(request.client_id)
        return reply

    async def _next_task(self, client_id: str, held_version: int) -> TaskReply:
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.config.limits.long_poll_s
        while True:
            changed = self._changed
            reply = self._issue(client_id, held_version)
            remaining = give_up_at - loop.time()
            if isinstance(reply, Task | Finished) or remaining <= 0:
                return reply
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except TimeoutError:
                return self._issue(client_id, held_version)

    def _issue(self, client_id: str, held_version: int) -> TaskReply:
        with self._durably():
            return self.engine.issue(client_id, held_version)

    def _with_inline_payload(self, client_id: str, task: Task) -> Task:
        """``task`` carrying its delta, else its model, when that fits ``inline_limit``."""
        limit = self.config.limits.inline_limit
        record = self.engine.task(client_id, task.task_id)
        full = self.engine.payload(record.version)
        if task.has_delta:
            delta = self.engine.delta_payload(record)
            if len(delta.data) <= limit:
                self._offer(record, full, delta, delta=True, inline=True)
                return dataclasses.replace(task, delta_data=delta.data)
        if len(full.data) <= limit:
            self._offer(record, full, full, delta=False, inline=True)
            return dataclasses.replace(task, model_data=full.data)
        return task

    def clients_to_inform(self, silent_after_s: float) -> set[str]:
        """Clients not yet told that the run is over that called within ``silent_after_s``."""
        now = self._clock.now()
        return {client_id for client_id in self.registry.ids() - self._told_finished
                if now - (self.registry.last_seen(client_id) or -math.inf) <= silent_after_s}

    def all_gone_at(self, silent_after_s: float) -> float | None:
        """When every client that has not left counts as gone (silent for longer than
        ``silent_after_s``) if none calls again; ``None``: all are gone already. Told or not:
        a client whose ``Finished`` reply was lost asks again."""
        now = self._clock.now()
        seen = [self.registry.last_seen(client_id) for client_id in self.registry.ids()]
        here = [t for t in seen if t is not None and now - t <= silent_after_s]
        return max(here) + silent_after_s if here else None

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next change a waiting caller may care about (a place freed, a new
        version, a client left, the run's end); take it before checking, then wait on it."""
        return self._changed

    async def download(self, request: DownloadRequest) -> AsyncIterator[DataChunk]:
        """Stream a task's model, or with ``request.delta`` its delta, from ``request.offset``.

        Every chunk sent counts as a sign of life of the client (a slow download is not a
        dead client). The bytes count as downloaded once the client shows it has them
        (``fedlink.coordinator.downloads``): ``download_finished`` comes with its ``Commit``.
        """
        self._admit(request.client_id)
        self._check_strings(task_id=request.task_id)
        if request.offset < 0 or request.max_chunk_bytes < 0:
            raise InvalidArgument("offset and max_chunk_bytes must be >= 0")
        record = self.engine.task(request.client_id, request.task_id)
        if not self.engine.is_open(record):
            raise UpdateRefused(f"task {request.task_id!r} is closed")
        full = self.engine.payload(record.version)
        payload = self.engine.delta_payload(record) if request.delta else full
        if request.offset > len(payload.data):
            raise InvalidArgument(f"offset {request.offset} is past the end of the "
                                  f"{len(payload.data)}-byte {_what(request)}")
        chunk_bytes = min(request.max_chunk_bytes or self.config.limits.chunk_bytes,
                          self.config.limits.max_chunk_bytes)
        self._offer(record, full, payload, delta=request.delta)
        kind = _what(request)
        self.downloads.streaming(record.client_id, record.task_id, kind, request.offset)
        for offset, piece in iter_chunks(payload.data, chunk_bytes, request.offset):
            yield DataChunk(offset, piece)
            self.registry.touch(request.client_id)
        self.downloads.streamed(record.client_id, record.task_id, kind)

    def _offer(self, record: TaskRecord, full: Payload, payload: Payload, delta: bool,
               inline: bool = False) -> None:
        """Note that ``payload`` (the task's model ``full``, or a delta) goes to the client."""
        self.downloads.offer(record.client_id, record.task_id, "delta" if delta else "model",
                             len(payload.data),
                             len(full.data) - len(payload.data) if delta else 0,
                             record.delta_base if delta else None, inline)

    def _downloads_confirmed(self, client_id: str, task_id: str) -> None:
        """The client has its task's payloads (it commits): log ``download_finished``, once."""
        for fields in self.downloads.confirm(client_id, task_id):
            self._round_bytes_down += fields["bytes"]
            self.events.emit("download_finished", **fields)

    async def upload(self, chunks: AsyncIterator[UploadChunk]) -> UploadReply:
        """Receive chunks of one upload; answer with the durable bytes held.

        What arrived is made durable once, when the stream ends, fails or is cut by the
        network (so ``UploadStatus`` after a reconnect reports it), not once per chunk.
        """
        written: tuple[str, str] | None = None  # (client_id, upload_id) once a chunk landed
        with contextlib.ExitStack() as slot:
            try:
                async for chunk in chunks:
                    if written is None:  # the stream's first chunk names the caller
                        self._admit(chunk.client_id)
                        slot.enter_context(self.limiter.upload_slot(chunk.client_id,
                                                                      chunk.upload_id))
                    else:
                        self.registry.touch(chunk.client_id)
                        if chunk.client_id != written[0] or chunk.upload_id != written[1]:
                            raise InvalidArgument("one Upload stream must carry a single "
                                                  "client_id and upload_id")
                    if chunk.offset < 0:
                        raise InvalidArgument(f"offset must be >= 0, got {chunk.offset}")
                    self.uploads.write(chunk.client_id, chunk.upload_id, chunk.offset,
                                       chunk.data)
                    written = (chunk.client_id, chunk.upload_id)
            finally:
                if written is not None:
                    await self._make_durable(*written)
        if written is None:
            raise InvalidArgument("Upload stream carried no chunk")
        return UploadReply(written[1], self.uploads.status(*written))

    async def _make_durable(self, client_id: str, upload_id: str) -> None:
        """fsync what the upload received, off the event loop (nothing to do in memory)."""
        if self.uploads.needs_sync(upload_id):
            await asyncio.to_thread(self.uploads.sync, client_id, upload_id)

    async def upload_status(self, request: UploadStatusRequest) -> UploadReply:
        """How many bytes of an upload the coordinator holds.

        Bytes received but not yet durable (a stream that was just cut, whose ``finally`` may
        not have run or finished its fsync yet) are made durable first, so the answer covers
        everything the coordinator received.
        """
        self._admit(request.client_id)
        await self._make_durable(request.client_id, request.upload_id)
        held = self.uploads.status(request.client_id, request.upload_id)
        return UploadReply(request.upload_id, held)

    async def commit(self, request: CommitRequest) -> CommitReply:
        """Turn a complete upload into an accepted update; the same answer on every repeat."""
        self._admit(request.client_id)
        self._check_strings(upload_id=request.upload_id, task_id=request.task_id)
        self._check_mapping("metrics", request.metrics)
        self._check_header(request.update)
        self._downloads_confirmed(request.client_id, request.task_id)
        if request.update_data:
            self._take_inline_update(request)
        await self._make_durable(request.client_id, request.upload_id)
        # From here to ``settle`` nothing awaits: a duplicate commit running concurrently
        # either finds the remembered answer or has not started yet.
        previous = self.uploads.answer(request.client_id, request.upload_id)
        if previous is not None:
            await self.state.sync()  # the first commit's answer may still be on its way
            return self._replay(previous)
        session = self.uploads.get(request.client_id, request.upload_id)
        with self._durably():
            self._faults.reached("commit.before_accept")
            answer = self._settle(request, session)
        await self.state.sync()
        if isinstance(answer, RemoteError):
            raise answer
        return answer

    def _take_inline_update(self, request: CommitRequest) -> None:
        """Hold an update that came inside its ``Commit`` as if it had been uploaded.

        A repeat of an answered commit writes nothing: it gets the remembered answer.
        """
        limit = self.config.limits.inline_limit
        if len(request.update_data) > limit:
            raise ResourceExhausted(f"inline update of {len(request.update_data)} bytes "
                                    f"exceeds this coordinator's inline limit of {limit} "
                                    "bytes (RunConfig.inline_bytes); upload it, then commit")
        if self.uploads.answer(request.client_id, request.upload_id) is None:
            self.uploads.write(request.client_id, request.upload_id, 0, request.update_data)

    def _settle(self, request: CommitRequest, session: UploadSession) -> CommitReply | RemoteError:
        """Accept or refuse the upload, and remember the answer (an incomplete one is not final)."""
        try:
            answer: CommitReply | RemoteError = self._accept(request, session)
        except UploadIncomplete as err:  # not final: the client resumes and commits again
            log.info("early commit of upload %s: %s", request.upload_id, err.detail)
            return err
        except RemoteError as err:
            self.progress.refused()
            self.events.emit("update_refused", client_id=request.client_id,
                             task_id=request.task_id, reason=err.detail, code=err.code,
                             bytes_up=request.update.num_bytes,
                             **_reported_counters(request.metrics))
            answer = err
        self.uploads.settle(request.client_id, request.upload_id, answer)
        return answer

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatReply:
        """Note that the client is alive; say whether its task is still open."""
        self._admit(request.client_id)
        self._check_strings(task_id=request.task_id)
        task_open = False
        if request.task_id:
            try:
                task_open = self.engine.is_open(self.engine.task(request.client_id,
                                                                 request.task_id))
            except UpdateRefused:  # forgotten because too stale: closed
                task_open = False
        return HeartbeatReply(self.engine.version, task_open)  # changes nothing: no sync

    async def leave(self, request: LeaveRequest) -> LeaveReply:
        """Forget the client; its open task stops holding a place, its uploads are dropped.

        The resilience counters it reports (what grew since its last ``Commit``) go into
        ``client_left``, so that the run's summary counts them.
        """
        self._check_strings(reason=request.reason)
        self._check_mapping("metrics", request.metrics)
        with self._durably():
            self.registry.touch(request.client_id)
            self._forget_client(request.client_id)
            self.events.emit("client_left", client_id=request.client_id,
                             reason=request.reason, **_reported_counters(request.metrics))
        self._notify()
        await self.state.sync()
        return LeaveReply()

    def _forget_client(self, client_id: str) -> None:
        """Everything the coordinator holds for ``client_id`` goes (Leave, or expiry)."""
        self.registry.remove(client_id)
        self.state.forget_client(client_id)
        self.limiter.forget(client_id)
        self.engine.release_client(client_id)
        self.uploads.drop_client(client_id)
        self.downloads.forget_client(client_id)

    def _expire(self) -> bool:
        """Forget clients silent for ``client_ttl_s`` and uploads idle for ``upload_idle_s``.

        Returns whether a client went (its cohort place may have freed).
        """
        self.uploads.expire_idle()
        ttl = self.config.limits.client_ttl_s
        if not ttl:
            return False
        silent = self.registry.silent_since(self._clock.now() - ttl)
        for client_id in silent:
            self._forget_client(client_id)
            self.events.emit("client_expired", client_id=client_id,
                             reason=f"silent for more than {ttl:g} s (limits.client_ttl_s)")
        return bool(silent)

    # -- internals ----------------------------------------------------------------------------

    def _admit(self, client_id: str) -> None:
        """Check the caller is registered (marking it seen), then its request rate."""
        self.registry.touch(client_id)
        self.limiter.admit(client_id)

    def _check_strings(self, **fields: str) -> None:
        """``InvalidArgument`` naming the first field longer than ``max_string_bytes``."""
        limit = self.config.limits.max_string_bytes
        for name, value in fields.items():
            if len(value) > limit:
                raise InvalidArgument(f"{name} is {len(value)} characters long; the limit is "
                                      f"{limit}")

    def _check_header(self, header: TensorHeader) -> None:
        """Bound every client-chosen field of a payload header before anything quotes it."""
        self._check_strings(encoding=header.encoding, dtype=header.dtype,
                            checksum=header.checksum)
        self._check_mapping("codec_params", header.codec_params)
        if len(header.shape) > MAX_SHAPE_DIMS:
            raise InvalidArgument(f"shape has {len(header.shape)} dimensions; the limit is "
                                  f"{MAX_SHAPE_DIMS}")

    def _check_mapping(self, name: str, mapping: Mapping[str, Any]) -> None:
        """``InvalidArgument`` for a map with too many entries, or too long keys or values."""
        limit = self.config.limits.max_metadata_entries
        if len(mapping) > limit:
            raise InvalidArgument(f"{name} has {len(mapping)} entries; the limit is {limit}")
        size = sum(len(k) + (len(v) if isinstance(v, str) else 8) for k, v in mapping.items())
        cap = self.config.limits.max_metadata_bytes
        if cap and size > cap:
            raise InvalidArgument(f"{name} holds {size} characters in all; the limit is {cap}")
        for key, value in mapping.items():
            self._check_strings(**{f"{name} key": key})
            if isinstance(value, str):
                self._check_strings(**{f"{name}[{key[:32]!r}]": value})

    def _accept(self, request: CommitRequest, session: UploadSession) -> CommitReply:
        if session.committed_offset < request.update.num_bytes:
            raise UploadIncomplete(f"upload {request.upload_id!r} is incomplete: "
                                f"{session.committed_offset} of {request.update.num_bytes} "
                                "bytes received; resume it, then commit")
        _check_counts(request)
        if request.base_version > self.engine.version:
            raise InvalidArgument(f"base_version {request.base_version} is from the future: "
                                  f"the current model version is {self.engine.version}")
        delta = unpack(request.update, bytes(session.data), self.engine.num_parameters)
        acceptance = self.engine.submit(ReceivedUpdate(
            client_id=request.client_id, task_id=request.task_id,
            base_version=request.base_version, delta=delta,
            num_examples=bounded_examples(request.num_examples,
                                          self.registry.declared_examples(request.client_id),
                                          self.config.limits.max_examples_per_update),
            steps_completed=request.steps_completed,
            steps_planned=request.steps_planned, bytes_up=request.update.num_bytes,
            metrics=request.metrics))
        if acceptance.flush is not None:
            self._on_flush(acceptance.flush)
        elif self.engine.rule.continuous:  # a place just freed: wake a waiting client
            self._notify()
        flushed = acceptance.flush.version if acceptance.flush is not None else 0
        return CommitReply(request.upload_id, acceptance.model_version, acceptance.staleness,
                           accepted_version=acceptance.accepted_version,
                           flushed_version=flushed)

    @staticmethod
    def _replay(previous: CommitReply | RemoteError) -> CommitReply:
        if isinstance(previous, RemoteError):
            raise type(previous)(previous.detail)
        return previous

    async def keep_time(self) -> None:
        """Apply the time rules each time one falls due, until the run ends (a background
        task of the server): the alarm rings from ``Clock.call_at``, never from a poll."""
        self._alarm.start(asyncio.get_running_loop())
        try:
            while not self.engine.finished:
                await self._alarm.wait()
                self.poll()
                await self.state.sync()  # what poll changed (or an end_run) is journaled
        finally:
            self._alarm.stop()

    def next_due(self) -> float | None:
        """The earliest instant a time rule (deadline, liveness, expiry, stuck line) has
        something to do, as things stand; a scan of tasks, clients and uploads."""
        limits = self.config.limits
        due = [self.engine.next_due(self.registry.last_seen), self._stuck_due()]
        oldest_seen = self.registry.oldest_seen()
        if limits.client_ttl_s and oldest_seen is not None:
            due.append(oldest_seen + limits.client_ttl_s)
        due.append(self.uploads.next_expiry())
        return min((t for t in due if t is not None), default=None)

    def _soonest_new_due(self) -> float | None:
        """A bound on when a rule can fall due after a change, in O(1): the round's deadline
        and stuck line exactly, and for the rules counted from a client's last activity
        (liveness, task age, expiry) the shortest of their periods from now. ``keep_time``
        computes the exact instant once woken."""
        limits, now = self.config.limits, self._clock.now()
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

    def poll(self) -> None:
        """Apply the deadline rule and the liveness check (when one falls due, ``keep_time``).

        Places released by either are offered at once to clients waiting in ``GetTask``.
        """
        with self._durably():
            expired = self._expire()
            released = self.engine.release_silent(self.registry.last_seen) or expired
            outcome = self.engine.poll()
        if outcome is not None:
            self._on_flush(outcome)
        elif released or self.engine.rule.deadline_s is not None:
            self._notify()
        if not self.engine.finished and self.progress.due(self.engine.version,
                                                          self.engine.round_age_s()):
            self.progress.stuck(self.engine.round_state())
        due = self.next_due()
        if due is not None:  # what was due now was just done: the next wake is after now
            self._alarm.arm(strictly_after(self._clock.now(), due))

    def close(self) -> None:
        """Release open upload spools (their bytes stay on disk for a restart) and the state."""
        self.uploads.close()
        self.state.close()

    def _on_flush(self, outcome: FlushOutcome) -> None:
        self._flushes.put_nowait((outcome, self._round_bytes_down))
        self._round_bytes_down = 0
        self._notify()

    def _notify(self) -> None:
        """Wake every long-polling ``GetTask``."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def report_flushes(self) -> None:
        """Evaluate each new version off the event loop and log its ``flush`` event.

        Runs as one background task so evaluation never delays a call, and flush events come
        out in version order.
        """
        while True:
            outcome, bytes_down = await self._flushes.get()
            if not self.lifecycle.reports(outcome.version):  # made after the run's last
                with self._durably():
                    self.state.mark_reported(outcome.version)
                continue
            metrics = await self._evaluate(outcome.model)
            fields = {"model_version": outcome.version, "num_updates": outcome.num_updates,
                      "total_weight": outcome.total_weight,
                      "round_seconds": outcome.round_seconds, "bytes_up": outcome.bytes_up,
                      "bytes_down": bytes_down, "updates": list(outcome.task_ids),
                      **dict(outcome.hook_report), **metrics}
            with self._durably():
                self.events.emit("flush", **fields)
                self.state.mark_reported(outcome.version)
            await self.state.sync()
            self.progress.flushed(outcome.version, outcome.num_updates, outcome.round_seconds,
                                  metrics)
            self.lifecycle.flush_reported(outcome.version, fields, outcome.model)

    async def _evaluate(self, model: np.ndarray) -> dict[str, Any]:
        if self._evaluator is None:
            return {}
        try:
            return dict(await asyncio.to_thread(self._evaluator, model))
        except Exception:  # an evaluator bug must not stop training
            log.exception("evaluating the global model failed")
            return {}


def _outcome(record: FlushRecord, model: np.ndarray) -> FlushOutcome:
    """A flush made by a previous process, to report now."""
    return FlushOutcome(record.version, model, record.num_updates, record.total_weight,
                        record.round_seconds, record.bytes_up, record.finished,
                        dict(record.hook_report), record.task_ids)


REPORTED_COUNTERS = ("retries", "offline_seconds", "resumed_bytes")


def _reported_counters(metrics: Mapping[str, float]) -> dict[str, float]:
    """The resilience counters among a client's ``metrics`` (finite, >= 0; others ignored)."""
    return {name: float(metrics[name]) for name in REPORTED_COUNTERS
            if name in metrics and math.isfinite(metrics[name]) and metrics[name] >= 0}


def bounded_examples(claimed: int, declared: int, cap: int) -> int:
    """The example count an update is weighted by: what it claims, at most what its client
    declared at ``Join`` (when it declared a size) and at most ``cap`` (0: no cap).

    A weight is the client's word about itself; without a bound one commit claiming 2**62
    examples *is* the weighted mean (a model takeover).
    """
    bounded = claimed
    if declared > 0:
        bounded = min(bounded, declared)
    if cap > 0:
        bounded = min(bounded, cap)
    return bounded


def upload_limits(config: CoordinatorConfig, num_parameters: int) -> tuple[int, int]:
    """``(max_update_bytes, max_chunk_bytes)`` in force for a model of ``num_parameters``."""
    limits = config.limits
    return limits.update_bytes_for(num_parameters), limits.max_chunk_bytes


def upload_bounds(config: CoordinatorConfig, num_parameters: int) -> UploadBounds:
    """What ``config.limits`` lets one client, and all of them, hold in uploads."""
    limits = config.limits
    return UploadBounds(per_client_uploads=limits.max_open_uploads_per_client,
                        per_client_bytes=limits.client_upload_bytes_for(num_parameters),
                        total_bytes=limits.spool_bytes_for(num_parameters),
                        idle_s=limits.upload_idle_s, retry_after_s=limits.retry_after_s)


def announced_limits(limits: LimitsConfig, num_parameters: int) -> dict[str, Any]:
    """The limits a client must respect, as ``RunConfig`` fields (``docs/protocol.md``)."""
    return {"max_chunk_bytes": limits.max_chunk_bytes, "long_poll_s": limits.long_poll_s,
            "max_update_bytes": limits.update_bytes_for(num_parameters),
            "max_string_bytes": limits.max_string_bytes,
            "max_metadata_entries": limits.max_metadata_entries,
            "max_uploads_per_client": limits.max_uploads_per_client,
            "requests_per_s": limits.requests_per_s, "request_burst": limits.request_burst,
            "max_metadata_bytes": limits.max_metadata_bytes,
            "max_examples_per_update": limits.max_examples_per_update,
            "max_open_uploads_per_client": limits.max_open_uploads_per_client}


def _what(request: DownloadRequest) -> str:
    return "delta" if request.delta else "model"


def _check_counts(request: CommitRequest) -> None:
    if request.num_examples < 1:
        raise InvalidArgument(f"num_examples must be >= 1, got {request.num_examples}")
    if request.steps_completed < 0 or request.steps_planned < 0:
        raise InvalidArgument("steps_completed and steps_planned must be >= 0")
    if request.steps_completed > request.steps_planned > 0:
        raise InvalidArgument(f"steps_completed {request.steps_completed} exceeds "
                              f"steps_planned {request.steps_planned}")

