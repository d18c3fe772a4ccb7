"""Commits: a complete upload becomes an accepted (or refused) update, the same answer on
every repeat.

``Commit`` first makes the upload durable, then checks for a remembered answer, accepts and
remembers the new answer with no ``await`` in between, so concurrent duplicate commits cannot
both reach the engine. An incomplete upload's answer is not final: the client resumes and
commits again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fedlink.coordinator.admission import CallerCheck
from fedlink.coordinator.config import LimitsConfig
from fedlink.coordinator.engine import FlushOutcome, RoundEngine
from fedlink.coordinator.faults import FaultPlan
from fedlink.coordinator.journal import Journal
from fedlink.coordinator.outcomes import update_refused
from fedlink.coordinator.progress import ProgressLog
from fedlink.coordinator.records import ReceivedUpdate
from fedlink.coordinator.transfers import Transfers
from fedlink.coordinator.uploads import UploadSession, UploadStore
from fedlink.coordinator.validation import RequestChecks, check_counts
from fedlink.errors import InvalidArgument, RemoteError, UploadIncomplete
from fedlink.messages import CommitReply, CommitRequest
from fedlink.metrics import EventLog
from fedlink.wire import unpack

log = logging.getLogger(__name__)


class Commits:
    """``Commit``: idempotency by upload id, then acceptance by the engine.

    ``on_flush(outcome)`` is told each flush an accepted update triggered; ``wake()`` wakes
    long-polling clients when a place frees (``continuous``).
    """

    def __init__(self, limits: LimitsConfig, engine: RoundEngine, uploads: UploadStore,
                 callers: CallerCheck, checks: RequestChecks, transfers: Transfers,
                 journal: Journal, events: EventLog, progress: ProgressLog, faults: FaultPlan,
                 on_flush: Callable[[FlushOutcome], None], wake: Callable[[], None]) -> None:
        self.limits = limits
        self.engine = engine
        self.uploads = uploads
        self._callers = callers
        self._checks = checks
        self._transfers = transfers
        self._journal = journal
        self._events = events
        self._progress = progress
        self._faults = faults
        self._on_flush = on_flush
        self._wake = wake

    async def commit(self, request: CommitRequest) -> CommitReply:
        """Turn a complete upload into an accepted update; the same answer on every repeat."""
        self._callers.admit(request.client_id)
        self._checks.commit(request)
        if request.update_data:
            self._transfers.take_inline_update(request)
        await self._transfers.make_durable(request.client_id, request.upload_id)
        # From here to ``settle`` nothing awaits: a duplicate commit running concurrently
        # either finds the remembered answer or has not started yet.
        previous = self.uploads.answer(request.client_id, request.upload_id)
        if previous is not None:
            await self._journal.state.sync()  # the first commit's answer may still be on its way
            return _replay(previous)
        session = self.uploads.get(request.client_id, request.upload_id)
        with self._journal.durably():
            self._faults.reached("commit.before_accept")
            answer = self._settle(request, session)
        await self._journal.state.sync()
        if isinstance(answer, RemoteError):
            raise answer
        return answer

    def _settle(self, request: CommitRequest, session: UploadSession) -> CommitReply | RemoteError:
        """Accept or refuse the upload, and remember the answer (an incomplete one is not final)."""
        try:
            answer: CommitReply | RemoteError = self._accept(request, session)
        except UploadIncomplete as err:  # not final: the client resumes and commits again
            log.info("early commit of upload %s: %s", request.upload_id, err.detail)
            return err
        except RemoteError as err:
            self._progress.refused()
            self._events.emit(update_refused(request.client_id, request.task_id, err,
                                             request.update.num_bytes, request.metrics))
            answer = err
        self.uploads.settle(request.client_id, request.upload_id, answer)
        # final: an accepted update used what was sent for its task, a refused one none of it
        self._transfers.downloads_settled(request.client_id, request.task_id,
                                          isinstance(answer, CommitReply))
        return answer

    def _accept(self, request: CommitRequest, session: UploadSession) -> CommitReply:
        if session.committed_offset < request.update.num_bytes:
            raise UploadIncomplete(f"upload {request.upload_id!r} is incomplete: "
                                   f"{session.committed_offset} of {request.update.num_bytes} "
                                   "bytes received; resume it, then commit")
        check_counts(request)
        if request.base_version > self.engine.version:
            raise InvalidArgument(f"base_version {request.base_version} is from the future: "
                                  f"the current model version is {self.engine.version}")
        delta = unpack(request.update, bytes(session.data), self.engine.num_parameters)
        acceptance = self.engine.submit(ReceivedUpdate(
            client_id=request.client_id, task_id=request.task_id,
            base_version=request.base_version, delta=delta,
            num_examples=bounded_examples(
                request.num_examples,
                self._callers.registry.declared_examples(request.client_id),
                self.limits.max_examples_per_update),
            steps_completed=request.steps_completed,
            steps_planned=request.steps_planned, bytes_up=request.update.num_bytes,
            metrics=request.metrics))
        if acceptance.flush is not None:
            self._on_flush(acceptance.flush)
        elif self.engine.rule.continuous:  # a place just freed: wake a waiting client
            self._wake()
        flushed = acceptance.flush.version if acceptance.flush is not None else 0
        return CommitReply(request.upload_id, acceptance.model_version, acceptance.staleness,
                           accepted_version=acceptance.accepted_version,
                           flushed_version=flushed)


def _replay(previous: CommitReply | RemoteError) -> CommitReply:
    if isinstance(previous, RemoteError):
        raise previous.again()  # the same error, its refusal code included
    return previous


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
