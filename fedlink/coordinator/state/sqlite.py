"""The durable state store: SQLite in WAL mode plus atomic checkpoint files.

Layout of a ``state_dir``::

    state.sqlite (+ -wal, -shm)   clients, tasks, pending updates, settled commits, flushes, meta
    checkpoints/v000000042.npz    the model and engine state of each version still kept
    uploads/<client>/<id>.spool   bytes of uploads in progress (``fedlink.coordinator.spool``)

Journaled changes are buffered on the event loop; ``sync`` hands them to one writer thread,
which applies them as one SQLite transaction committed with ``synchronous=FULL``: when
``COMMIT`` returns, they survive a crash of the process or of the machine. Calls that sync while
a commit is in flight share the next one (group commit), so the fsync rate stays bounded
however many clients are calling, and the event loop never waits on a disk.

Times are not restored: a restarted coordinator counts clients as seen, tasks as issued and the
round as started at its own start, so a restart never makes a live client look dead.

The store tells its ``FaultPlan`` (``fedlink.coordinator.faults``, a no-op unless a test passes
one) when it passes the named moments of a batch and a flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from fedlink.coordinator.faults import NO_FAULTS, FaultPlan
from fedlink.coordinator.records import ClientRecord, ReceivedUpdate, TaskRecord
from fedlink.coordinator.state.base import (
    STATE_STORES,
    Answer,
    Checkpoint,
    FlushRecord,
    SavedState,
    SettledUpload,
    StateStore,
)
from fedlink.coordinator.state.checkpoint import (
    delete_checkpoints_before,
    read_checkpoint,
    saved_versions,
    write_checkpoint,
)
from fedlink.coordinator.tasks import TaskState
from fedlink.errors import ConfigError, RemoteError, Unavailable, remote_error
from fedlink.messages import CommitReply
from fedlink.metrics.events import to_jsonable
from fedlink.private import private_dir, private_file, touch_private
from fedlink.refusals import refusal_code

log = logging.getLogger(__name__)

Op = Callable[[sqlite3.Connection], Any]  # one journaled write, run on the writer thread

DB_FILENAME = "state.sqlite"
SCHEMA_VERSION = 2  # 2: a task's state is one column (``TaskState``), not four flags

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clients (
    client_id TEXT PRIMARY KEY, name TEXT NOT NULL, num_examples INTEGER NOT NULL,
    metadata TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS task_states (
    task_id TEXT PRIMARY KEY, client_id TEXT NOT NULL, version INTEGER NOT NULL,
    state TEXT NOT NULL, delta_base INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS pending (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, client_id TEXT NOT NULL, task_id TEXT NOT NULL,
    base_version INTEGER NOT NULL, num_examples INTEGER NOT NULL,
    steps_completed INTEGER NOT NULL, steps_planned INTEGER NOT NULL,
    bytes_up INTEGER NOT NULL, metrics TEXT NOT NULL, delta BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS settled (
    upload_id TEXT NOT NULL, client_id TEXT NOT NULL, size INTEGER NOT NULL,
    answer TEXT NOT NULL, PRIMARY KEY (client_id, upload_id));
CREATE TABLE IF NOT EXISTS flushes (
    version INTEGER PRIMARY KEY, record TEXT NOT NULL, reported INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS event_outbox (
    event_id INTEGER PRIMARY KEY AUTOINCREMENT, event TEXT NOT NULL);
"""


INSTANCE_KEY_COLUMN = "\x00instance_key"
"""Where a client's instance key is kept inside its metadata JSON (a NUL: never a client's)."""


