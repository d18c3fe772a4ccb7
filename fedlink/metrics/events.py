"""The run event log: an append-only JSON-lines record of everything a run does.

Every event is one JSON object on its own line. :class:`EventLog` adds three fields to each:

========== ==========================================================================
``t``       wall-clock time, Unix seconds (``time.time()`` unless a clock is injected)
``elapsed`` seconds since the log was created, from a monotonic clock
``kind``    the event kind (below)
========== ==========================================================================

A coordinator with a ``state_dir`` also gives each event that records a change of its durable
state an ``event_id``, unique within the run: such events are made durable with the change and
written again by a restarted coordinator if it may not have written them, and
:func:`read_events` keeps the first of each ``event_id``.

Event kinds and their fields (the schema the framework writes and :mod:`.summary` reads):

``run_started``
    ``config`` -- the run configuration, as a JSON object.
``client_joined``
    ``client_id``, ``name``, ``num_examples``.
``task_issued``
    ``client_id``, ``task_id``, ``model_version``.
``download_finished``
    ``client_id``, ``task_id``, ``bytes`` -- bytes sent to the client for this task.
``update_accepted``
    ``client_id``, ``task_id``, ``base_version``, ``staleness`` (versions behind),
    ``num_examples``, ``steps_completed``, ``bytes_up`` (encoded update size), ``weight``
    (aggregation weight).
``update_refused``
    ``client_id``, ``task_id``, ``reason`` (human-readable), ``code`` (gRPC status code
    name, e.g. ``FAILED_PRECONDITION``); optionally ``bytes_up`` when the update was
    received before it was refused.
``flush``
    ``model_version`` (after the flush), ``num_updates``, ``updates`` (the task ids of the
    updates it folded in), ``accuracy``, ``loss`` (either may
    be ``null`` when not evaluated), ``bytes_up``, ``bytes_down`` (traffic during the round),
    ``round_seconds``.
``client_left``
    ``client_id``.
``client_timeout``
    ``client_id``.
``run_finished``
    ``reason``.
``coordinator_restored``
    ``model_version``, ``clients``, ``tasks``, ``pending_updates``, ``settled_uploads``,
    ``unreported_flushes``: what a coordinator restarted on its ``state_dir`` took back.

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
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePath
from types import TracebackType
from typing import IO, Any, Final, Self

import numpy as np

from fedlink.private import private_dir, touch_private

Event = dict[str, Any]
"""One event: a JSON object with at least ``t``, ``elapsed`` and ``kind``."""

RUN_STARTED: Final = "run_started"
CLIENT_JOINED: Final = "client_joined"
TASK_ISSUED: Final = "task_issued"
DOWNLOAD_FINISHED: Final = "download_finished"
UPDATE_ACCEPTED: Final = "update_accepted"
UPDATE_REFUSED: Final = "update_refused"
FLUSH: Final = "flush"
CLIENT_LEFT: Final = "client_left"
CLIENT_TIMEOUT: Final = "client_timeout"
RUN_FINISHED: Final = "run_finished"

EVENT_KINDS: Final = frozenset(
    {
        RUN_STARTED,
        CLIENT_JOINED,
        TASK_ISSUED,
        DOWNLOAD_FINISHED,
        UPDATE_ACCEPTED,
        UPDATE_REFUSED,
        FLUSH,
        CLIENT_LEFT,
        CLIENT_TIMEOUT,
        RUN_FINISHED,
    }
)
"""The kinds the framework emits; :meth:`EventLog.emit` accepts others too."""

RESERVED_FIELDS: Final = frozenset({"t", "elapsed", "kind", "event_id"})
"""Fields the log sets itself; passing them to :meth:`EventLog.emit` is an error."""


def to_jsonable(value: Any) -> Any:
    """Return ``value`` as plain JSON data (dict, list, str, int, float, bool or None).

    Raises ``TypeError`` for a value with no sensible JSON form.
    """
    if value is None or isinstance(value, str | bool):
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


class EventLog:
    """An append-only, thread-safe event log, in memory and optionally on disk as JSON lines.

    ``path=None`` keeps events in memory only. With a path, the file is opened for appending
    (parent folders are created), and every event is written as one line and flushed before
    :meth:`emit` returns. ``clock`` (monotonic, for ``elapsed``) and ``wall_clock`` (for
    ``t``) may be injected, e.g. by a virtual-clock simulation.
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = path
        self._clock = clock
        self._wall_clock = wall_clock
        self._start = clock()
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._closed = False
        self._held: list[Event] | None = None
        self._subscribers: list[Callable[[Event], None]] = []
        self._file: IO[str] | None = None
        if path is not None:
            private_dir(path.parent)
            self._file = touch_private(path).open("a", encoding="utf-8", buffering=1)

    @property
    def path(self) -> Path | None:
        """The JSON-lines file, or None for an in-memory log."""
        return self._path

    @property
    def events(self) -> list[Event]:
        """A copy of the events emitted through this log, oldest first."""
        with self._lock:
            return [dict(e) for e in self._events]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def elapsed(self) -> float:
        """Seconds since the log was created, by the log's monotonic clock."""
        return self._clock() - self._start

    def emit(self, kind: str, **fields: Any) -> Event:
        """Record one event of ``kind`` with ``fields`` and return it as written.

        Raises ``ValueError`` if the log is closed or a field name is reserved, and
        ``TypeError`` if a value cannot be written as JSON.
        """
        clash = RESERVED_FIELDS.intersection(fields)
        if clash:
            raise ValueError(f"reserved event field(s): {', '.join(sorted(clash))}")
        body = to_jsonable(fields)
        with self._lock:
            if self._closed:
                raise ValueError("emit on a closed event log")
            event: Event = {"t": self._wall_clock(), "elapsed": self.elapsed(), "kind": kind}
            event.update(body)
            if self._held is not None:
                self._held.append(event)
            else:
                self._record(event)
        return dict(event)

    @contextlib.contextmanager
    def captured(self) -> Iterator[list[Event]]:
        """Capture the events emitted inside instead of writing them; yields their list.

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

    def write_captured(self, events: list[Event]) -> None:
        """Write and keep events captured by :meth:`captured`, in order."""
        with self._lock:
            for event in events:
                self._record(event)

    def replay(self, event: Event) -> None:
        """Write an event made by an earlier process as it is (a coordinator's restart)."""
        with self._lock:
            self._record(dict(event))

    def subscribe(self, subscriber: Callable[[Event], None]) -> None:
        """Call ``subscriber`` with a copy of every event from now on, once it is written.

        Subscribers (live exporters: Prometheus, TensorBoard) see what the file records, in
        order, captured events only once they are durable; they run under the log's lock, so
        they must be quick and must not emit.
        """
        with self._lock:
            self._subscribers.append(subscriber)

    def _record(self, event: Event) -> None:
        """Write and keep one event, and hand it to subscribers; the caller holds the lock."""
        self._write(event)
        self._events.append(event)
        for subscriber in self._subscribers:
            subscriber(dict(event))

    def of_kind(self, kind: str) -> list[Event]:
        """The events of one kind, oldest first."""
        with self._lock:
            return [dict(e) for e in self._events if e["kind"] == kind]

    def close(self) -> None:
        """Close the file (if any); further :meth:`emit` calls raise. Idempotent."""
        with self._lock:
            self._closed = True
            if self._file is not None:
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
        where = str(self._path) if self._path is not None else "memory"
        return f"EventLog({where}, {len(self._events)} events)"

    def _write(self, event: Event) -> None:
        """Append one event as a line and flush it; the caller holds the lock."""
        if self._file is None:
            return
        self._file.write(json.dumps(event, allow_nan=False, separators=(",", ":")) + "\n")
        self._file.flush()


def read_events(path: Path) -> list[Event]:
    """Read a JSON-lines event log back, oldest first.

    Blank lines are skipped. A torn final line (a process killed mid-write) is ignored; a
    malformed line anywhere else raises ``ValueError`` naming the line. An event whose
    ``event_id`` was already read is skipped: a restarted coordinator writes again the events
    it had made durable but may not have written (see ``fedlink.coordinator.state``).
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    events: list[Event] = []
    seen: set[Any] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines) and not _ends_with_newline(path):
                break
            raise ValueError(f"{path}:{number}: not a JSON event: {err}") from err
        if not isinstance(event, dict) or "kind" not in event:
            raise ValueError(f"{path}:{number}: not an event object")
        if "event_id" in event:
            if event["event_id"] in seen:
                continue
            seen.add(event["event_id"])
        events.append(event)
    return events


def _ends_with_newline(path: Path) -> bool:
    """Whether the file's last byte is a newline (a complete final line)."""
    with path.open("rb") as f:
        f.seek(0, 2)
        if f.tell() == 0:
            return True
        f.seek(-1, 2)
        return f.read(1) == b"\n"
