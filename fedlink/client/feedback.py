"""Error feedback: the part of each update a biased codec did not send is sent later.

With a biased codec (top-k, random-k, sign) the dropped part of an update would be lost for
good; error feedback keeps it in a residual memory ``r`` and adds it to the next update::

    accumulated = update + r        # what should have been sent by now
    sent        = decode(encode(accumulated))
    r           = accumulated - sent

so that ``sent + r == accumulated`` (up to float32 rounding; exactly for codecs that send the
values they keep, such as ``topk``). The residual lives in client state across tasks, and in
``<outbox_dir>/error_feedback.npy`` when the client has an outbox directory, written
atomically (temporary file, fsync, rename, fsync of the directory), so a restart keeps it.

The session saves the residual right after the encoded update is durable in the outbox. A crash
between the two writes leaves the previous residual on disk while the update (which already
carries it) is delivered from the outbox: that one residual is then sent twice. Saving it first
would instead lose it with an update the crash lost; a bounded repeat was preferred. A residual
of another length (another model) is dropped with a warning; one left by another run of a model
of the same size is not detected.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np

from fedlink.atomic import write_atomic

log = logging.getLogger(__name__)

RESIDUAL_FILENAME = "error_feedback.npy"


class ErrorFeedback:
    """The residual memory of one client (see the module docstring)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.residual: np.ndarray | None = None
        if path is not None and path.exists():
            self.residual = _load(path)

    def accumulate(self, update: np.ndarray) -> np.ndarray:
        """``update`` plus the residual (a residual of another size is dropped, logged)."""
        update = np.asarray(update, dtype=np.float32)
        if self.residual is not None and self.residual.shape != update.shape:
            log.warning("error feedback: dropping a residual of %d values; the update has %d",
                        self.residual.size, update.size)
            self.residual = None
        return update if self.residual is None else update + self.residual

    def record(self, accumulated: np.ndarray, sent: np.ndarray) -> None:
        """Keep what of ``accumulated`` was not ``sent`` (in memory; ``save`` persists it)."""
        self.residual = (np.asarray(accumulated, np.float32)
                         - np.asarray(sent, np.float32)).astype(np.float32)

    def save(self) -> None:
        """Write the residual atomically and durably (nothing to do without a path)."""
        if self.path is None or self.residual is None:
            return
        buffer = io.BytesIO()
        np.save(buffer, self.residual, allow_pickle=False)
        write_atomic(self.path, [buffer.getbuffer()])

    def reset(self) -> None:
        """Forget the residual (and its file)."""
        self.residual = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _load(path: Path) -> np.ndarray | None:
    try:
        residual = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        log.warning("error feedback: %s is unreadable (%s); starting from zero", path, exc)
        return None
    if residual.dtype != np.float32 or residual.ndim != 1 or not np.isfinite(residual).all():
        log.warning("error feedback: %s is not a finite float32 vector; starting from zero",
                    path)
        return None
    return residual