@STATE_STORES.register("sqlite")
class SqliteStore(StateStore):
    """Durable coordinator state under ``state_dir`` (see the module docstring)."""

    durable = True

    def __init__(self, state_dir: str | Path, faults: FaultPlan = NO_FAULTS) -> None:
        self.root = Path(state_dir)
        self._faults = faults
        self.checkpoints = self.root / "checkpoints"
        private_dir(self.root)
        private_dir(self.checkpoints)
        self._db = sqlite3.connect(touch_private(self.root / DB_FILENAME), isolation_level=None,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        for suffix in ("-wal", "-shm"):  # SQLite copies the database's mode; older files too
            private_file(self.root / f"{DB_FILENAME}{suffix}")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        _migrate_task_flags(self._db)
        self._ops: list[Op] = []  # journaled, not yet handed to the writer
        self._after: list[Callable[[], None]] = []  # to run once those ops are durable
        self._queued = 0  # ops journaled so far, ever
        self._durable = 0  # ops durable so far
        self._inflight: asyncio.Future[None] | None = None
        self._failed: BaseException | None = None
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedlink-state")
        self._event_ids = self._last_event_id()
        self._written = self._dropped = 0  # event ids in the event log / out of the outbox

    # -- group commit -------------------------------------------------------------------------

    async def sync(self) -> None:
        """Return once everything journaled before this call is durable.

        Whatever was journaled meanwhile by other calls goes into the same transaction: one
        commit (one fsync) serves every call waiting, on the writer thread, off the loop.
        """
        target = self._queued
        while self._durable < target:
            self._check_failed()
            if self._inflight is None:
                self._start_commit()
            assert self._inflight is not None
            await asyncio.shield(self._inflight)

    def sync_now(self) -> None:
        """``sync`` for code outside the event loop (start-up, shutdown): commits right here."""
        if self._inflight is not None:
            raise RuntimeError("sync_now while a commit is in flight: await sync() instead")
        ops, after, upto = self._take()
        if ops:
            self._commit(ops)
        self._committed(after, upto)

    def _take(self) -> tuple[list[Op], list[Callable[[], None]], int]:
        if self._ops and self._written > self._dropped:
            written, self._dropped = self._written, self._written
            self._ops.insert(0, lambda db: db.execute(
                "DELETE FROM event_outbox WHERE event_id <= ?", (written,)))
        ops, after = self._ops, self._after
        self._ops, self._after = [], []
        return ops, after, self._queued

    def _start_commit(self) -> None:
        ops, after, upto = self._take()
        loop = asyncio.get_running_loop()
        # Waiters wait on ``committed``, resolved only after the bookkeeping below: awaiting
        # the executor's own future could return before its callbacks ran, and spin.
        committed: asyncio.Future[None] = loop.create_future()
        work = loop.run_in_executor(self._writer, self._commit, ops)
        work.add_done_callback(lambda done: self._finished(done, after, upto, committed))
        self._inflight = committed

    def _finished(self, done: asyncio.Future[None], after: list[Callable[[], None]],
                  upto: int, committed: asyncio.Future[None]) -> None:
        """On the loop: note the commit, run what waited for it, then wake the waiters."""
        self._inflight = None
        error = done.exception() if not done.cancelled() else asyncio.CancelledError()
        if error is not None:
            self._failed = error
            log.critical("the coordinator's state store failed; refusing further calls: %r",
                         error)
            committed.set_exception(error)
            return
        self._committed(after, upto)
        committed.set_result(None)

    def _committed(self, after: list[Callable[[], None]], upto: int) -> None:
        self._durable = upto
        for action in after:
            action()

    def _commit(self, ops: list[Op]) -> None:
        """One transaction of ``ops`` (on the writer thread)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for op in ops:
                op(self._db)
            self._faults.reached("batch.before_commit")
            self._db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise
        self._faults.reached("batch.after_commit")

    def _check_failed(self) -> None:
        if self._failed is not None:
            raise Unavailable(f"the coordinator's state store failed ({self._failed!r}); "
                              "it must be restarted")

    def _run(self, sql: str, *params: Any) -> None:
        self._queue(lambda db: db.execute(sql, params))

    def _queue(self, op: Op) -> None:
        self._check_failed()
        self._ops.append(op)
        self._queued += 1

    def on_durable(self, action: Callable[[], None]) -> None:
        """Run ``action`` (on the loop) once everything journaled so far is durable."""
        if self._ops:
            self._after.append(action)
        elif self._inflight is not None:  # only the commit in flight holds what came before
            self._ops.append(lambda db: None)
            self._queued += 1
            self._after.append(action)
        else:
            action()

    # -- journal ------------------------------------------------------------------------------

    def save_client(self, record: ClientRecord) -> None:
        """Insert or replace the client's row."""
        # the instance key rides in the metadata column (no schema change), under a name no
        # client can set: the registry strips it from what clients send
        metadata = {**record.metadata, INSTANCE_KEY_COLUMN: record.instance_key}
        self._run("INSERT OR REPLACE INTO clients VALUES (?, ?, ?, ?)", record.client_id,
                  record.name, record.num_examples, json.dumps(metadata))

    def forget_client(self, client_id: str) -> None:
        """Delete the client's row."""
        self._run("DELETE FROM clients WHERE client_id = ?", client_id)

    def save_task(self, record: TaskRecord, next_task: int) -> None:
        """Insert or replace the task's row; remember the task counter."""
        self._run("INSERT OR REPLACE INTO task_states VALUES (?, ?, ?, ?, ?)",
                  record.task_id, record.client_id, record.version, record.state.value,
                  record.delta_base)
        self._set_meta("next_task", next_task)

    def save_secure_groups(self, next_number: int,
                           open_groups: Mapping[int, Mapping[str, Any]]) -> None:
        """Remember the next secure group's number and the groups still going."""
        self._set_meta("next_secure_group", next_number)
        self._set_meta("secure_open_groups",
                       {str(number): dict(group) for number, group in open_groups.items()})

    def save_secure_accounting(self, state: Mapping[str, Any]) -> None:
        """Remember distributed DP's accounting (a JSON object)."""
        self._set_meta("secure_accounting", dict(state))

    def forget_tasks(self, task_ids: list[str]) -> None:
        """Delete the tasks' rows."""
        rows = [(t,) for t in task_ids]
        self._queue(lambda db: db.executemany("DELETE FROM task_states WHERE task_id = ?", rows))

    def save_pending(self, update: ReceivedUpdate) -> None:
        """Append the accepted update (its decoded delta as float32 bytes)."""
        delta = np.ascontiguousarray(update.delta, dtype=np.float32).tobytes()
        self._run("INSERT INTO pending (client_id, task_id, base_version, num_examples, "
                  "steps_completed, steps_planned, bytes_up, metrics, delta) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", update.client_id, update.task_id,
                  update.base_version, update.num_examples, update.steps_completed,
                  update.steps_planned, update.bytes_up, json.dumps(dict(update.metrics)),
                  delta)

    def save_settled(self, settled: SettledUpload) -> None:
        """Remember the commit's final answer."""
        self._run("INSERT OR REPLACE INTO settled VALUES (?, ?, ?, ?)", settled.upload_id,
                  settled.client_id, settled.size, json.dumps(_answer_json(settled.answer)))

    def save_initial(self, checkpoint: Checkpoint) -> None:
        """The model a fresh run starts from."""
        self.save_flush(checkpoint, None, keep_from=0)

    def save_flush(self, checkpoint: Checkpoint, record: FlushRecord | None,
                   keep_from: int) -> None:
        """The checkpoint file is written first, in the same commit that moves the version on.

        A crash between the two leaves a checkpoint the next start discards (see ``load``).
        """
        model = np.array(checkpoint.model, dtype=np.float32)  # the caller may reuse its array
        frozen = Checkpoint(checkpoint.version, model, checkpoint.engine_state)

        def write(db: sqlite3.Connection) -> None:
            self._faults.reached("flush.before_checkpoint")
            write_checkpoint(self.checkpoints, frozen)
            self._faults.reached("flush.after_checkpoint")

        self._queue(write)
        self._set_meta("version", checkpoint.version)
        self._run("DELETE FROM pending")
        if record is not None:
            self._run("INSERT OR REPLACE INTO flushes VALUES (?, ?, 0)", record.version,
                      json.dumps(_flush_json(record)))
        # Old checkpoints go only once the new version is the durable one.
        self.on_durable(lambda: delete_checkpoints_before(self.checkpoints, keep_from))

    def mark_reported(self, version: int) -> None:
        """The flush event of ``version`` is in the event log."""
        self._run("UPDATE flushes SET reported = 1 WHERE version = ?", version)

    def save_events(self, events: list[dict[str, Any]]) -> None:
        """Journal the events into the outbox, each with the next ``event_id``."""
        rows = []
        for event in events:
            self._event_ids += 1
            event["event_id"] = self._event_ids
            rows.append((self._event_ids, json.dumps(event, allow_nan=False)))
        if rows:
            self._queue(lambda db: db.executemany("INSERT INTO event_outbox VALUES (?, ?)",
                                                  rows))
            self._set_meta("last_event_id", self._event_ids)  # ids are never reused

    def events_written(self, events: list[dict[str, Any]]) -> None:
        """``events`` (and every earlier one) are in the event log: the next commit drops them
        from the outbox (no commit of its own)."""
        self._written = max([self._written, *(int(e["event_id"]) for e in events)])

    def save_finished(self, reason: str) -> None:
        """Remember that the run is over."""
        self._set_meta("finished_reason", reason)

    def _set_meta(self, key: str, value: Any) -> None:
        self._run("INSERT OR REPLACE INTO meta VALUES (?, ?)", key, json.dumps(value))

    def _last_event_id(self) -> int:
        """The last ``event_id`` handed out (saved with every event batch)."""
        return int(self._meta("last_event_id", 0))

    def _meta(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    # -- loading ------------------------------------------------------------------------------

    def load(self, num_parameters: int) -> SavedState | None:
        """The saved state; None (after noting the model size) when the folder is new."""
        saved_size = self._meta("num_parameters")
        if saved_size is None:
            self._set_meta("schema", SCHEMA_VERSION)
            self._set_meta("num_parameters", num_parameters)
            self.sync_now()
            return None
        if saved_size != num_parameters:
            raise ConfigError(f"state_dir {str(self.root)!r} holds a run of a model with "
                              f"{saved_size} parameters, this model has {num_parameters}: "
                              "use another state_dir, or delete this one to start over")
        version = self._meta("version")
        if version is None:  # killed before the initial checkpoint: nothing was served
            return None
        return SavedState(
            checkpoints=self._load_checkpoints(int(version)),
            clients=self._load_clients(), tasks=self._load_tasks(),
            next_task=int(self._meta("next_task", 1)), pending=self._load_pending(),
            settled=self._load_settled(), unreported=self._load_unreported(),
            finished_reason=str(self._meta("finished_reason", "")),
            unwritten_events=self._load_outbox(),
            next_secure_group=int(self._meta("next_secure_group", 1)),
            open_secure_groups={int(number): group for number, group in
                                self._meta("secure_open_groups", {}).items()},
            secure_accounting=self._meta("secure_accounting"))

    def _load_checkpoints(self, version: int) -> list[Checkpoint]:
        """Kept checkpoints up to ``version``; later ones (a flush never committed) go."""
        versions = saved_versions(self.checkpoints)
        for orphan in (v for v in versions if v > version):
            log.info("discarding checkpoint of version %d: its flush was not committed",
                     orphan)
            (self.checkpoints / f"v{orphan:09d}.npz").unlink(missing_ok=True)
        if version not in versions:
            raise ConfigError(f"state_dir {str(self.root)!r} is damaged: the checkpoint of the "
                              f"current version {version} is missing")
        return [read_checkpoint(self.checkpoints, v) for v in versions if v <= version]

    def _load_clients(self) -> list[ClientRecord]:
        rows = self._db.execute("SELECT client_id, name, num_examples, metadata FROM clients")
        records = []
        for cid, name, n, meta in rows:
            metadata = json.loads(meta)
            key = str(metadata.pop(INSTANCE_KEY_COLUMN, ""))
            records.append(ClientRecord(cid, name, n, 0.0, 0.0, metadata, key))
        return records

    def _load_tasks(self) -> list[TaskRecord]:
        rows = self._db.execute("SELECT task_id, client_id, version, state, delta_base "
                                "FROM task_states ORDER BY rowid")
        return [TaskRecord(tid, cid, v, 0.0, TaskState(state), base)
                for tid, cid, v, state, base in rows]

    def _load_pending(self) -> list[ReceivedUpdate]:
        rows = self._db.execute("SELECT client_id, task_id, base_version, num_examples, "
                                "steps_completed, steps_planned, bytes_up, metrics, delta "
                                "FROM pending ORDER BY seq")
        return [ReceivedUpdate(cid, tid, base, np.frombuffer(delta, dtype=np.float32).copy(),
                               n, done, planned, up, json.loads(metrics))
                for cid, tid, base, n, done, planned, up, metrics, delta in rows]

    def _load_settled(self) -> list[SettledUpload]:
        rows = self._db.execute("SELECT upload_id, client_id, size, answer FROM settled")
        return [SettledUpload(uid, cid, size, _answer_from_json(json.loads(answer)))
                for uid, cid, size, answer in rows]

    def _load_outbox(self) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT event FROM event_outbox ORDER BY event_id")
        return [json.loads(event) for (event,) in rows]

    def _load_unreported(self) -> list[FlushRecord]:
        rows = self._db.execute("SELECT record FROM flushes WHERE reported = 0 ORDER BY version")
        return [_flush_from_json(json.loads(record)) for (record,) in rows]

    # -- shutdown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Commit what is journaled (a graceful stop loses nothing), then close (idempotent)."""
        self._writer.shutdown(wait=True)
        self._inflight = None
        with contextlib.suppress(sqlite3.ProgrammingError):
            if self._failed is None and self._ops:
                self.sync_now()
            self._db.close()


def _migrate_task_flags(db: sqlite3.Connection) -> None:
    """Carry a schema-1 ``tasks`` table (four flags a task) over to ``task_states``."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'tasks'").fetchone():
        return
    rows = db.execute("SELECT task_id, client_id, version, done, expired, delta_base, "
                      "holds_issue, dropped FROM tasks ORDER BY rowid").fetchall()
    db.execute("BEGIN IMMEDIATE")  # one transaction: a crash leaves either table whole
    db.executemany("INSERT OR REPLACE INTO task_states VALUES (?, ?, ?, ?, ?)",
                   [(tid, cid, v, _flags_state(done, exp, holds, dropped).value, base)
                    for tid, cid, v, done, exp, base, holds, dropped in rows])
    db.execute("DROP TABLE tasks")
    db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (json.dumps(SCHEMA_VERSION),))
    db.execute("COMMIT")


def _flags_state(done: int, expired: int, holds_issue: int, dropped: int) -> TaskState:
    """The state schema 1's flags meant (every ended task behaves as ``DELIVERED`` does)."""
    if done:
        return TaskState.DROPPED if dropped else TaskState.DELIVERED
    if expired:
        return TaskState.OVERDUE if holds_issue else TaskState.RELEASED
    return TaskState.ISSUED


def _answer_json(answer: Answer) -> dict[str, Any]:
    if isinstance(answer, RemoteError):
        return {"code": answer.code, "detail": answer.detail, "reason": answer.refusal.value}
    return {"accepted": to_jsonable(asdict(answer))}


def _answer_from_json(value: Mapping[str, Any]) -> Answer:
    if "accepted" in value:
        return CommitReply(**value["accepted"])
    return remote_error(str(value["code"]), str(value["detail"]),
                        reason=refusal_code(value.get("reason")))


def _flush_json(record: FlushRecord) -> dict[str, Any]:
    value = asdict(record)
    value["task_ids"] = list(record.task_ids)
    value["hook_report"] = to_jsonable(dict(record.hook_report))
    return value


def _flush_from_json(value: Mapping[str, Any]) -> FlushRecord:
    return FlushRecord(**{**value, "task_ids": tuple(value["task_ids"])})
