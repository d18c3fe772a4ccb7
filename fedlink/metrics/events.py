"""The run event log: an append-only JSON-lines record of everything a run does.

Every event is one JSON object on its own line. :class:`EventLog` stamps three fields on each:

========== ==========================================================================
``t``       wall-clock time, Unix seconds (``time.time()`` unless a clock is injected)
``elapsed`` seconds since the log was created, from a monotonic clock
``kind``    the event kind
========== ==========================================================================

The kinds and their fields are typed: one frozen dataclass per kind in
:mod:`fedlink.metrics.kinds` (``EVENT_TYPES`` is the table). Writers either pass one
(``log.emit(TaskIssued(client_id=..., task_id=..., model_version=...))``) or use the
``log.emit("task_issued", client_id=..., ...)`` form, which builds and checks the same type
(an unknown kind or field is an error naming it). Readers get the same types back from
:func:`read_events` and from subscribers (:meth:`EventLog.subscribe`, :meth:`EventLog.on_flush`).

A coordinator with a ``state_dir`` also gives each event that records a change of its durable
state an ``event_id``, unique within the run: such events are made durable with the change and
written again by a restarted coordinator if it may not have written them, and
:func:`read_events` keeps the first of each ``event_id``.

The log streams: each event goes to the file as it is written and the log keeps only running
counts in memory, so a long-running coordinator's memory does not grow with its events. A log
without a path streams to an anonymous temporary file, so it can be read back the same way.

Values are converted to plain JSON on the way in: numpy scalars and arrays, tuples, sets,
dataclasses, enums and paths become their JSON equivalents, and non-finite floats become
``null`` so that every line is strict JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
import tempfile
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from pathlib import Path, PurePath
from types import TracebackType
from typing import IO, Any, Final, Self, TypeVar, overload

import numpy as np

from fedlink.metrics.kinds import (
    EVENT_TYPES,
    RESERVED_FIELDS,
    Event,
    Flush,
    check_fields,
    from_record,
)
from fedlink.private import private_dir, touch_private

Record = dict[str, Any]
"""One event as the JSON object written on its line."""

E = TypeVar("E", bound=Event)
Subscriber = Callable[[Event], None]
Unsubscribe = Callable[[], None]

RUN_STARTED: Final = "run_started"
CLIENT_JOINED: Final = "client_joined"
TASK_ISSUED: Final = "task_issued"
DOWNLOAD_FINISHED: Final = "download_finished"
DOWNLOAD_USED: Final = "download_used"
UPDATE_ACCEPTED: Final = "update_accepted"
UPDATE_REFUSED: Final = "update_refused"
SECURE_ANSWER_LATE: Final = "secure_answer_late"
FLUSH: Final = "flush"
CLIENT_LEFT: Final = "client_left"
CLIENT_TIMEOUT: Final = "client_timeout"
RUN_FINISHED: Final = "run_finished"

EVENT_KINDS: Final = frozenset(EVENT_TYPES)
"""Every kind the framework emits (the names of ``fedlink.metrics.kinds.EVENT_TYPES``)."""

__all__ = ["EVENT_KINDS", "RESERVED_FIELDS", "Event", "EventLog", "Record", "iter_events",
           "read_events", "to_jsonable"]


def to_jsonable(value: Any) -> Any:
    """Return ``value`` as plain JSON data (dict, list, str, int, float, bool or None).

    Raises ``TypeError`` for a value with no sensible JSON form.
    """
    kind = type(value)
    if value is None or kind is str or kind is bool or kind is int:  # the common cases, fast
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is dict:
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, str | bool):
        return value
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, int | float | np.generic):
        return _scalar(value)
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [to_jsonable(v) for v in items]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"cannot write a {type(value).__name__} to the event log")


def _scalar(value: int | float | np.generic) -> int | float | bool | str | None:
    """Convert a Python or numpy scalar to a JSON scalar; non-finite floats become None."""
    item = value.item() if isinstance(value, np.generic) else value
    if isinstance(item, bool | int | str):
        return item
    if isinstance(item, float):
        return item if math.isfinite(item) else None
    raise TypeError(f"cannot write a {type(value).__name__} to the event log")


TAIL_BYTES: Final = 1 << 20
"""How far back from a log's end its last line is looked for (an event's line is far
shorter)."""


def _end_cleanly(path: Path) -> None:
    """Make ``path`` end at a line's end before it is appended to. A last line that does not
    parse is the torn write of a process killed mid-line: it is cut (appending after it would
    glue the next event onto it, leaving a malformed line inside the log; an event the
    coordinator had made durable is written again by its restart, ``EventLog.replay``). A
    whole last event without its newline gets one."""
    with path.open("rb+") as f:
        end = f.seek(0, 2)
        start = max(0, end - TAIL_BYTES)
        f.seek(start)
        tail = f.read()
        if not tail or tail.endswith(b"\n"):
            return
        cut = tail.rfind(b"\n")
        if _parsed(tail[cut + 1:]) is not None:
            f.write(b"\n")
        elif cut >= 0 or start == 0:
            f.truncate(start + cut + 1)


def _earlier_elapsed(path: Path, now: float) -> float:
    """The ``elapsed`` a resumed log continues from: what the earlier processes' events in
    ``path`` measured, plus the wall time since (a coordinator restarted from its
    ``state_dir`` continues its run's log, downtime included, so that the run's times span
    every process). 0 for a file without a readable event."""
    with path.open("rb") as f:
        head = _parsed(f.readline())
        f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
        tail = f.read().splitlines()
    last = next((r for r in map(_parsed, reversed(tail)) if r is not None), None)
    try:
        origin = float(head["t"]) - float(head["elapsed"])  # type: ignore[index]
        # never behind the last event written, even when the wall clock was set back
        return max(now - origin, float(last["elapsed"]))  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return 0.0


def _parsed(line: bytes) -> dict[str, Any] | None:
    """One written event's record (``None``: a torn or foreign line)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class EventLog:
    """An append-only, thread-safe event log streamed to a JSON-lines file.

    With a path, the file is opened for appending (parent folders are created; a torn last
    line is cut first). ``resume=True`` continues a run's log (a coordinator restarted from
    its ``state_dir``): this log's ``elapsed`` goes on from the run's first event, counting
    the time between the processes, so that a resumed run's times (``wall_seconds``, a time
    to target) span all of it. With
    ``path=None`` the log streams to an anonymous temporary file that goes with the log.
    Every event is written as one line (to a named file: flushed before :meth:`emit`
    returns); in memory the log keeps only a count per kind. ``clock`` (monotonic, for
    ``elapsed``) and ``wall_clock`` (for ``t``) may be injected, e.g. by a virtual-clock
    simulation.
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        resume: bool = False,
    ) -> None:
        self._path = path
        self._clock = clock
        self._wall_clock = wall_clock
        self._start = clock()
        self._lock = threading.Lock()
        self._closed = False
        self._held: list[Record] | None = None
        self._subscribers: list[tuple[str | None, Subscriber]] = []
        self._counts: Counter[str] = Counter()
        self._file: IO[str] | None
        if path is not None:
            private_dir(path.parent)
            _end_cleanly(touch_private(path))
            self._file = path.open("a", encoding="utf-8", buffering=1)
            self._anonymous: IO[str] | None = None
        else:
            # Buffered, not flushed per line: only this log reads it (seeking flushes), and
            # a syscall per event would cost a busy coordinator for nothing.
            self._file = self._anonymous = tempfile.TemporaryFile(  # noqa: SIM115 - kept open
                "w+", encoding="utf-8", buffering=1 << 16)
            weakref.finalize(self, self._anonymous.close)
        self._offset = self._file.tell()  # this log's events start here (appending)
        if resume and self._offset and path is not None:
            self._start -= _earlier_elapsed(path, wall_clock())

    @property
    def path(self) -> Path | None:
        """The JSON-lines file, or None for a log on an anonymous temporary file."""
        return self._path

    @property
    def events(self) -> list[Event]:
        """The events written through this log, oldest first (read back from its file)."""
        return list(self._read())

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def count(self, kind: str | type[Event] | None = None) -> int:
        """How many events (of one kind) this log has written, from its running count."""
        if kind is None:
            return sum(self._counts.values())
        return self._counts[_kind_name(kind)]

    def __len__(self) -> int:
        return self.count()

    def earlier(self, kinds: Set[str]) -> Iterator[Record]:
        """The events of ``kinds`` that earlier processes wrote to this log's file before it
        was opened (a coordinator restarted from its ``state_dir``), as written, streamed,
        each once (an event written again after a restart has the ``event_id`` it had); a
        line that does not parse is passed over. Nothing for a new log."""
        if self._path is None or not self._offset:
            return
        with self._path.open("rb") as f:
            yield from (r for r in _once(self._earlier_records(f)) if r.get("kind") in kinds)

    def _earlier_records(self, f: IO[bytes]) -> Iterator[Record]:
        """The records that parse among the lines of ``f`` before this log's own."""
        position = 0
        for line in f:
            position += len(line)
            if position > self._offset:  # this process's own events from here
                return
            record = _parsed(line)
            if record is not None:
                yield record

    def elapsed(self) -> float:
        """Seconds since the log was created, by the log's monotonic clock."""
        return self._clock() - self._start

    def emit(self, event: Event | str, /, **fields: Any) -> Event:
        """Record one event and return it as written (time fields stamped).

        ``event`` is a typed event, or a kind name with its ``fields`` (checked against the
        kind's type). Raises ``ValueError`` if the log is closed, the kind is unknown or a
        field is reserved or undeclared, and ``TypeError`` if a value cannot be JSON.
        """
        if isinstance(event, str):
            check_fields(event, fields)
            kind, body = event, to_jsonable(fields)
        elif fields:
            raise TypeError("emit(event) takes no fields beside a typed event")
        else:
            kind, body = event.kind, to_jsonable(event.body())
        with self._lock:
            if self._closed:
                raise ValueError("emit on a closed event log")
            record: Record = {"t": self._wall_clock(), "elapsed": self.elapsed(),
                              "kind": kind, **body}
            if self._held is not None:
                self._held.append(record)
            else:
                self._record(record)
        return from_record(record)

    @contextlib.contextmanager
    def captured(self) -> Iterator[list[Record]]:
        """Capture the events emitted inside instead of writing them; yields their records.

        The caller writes them later with :meth:`write_captured`. The coordinator captures the
        events of a change to its durable state and writes them once the change is durable: a
        crash in between then loses neither or both, and never leaves an event that claims what
        a restart does not know. Nested blocks share the outermost one's list.
        """
        with self._lock:
            outermost = self._held is None
            if self._held is None:
                self._held = []
            held = self._held
        try:
            yield held
        finally:
            if outermost:
                with self._lock:
                    self._held = None

    def write_captured(self, events: list[Record]) -> None:
        """Write records captured by :meth:`captured`, in order."""
        with self._lock:
            for record in events:
                self._record(record)

    def replay(self, event: Mapping[str, Any]) -> None:
        """Write an event made by an earlier process as it is (a coordinator's restart)."""
        with self._lock:
            self._record(dict(event))

    @overload
    def subscribe(self, kind: Subscriber, /) -> Unsubscribe: ...

    @overload
    def subscribe(self, kind: type[E], callback: Callable[[E], None], /) -> Unsubscribe: ...

    @overload
    def subscribe(self, kind: str, callback: Subscriber, /) -> Unsubscribe: ...

    def subscribe(self, kind: Any, callback: Any = None, /) -> Unsubscribe:
        """Call ``callback`` with every typed event from now on (of ``kind``: a name or an
        event type), once it is written; ``subscribe(callback)`` subscribes to every kind.

        Subscribers (the progress bar, live exporters: Prometheus, TensorBoard) see what the
        file records, in order, captured events only once they are durable; they run under
        the log's lock, on the writer's thread, so they must be quick and must not emit
        (hand work to a loop with ``call_soon_threadsafe``). Returns a function that
        unsubscribes.
        """
        if callback is None:
            kind, callback = None, kind
        name = None if kind is None else _kind_name(kind)
        if name is not None and name not in EVENT_TYPES:
            raise ValueError(f"unknown event kind {name!r}")
        entry = (name, callback)
        with self._lock:
            self._subscribers.append(entry)

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._subscribers:
                    self._subscribers.remove(entry)

        return unsubscribe

    def on_flush(self, callback: Callable[[Flush], None]) -> Unsubscribe:
        """Call ``callback`` with every ``flush`` event (a new model version), once written."""
        return self.subscribe(Flush, callback)

    def _record(self, record: Record) -> None:
        """Write one record, count it and hand it to subscribers; the caller holds the lock."""
        self._write(record)
        kind = str(record.get("kind"))
        self._counts[kind] += 1
        wanted = [cb for name, cb in self._subscribers if name is None or name == kind]
        if wanted:
            event = from_record(record)
            for callback in wanted:
                callback(event)

    def of_kind(self, kind: str | type[E]) -> list[Any]:
        """The events of one kind (a name or an event type), oldest first, read back from
        the file (nothing is kept in memory to copy)."""
        name = _kind_name(kind)
        return [e for e in self._read() if e.kind == name]

    def _read(self) -> Iterator[Event]:
        """This log's events, read back from its file (without dropping repeats)."""
        with self._lock:
            if self._anonymous is not None:
                self._anonymous.seek(self._offset)
                lines = self._anonymous.readlines()
                self._anonymous.seek(0, 2)
            elif self._path is not None:
                with self._path.open(encoding="utf-8") as f:
                    f.seek(self._offset)
                    lines = f.readlines()
            else:
                lines = []
        for line in lines:
            if line.strip():
                yield from_record(json.loads(line))

    def close(self) -> None:
        """Stop writing (further :meth:`emit` calls raise) and close a named file. Idempotent.

        A log on an anonymous file can still be read until it is garbage collected.
        """
        with self._lock:
            self._closed = True
            if self._file is not None and self._anonymous is None:
                self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = str(self._path) if self._path is not None else "anonymous file"
        return f"EventLog({where}, {self.count()} events)"

    def _write(self, record: Record) -> None:
        """Append one record as a line and flush it; the caller holds the lock."""
        if self._file is None:
            return
        self._file.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
        if self._anonymous is None:  # a named file is read by others: each line at once
            self._file.flush()


