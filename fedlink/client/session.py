"""The client session loop: join, get a task, download, train, upload, commit, repeat.

``ClientSession`` is the async core; ``run_client`` is the thin sync facade for scripts and
devices that do not run an event loop of their own. Training runs off the event loop (in a
thread, or the executor you pass), so heartbeats keep flowing while it trains.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from fedlink.client.base import Trainer, TrainPlan, TrainResult
from fedlink.client.pipeline import UpdatePipeline
from fedlink.client.retry import RetryPolicy, Sleep
from fedlink.client.transport import Timeouts, Transport
from fedlink.errors import DataLoss, NotFound, RemoteError, Unauthenticated, UpdateRefused
from fedlink.messages import (
    CommitRequest,
    DownloadRequest,
    Finished,
    GetTaskRequest,
    HeartbeatRequest,
    JoinRequest,
    LeaveRequest,
    RunConfig,
    Task,
    TaskReply,
    UploadChunk,
    UploadStatusRequest,
    Wait,
)
from fedlink.wire import Payload, iter_chunks, unpack

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class SessionStats:
    """What one client did during a run (for logs, reports and benchmarks).

    ``refused`` counts updates the coordinator would not use (too stale, task closed);
    ``failed`` counts tasks lost to corrupted transfers or forgotten tasks; ``retries`` counts
    retried calls; ``resumed_bytes`` the upload bytes a resume did not have to send again;
    ``network_seconds`` the time spent downloading, uploading and committing.
    """

    tasks: int = 0
    accepted: int = 0
    refused: int = 0
    failed: int = 0
    retries: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    train_seconds: float = 0.0
    resumed_bytes: int = 0
    network_seconds: float = 0.0
    refusals: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ClientOptions:
    """How a client behaves; every field has a sensible default."""

    name: str = ""
    token: str = ""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    seed: int = 0
    max_tasks: int | None = None


class ClientSession:
    """One client taking part in a run, from ``Join`` to ``Finished``.

    Training runs on ``executor`` (default: asyncio's thread pool) so that heartbeats go on
    meanwhile. ``inline_training=True`` trains on the event loop's own thread instead: for many
    simulated clients with small models in one process this avoids contention for the GIL
    between the loop and the training threads (about 3x less time per update on 2 cores), at
    the price of no heartbeats during training.
    """

    def __init__(self, target: str, trainer: Trainer, options: ClientOptions | None = None,
                 pipeline: UpdatePipeline | None = None, executor: Executor | None = None,
                 sleep: Sleep = asyncio.sleep, inline_training: bool = False) -> None:
        self.target = target
        self.trainer = trainer
        self.options = options or ClientOptions()
        self.pipeline = pipeline or UpdatePipeline()
        self.stats = SessionStats()
        self.client_id = ""
        self.config: RunConfig | None = None
        self._executor = executor
        self._inline_training = inline_training
        self._sleep = sleep
        self._rng = np.random.default_rng(self.options.seed)
        self._transport: Transport | None = None

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> SessionStats:
        """Take part until the coordinator says the run is over (or ``max_tasks`` are done)."""
        async with Transport(self.target, self.options.timeouts) as transport:
            self._transport = transport
            try:
                await self._join()
                await self._work()
                await self._leave("run finished")
            finally:
                self._transport = None
        return self.stats

    async def _work(self) -> None:
        while self.options.max_tasks is None or self.stats.tasks < self.options.max_tasks:
            reply = await self._retry(self._get_task, "GetTask")
            if isinstance(reply, Finished):
                log.info("%s: run finished: %s", self.client_id, reply.reason)
                return
            if isinstance(reply, Wait):
                await self._sleep(reply.retry_after_s)
                continue
            await self._do_task(reply)

    async def _do_task(self, task: Task) -> None:
        self.stats.tasks += 1
        started = time.monotonic()
        try:
            # the task may close before the download (its round flushed meanwhile) as well as
            # before the commit: either way the coordinator refuses, and the client moves on
            with self._network_clock():
                model = await self._download(task)
            result = await self._train_with_heartbeats(task, model, started)
            delta = result.params - model
            payload = self.pipeline.process(delta, self._rng)
            with self._network_clock():
                await self._deliver(task, payload, result)
        except UpdateRefused as refusal:
            self.stats.refused += 1
            self.stats.refusals.append(refusal.detail)
            log.warning("%s: update for %s refused: %s", self.client_id, task.task_id,
                        refusal.detail)
        except (DataLoss, NotFound) as failure:
            # bytes corrupted in transit or a task the coordinator no longer knows: this task
            # is lost, the next one may well succeed
            self.stats.failed += 1
            log.warning("%s: task %s failed: %s", self.client_id, task.task_id, failure)

    @contextlib.contextmanager
    def _network_clock(self) -> Iterator[None]:
        """Adds the time spent in the block to ``stats.network_seconds`` (even on failure)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.stats.network_seconds += time.monotonic() - started

    # -- calls ----------------------------------------------------------------------------------

    @property
    def transport(self) -> Transport:
        """The open transport (only inside ``run``)."""
        if self._transport is None:
            raise RuntimeError("the session is not running")
        return self._transport

    async def _retry(self, fn: Callable[[], Awaitable[T]], what: str) -> T:
        """Retry ``fn`` per the policy; re-join once if the coordinator forgot us."""

        def count(_: BaseException) -> None:
            self.stats.retries += 1

        async def attempt() -> T:
            try:
                return await fn()
            except Unauthenticated:
                log.info("%s: coordinator does not know us; joining again", self.client_id)
                await self._join()
                return await fn()

        return await self.options.retry.call(attempt, what=what, sleep=self._sleep,
                                             on_retry=count)

    async def _join(self) -> None:
        reply = await self.options.retry.call(
            lambda: self.transport.join(JoinRequest(
                client_name=self.options.name, token=self.options.token,
                num_examples=self.trainer.num_examples(), metadata={"sdk": "fedlink"})),
            what="Join", sleep=self._sleep)
        self.client_id = reply.client_id
        self.config = reply.config
        log.info("joined as %s (%d parameters)", self.client_id, reply.config.num_parameters)

    async def _leave(self, reason: str) -> None:
        with contextlib.suppress(RemoteError):
            await self.transport.leave(LeaveRequest(self.client_id, reason))

    async def _get_task(self) -> TaskReply:
        return await self.transport.get_task(GetTaskRequest(self.client_id))

    async def _download(self, task: Task) -> np.ndarray:
        """Fetch the task's model, resuming from the bytes already received after a break."""
        buffer = bytearray()

        async def attempt() -> None:
            request = DownloadRequest(self.client_id, task.task_id, offset=len(buffer))
            async for chunk in self.transport.download(request):
                if chunk.offset != len(buffer):
                    raise DataLoss(f"download chunk at offset {chunk.offset}, "
                                        f"expected {len(buffer)}")
                buffer.extend(chunk.data)

        await self._retry(attempt, "Download")
        self.stats.bytes_down += len(buffer)
        return unpack(task.model, bytes(buffer), task.model.shape[0])

    async def _train_with_heartbeats(self, task: Task, model: np.ndarray,
                                     started: float) -> TrainResult:
        plan = self._plan(task, started)
        beating = asyncio.create_task(self._heartbeat(task))
        loop = asyncio.get_running_loop()
        try:
            if self._inline_training:
                result = self.trainer.train(model, plan)
            else:
                result = await loop.run_in_executor(self._executor, self.trainer.train, model, plan)
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
        self.stats.train_seconds += float(result.metrics.get("train_seconds", 0.0))
        return result

    def _plan(self, task: Task, started: float) -> TrainPlan:
        config = self.config
        assert config is not None
        deadline = started + task.deadline_s if task.deadline_s > 0 else None
        return TrainPlan(local_steps=task.local_steps, local_epochs=task.local_epochs,
                         batch_size=config.batch_size, learning_rate=config.learning_rate,
                         deadline=deadline, seed=int(self._rng.integers(2**31)),
                         options=config.trainer_options)

    async def _heartbeat(self, task: Task) -> None:
        assert self.config is not None
        while True:
            await self._sleep(self.config.heartbeat_interval_s)
            with contextlib.suppress(RemoteError):
                await self.transport.heartbeat(HeartbeatRequest(self.client_id, task.task_id))

    async def _deliver(self, task: Task, payload: Payload, result: TrainResult) -> None:
        """Upload (resuming after breaks), then commit; commit is idempotent by upload id."""
        upload_id = f"{self.client_id}-{task.task_id}-{uuid.uuid4().hex[:12]}"
        attempts = 0

        async def upload_attempt() -> None:
            nonlocal attempts
            attempts += 1
            # A fresh upload id holds nothing yet; only a retry needs to ask where to resume.
            await self._upload(upload_id, payload, resume=attempts > 1)

        await self._retry(upload_attempt, "Upload")
        request = CommitRequest(
            client_id=self.client_id, upload_id=upload_id, task_id=task.task_id,
            base_version=task.model_version, num_examples=result.num_examples,
            steps_completed=result.steps_completed, steps_planned=result.steps_planned,
            update=payload.header, metrics=dict(result.metrics))
        await self._retry(lambda: self.transport.commit(request), "Commit")
        self.stats.accepted += 1

    async def _upload(self, upload_id: str, payload: Payload, resume: bool) -> None:
        held = 0
        if resume:
            status = await self.transport.upload_status(
                UploadStatusRequest(self.client_id, upload_id))
            held = status.committed_offset
            self.stats.resumed_bytes += held
        if held >= len(payload.data):
            return
        assert self.config is not None
        chunks = [UploadChunk(self.client_id, upload_id, offset, piece)
                  for offset, piece in iter_chunks(payload.data, self.config.chunk_bytes, held)]
        reply = await self.transport.upload(chunks)
        self.stats.bytes_up += reply.committed_offset - held


def run_client(target: str, trainer: Trainer, options: ClientOptions | None = None,
               pipeline: UpdatePipeline | None = None) -> SessionStats:
    """Sync facade: run one client session to the end of the run."""
    return asyncio.run(ClientSession(target, trainer, options, pipeline).run())
