"""The event kinds: one small frozen dataclass per kind, written and read through the same types.

Every event has the time fields the log stamps (``t``, ``elapsed``), its ``kind`` and, when a
coordinator made it durable with a change of its state, an ``event_id``. The rest are the
fields of its kind, declared below; :data:`EVENT_TYPES` maps each kind name to its class.

An event reads like the JSON object it is on disk (``event["task_id"]``, ``event.get("accuracy")``,
``dict(event)``), so code written for plain dict events and runs written by earlier versions
still read; new code uses the attributes (``event.task_id``). On disk a field that is None is
left out, as writers always did; reading it back gives None either way.

Two kinds are open: ``flush`` (an evaluator's metrics and a flush hook's report ride along) and
``run_started`` (a driver may add what it knows about the run). Their extra fields live in
``extra``; any other kind given a field it does not declare is an error naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, TypeVar

from fedlink.refusals import RefusalCode, refusal_code

TIME_FIELDS = ("t", "elapsed")
"""The fields the log stamps on every event."""

RESERVED_FIELDS = frozenset({"t", "elapsed", "kind", "event_id", "extra"})
"""Fields a writer may not pass as event fields: the log sets them itself."""


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class Event(Mapping[str, Any]):
    """Base of every typed event: the time fields, an optional ``event_id`` and ``extra``.

    Equality is a mapping's: an event equals another event, or a dict, with the same JSON
    fields.
    """

    KIND: ClassVar[str] = ""
    OPEN: ClassVar[bool] = False
    """Whether fields beyond the declared ones are accepted (kept in ``extra``)."""

    t: float = 0.0
    elapsed: float = 0.0
    event_id: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """The event kind, as written in the ``kind`` field."""
        return self.KIND

    @classmethod
    def declared(cls) -> tuple[str, ...]:
        """The names of this kind's own fields, in declaration order."""
        return _declared(cls)

    @classmethod
    def build(cls, **fields: Any) -> Self:
        """This kind's event from ``fields``, the extra ones of an open kind (an evaluator's
        metrics in a ``flush``) going into ``extra``; ``ValueError`` names a field the kind
        does not have."""
        if not cls.OPEN and RESERVED_FIELDS.isdisjoint(fields):
            try:  # declared fields only (the common case): no per-field checks, a third of
                return cls(**fields)  # the cost; a coordinator builds one per update
            except TypeError:
                pass  # an undeclared field: make_event's error names it
        event = make_event(cls.KIND, fields)
        assert isinstance(event, cls)
        return event

    def body(self) -> dict[str, Any]:
        """The kind's fields that are set (declared, then extra), as on disk."""
        own = {name: getattr(self, name) for name in self.declared()}
        return {**{k: v for k, v in own.items() if v is not None}, **self.extra}

    def to_record(self) -> dict[str, Any]:
        """The event as the JSON object written to ``events.jsonl``."""
        record: dict[str, Any] = {"t": self.t, "elapsed": self.elapsed, "kind": self.kind}
        record.update(self.body())
        if self.event_id is not None:
            record["event_id"] = self.event_id
        return record

    def __getitem__(self, key: str) -> Any:
        if key in _names(type(self)):  # declared but unset reads as None, like ``get``
            return getattr(self, key)
        if key == "kind":
            return self.kind
        if key in TIME_FIELDS or (key == "event_id" and self.event_id is not None):
            return getattr(self, key)
        return self.extra[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value; ``default`` when it is missing or unset (None)."""
        try:
            value = self[key]
        except KeyError:
            return default
        return default if value is None else value

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_record())

    def __len__(self) -> int:
        return len(self.to_record())

    def __contains__(self, key: object) -> bool:
        return key in self.to_record()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_record()!r})"


@functools.cache
def _names(cls: type[Event]) -> frozenset[str]:
    return frozenset(cls.declared())


@functools.cache
def _declared(cls: type[Event]) -> tuple[str, ...]:
    base = {f.name for f in dataclasses.fields(Event)}
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in base)


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class RunStarted(Event):
    """The coordinator is serving: its configuration, port and model size."""

    KIND: ClassVar[str] = "run_started"
    OPEN: ClassVar[bool] = True
    config: Mapping[str, Any] | None = None
    port: int | None = None
    num_parameters: int | None = None
    resumed_from_version: int | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class ClientJoined(Event):
    """A client joined the run."""

    KIND: ClassVar[str] = "client_joined"
    client_id: str | None = None
    name: str | None = None
    num_examples: int | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class TaskIssued(Event):
    """A client was given a task on ``model_version``."""

    KIND: ClassVar[str] = "task_issued"
    client_id: str | None = None
    task_id: str | None = None
    model_version: int | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class DownloadFinished(Event):
    """A download stream ended (to the payload's end, ``completed``, or cut), or an inline
    payload went out in a ``Task`` reply: ``bytes`` the coordinator sent in it
    (``fedlink.coordinator.downloads``). Logs from before protocol 1.1 have one per task at
    its commit, with ``bytes_saved`` and ``base_version``."""

    KIND: ClassVar[str] = "download_finished"
    client_id: str | None = None
    task_id: str | None = None
    bytes: int | None = None
    offset: int | None = None
    delta: bool | None = None
    bytes_saved: int | None = None
    base_version: int | None = None
    inline: bool | None = None
    evaluation: bool | None = None
    completed: bool | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class DownloadUsed(Event):
    """A task's result was accepted: of the bytes sent for it, ``bytes`` (one whole payload,
    a delta when ``delta``, saving ``bytes_saved``) were used and ``wasted`` were not."""

    KIND: ClassVar[str] = "download_used"
    client_id: str | None = None
    task_id: str | None = None
    bytes: int | None = None
    wasted: int | None = None
    delta: bool | None = None
    bytes_saved: int | None = None
    base_version: int | None = None
    evaluation: bool | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class UpdateAccepted(Event):
    """An update was folded in, with what its client reported about the task (see
    ``fedlink.coordinator.client_metrics``)."""

    KIND: ClassVar[str] = "update_accepted"
    client_id: str | None = None
    task_id: str | None = None
    base_version: int | None = None
    staleness: int | None = None
    num_examples: int | None = None
    steps_completed: int | None = None
    bytes_up: int | None = None
    weight: float | None = None
    retries: int | None = None
    resumed_bytes: int | None = None
    offline_seconds: float | None = None
    train_seconds: float | None = None
    network_seconds: float | None = None
    train_loss: float | None = None
    client_metrics: Mapping[str, Any] | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class UpdateRefused(Event):
    """An update was refused: ``reason_code`` (a ``fedlink.refusals.RefusalCode`` value) says
    why in one word, ``reason`` in a sentence; ``code`` is the gRPC status code name.
    ``train_seconds`` and ``network_seconds``, like an accepted update's, are what the task
    cost (a virtual-clock run reports them in model seconds)."""

    KIND: ClassVar[str] = "update_refused"
    client_id: str | None = None
    task_id: str | None = None
    reason: str | None = None
    reason_code: str | None = None
    code: str | None = None
    bytes_up: int | None = None
    retries: int | None = None
    resumed_bytes: int | None = None
    offline_seconds: float | None = None
    train_seconds: float | None = None
    network_seconds: float | None = None

    @property
    def refusal(self) -> RefusalCode:
        """``reason_code`` as a :class:`~fedlink.refusals.RefusalCode` (``NONE`` when the event
        has none or one this version does not know)."""
        return refusal_code(self.reason_code)


EVALUATION_ERROR = "evaluation_error"
"""The ``flush`` field that says the central evaluator raised on that version (``"Type:
message"``): the run goes on, and the summary and report say so (no accuracy is not a
silent None)."""


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class Flush(Event):
    """A new model version; evaluator metrics and hook reports beyond these go in ``extra``."""

    KIND: ClassVar[str] = "flush"
    OPEN: ClassVar[bool] = True
    model_version: int | None = None
    num_updates: int | None = None
    total_weight: float | None = None
    round_seconds: float | None = None
    bytes_up: int | None = None
    bytes_down: int | None = None
    bytes_down_model: int | None = None
    bytes_down_delta: int | None = None
    bytes_down_evaluation: int | None = None
    updates: list[str] | None = None
    model_seconds: float | None = None
    made_elapsed: float | None = None
    """The log's ``elapsed`` when the version was made; the event's own ``elapsed`` is when
    it was reported, after central evaluation (None: the same, or made by an earlier
    process)."""
    accuracy: float | None = None
    loss: float | None = None
    privacy: Mapping[str, Any] | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class FlushRefused(Event):
    """The server optimizer's step was refused (non-finite or exploding): the new version
    keeps the model as it was."""

    KIND: ClassVar[str] = "flush_refused"
    model_version: int | None = None
    num_updates: int | None = None
    reason: str | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class UpdateLimited(Event):
    """The flush guard clipped, down-weighted or dropped an accepted update, and why."""

    KIND: ClassVar[str] = "update_limited"
    client_id: str | None = None
    task_id: str | None = None
    model_version: int | None = None
    action: str | None = None
    reason: str | None = None
    norm: float | None = None
    bound: float | None = None
    weight: float | None = None
    limited_weight: float | None = None
    cosine: float | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class SecureGroupLost(Event):
    """A secure group could not go on (``[coordinator.secure]``): ``phase`` is where it
    stopped (``advertise``, ``share``, ``masked``, ``unmask``), ``reason`` why, ``members``
    how many it had; the members' tasks stay open and they try again in later groups."""

    KIND: ClassVar[str] = "secure_group_lost"
    group: int | None = None
    phase: str | None = None
    reason: str | None = None
    members: int | None = None
    model_version: int | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class SecureAnswerLate(Event):
    """A member's unmask answer reached its secure group after the group had flushed (its
    sum was rebuilt from the others' shares): ``bytes_up`` it cost, which the member's
    ``update_accepted`` did not count (counted once per member)."""

    KIND: ClassVar[str] = "secure_answer_late"
    client_id: str | None = None
    task_id: str | None = None
    group: int | None = None
    bytes_up: int | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class ClientLeft(Event):
    """A client left, with the resilience counters it reported since its last commit."""

    KIND: ClassVar[str] = "client_left"
    client_id: str | None = None
    reason: str | None = None
    retries: int | None = None
    resumed_bytes: int | None = None
    offline_seconds: float | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class ClientExpired(Event):
    """A client silent for longer than ``limits.client_ttl_s`` was forgotten."""

    KIND: ClassVar[str] = "client_expired"
    client_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class ClientTimeout(Event):
    """A task stopped holding its place in the cohort (its client was too slow or silent).

    ``cause``: ``silent`` (no sign of life within the client's silence bound), ``deadline``
    (the round's deadline passed short of ``min_updates``), ``overdue`` (``max_task_s``) or
    ``gone`` (the client is no longer registered); absent in logs written before it.
    """

    KIND: ClassVar[str] = "client_timeout"
    client_id: str | None = None
    task_id: str | None = None
    model_version: int | None = None
    reason: str | None = None
    cause: str | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class RunFinished(Event):
    """The run ended; ``privacy``: the run's privacy record as it ended, for a run with one
    (it may be ahead of the last flush's)."""

    KIND: ClassVar[str] = "run_finished"
    reason: str | None = None
    model_version: int | None = None
    privacy: dict[str, Any] | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class CoordinatorRestored(Event):
    """What a coordinator restarted on its ``state_dir`` took back."""

    KIND: ClassVar[str] = "coordinator_restored"
    model_version: int | None = None
    clients: int | None = None
    tasks: int | None = None
    pending_updates: int | None = None
    settled_uploads: int | None = None
    unreported_flushes: int | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class ClientNetwork(Event):
    """A simulated client's link and what it went through (written at the end of a run)."""

    KIND: ClassVar[str] = "client_network"
    index: int | None = None
    profile: str | None = None
    speed: float | None = None
    tasks: int | None = None
    accepted: int | None = None
    refused: int | None = None
    failed: int | None = None
    retries: int | None = None
    network_seconds: float | None = None
    train_seconds: float | None = None
    link: Mapping[str, Any] | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class EvaluationIssued(Event):
    """A client was given an evaluation task on ``model_version``
    (``fedlink.coordinator.evaluations``)."""

    KIND: ClassVar[str] = "evaluation_issued"
    client_id: str | None = None
    task_id: str | None = None
    model_version: int | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class EvaluationReported(Event):
    """A client scored the global model of ``model_version`` on ``num_examples`` of its own
    examples (the weight ``fedlink.metrics.federated`` gives it): ``loss``, ``accuracy``
    (classification) and every score it reported in ``metrics``. One per evaluation task."""

    KIND: ClassVar[str] = "evaluation_reported"
    client_id: str | None = None
    task_id: str | None = None
    model_version: int | None = None
    num_examples: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    metrics: Mapping[str, float] | None = None


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class OtherEvent(Event):
    """An event of a kind this version does not know, read from a file (never written)."""

    OPEN: ClassVar[bool] = True
    name: str = ""

    @property
    def kind(self) -> str:
        """The kind as the file says."""
        return self.name

    def body(self) -> dict[str, Any]:
        """Every field of the event is an extra one."""
        return dict(self.extra)

    @classmethod
    def declared(cls) -> tuple[str, ...]:
        """No declared fields: ``name`` is the kind itself."""
        return ()


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class EvaluationDeclined(Event):
    """A client declined its evaluation task of ``model_version``: it could not score the
    model (no local example, or a score that is not a finite number; its own log says
    which). The task closed without a score."""

    KIND: ClassVar[str] = "evaluation_declined"
    client_id: str | None = None
    task_id: str | None = None
    model_version: int | None = None


EVENT_TYPES: Mapping[str, type[Event]] = {
    cls.KIND: cls for cls in (
        RunStarted, ClientJoined, TaskIssued, DownloadFinished, DownloadUsed, UpdateAccepted,
        UpdateRefused, Flush, FlushRefused, UpdateLimited, SecureGroupLost, SecureAnswerLate,
        ClientLeft,
        ClientExpired, ClientTimeout, RunFinished,
        CoordinatorRestored, ClientNetwork, EvaluationIssued, EvaluationReported,
        EvaluationDeclined)
}
"""Every event kind the framework writes, by name."""

E = TypeVar("E", bound=Event)


def check_fields(kind: str, fields: Mapping[str, Any]) -> type[Event]:
    """The type of ``kind``, once ``fields`` are valid for it.

    Raises ``ValueError`` naming an unknown kind, a reserved field, or a field the kind
    does not declare (open kinds accept such fields: they go into ``extra``).
    """
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r} (known: {', '.join(sorted(EVENT_TYPES))})")
    clash = RESERVED_FIELDS.intersection(fields)
    if clash:
        raise ValueError(f"reserved event field(s): {', '.join(sorted(clash))}")
    if not cls.OPEN:
        unknown = [k for k in fields if k not in _names(cls)]
        if unknown:
            raise ValueError(f"a {kind} event has no field(s) {', '.join(sorted(unknown))} "
                             f"(its fields: {', '.join(cls.declared())})")
    return cls


def make_event(kind: str, fields: Mapping[str, Any]) -> Event:
    """The typed event of ``kind`` with ``fields`` (the ``emit("kind", **fields)`` form),
    checked by :func:`check_fields`."""
    cls = check_fields(kind, fields)
    own = cls.declared()
    extra = {k: v for k, v in fields.items() if k not in own}
    return cls(**{k: v for k, v in fields.items() if k in own}, extra=extra)


def from_record(record: Mapping[str, Any]) -> Event:
    """The typed event of a JSON object read from an event log (lenient: an old run's
    unknown kind becomes :class:`OtherEvent`, an undeclared field goes into ``extra``)."""
    kind = str(record.get("kind"))
    cls = EVENT_TYPES.get(kind)
    own = _names(cls) if cls is not None else frozenset()
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in record.items():
        if key in own:
            fields[key] = value
        elif key not in RESERVED_FIELDS:
            extra[key] = value
    t, elapsed = float(record.get("t") or 0.0), float(record.get("elapsed") or 0.0)
    if cls is None:
        return OtherEvent(name=kind, extra=extra, t=t, elapsed=elapsed,
                          event_id=record.get("event_id"))
    return cls(**fields, extra=extra, t=t, elapsed=elapsed, event_id=record.get("event_id"))
