"""What the coordinator sent down, counted when it sends it, and which of it a client used.

``bytes_down`` is every payload byte the coordinator sent: each chunk of every ``Download``
stream once gRPC has taken it (a stream cut by the network counts what went out before the
cut; a resumed or repeated download counts again what it sends again), and each inline
payload each time a ``Task`` reply carries it. It is counted by kind: ``model`` and ``delta``
for training tasks, ``evaluation`` for an evaluation task's model or delta.

A task's bytes are *used* when its accepted ``Commit`` (or accepted evaluation report) shows
the client has the model: one whole payload, the one the client finished receiving last (the
model it trained on: a delta, or the full model it fell back to). Everything else sent for
the task, and everything sent for a task that never gets an accepted result, is
``bytes_down_wasted``. ``DownloadLedger`` keeps per task what was sent until the task is
settled; a coordinator restarted from its ``state_dir`` takes back, from the run's earlier
``download_finished`` events, what was sent for the tasks its previous process had not
settled (``restore``), so that a result accepted after the restart uses them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MODEL, DELTA, EVALUATION = "model", "delta", "evaluation"
"""The kinds ``bytes_down`` is split into."""

_SETTLING = frozenset({"download_used", "update_accepted", "update_refused",
                       "evaluation_reported"})
"""The event kinds after which a task's downloads are settled."""
RESTORED_KINDS = frozenset({"download_finished", "client_left", *_SETTLING})
"""The earlier events ``DownloadLedger.restore`` reads."""


@dataclass
class _Payload:
    """One payload of a task: its size, the bytes sent of it, what a delta saves."""

    size: int
    sent: int = 0
    bytes_saved: int = 0
    base_version: int | None = None


@dataclass
class _TaskDownloads:
    """What was sent for one task, by payload (``model``/``delta``), and which payload was
    last sent to its end."""

    evaluation: bool
    payloads: dict[str, _Payload] = field(default_factory=dict)
    completed: str | None = None

    @property
    def sent(self) -> int:
        return sum(p.sent for p in self.payloads.values())


@dataclass
class DownloadLedger:
    """Bytes sent per ``(client id, task id)`` until the task is settled (used or not)."""

    _tasks: dict[tuple[str, str], _TaskDownloads] = field(default_factory=dict)

    def sent(self, client_id: str, task_id: str, payload: str, size: int, num_bytes: int, *,
             evaluation: bool = False, to_end: bool = False, bytes_saved: int = 0,
             base_version: int | None = None) -> None:
        """``num_bytes`` of ``payload`` (``model``/``delta``, ``size`` bytes in all) went to
        the client; ``to_end``: the payload's last byte was among them."""
        task = self._tasks.setdefault((client_id, task_id), _TaskDownloads(evaluation))
        entry = task.payloads.setdefault(payload, _Payload(size, 0, bytes_saved, base_version))
        entry.size = max(entry.size, size)  # a restored payload's size may be unknown (0)
        entry.sent += num_bytes
        if to_end:
            task.completed = payload

    def settle(self, client_id: str, task_id: str, used: bool) -> dict[str, Any] | None:
        """The task is over for its downloads: ``used`` (an accepted result) or not. Returns
        the ``download_used`` event's fields when a payload was used, else None."""
        task = self._tasks.pop((client_id, task_id), None)
        if task is None or not used or task.completed is None:
            return None
        payload = task.payloads[task.completed]
        used_bytes = min(payload.size, task.sent)  # a restart forgets what was sent before it
        fields: dict[str, Any] = {
            "client_id": client_id, "task_id": task_id, "bytes": used_bytes,
            "wasted": task.sent - used_bytes, "delta": task.completed == DELTA,
            "bytes_saved": payload.bytes_saved if task.completed == DELTA else 0,
            "evaluation": task.evaluation}
        if payload.base_version is not None:
            fields["base_version"] = payload.base_version
        return fields

    def restore(self, earlier: Iterable[Mapping[str, Any]]) -> None:
        """Take back, from earlier processes' events in order (a restart), what they sent
        for the tasks they had not settled: a ``download_finished`` counts until a
        ``download_used``, ``update_accepted``, ``update_refused`` or ``evaluation_reported``
        of its task, or a ``client_left`` of its client, settles it. A payload's size is
        where a stream that reached its end ended (an inline payload's bytes); a cut one's
        is learnt when it is sent again."""
        for event in earlier:
            kind, client_id, task_id = event.get("kind"), event.get("client_id"), \
                event.get("task_id")
            if kind == "client_left" and client_id is not None:
                self.forget_client(str(client_id))
            elif kind in _SETTLING and client_id is not None:
                self._tasks.pop((str(client_id), str(task_id)), None)
            elif kind == "download_finished" and client_id is not None and task_id is not None:
                self._take_back(str(client_id), str(task_id), event)

    def _take_back(self, client_id: str, task_id: str, event: Mapping[str, Any]) -> None:
        """One earlier ``download_finished``, as ``sent`` would have counted it."""
        sent = int(event.get("bytes") or 0)
        completed = bool(event.get("completed"))
        self.sent(client_id, task_id, DELTA if event.get("delta") else MODEL,
                  int(event.get("offset") or 0) + sent if completed else 0, sent,
                  evaluation=bool(event.get("evaluation")), to_end=completed,
                  bytes_saved=int(event.get("bytes_saved") or 0),
                  base_version=event.get("base_version"))

    def forget_client(self, client_id: str) -> None:
        """Drop what was sent to a client that left (none of it was used)."""
        for key in [k for k in self._tasks if k[0] == client_id]:
            del self._tasks[key]

    def __len__(self) -> int:
        """Tasks with bytes sent and not yet settled."""
        return len(self._tasks)
