"""Fault injection by an object: a ``FaultPlan`` is told each time the coordinator passes a
named moment, and by default does nothing.

Tests pass their own plan (``CoordinatorServer(..., faults=plan)``, or ``open_store``) to
kill or break the process at one of these moments; nothing in the environment makes a
production coordinator do anything there. The moments:

- ``batch.before_commit`` / ``batch.after_commit``: a journal batch is written but not
  committed / committed but its events not yet in the event log (the writer thread);
- ``flush.before_checkpoint`` / ``flush.after_checkpoint``: a flush's checkpoint file is about
  to be / was written, its batch not committed (the writer thread);
- ``commit.before_accept``: a ``Commit`` is about to fold its update in (the event loop).
"""

from __future__ import annotations

MOMENTS = ("batch.before_commit", "batch.after_commit", "flush.before_checkpoint",
           "flush.after_checkpoint", "commit.before_accept")
"""Every moment the coordinator reports to its ``FaultPlan``."""


class FaultPlan:
    """What to do at each named moment (``MOMENTS``): this one does nothing.

    A subclass overrides ``reached``; it may be called from the state store's writer thread.
    """

    def reached(self, moment: str) -> None:
        """The coordinator is at ``moment``."""


NO_FAULTS = FaultPlan()
"""The plan of every production coordinator (stateless: shared safely)."""
