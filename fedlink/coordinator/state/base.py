"""The contract of the coordinator's durable state, and the in-memory store that keeps none.

The coordinator's state is *journaled*: the round engine, the client registry and the upload
store change their in-memory state as before and tell a ``StateStore`` each change as it
happens. Before a call answers, it awaits ``sync()``: everything journaled until then is
durable when it returns (a *group commit*: one transaction, one fsync, for every call waiting
at that moment, off the event loop). So a client is never told of something the store could
lose, and a restarted coordinator rebuilds exactly what it had acknowledged:

- the model of the current version, the server optimizer's and flush hooks' state, and the
  models of the versions clients may still download, from the last *checkpoint*;
- the updates accepted since that checkpoint (*pending*), replayed into the accumulator in the
  order they were accepted (replay is deterministic, so the accumulator ends up bit-identical);
- clients, tasks and the remembered answer of every settled commit.

A flush writes the new version's checkpoint (write, fsync, rename) in the same commit, before
the transaction that moves the version on; the store's record of the current version is the
authority, so a checkpoint written by a flush whose transaction never committed is ignored and
its updates, still pending, flush again.

``NullStore`` is the default with no ``state_dir``: it keeps nothing and restores nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedlink.coordinator.records import ClientRecord, ReceivedUpdate, TaskRecord
from fedlink.errors import RemoteError
from fedlink.messages import CommitReply
from fedlink.registry import Registry

Answer = CommitReply | RemoteError


@dataclass(frozen=True)
class FlushRecord:
    """What the ``flush`` event of one version reports (kept until that event is written)."""

    version: int
    num_updates: int
    total_weight: float
    round_seconds: float
    bytes_up: int
    finished: bool
    task_ids: tuple[str, ...]
    hook_report: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpoint:
    """One model version as written at its flush, with the engine state after that flush.

    ``engine_state`` holds the server optimizer's and the flush hooks' ``state_dict``s (numpy
    arrays allowed anywhere inside).
    """

    version: int
    model: np.ndarray
    engine_state: Mapping[str, Any]


@dataclass(frozen=True)
class SettledUpload:
    """The remembered final answer to an upload's ``Commit``, and the size it had."""

    upload_id: str
    client_id: str
    size: int
    answer: Answer


@dataclass
class SavedState:
    """Everything a restarted coordinator restores, as the store last made it durable.

    ``checkpoints`` holds the current version's checkpoint last, preceded by the older versions
    still kept for stale clients and deltas. ``pending`` are the updates accepted since the
    current version, in acceptance order. ``unreported`` are flushes whose ``flush`` event was
    not made yet; ``unwritten_events`` are events made durable that may not have reached the
    event log.
    """

    checkpoints: list[Checkpoint]
    clients: list[ClientRecord]
    tasks: list[TaskRecord]
    next_task: int
    pending: list[ReceivedUpdate]
    settled: list[SettledUpload]
    unreported: list[FlushRecord]
    finished_reason: str = ""
    unwritten_events: list[dict[str, Any]] = field(default_factory=list)
    next_secure_group: int = 1
    """The number the next secure group takes (groups are never numbered twice in a run)."""
    open_secure_groups: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The secure groups still going when the store last heard of them, by number, each with
    its ``phase`` and ``members`` (a restart loses them: their secrets lived in memory)."""
    secure_accounting: dict[str, Any] | None = None
    """Distributed DP's accounting as last journalled (``SecureDDPHook.state_dict``): ahead
    of the current checkpoint's, by the sums asked for since (``None``: none journalled)."""

    @property
    def current(self) -> Checkpoint:
        """The checkpoint of the current model version."""
        return self.checkpoints[-1]


