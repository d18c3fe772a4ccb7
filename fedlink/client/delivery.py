"""Delivering updates through the outbox: keep, upload, commit, and recover after a restart.

Every encoded update goes to the outbox before it is uploaded (``fedlink.client.outbox``), and
leaves it once committed or refused for good; a retryable failure that outlasts the retry policy
leaves it there for the next start. Commits are idempotent by upload id, so an update is counted
once however often it is sent.

A client restarted with the same name and outbox directory first settles what its previous
process left there (``Courier.recover``), after joining (a new client id, and a ``RunConfig``
that shows whether the coordinator still runs the run the update was trained for):

1. an update for another run, or of another model size, is discarded, the reason logged;
2. otherwise ``Heartbeat`` under the update's *stored* client id (the id that owns its task and
   upload) asks whether its task is still open. An unknown client or task (``UNAUTHENTICATED``,
   ``NOT_FOUND``, ``PERMISSION_DENIED``): discarded, the reason logged. A closed task (too
   stale, run over, or committed just before the crash): one ``Commit`` without upload tells an
   earlier acceptance (the remembered answer) from a refusal, which discards the update with the
   reason logged. An open task: the upload resumes under the same upload id from the offset
   ``UploadStatus`` reports, then commits;
3. the old client id is retired with ``Leave``; the client goes on under its new id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TypeVar

from fedlink.client.outbox import Outbox, PendingUpdate
from fedlink.client.protocol import travels_inline
from fedlink.client.retry import Caller
from fedlink.client.stats import SessionStats
from fedlink.client.transfer import Transfers
from fedlink.client.transport import Transport
from fedlink.clock import RealClock
from fedlink.errors import NotFound, PermissionDenied, RemoteError, Unauthenticated
from fedlink.messages import (
    CommitReply,
    HeartbeatReply,
    HeartbeatRequest,
    LeaveRequest,
    RunConfig,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

Standing = HeartbeatReply | RemoteError


class Courier:
    """Takes pending updates to the coordinator, keeping the outbox in step with its answers.

    One per running session: it uses the session's open ``transport``, its ``transfers`` and
    retrying ``call``, counts into its ``stats``, and knows the run's ``config`` from ``Join``.

    Every ``Commit`` reports what the resilience counters grew by since the last commit the
    coordinator answered (``reported``): the retries of ``GetTask`` between tasks and of the
    previous ``Commit`` itself included; what is left at the end goes with ``Leave``.
    """

    def __init__(self, transport: Transport, transfers: Transfers, call: Caller,
                 stats: SessionStats, outbox: Outbox, config: RunConfig,
                 clock: Callable[[], float] | None = None) -> None:
        self.transport = transport
        self.clock = clock or RealClock().now  # the session's: times the upload
        self.transfers = transfers
        self.call = call
        self.stats = stats
        self.outbox = outbox
        self.config = config
        self.reported = stats.mark()

    async def keep(self, update: PendingUpdate) -> None:
        """Put ``update`` in the outbox (durably, off the event loop) before it is sent."""
        await self._outbox_call(self.outbox.put, update)

    async def deliver(self, update: PendingUpdate, recovered: bool = False) -> CommitReply:
        """Upload (resuming after breaks), then commit; the outbox keeps it until an answer.

        An update of at most the run's ``inline_bytes`` skips the upload and travels inside
        the ``Commit`` (one call, one round trip).

        Acceptance or a non-retryable refusal removes it from the outbox; a retryable failure
        that outlasts the retry policy leaves it there. A ``recovered`` update (from an earlier
        process) asks where to resume before it sends anything.
        """
        sending = self.clock()
        try:
            if not self._inline(update):
                await self.transfers.upload(update.client_id, update.upload_id,
                                            update.payload.data, resume=recovered)
            reply = await self._commit(update, recovered, self.clock() - sending)
        except RemoteError as err:
            if not err.retryable:
                await self._forget(update)
            raise
        await self._forget(update)
        return reply

    async def _commit(self, update: PendingUpdate, recovered: bool,
                      upload_s: float = 0.0) -> CommitReply:
        """``Commit`` with the counters not yet reported, the network time (the upload's
        ``upload_s`` included) and ``from_outbox`` as metrics."""
        sending = self.stats.mark()
        metrics = self.stats.since(self.reported, upload_s)
        if recovered:
            metrics["from_outbox"] = 1.0
        request = update.commit_request(metrics, inline=self._inline(update))

        async def attempt() -> CommitReply:
            self.stats.bytes_up += len(request.update_data)  # each attempt sends it again
            return await self.transport.commit(request)

        try:
            reply = await self.call(attempt, "Commit")
        except RemoteError as err:
            if not err.retryable:  # refused: the coordinator logged these metrics with it
                self.reported = sending
            raise
        self.reported = sending
        self.stats.accepted += 1
        return reply

    def _inline(self, update: PendingUpdate) -> bool:
        """Whether the update is small enough to travel inside its ``Commit`` (the protocol's
        rule, which the virtual loop follows too)."""
        return travels_inline(update.payload.header.num_bytes, self.config.inline_bytes)

    async def _forget(self, update: PendingUpdate) -> None:
        await self._outbox_call(self.outbox.remove, update.upload_id)

    async def _outbox_call(self, fn: Callable[..., T], *args: object) -> T:
        """Call the outbox: on a worker thread when it waits on the disk, else right here."""
        if getattr(self.outbox, "blocks", True):
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    # -- recovery after a restart ---------------------------------------------------------------

    async def recover(self, target: str, client_name: str, client_id: str) -> None:
        """Settle the updates an earlier process of this client (``client_name`` at ``target``,
        now joined as ``client_id``) left in the outbox; updates of others are left alone."""
        earlier_ids: set[str] = set()
        for update in await self._outbox_call(self.outbox.pending):
            if (update.target, update.client_name) != (target, client_name):
                log.warning("outbox: leaving pending update %s alone: it is for client %r of "
                            "%s", update.upload_id, update.client_name, update.target)
                continue
            log.info("%s: outbox holds update %s (task %s, version %d, trained as %s); "
                     "delivering it", client_id, update.upload_id, update.task_id,
                     update.base_version, update.client_id)
            if await self._recover_one(update) and update.client_id != client_id:
                earlier_ids.add(update.client_id)
        for earlier in sorted(earlier_ids):
            with contextlib.suppress(RemoteError):
                await self.transport.leave(LeaveRequest(earlier, f"restarted as {client_id}"))

    async def _recover_one(self, update: PendingUpdate) -> bool:
        """Settle one pending update; ``True`` if the coordinator knew its client id."""
        foreign = self._foreign(update)
        if foreign is not None:
            await self._discard(update, foreign)
            return False
        standing = await self._standing(update)
        if isinstance(standing, Unauthenticated | NotFound | PermissionDenied):
            await self._discard(update, f"the coordinator does not know its client or task "
                                        f"any more: {standing}")
            return False
        try:
            reply = await self._finish(update, standing)
        except RemoteError as err:
            if err.retryable:
                raise
            await self._discard(update, self._refusal(update, standing, err))
            return True
        self.stats.recovered += 1
        log.info("pending update %s delivered (accepted at version %d)", update.upload_id,
                 reply.model_version)
        return True

    async def _finish(self, update: PendingUpdate, standing: Standing) -> CommitReply:
        if isinstance(standing, HeartbeatReply) and not standing.task_open:
            # too late to count, unless it was committed just before the crash: one Commit
            # (no upload) gets the coordinator's remembered answer, or its refusal
            reply = await self._commit(update, recovered=True)
            await self._forget(update)
            return reply
        return await self.deliver(update, recovered=True)

    def _foreign(self, update: PendingUpdate) -> str | None:
        """Why ``update`` cannot belong to the coordinator's run (``None`` if it may)."""
        if update.run_name != self.config.run_name:
            return (f"it was trained for run {update.run_name!r}; the coordinator runs "
                    f"{self.config.run_name!r}")
        if tuple(update.payload.header.shape) != (self.config.num_parameters,):
            return (f"its shape {list(update.payload.header.shape)} does not match the "
                    f"model's {self.config.num_parameters} parameters")
        return None

    async def _standing(self, update: PendingUpdate) -> Standing:
        """The coordinator's version and whether the update's task is open (or why it can't
        tell); retryable errors that outlast the policy propagate."""
        request = HeartbeatRequest(update.client_id, update.task_id)
        try:
            return await self.call(lambda: self.transport.heartbeat(request), "Heartbeat")
        except RemoteError as err:
            if err.retryable:
                raise
            return err

    def _refusal(self, update: PendingUpdate, standing: Standing, err: RemoteError) -> str:
        """Why a pending update was refused, for the log and ``stats.refusals``.

        For a task the heartbeat found closed, the commit's own refusal adds nothing useful
        (often "upload incomplete", not worth resuming once the task is closed).
        """
        if isinstance(standing, HeartbeatReply) and not standing.task_open:
            return (f"too stale / task closed: trained on version {update.base_version}, the "
                    f"coordinator is at version {standing.model_version} "
                    f"(max_staleness {self.config.max_staleness})")
        return f"refused: {err.detail}"

    async def _discard(self, update: PendingUpdate, reason: str) -> None:
        self.stats.refused += 1
        self.stats.refusals.append(reason)
        log.warning("discarding pending update %s (task %s): %s", update.upload_id,
                    update.task_id, reason)
        await self._forget(update)