def _kind_name(kind: str | type[Event]) -> str:
    return kind if isinstance(kind, str) else kind.KIND


def iter_events(path: Path) -> Iterator[Event]:
    """The typed events of a JSON-lines event log, oldest first, streamed line by line.

    Blank lines are skipped. A torn final line (a process killed mid-write) is ignored; a
    malformed line anywhere else raises ``ValueError`` naming the line. An event whose
    ``event_id`` was already read is skipped: a restarted coordinator writes again the events
    it had made durable but may not have written (see ``fedlink.coordinator.state``).
    """
    with path.open(encoding="utf-8") as f:
        yield from map(from_record, _once(_records(path, f)))


def _records(path: Path, f: IO[str]) -> Iterator[Record]:
    """The event records of the lines of ``f`` (``path``'s), as ``iter_events`` reads them."""
    for number, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if not line.endswith("\n"):
                return  # only the last line lacks one: the torn line of a killed writer
            raise ValueError(f"{path}:{number}: not a JSON event: {err}") from err
        if not isinstance(record, dict) or "kind" not in record:
            raise ValueError(f"{path}:{number}: not an event object")
        yield record


def _once(records: Iterable[Record]) -> Iterator[Record]:
    """``records`` without repeats: a restarted coordinator writes again the events it had
    made durable but may not have written, each with the ``event_id`` it had."""
    seen: set[Any] = set()
    for record in records:
        if "event_id" in record:
            if record["event_id"] in seen:
                continue
            seen.add(record["event_id"])
        yield record


def read_events(path: Path) -> list[Event]:
    """Every typed event of a JSON-lines event log, oldest first (see :func:`iter_events`)."""
    return list(iter_events(path))
