"""Why the coordinator refuses an update: one code per reason, beside the readable detail.

A refusal travels as a gRPC status (its code and a human-readable detail, ``fedlink.errors``)
and, for the reasons below, with a :class:`RefusalCode` too (``docs/protocol.md``: a
``CommitReply`` with ``refusal`` set in the status details), so that clients, the run summary
and the report can group refusals without reading the text.
"""

from __future__ import annotations

import enum


class RefusalCode(enum.Enum):
    """The reason an update, or the transfer of a task's model, was refused.

    The value is what the event log and ``summary.json`` write (``update_refused``'s
    ``reason_code``); the protocol's ``fedlink.v1.RefusalReason`` has one value per member,
    ``REFUSAL_REASON_`` + the member's name (``NONE`` is ``REFUSAL_REASON_UNSPECIFIED``).
    """

    NONE = "none"
    """Not refused (an accepted commit), or a reason this version does not know."""
    TOO_STALE = "too_stale"
    """Trained on a version more than ``max_staleness`` behind the current one."""
    TASK_CLOSED = "task_closed"
    """The task can no longer be delivered (its round flushed without it, it was released)."""
    ALREADY_ACCEPTED = "already_accepted"
    """The task already has an accepted update (a second upload for it)."""
    RUN_OVER = "run_over"
    """The run has ended (rounds done, a target reached, a privacy budget spent, a stop)."""
    PARTIAL_DROPPED = "partial_dropped"
    """Partial work, refused under ``drop_partial``."""
    NO_WORK = "no_work"
    """No local step completed before the deadline: the update carries nothing (its task is
    closed, and it answers for its place as a dropped partial update does)."""
    MODEL_GONE = "model_gone"
    """The model version the task was for is no longer kept to download."""
    UPLOAD_INCOMPLETE = "upload_incomplete"
    """A commit before all of its upload's bytes arrived (not final: resume, then commit)."""
    PROBES_OFF = "probes_off"
    """``fedlink netcheck`` probes are switched off on this coordinator."""
    INVALID_UPDATE = "invalid_update"
    """The update is malformed (``INVALID_ARGUMENT``: shape, counts, encoding, ...)."""
    CORRUPT_UPDATE = "corrupt_update"
    """The update's bytes do not match their checksum (``DATA_LOSS``)."""
    TOO_LARGE = "too_large"
    """The update is larger than the coordinator accepts (``RESOURCE_EXHAUSTED``)."""
    UNKNOWN_TASK = "unknown_task"
    """The task or upload is not known (``NOT_FOUND``)."""
    NOT_PERMITTED = "not_permitted"
    """The caller may not commit this (``PERMISSION_DENIED``, ``UNAUTHENTICATED``)."""
    NEW_KEYS = "new_keys"
    """A secure group went on without the task before its masked update (lost, or the task's
    keys were not shared in time): the task stays open; fresh keys join the next group."""


_BY_STATUS = {
    "INVALID_ARGUMENT": RefusalCode.INVALID_UPDATE,
    "DATA_LOSS": RefusalCode.CORRUPT_UPDATE,
    "RESOURCE_EXHAUSTED": RefusalCode.TOO_LARGE,
    "NOT_FOUND": RefusalCode.UNKNOWN_TASK,
    "PERMISSION_DENIED": RefusalCode.NOT_PERMITTED,
    "UNAUTHENTICATED": RefusalCode.NOT_PERMITTED,
}


def code_for_status(status: str) -> RefusalCode:
    """The code of a refusal that only has a gRPC status code name (an invalid update, ...)."""
    return _BY_STATUS.get(status, RefusalCode.NONE)


def refusal_code(value: object) -> RefusalCode:
    """The code written as ``value`` (an event's ``reason_code``); ``NONE`` for anything else
    (a run written before codes existed, a code from a newer version)."""
    try:
        return RefusalCode(value)
    except ValueError:
        return RefusalCode.NONE
