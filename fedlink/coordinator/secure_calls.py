"""The coordinator's four secure-aggregation calls, composed for the service.

``CoordinatorService`` keeps only its handlers; this piece owns what the secure calls need
around the group logic of ``fedlink.coordinator.secure.SecureDesk``: admitting the caller, the
refusal when secure aggregation is off, taking a masked update sent as a resumable upload,
and making the group's flush durable before the last phase answers. ``SecureDesk`` is imported
only when secure aggregation is on: it needs the ``secagg`` extra (``cryptography``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fedlink.clock import Clock
from fedlink.coordinator.admission import CallerCheck
from fedlink.coordinator.commits import bounded_examples
from fedlink.coordinator.config import CoordinatorConfig
from fedlink.coordinator.engine import RoundEngine
from fedlink.coordinator.journal import Journal
from fedlink.coordinator.state import StateStore
from fedlink.coordinator.transfers import Transfers
from fedlink.coordinator.uploads import UploadStore
from fedlink.coordinator.validation import check_counts
from fedlink.errors import InvalidArgument, UpdateRefused, UploadIncomplete
from fedlink.messages import (
    CommitReply,
    SecureAdvertiseReply,
    SecureAdvertiseRequest,
    SecureMaskedReply,
    SecureMaskedRequest,
    SecureSettings,
    SecureShareReply,
    SecureShareRequest,
    SecureUnmaskReply,
    SecureUnmaskRequest,
)
from fedlink.refusals import RefusalCode

if TYPE_CHECKING:
    from fedlink.coordinator.secure import SecureDesk

T = TypeVar("T")


class SecureCalls:
    """SecureAdvertise, SecureShare, SecureMasked and SecureUnmask on one coordinator.

    ``desk`` is the run's secure groups, or ``None`` when ``[coordinator.secure]`` is off (each
    call is then refused ``TASK_CLOSED``).
    """

    def __init__(self, config: CoordinatorConfig, engine: RoundEngine, clock: Clock,
                 made: Callable[..., Any], journal: Journal, transfers: Transfers,
                 uploads: UploadStore, state: StateStore, callers: CallerCheck) -> None:
        self._config, self._engine = config, engine
        self._journal, self._transfers, self._uploads = journal, transfers, uploads
        self._state, self._callers = state, callers
        self.desk: SecureDesk | None = None
        if config.secure.enabled:
            from fedlink.coordinator.secure import SecureDesk

            self.desk = SecureDesk(config, engine, clock, made, journal.durably,
                                   self._take_masked_upload, self._downloads_used)
            self.desk.on_groups = state.save_secure_groups
            self.desk.on_accounted = state.save_secure_accounting

    def settings(self) -> SecureSettings | None:
        """What ``RunConfig.secure`` tells clients (``None`` when secure aggregation is off)."""
        if self.desk is None:
            return None
        from fedlink.coordinator.secure import secure_settings

        return secure_settings(self._config)

    async def advertise(self, request: SecureAdvertiseRequest) -> SecureAdvertiseReply:
        """Secure phase 1 (``SecureDesk.advertise``); the group's number is durable before
        it answers (a restarted coordinator never numbers another group the same)."""
        return await self._durable_answer(self._desk_for(request.client_id).advertise(request))

    async def share(self, request: SecureShareRequest) -> SecureShareReply:
        """Secure phase 2 (``SecureDesk.share``)."""
        return await self._durable_refusal(self._desk_for(request.client_id).share(request))

    async def masked(self, request: SecureMaskedRequest) -> SecureMaskedReply:
        """Secure phase 3 (``SecureDesk.masked``), its counts checked and bounded as a
        ``Commit``'s: they weigh nothing in the sum (the coordinator names each member's
        weight), but they are the record of the update. The answer (whom to unmask) waits
        until the sum's accounting under distributed DP is durable."""
        desk = self._desk_for(request.client_id)
        check_counts(request)
        request = dataclasses.replace(request, num_examples=bounded_examples(
            request.num_examples, self._callers.registry.declared_examples(request.client_id),
            self._config.limits.max_examples_per_update))
        return await self._durable_answer(desk.masked(request))

    async def unmask(self, request: SecureUnmaskRequest) -> SecureUnmaskReply:
        """Secure phase 4 (``SecureDesk.unmask``); the group's flush is durable before it
        answers."""
        return await self._durable_answer(self._desk_for(request.client_id).unmask(request))

    async def _durable_answer(self, call: Awaitable[T]) -> T:
        """``call``'s answer, or its refusal, once everything journalled until then is
        durable (a group's number, distributed DP's accounting, a flush)."""
        reply = await self._durable_refusal(call)
        await self._state.sync()
        return reply

    async def _durable_refusal(self, call: Awaitable[T]) -> T:
        """``call``'s answer; a refusal only once what it changed (a task it closed, and the
        ``update_refused`` event) is durable, as a refused ``Commit`` is."""
        try:
            return await call
        except UpdateRefused:
            await self._state.sync()
            raise

    def _desk_for(self, client_id: str) -> SecureDesk:
        self._callers.admit(client_id)
        if self.desk is None:
            raise UpdateRefused("secure aggregation is off on this coordinator",
                                RefusalCode.TASK_CLOSED)
        return self.desk

    def _downloads_used(self, client_id: str, task_id: str) -> None:
        self._transfers.downloads_settled(client_id, task_id, True)

    async def _take_masked_upload(self, client_id: str, upload_id: str, size: int) -> bytes:
        """The ``size`` bytes of a masked update sent as a resumable upload; the upload is
        settled (its spool freed) once they are taken."""
        await self._transfers.make_durable(client_id, upload_id)
        session = self._uploads.get(client_id, upload_id)
        if session.committed_offset != size:
            raise (UploadIncomplete if session.committed_offset < size else InvalidArgument)(
                f"upload {upload_id!r} holds {session.committed_offset} bytes; the masked "
                f"update takes {size}")
        data = bytes(session.data)
        with self._journal.durably():
            self._uploads.settle(client_id, upload_id,
                                 CommitReply(upload_id, self._engine.version, 0))
        await self._state.sync()
        return data