class StateStore(ABC):
    """Where the coordinator journals its state; ``load`` gives it back after a restart.

    ``save_*``/``forget_*`` journal a change (on the event loop, without waiting); ``sync``
    makes everything journaled so far durable. A store whose writes fail stops: every later
    ``sync`` raises ``Unavailable`` (the in-memory state is then ahead of the disk, and only a
    restart from the disk is consistent).
    """

    durable: bool = False

    @abstractmethod
    def load(self, num_parameters: int) -> SavedState | None:
        """The saved state, or None for a fresh start (``ConfigError`` if it does not fit)."""

    async def sync(self) -> None:  # noqa: B027 (nothing to wait for in this store)
        """Return once everything journaled before this call is durable (now, for this store)."""

    def sync_now(self) -> None:  # noqa: B027 (nothing to do for this store)
        """``sync`` outside the event loop (start-up and shutdown)."""

    def save_secure_groups(self, next_number: int,  # noqa: B027 (kept in memory)
                           open_groups: Mapping[int, Mapping[str, Any]]) -> None:
        """A secure group was numbered, moved on or ended: ``next_number`` is the next
        group's, ``open_groups`` those still going (``SavedState.open_secure_groups``)."""

    def save_secure_accounting(self, state: Mapping[str, Any]) -> None:  # noqa: B027
        """Distributed DP's accounting changed (a sum about to be unmasked, or one withheld
        for the budget); ``state`` is the accountant's ``state_dict``. Kept in memory by
        default."""

    @abstractmethod
    def save_client(self, record: ClientRecord) -> None:
        """A client joined."""

    @abstractmethod
    def forget_client(self, client_id: str) -> None:
        """A client left."""

    @abstractmethod
    def save_task(self, record: TaskRecord, next_task: int) -> None:
        """A task was issued or changed; ``next_task`` is the next task number to issue."""

    @abstractmethod
    def forget_tasks(self, task_ids: list[str]) -> None:
        """Tasks too old to matter any more."""

    @abstractmethod
    def save_pending(self, update: ReceivedUpdate) -> None:
        """An update was accepted into the accumulator (until the next flush)."""

    @abstractmethod
    def save_settled(self, settled: SettledUpload) -> None:
        """A commit got its final answer."""

    @abstractmethod
    def save_initial(self, checkpoint: Checkpoint) -> None:
        """The model a fresh run starts from (version 0)."""

    @abstractmethod
    def save_flush(self, checkpoint: Checkpoint, record: FlushRecord, keep_from: int) -> None:
        """A flush: the new version's checkpoint (written now), its record, no pending updates.

        Checkpoints of versions before ``keep_from`` may be deleted.
        """

    @abstractmethod
    def mark_reported(self, version: int) -> None:
        """The ``flush`` event of ``version`` was made."""

    @abstractmethod
    def save_events(self, events: list[dict[str, Any]]) -> None:
        """Journal events with the changes they report, giving each an ``event_id``.

        The caller writes them to the event log once they are durable (``on_durable``), then
        calls ``events_written``; a restart hands back those it may not have written.
        """

    @abstractmethod
    def events_written(self, events: list[dict[str, Any]]) -> None:
        """``events``, saved by ``save_events``, and every earlier one are in the event log."""

    @abstractmethod
    def save_finished(self, reason: str) -> None:
        """The run ended for ``reason`` (a restarted coordinator only tells clients so)."""

    def on_durable(self, action: Callable[[], None]) -> None:
        """Run ``action`` once what was journaled so far is durable (now, for this store).

        For deleting what the journal makes redundant: a spool once its commit is recorded.
        """
        action()

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release files and connections."""


class NullStore(StateStore):
    """No durable state: everything lives in the coordinator's memory, as long as it runs."""

    def load(self, num_parameters: int) -> SavedState | None:
        """Nothing was saved."""
        return None

    def save_client(self, record: ClientRecord) -> None:
        """Kept in memory only."""

    def forget_client(self, client_id: str) -> None:
        """Kept in memory only."""

    def save_task(self, record: TaskRecord, next_task: int) -> None:
        """Kept in memory only."""

    def forget_tasks(self, task_ids: list[str]) -> None:
        """Kept in memory only."""

    def save_pending(self, update: ReceivedUpdate) -> None:
        """Kept in memory only."""

    def save_settled(self, settled: SettledUpload) -> None:
        """Kept in memory only."""

    def save_initial(self, checkpoint: Checkpoint) -> None:
        """Kept in memory only."""

    def save_flush(self, checkpoint: Checkpoint, record: FlushRecord, keep_from: int) -> None:
        """Kept in memory only."""

    def mark_reported(self, version: int) -> None:
        """Kept in memory only."""

    def save_events(self, events: list[dict[str, Any]]) -> None:
        """Events are written straight away, without an ``event_id``."""

    def events_written(self, events: list[dict[str, Any]]) -> None:
        """Nothing to track."""

    def save_finished(self, reason: str) -> None:
        """Kept in memory only."""


STATE_STORES: Registry[StateStore] = Registry("state store")
STATE_STORES.register("memory")(NullStore)
