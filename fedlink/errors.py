"""fedlink's own exception tree.

Errors from grpc, tenacity and opacus are translated into these where they cross the library
boundary, so user code catches ``fedlink.errors.*`` and never a transport-specific type.

``RemoteError`` subclasses each carry the gRPC status code *name* (a plain string) that the
coordinator answers with; the servicer maps them onto the wire and the client SDK maps them
back, so neither side's domain code imports grpc to raise or catch them.

Status codes used by the coordinator:

======================  ==================================================================
``INVALID_ARGUMENT``    malformed request: wrong vector length, shape or dtype, NaN/Inf,
                        unknown encoding, offset gaps, bad field values
``UNAUTHENTICATED``     unknown client id or bad join token (the SDK re-joins once)
``PERMISSION_DENIED``   known caller acting on another client's upload or task
``NOT_FOUND``           unknown task id; ``Commit`` of an upload id that holds no bytes
                        (``UploadStatus`` of an upload id never used answers OK with
                        offset 0: upload ids are the client's to choose, and "nothing held"
                        is the answer that lets a resuming client start from 0)
``FAILED_PRECONDITION`` valid but refused: too stale, task closed, upload incomplete
``DATA_LOSS``           checksum mismatch between the header and the received bytes
``RESOURCE_EXHAUSTED``  payload, chunk or inline update larger than allowed; overload (request
                        rate, concurrent uploads, connected clients), then with a
                        ``google.rpc.RetryInfo`` in the rich status (``fedlink.wire.status``)
                        that the SDK waits out before retrying
``UNAVAILABLE``         transient: retry
======================  ==================================================================
"""

from __future__ import annotations

import copy
from typing import Self

from fedlink.refusals import RefusalCode, code_for_status


class FedlinkError(Exception):
    """Base class of every error fedlink raises on purpose."""


class ConfigError(FedlinkError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class RunFinished(FedlinkError):
    """The coordinator has ended the run; no more tasks will be issued."""


class WrongRun(FedlinkError):
    """The coordinator serves a run this client cannot take part in: a model of another size
    than the client's trainer holds, or, when the client joins again, another run than the one
    it joined (another process took over the address). Raised instead of training a model of
    the wrong shape or mixing updates of two runs."""


MAX_DETAIL_CHARS = 512
"""The longest detail a ``RemoteError`` carries: a refusal that quotes client input (an
attacker-sized encoding name, say) is cut here, so it is never echoed, remembered as a commit's
answer or logged at the size the client chose."""


def bounded_detail(detail: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``detail`` cut to ``limit`` characters, saying how much was left out."""
    if len(detail) <= limit:
        return detail
    return f"{detail[:limit]}... ({len(detail) - limit} more characters not shown)"


def excerpt(value: str, limit: int = 32) -> str:
    """A short quoted prefix of client input for a refusal detail (``repr``, cut)."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}..."


class SecAggError(FedlinkError):
    """A secure round cannot go on (a message out of place, a share that does not decrypt)."""


class RemoteError(FedlinkError):
    """An error that crosses the wire as a gRPC status code plus a human-readable detail."""

    code: str = "UNKNOWN"
    retryable: bool = False
    retry_after_s: float | None = None
    """The coordinator's hint: wait at least this long before retrying (overload only)."""

    def __init__(self, detail: str) -> None:
        detail = bounded_detail(detail)
        super().__init__(detail)
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"

    @property
    def refusal(self) -> RefusalCode:
        """The refusal code of this error when it refuses an update (from its status code:
        ``INVALID_ARGUMENT`` is an invalid update, ...; ``NONE`` for other codes)."""
        return code_for_status(self.code)

    def again(self) -> Self:
        """A fresh error equal to this one (a remembered answer, raised again)."""
        return copy.copy(self)


class InvalidArgument(RemoteError):
    """The request is malformed or its payload is not acceptable."""

    code = "INVALID_ARGUMENT"


class Unauthenticated(RemoteError):
    """The caller is not known to the coordinator (or its credentials are wrong)."""

    code = "UNAUTHENTICATED"


class PermissionDenied(RemoteError):
    """The caller is known but may not do this."""

    code = "PERMISSION_DENIED"


class NotFound(RemoteError):
    """A task or upload id the coordinator does not know."""

    code = "NOT_FOUND"


class UpdateRefused(RemoteError):
    """A well-formed update the coordinator will not use (too stale, task closed, ...).

    ``reason`` says why as a :class:`~fedlink.refusals.RefusalCode` (it travels beside the
    detail: ``docs/protocol.md``); ``NONE`` when the coordinator gave none.
    """

    code = "FAILED_PRECONDITION"
    reason: RefusalCode = RefusalCode.NONE

    def __init__(self, detail: str, reason: RefusalCode | None = None) -> None:
        super().__init__(detail)
        if reason is not None:
            self.reason = reason

    @property
    def refusal(self) -> RefusalCode:
        """Why: ``reason``."""
        return self.reason


class UploadIncomplete(UpdateRefused):
    """A commit arrived before all of its upload's bytes; resume the upload, then commit."""

    reason = RefusalCode.UPLOAD_INCOMPLETE


class DataLoss(RemoteError):
    """Received bytes do not match their checksum."""

    code = "DATA_LOSS"


class ResourceExhausted(RemoteError):
    """A size or rate limit was exceeded.

    With ``retry_after_s`` (overload: rate, concurrency or client limits) the refusal is
    transient and retryable after at least that many seconds; without it (a payload too
    large) retrying the same request cannot succeed.
    """

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s
        self.retryable = retry_after_s is not None


class Unavailable(RemoteError):
    """The coordinator cannot be reached or is shutting down; retry later."""

    code = "UNAVAILABLE"
    retryable = True


class NoProgress(Unavailable):
    """A transfer made no progress for the share of the stall bound it was given and was
    cancelled on the client, its connection not marked stalled: the client goes on over
    another open connection (``fedlink.client.transfer.Transfers.upload``)."""


class DeadlineExceeded(RemoteError):
    """A call did not finish within its deadline; retry later."""

    code = "DEADLINE_EXCEEDED"
    retryable = True


class Internal(RemoteError):
    """The coordinator failed unexpectedly (its log has the details)."""

    code = "INTERNAL"


class Cancelled(RemoteError):
    """The call was cancelled."""

    code = "CANCELLED"
    retryable = True


REMOTE_ERRORS: dict[str, type[RemoteError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        UpdateRefused,
        DataLoss,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Internal,
        Cancelled,
    )
}


def remote_error(code: str, detail: str, retry_after_s: float | None = None,
                 reason: RefusalCode | None = None) -> RemoteError:
    """The ``RemoteError`` for a status code name (``RemoteError`` itself when unknown).

    ``retry_after_s`` (the coordinator's ``RetryInfo`` delay) is kept on ``RESOURCE_EXHAUSTED``,
    where it also makes the refusal retryable, and on the codes that are retryable anyway;
    ``reason`` (a refusal code) on ``FAILED_PRECONDITION``.
    """
    cls = REMOTE_ERRORS.get(code)
    if cls is None:
        err = RemoteError(detail)
        err.code = code
        return err
    if cls is ResourceExhausted:
        return ResourceExhausted(detail, retry_after_s=retry_after_s)
    if cls is UpdateRefused:
        if reason is RefusalCode.UPLOAD_INCOMPLETE:
            return UploadIncomplete(detail)
        return UpdateRefused(detail, reason)
    err = cls(detail)
    if err.retryable and retry_after_s is not None:  # UNAVAILABLE with a RetryInfo delay
        err.retry_after_s = retry_after_s
    return err
