"""Coordinator configuration: the flush rule, the run, and the limits, as frozen dataclasses."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# registers the differential-privacy flush hooks, and secure runs' distributed-DP hook
import fedlink.privacy.hooks
import fedlink.privacy.secure_ddp  # noqa: F401
from fedlink.aggregate import ACCUMULATORS, FLUSH_HOOKS, SERVER_OPTIMIZERS, STALENESS_WEIGHTS
from fedlink.aggregate.flushguard import RobustConfig
from fedlink.compress import broadcast_codec
from fedlink.config import changed_fields, check_fields, field_default, from_table, require
from fedlink.coordinator.operations import MetricsConfig, NetcheckConfig
from fedlink.errors import ConfigError
from fedlink.registry import Registry
from fedlink.wire.options import SERVER_STREAM_WINDOW_BYTES

if TYPE_CHECKING:
    from fedlink.secagg.base import SecAggConfig


@dataclass(frozen=True)
class FlushRule:
    """When the updates gathered so far become one step of the global model.

    A flush fires when ``goal`` updates are in, or when ``deadline_s`` seconds have passed since
    the current model version was published and at least ``min_updates`` are in. Updates more
    than ``max_staleness`` versions old are refused. ``deadline_s = 0`` (or ``None``) means no
    deadline: flush only at ``goal`` (a ``min_updates`` other than 1 or ``goal`` is then
    refused, as nothing would read it, but in a secure run, where it is each group's floor; a
    preset's is ``goal``). If the deadline passes with fewer than ``min_updates``
    in, the open tasks are released and their places offered to other clients; the deadline
    then starts again.

    How tasks are handed out, with ``cohort = ceil(goal * over_selection)``:

    - ``continuous = false`` (rounds): up to ``cohort`` tasks per model version, one per
      client per version; an accepted update keeps its place until the flush, so a few slow or
      dead clients do not hold a flush back but no more than ``cohort`` train each version.
    - ``continuous = true`` (FedBuff): at most ``cohort`` tasks in flight at any time, each on
      the latest model; a client that delivers gets its next task at once, whatever the
      version. The flush every ``goal`` updates is FedBuff's buffer of size K.

    ``sync``, ``elastic`` and ``async`` are presets of these fields (``FLUSH_PRESETS``,
    ``[coordinator.flush] preset = "elastic"``; fields set beside it override the preset).
    """

    goal: int = 10
    min_updates: int = 1
    deadline_s: float | None = 60.0
    over_selection: float = 1.0
    max_staleness: int = 0
    continuous: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "coordinator.flush")
        require(self.goal >= 1, "coordinator.flush.goal", f"must be >= 1, got {self.goal}")
        require(1 <= self.min_updates <= self.goal, "coordinator.flush.min_updates",
                f"must be in [1, goal={self.goal}], got {self.min_updates}")
        require(self.deadline_s is None or self.deadline_s >= 0, "coordinator.flush.deadline_s",
                f"must be > 0, or 0 for no deadline, got {self.deadline_s}")
        if self.deadline_s == 0:  # TOML has no null: 0 spells "no deadline"
            object.__setattr__(self, "deadline_s", None)
        require(self.over_selection >= 1.0, "coordinator.flush.over_selection",
                f"must be >= 1.0, got {self.over_selection}")
        require(self.max_staleness >= 0, "coordinator.flush.max_staleness",
                f"must be >= 0, got {self.max_staleness}")

    @property
    def cohort(self) -> int:
        """How many tasks may be open per model version (``continuous``: in flight at once)."""
        return math.ceil(self.goal * self.over_selection)

    def unfillable_by(self, clients: int, clients_key: str = "the clients") -> str | None:
        """Why ``clients`` clients can never flush a round under this rule (``None``: they
        can), with the way out (``clients_key``: the setting that counts them). In rounds each
        client trains once per version, so fewer clients than ``min_updates`` (or than
        ``goal``, without a deadline) wait for ever; a continuous rule asks a client again as
        soon as it delivers, so any number fills its buffer."""
        if self.continuous:
            return None
        once = f"but the run has {clients} clients, each training once per version"
        if clients < self.min_updates:
            return (f"min_updates = {self.min_updates} {once}: no round could ever flush. "
                    f"Lower min_updates, or raise {clients_key}")
        if self.deadline_s is None and clients < self.goal:
            return (f"goal = {self.goal} and no deadline, {once}: no round could ever flush. "
                    f"Lower goal, set a deadline_s, or raise {clients_key}")
        return None

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> FlushRule:
        """The preset ``name`` (``FLUSH_PRESETS``) with ``overrides`` applied."""
        return cls(**_preset_fields(name, overrides))

    @classmethod
    def from_table(cls, table: Mapping[str, Any], section: str = "coordinator.flush") -> FlushRule:
        """Build from a ``[coordinator.flush]`` table: an optional ``preset`` plus fields."""
        if not isinstance(table, Mapping) or "preset" not in table:
            return from_table(cls, table, section)
        values = dict(table)
        name = values.pop("preset")
        require(isinstance(name, str), f"{section}.preset", f"expected a name, got {name!r}")
        try:
            fields = _preset_fields(name, values)
        except ConfigError as exc:
            raise ConfigError(f"{section}.preset: {exc}") from exc
        return from_table(cls, fields, section)


@dataclass(frozen=True)
class FlushPreset:
    """A named starting point for ``FlushRule``; ``min_updates = ceil(min_fraction * goal)``.

    ``min_fraction`` rather than a count, so that a config that only changes ``goal`` keeps the
    preset's meaning (``sync`` waits for all ``goal``, ``elastic`` for half at the deadline).
    """

    goal: int
    min_fraction: float
    deadline_s: float
    over_selection: float
    max_staleness: int
    continuous: bool

    def fields(self, goal: int | None = None) -> dict[str, Any]:
        """``FlushRule`` field values, ``min_updates`` computed for ``goal`` (or the preset's)."""
        goal = self.goal if not isinstance(goal, int) or goal < 1 else goal
        return {"goal": goal, "min_updates": max(1, math.ceil(self.min_fraction * goal)),
                "deadline_s": self.deadline_s, "over_selection": self.over_selection,
                "max_staleness": self.max_staleness, "continuous": self.continuous}


FLUSH_PRESETS: Registry[FlushPreset] = Registry("flush preset")


def _preset_fields(name: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The preset ``name``'s ``FlushRule`` fields with ``overrides`` applied. Its
    ``min_updates`` is what its deadline flushes with: where ``overrides`` remove the deadline
    (``deadline_s = 0``) and set no ``min_updates``, a version flushes at ``goal`` alone and
    ``min_updates`` is ``goal``."""
    fields = {**FLUSH_PRESETS.create(name).fields(overrides.get("goal")), **overrides}
    if not fields["deadline_s"] and "min_updates" not in overrides:
        fields["min_updates"] = fields["goal"]
    return fields

FLUSH_PRESETS.register("sync")(lambda: FlushPreset(
    goal=10, min_fraction=1.0, deadline_s=0.0, over_selection=1.0, max_staleness=0,
    continuous=False))
"""Synchronous FedAvg: every version waits for ``goal`` updates from the clients it asked
(``min_updates = goal``, no deadline, no over-selection, ``max_staleness = 0``). What it
waits for, exactly: each of the ``goal`` places is held by a task that is making progress.
A task loses its place, which goes to the next client that asks, when its client is silent
for the liveness timeout, when it shows no progress (no bytes down or up, no commit) for
``limits.task_quiet_multiple`` times the run's typical training time
(``fedlink.coordinator.tasks.TaskPace``), or at the latest ``limits.max_task_s`` after it was
issued. A client that lost its place may still deliver for that version; its update counts
if it comes before the flush. So slow clients that are working are waited for, and ids that
take tasks and only heartbeat hold a round for a few training times, not half an hour; with
no other client to take the place, the round waits until one comes."""

FLUSH_PRESETS.register("elastic")(lambda: FlushPreset(
    goal=10, min_fraction=0.5, deadline_s=30.0, over_selection=1.3, max_staleness=2,
    continuous=False))
"""Elastic rounds: ask ``ceil(1.3 goal)`` clients per version, flush at ``goal`` updates or
after 30 s with at least half of ``goal``, and still count updates up to 2 versions late
(discounted by ``staleness_weight``)."""

FLUSH_PRESETS.register("async")(lambda: FlushPreset(
    goal=10, min_fraction=1.0, deadline_s=0.0, over_selection=3.0, max_staleness=10,
    continuous=True))
"""Buffered asynchronous aggregation (FedBuff, Nguyen et al. 2022): ``ceil(3 goal)`` clients
train at once, each on the latest model; every ``goal`` (K) updates make a flush; updates up
to 10 versions old count, discounted by ``staleness_weight`` (FedBuff uses ``polynomial``
with ``a = 0.5``) and scaled by the server optimizer's ``lr``."""


@dataclass(frozen=True)
class TrainingConfig:
    """Local training every client is asked to do (served at ``Join``).

    A task is ``local_steps`` SGD steps when that is above 0, else ``local_epochs`` passes over
    the client's data; ``local_epochs`` set beside ``local_steps > 0`` is refused (unread).

    ``trainer_options`` reach the client's trainer as strings; ``TorchTrainer`` reads
    ``prox_mu`` (FedProx's proximal coefficient), the DP-SGD trainer its ``dp_*`` options
    (``fedlink.privacy.dp_sgd``). A simulation refuses an option its ``[client] trainer``
    does not read (a registered trainer says which it reads,
    ``fedlink.experiment.trainers.reads_options``; a plugged trainer is not checked), and the
    DP-SGD trainer refuses a ``dp_*`` option it does not know: either would otherwise change
    nothing.

    The defaults (5 local epochs of batches of 10, FedAvg's ``E = 5, B = 10`` of McMahan et
    al., at learning rate 0.2) learn in the rounds a quick run asks for: the digits split
    among 50 clients (29 examples each) reach about 0.9 with an MLP in the default 10 rounds,
    where one epoch of batches of 32 (one step a round) stayed at chance.
    """

    local_steps: int = 0
    local_epochs: int = 5
    batch_size: int = 10
    learning_rate: float = 0.2
    trainer_options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self, "coordinator.training")
        require(self.local_steps >= 0, "coordinator.training.local_steps", "must be >= 0")
        require(self.local_steps > 0 or self.local_epochs >= 1, "coordinator.training.local_epochs",
                "must be >= 1 when local_steps is 0")
        require(self.local_steps == 0
                or self.local_epochs == field_default(TrainingConfig, "local_epochs"),
                "coordinator.training.local_epochs",
                f"is read only when local_steps is 0: a task of local_steps = "
                f"{self.local_steps} counts steps, not epochs; remove local_epochs, or set "
                f"local_steps = 0")
        require(self.batch_size >= 1, "coordinator.training.batch_size", "must be >= 1")
        require(self.learning_rate > 0, "coordinator.training.learning_rate", "must be > 0")
        # Options travel as strings in the protocol; accept TOML numbers and booleans too.
        options = {str(k): str(v) for k, v in self.trainer_options.items()}
        object.__setattr__(self, "trainer_options", options)


@dataclass(frozen=True)
class EvaluationConfig:
    """``[coordinator.evaluation]``: federated evaluation of the global model on clients' data.

    On versions that are multiples of ``every``, each joined client that advertised the
    ``evaluate`` capability is picked with probability ``fraction`` (a coin seeded by the
    run's ``seed``, the client's name and the version: the same run picks the same clients)
    and gets one evaluation task for that version at its next ``GetTask``, ahead of any
    training task (``fedlink.coordinator.evaluations``). ``fraction = 0`` (the default): off,
    and ``every`` other than 1 is then refused (no version would be evaluated).
    """

    fraction: float = 0.0
    every: int = 1
    holdout: float = 0.0
    """The share of each client's examples kept out of its training and scored by its
    evaluation tasks (seeded; ``fedlink.experiment.setup``). 0: clients score on their training
    data."""

    def __post_init__(self) -> None:
        check_fields(self, "coordinator.evaluation")
        require(isinstance(self.holdout, int | float) and 0.0 <= self.holdout < 1.0,
                "coordinator.evaluation.holdout",
                f"must be a number in [0, 1), got {self.holdout!r}")
        require(not self.holdout or self.fraction > 0, "coordinator.evaluation.holdout",
                "needs coordinator.evaluation.fraction > 0: without evaluation tasks nothing "
                "would score the held-out examples")
        require(isinstance(self.fraction, int | float) and 0.0 <= self.fraction <= 1.0,
                "coordinator.evaluation.fraction",
                f"must be a number in [0, 1], got {self.fraction!r}")
        require(isinstance(self.every, int) and self.every >= 1, "coordinator.evaluation.every",
                f"must be an integer >= 1, got {self.every!r}")
        require(self.fraction > 0 or self.every == 1, "coordinator.evaluation.every",
                "picks the versions that get evaluation tasks, and with "
                "coordinator.evaluation.fraction = 0 none do: set fraction > 0, or remove every")

    @property
    def enabled(self) -> bool:
        """Whether any client is ever asked to evaluate."""
        return self.fraction > 0


REDACTED = "<redacted>"
"""What ``CoordinatorConfig.to_dict`` writes in place of a secret."""

UPDATE_BYTES_MULTIPLE = 3
"""Default ``max_update_bytes``: three times the model's fp32 size (a dense fp32 update is
once; sparse codes with indices stay under twice), plus 64 KiB for small models."""
LIVENESS_MAX_MULTIPLE = 10
"""Default ``max_liveness_timeout_s``: this many times the liveness timeout."""
SPOOL_UPDATES = 256
"""Default ``max_spool_bytes``: room for this many largest-possible updates at once."""

MAX_WEIGHTS_CHECKED = 10_000
"""The start-up check of the staleness weights stops at this staleness (``max_staleness`` can
be any integer)."""

FEWEST_MEMBERS = 3
"""The smallest secure group that can go on: each member shares its secrets among at least
2 others (and a sum of 2 would tell each member the other's update)."""


@dataclass(frozen=True)
class LimitsConfig:
    """Size limits and timing knobs of the coordinator.

    ``liveness_timeout_s``: a client holding a task that the coordinator has not heard from
    (any call, heartbeats included) for this many seconds is presumed dead, and its task stops
    holding a place in the cohort (it may still deliver, like a task released at the
    deadline). ``None`` (the default) means ``3 x heartbeat_interval_s + long_poll_s``;
    ``0`` disables the check.
    That is the bound of a client on a clean link; one whose link has shown long gaps between
    its signs of life (calls, heartbeats, transfer chunks: TCP backing off under loss) gets
    ``liveness_gap_multiple`` times its p99 gap, at most ``max_liveness_timeout_s`` (``0``,
    the default: ten times the liveness timeout; see ``fedlink.coordinator.heartbeat``), so
    that a lossy client making progress is not timed out.

    ``inline_bytes``: a payload of at most this many bytes travels inside the message that
    announces it, saving a call and its round trip: the model (or delta) of a task inside
    ``Task``, an update inside ``CommitRequest``. Larger ones go by ``Download``/``Upload`` in
    resumable chunks; ``0`` inlines nothing. The limit in force (``inline_limit``) is at most
    ``chunk_bytes``: an inline payload is re-sent whole when its call is retried.

    ``delta_history``: how many recent model versions the coordinator keeps as raw vectors so
    that a client holding one of them downloads an exact ``xor-zlib`` delta instead of the
    whole model. Costs ``delta_history x model size`` of memory; ``0`` disables deltas.

    Overload limits (``fedlink.coordinator.limits``; 0 disables each): ``max_clients``
    registered at once (``Join`` beyond is refused), ``max_uploads_per_client`` concurrent
    ``Upload`` streams, and a per-client token bucket of ``requests_per_s`` refill and
    ``request_burst`` capacity. A refusal is ``RESOURCE_EXHAUSTED`` with a retry-after hint.
    Input limits: ``max_metadata_entries`` (join metadata and commit metrics entries) and
    ``max_string_bytes`` (any id, name, key or value in a request), ``max_metadata_bytes``
    (all keys and values of one such map together: what one ``Join`` makes the registry keep).

    ``checkins_per_s``: pace steering. A client told to wait comes back after
    ``retry_after_s``, or after ``registered clients / checkins_per_s`` when that is longer, so
    that idle clients check in at about this rate in all however large the population (a
    population of 10,000 polling every few seconds would be a load of its own). ``0`` (the
    default): the plain ``retry_after_s``. Long polls still hand a new version's tasks to the
    clients waiting in ``GetTask`` the moment it is published.

    ``finished_grace_s``: after the run ends, the coordinator keeps answering ``Finished`` until
    every client has left or been silent this long, so that a client in a blackout when the
    last flush happens still learns the run is over when it comes back (instead of finding the
    port closed). ``None`` (the default): twice the liveness timeout, at least one long poll
    plus a retry interval. ``stuck_after_s``: a round that has waited this long without a flush
    is logged as stuck, naming who it waits for (``0``: never).

    Limits against a hostile client (``docs/deployment.md``, "Threat model"; 0 disables each
    unless said otherwise):

    - ``max_examples_per_update``: the most examples one update may claim; the weight also
      never exceeds the size the client declared at ``Join`` when it declared one.
    - ``max_update_bytes``: the largest encoded update; 0 (default) means
      ``UPDATE_BYTES_MULTIPLE x`` the model's fp32 size plus 64 KiB (``update_bytes_for``).
    - ``upload_idle_s``: an upload not written to for this long is dropped (its bytes freed);
      uploads also go when their client leaves or expires. ``max_open_uploads_per_client``
      and ``max_upload_bytes_per_client`` (0: two full updates) bound what one client holds
      (beyond, its least recently written upload is dropped, never another client's);
      ``max_spool_bytes`` (0: ``SPOOL_UPDATES x`` the largest update) bounds all uploads.
    - ``join_global_per_s`` / ``join_global_burst``: a token bucket on new client ids, whoever
      asks (what survives rotated source addresses). ``join_per_peer_per_s`` /
      ``join_burst_per_peer``: the same per peer address, without per-client tokens;
      ``join_per_token_per_s`` / ``join_burst_per_token`` per client token name, and
      ``max_ids_per_token`` live ids per token name (per-client tokens). The request rate
      (``requests_per_s``) is a budget per identity, not per id: an id joined again under the
      same token (or, without tokens, the same address and name) inherits what was left.
    - ``client_ttl_s``: a client silent this long is forgotten (its task, cohort place and
      uploads freed); the SDK joins again if it comes back. ``max_task_s``: a task not
      delivered this long after it was issued stops holding a cohort place, heartbeats or not.
      ``task_quiet_multiple``: a task that shows no progress (no bytes of its model down, none
      of its update up, no commit) for this many times the median quiet stretch of the tasks
      this run saw delivered (its training), at least the liveness timeout (before any was
      delivered: this many liveness timeouts), stops holding its place the same way
      (``fedlink.coordinator.tasks.TaskPace``; 0: off). Heartbeats keep a client alive, not
      its place.
    - ``max_streams_per_connection``, ``connection_idle_s``, ``connection_age_s``: the gRPC
      server's caps on one HTTP/2 connection. gRPC core buffers at most
      ``stream_window_bytes`` (64 KiB by default) of each stream's message before it is read,
      so at most ``max_streams_per_connection`` x ``stream_window_bytes`` per connection.
    - ``max_connections``: HTTP/2 connections the server holds at once (0: no cap, the
      default). A connection over the cap is closed as soon as it is accepted, and its client
      retries. With the per-connection bound above, what gRPC core buffers for calls not yet
      read is at most ``max_connections`` x ``max_streams_per_connection`` x
      ``stream_window_bytes``; without it, the process's open-file limit is the only cap.
    - ``stream_window_bytes``: the coordinator's fixed HTTP/2 stream window. A message it
      reads opens its stream's window to the message's length, so each chunk of an upload
      costs about one round trip more than with a window grown by BDP probing (5-12% on a
      1 MB upload over a 4g profile; more on long fat links such as satellite). 0 turns BDP
      probing back on: uploads as fast as the link allows, but gRPC core may then buffer
      megabytes of every stream before the in-flight budget decides; only for trusted
      fleets on long links.
    - ``max_inflight_bytes`` and ``max_inflight_bytes_per_connection``: bytes of request
      messages being read at once, in all and per connection; a message's worst case (the
      largest chunk or probe accepted) is reserved before it is read, and a call that does not
      fit is refused ``RESOURCE_EXHAUSTED`` with a retry hint, unread
      (``fedlink.coordinator.inflight``). Each must hold one message of the largest kind.
    """

    chunk_bytes: int = 1 << 20
    max_chunk_bytes: int = 3 << 20
    max_update_bytes: int = 0
    heartbeat_interval_s: float = 5.0
    long_poll_s: float = 10.0
    retry_after_s: float = 1.0
    liveness_timeout_s: float | None = None
    liveness_gap_multiple: float = 3.0
    max_liveness_timeout_s: float = 0.0
    delta_history: int = 4
    inline_bytes: int = 64 << 10
    max_clients: int = 10_000
    max_uploads_per_client: int = 2
    requests_per_s: float = 50.0
    request_burst: int = 100
    max_metadata_entries: int = 64
    max_string_bytes: int = 1024
    finished_grace_s: float | None = None
    stuck_after_s: float = 60.0
    max_metadata_bytes: int = 4096
    max_examples_per_update: int = 100_000
    upload_idle_s: float = 600.0
    max_open_uploads_per_client: int = 4
    max_upload_bytes_per_client: int = 0
    max_spool_bytes: int = 0
    join_per_peer_per_s: float = 20.0
    join_burst_per_peer: int = 1000
    join_global_per_s: float = 20.0
    join_global_burst: int = 1000
    join_per_token_per_s: float = 1.0
    join_burst_per_token: int = 20
    max_ids_per_token: int = 8
    client_ttl_s: float = 600.0
    max_task_s: float = 1800.0
    task_quiet_multiple: float = 4.0
    max_inflight_bytes: int = 64 << 20
    max_inflight_bytes_per_connection: int = 16 << 20
    max_streams_per_connection: int = 100
    stream_window_bytes: int = SERVER_STREAM_WINDOW_BYTES
    connection_idle_s: float = 300.0
    connection_age_s: float = 3600.0
    max_connections: int = 0
    checkins_per_s: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self, "coordinator.limits")
        require(self.finished_grace_s is None or self.finished_grace_s >= 0,
                "coordinator.limits.finished_grace_s", f"must be >= 0, got {self.finished_grace_s}")
        require(self.stuck_after_s >= 0, "coordinator.limits.stuck_after_s",
                f"must be >= 0 (0: never), got {self.stuck_after_s}")
        require(0 < self.chunk_bytes <= self.max_chunk_bytes, "coordinator.limits.chunk_bytes",
                f"must be in (0, max_chunk_bytes={self.max_chunk_bytes}]")
        require(self.max_chunk_bytes < 4 << 20, "coordinator.limits.max_chunk_bytes",
                "must stay under gRPC's 4 MiB message limit")
        require(self.max_update_bytes >= 0, "coordinator.limits.max_update_bytes",
                "must be >= 0 (0: a multiple of the model's size)")
        require(self.heartbeat_interval_s > 0, "coordinator.limits.heartbeat_interval_s",
                "must be > 0")
        require(self.long_poll_s >= 0, "coordinator.limits.long_poll_s", "must be >= 0")
        require(self.retry_after_s > 0, "coordinator.limits.retry_after_s", "must be > 0")
        require(self.liveness_timeout_s is None or self.liveness_timeout_s == 0
                or self.liveness_timeout_s > self.heartbeat_interval_s,
                "coordinator.limits.liveness_timeout_s",
                f"must exceed heartbeat_interval_s={self.heartbeat_interval_s}, or be 0 to "
                f"disable the check, got {self.liveness_timeout_s}")
        require(math.isfinite(self.liveness_gap_multiple) and self.liveness_gap_multiple >= 1,
                "coordinator.limits.liveness_gap_multiple",
                f"must be >= 1, got {self.liveness_gap_multiple}")
        self._check_max_liveness()
        require(self.inline_bytes >= 0, "coordinator.limits.inline_bytes",
                f"must be >= 0 (0: nothing inline), got {self.inline_bytes}")
        require(self.delta_history >= 0, "coordinator.limits.delta_history",
                f"must be >= 0, got {self.delta_history}")
        for name in ("max_clients", "max_uploads_per_client", "requests_per_s"):
            require(getattr(self, name) >= 0, f"coordinator.limits.{name}",
                    f"must be >= 0 (0 = no limit), got {getattr(self, name)}")
        require(self.requests_per_s == 0 or self.request_burst >= 1,
                "coordinator.limits.request_burst",
                f"must be >= 1 when requests_per_s is set, got {self.request_burst}")
        require(self.max_metadata_entries >= 0, "coordinator.limits.max_metadata_entries",
                f"must be >= 0, got {self.max_metadata_entries}")
        require(self.max_string_bytes >= 64, "coordinator.limits.max_string_bytes",
                f"must be >= 64, got {self.max_string_bytes}")
        for name in ("max_metadata_bytes", "max_examples_per_update", "upload_idle_s",
                     "max_open_uploads_per_client", "max_upload_bytes_per_client",
                     "max_spool_bytes", "join_per_peer_per_s", "join_global_per_s",
                     "join_per_token_per_s", "max_ids_per_token", "client_ttl_s", "max_task_s",
                     "task_quiet_multiple", "max_inflight_bytes",
                     "max_inflight_bytes_per_connection",
                     "max_streams_per_connection", "connection_idle_s", "connection_age_s",
                     "max_connections", "checkins_per_s"):
            require(getattr(self, name) >= 0, f"coordinator.limits.{name}",
                    f"must be >= 0 (0 = no limit), got {getattr(self, name)}")
        for rate, burst in (("join_per_peer_per_s", "join_burst_per_peer"),
                            ("join_per_token_per_s", "join_burst_per_token"),
                            ("join_global_per_s", "join_global_burst")):
            require(getattr(self, rate) == 0 or getattr(self, burst) >= 1,
                    f"coordinator.limits.{burst}",
                    f"must be >= 1 when {rate} is set, got {getattr(self, burst)}")
        require(self.stream_window_bytes == 0 or self.stream_window_bytes >= 16 << 10,
                "coordinator.limits.stream_window_bytes",
                f"must be 0 (BDP probing) or >= 16384, got {self.stream_window_bytes}")
        require(self.client_ttl_s == 0 or self.client_ttl_s > self.heartbeat_interval_s,
                "coordinator.limits.client_ttl_s",
                f"must exceed heartbeat_interval_s={self.heartbeat_interval_s}, or be 0")

    def _check_max_liveness(self) -> None:
        """``max_liveness_timeout_s``: 0 (the default multiple), or at least the liveness
        timeout it caps (and refused when the liveness check it would cap is off)."""
        require(math.isfinite(self.max_liveness_timeout_s) and self.max_liveness_timeout_s >= 0,
                "coordinator.limits.max_liveness_timeout_s",
                f"must be >= 0 (0: {LIVENESS_MAX_MULTIPLE} x the liveness timeout), got "
                f"{self.max_liveness_timeout_s}")
        if not self.max_liveness_timeout_s:
            return
        base = self.liveness_timeout
        require(base is not None, "coordinator.limits.max_liveness_timeout_s",
                "cannot take effect: the liveness check is off "
                "(coordinator.limits.liveness_timeout_s = 0)")
        require(base is None or self.max_liveness_timeout_s >= base,
                "coordinator.limits.max_liveness_timeout_s",
                f"must be >= the liveness timeout ({base} s: "
                f"coordinator.limits.liveness_timeout_s), got {self.max_liveness_timeout_s}")

    def update_bytes_for(self, num_parameters: int) -> int:
        """``max_update_bytes`` in force for a model of ``num_parameters`` float32 values."""
        if self.max_update_bytes:
            return self.max_update_bytes
        return UPDATE_BYTES_MULTIPLE * 4 * num_parameters + (64 << 10)

    def spool_bytes_for(self, num_parameters: int) -> int:
        """``max_spool_bytes`` in force: all upload bytes held at once."""
        return self.max_spool_bytes or SPOOL_UPDATES * self.update_bytes_for(num_parameters)

    def client_upload_bytes_for(self, num_parameters: int) -> int:
        """``max_upload_bytes_per_client`` in force: upload bytes one client may hold."""
        return (self.max_upload_bytes_per_client
                or 2 * self.update_bytes_for(num_parameters))

    @property
    def inline_limit(self) -> int:
        """Largest payload sent inline: ``inline_bytes``, at most one chunk."""
        return min(self.inline_bytes, self.chunk_bytes)

    @property
    def finished_grace(self) -> float:
        """How long a finished coordinator keeps answering a silent client (seconds)."""
        if self.finished_grace_s is not None:
            return self.finished_grace_s
        window = self.long_poll_s + self.retry_after_s + 1.0
        return max(window, 2 * (self.liveness_timeout or 0.0))

    @property
    def max_liveness_timeout(self) -> float | None:
        """The longest silence bound of any client (seconds), ``None`` when the check is off."""
        base = self.liveness_timeout
        if base is None:
            return None
        return self.max_liveness_timeout_s or LIVENESS_MAX_MULTIPLE * base

    @property
    def liveness_timeout(self) -> float | None:
        """The effective liveness timeout in seconds, or ``None`` when the check is off."""
        if self.liveness_timeout_s is None:
            return 3 * self.heartbeat_interval_s + self.long_poll_s
        return self.liveness_timeout_s or None


@dataclass(frozen=True)
class TLSConfig:
    """TLS on the coordinator's port (``[coordinator.tls]``); all empty: plaintext.

    ``cert_file`` / ``key_file``: the server's PEM certificate chain and private key (both or
    neither). ``client_ca_file``: with it, mutual TLS: every client must present a certificate
    signed by this CA. Paths are relative to the working directory.
    """

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "coordinator.tls")
        require(bool(self.cert_file) == bool(self.key_file), "coordinator.tls.key_file",
                "cert_file and key_file go together: set both or neither")
        require(not self.client_ca_file or bool(self.cert_file), "coordinator.tls.client_ca_file",
                "mutual TLS needs the server's cert_file and key_file too")

    @property
    def enabled(self) -> bool:
        """Whether the coordinator serves TLS."""
        return bool(self.cert_file)


@dataclass(frozen=True)
class AuthConfig:
    """Per-client tokens (``[coordinator.auth]``, ``fedlink.coordinator.tokens``): JWTs.

    ``algorithm``: ``HS256`` (default) checks tokens with an HMAC secret read from
    ``secret_file`` or the environment variable named by ``secret_env``; ``ES256`` / ``RS256``
    check them with an identity provider's public key, ``public_key_file`` (PEM) or
    ``jwks_file`` (a JWKS document; the token's ``kid`` picks the key). The secret itself never
    sits in the config, so it never reaches the event log. ``fedlink simulate``, which holds the
    secret, issues each of its own clients a token.

    ``issuer`` / ``audience``: when set, a token's ``iss`` / ``aud`` must match. A token's
    ``run`` claim must name the coordinator's ``run_name``; ``require_run`` refuses tokens
    without one. ``legacy_tokens``: still accept the deprecated ``fl1`` tokens signed with the
    secret (with a deprecation warning); to be removed in the next release.
    """

    secret_file: str = ""
    secret_env: str = ""
    algorithm: str = "HS256"
    public_key_file: str = ""
    jwks_file: str = ""
    issuer: str = ""
    audience: str = ""
    require_run: bool = False
    legacy_tokens: bool = True

    def __post_init__(self) -> None:
        check_fields(self, "coordinator.auth")
        require(not (self.secret_file and self.secret_env), "coordinator.auth.secret_env",
                "set secret_file or secret_env, not both")
        require(self.algorithm in ("HS256", "ES256", "RS256"), "coordinator.auth.algorithm",
                f"must be HS256, ES256 or RS256, got {self.algorithm!r}")
        public = bool(self.public_key_file or self.jwks_file)
        require(not (self.public_key_file and self.jwks_file), "coordinator.auth.jwks_file",
                "set public_key_file or jwks_file, not both")
        if self.algorithm == "HS256":
            require(not public, "coordinator.auth.public_key_file",
                    "public_key_file / jwks_file verify ES256 or RS256 tokens: set "
                    "coordinator.auth.algorithm (HS256 takes secret_file or secret_env)")
            require(self.enabled or not self._verifying_keys_set, "coordinator.auth.secret_file",
                    "HS256 needs secret_file or secret_env")
        else:
            require(public, "coordinator.auth.public_key_file",
                    f"{self.algorithm} needs public_key_file or jwks_file")

    @property
    def _verifying_keys_set(self) -> bool:
        return any((self.issuer, self.audience, self.require_run, not self.legacy_tokens,
                    self.algorithm != "HS256"))

    @property
    def enabled(self) -> bool:
        """Whether every call must carry a valid per-client token."""
        return bool(self.secret_file or self.secret_env or self.public_key_file
                    or self.jwks_file)


MESSAGE_OVERHEAD_BYTES = 64 << 10
"""Room in a request message for its fields besides its payload (ids, headers, metadata)."""


@dataclass(frozen=True)
class SecureConfig:
    """``[coordinator.secure]``: secure aggregation (SecAgg / SecAgg+, docs/secure-aggregation.md).

    ``enabled``: the next ``flush.goal`` clients to start a training task form a secure group,
    exchanging keys while they train (stale
    members discounted by the staleness weight; the flush rule's ``max_staleness`` and
    ``min_updates`` bind a group as a flush); the coordinator learns only the group's sum.
    Every member weighs the same but for its staleness weight: the example count and the
    work a client reports are its record, not its weight (a weight the coordinator cannot
    check would decide the sum).
    Clients clip every coordinate of their update to ``[-clip, clip]`` (``clip`` at least 1:
    the update's weight, up to 1, travels as one more value) and send it as
    integers in Z_m, ``m = 2**modulus_bits``, ``quantization_bits`` per value (unset: the
    most the modulus allows for a group of ``flush.goal``). ``neighbours``: SecAgg+'s sparse
    graph (0: every other member). ``threshold``: the fraction of a client's neighbours whose
    shares rebuild its secrets, and the fraction of the group that must deliver a masked update
    for the sum to count. ``phase_s``: each phase's deadline (advertise keys, share keys,
    masked update, unmask), counted from the phase's opening (the masked phase's from its
    first update: its members may still be training); a client that misses it is out of the
    group. A roster too small to go on at its deadline (fewer than 3 members, or than
    ``flush.min_updates``) waits for more members instead, its deadline counted again from
    the next to join. A ``flush.deadline_s`` below ``4 x phase_s`` is refused: the phases run
    inside the round's deadline, two beside training and two after it. ``quorum``: the
    fraction of the group whose keys close the share phase, and of those that shared whose
    masked updates close the masked phase, without waiting for the deadline (1: every one of
    them; never fewer than the masked phase needs to go on). A member that answers after its
    phase closed is out, as one that missed the deadline (one whose keys came late tries the
    next group with fresh keys): on a fleet where a member in a blackout holds each phase up to
    ``phase_s``, a quorum below 1 trades a late member's work for the others' time. The two
    phases' quorums compound: a group of ``flush.goal`` 8 at quorum 0.75 may close its share
    phase at 6 members and its masked phase at 5 of those, so its version sums 5 to 8
    updates, where a plain flush sums ``goal``: with a quorum below 1, make the group a
    member larger than the plain flush's ``goal`` (a group of 9 at quorum 0.8 stops waiting
    once 8 shared and 7 of them delivered).
    ``density`` below 1: group random-k, the compression that survives masking. Every member
    of a group sends the same ``ceil(density * n - 1e-9)`` coordinates of its update (drawn
    from the run's ``seed`` and the group's number, public values) and keeps the rest as a residual
    that joins its next update (error feedback), so its masked update is about ``density``
    times as large.

    Distributed DP, ``noise_multiplier`` above 0 (``fedlink.privacy.secure_ddp``): each member
    clips its (staleness-weighted) update to L2 norm ``clip_norm``, counts it in units of
    ``clip_norm / 2**granularity_bits`` and adds its share of Skellam noise, so that a group of
    ``flush.goal`` carries noise of standard deviation ``noise_multiplier * clip_norm`` on its
    sum; no member sends, and the coordinator never sees, a less noisy value. Epsilon at
    ``delta`` is accounted for every sum the coordinator asks its members to unmask, with the
    noise it carries (durably, before any member answers); ``max_epsilon`` (0: no budget) is
    never exceeded: a sum that would is never asked for, and the run ends once the next
    would. ``clip`` and ``quantization_bits`` do not apply then (refused).
    """

    enabled: bool = False
    modulus_bits: int = 24
    quantization_bits: int | None = None
    clip: float = 1.0
    neighbours: int = 0
    threshold: float = 0.5
    phase_s: float = 10.0
    quorum: float = 1.0
    density: float = 1.0
    noise_multiplier: float = 0.0
    clip_norm: float = 1.0
    granularity_bits: int = 16
    delta: float = 1e-5
    max_epsilon: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self, "coordinator.secure")
        require(math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0,
                "coordinator.secure.noise_multiplier",
                f"must be >= 0 (0: no distributed DP), got {self.noise_multiplier}")
        if self.noise_multiplier == 0:
            self._refuse_unused_ddp()
            self._refuse_small_clip()
        require(math.isfinite(self.phase_s) and self.phase_s > 0, "coordinator.secure.phase_s",
                f"must be > 0 seconds, got {self.phase_s}")
        require(math.isfinite(self.quorum) and 0 < self.quorum <= 1,
                "coordinator.secure.quorum", f"must be in (0, 1] (1: every member), got "
                f"{self.quorum}")
        require(math.isfinite(self.density) and 0 < self.density <= 1,
                "coordinator.secure.density", f"must be in (0, 1], got {self.density}")

    def _refuse_small_clip(self) -> None:
        """A member's weight (up to 1) travels as the last value of its masked update, clipped
        like the others: below 1 it would be cut, and every flush scaled by ``1 / clip``."""
        require(math.isfinite(self.clip) and self.clip >= 1, "coordinator.secure.clip",
                f"must be at least 1, got {self.clip}: a member's weight (up to 1) travels as "
                f"the last value of its masked update, clipped like the others (for a finer "
                f"step, raise modulus_bits)")

    def _refuse_unused_ddp(self) -> None:
        """Distributed-DP settings without its noise would be recorded and never applied."""
        changed = changed_fields(self)
        for key in ("clip_norm", "granularity_bits", "delta", "max_epsilon"):
            require(key not in changed, f"coordinator.secure.{key}",
                    "applies to distributed DP only: set coordinator.secure.noise_multiplier "
                    "above 0, or remove it")

    @property
    def ddp(self) -> bool:
        """Whether the clients add distributed-DP noise."""
        return self.noise_multiplier > 0


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything a coordinator needs to run one federated training run.

    ``state_dir``: where the coordinator keeps what must survive a restart. Empty (the default)
    keeps everything in memory. With a folder, the coordinator is crash-safe: upload bytes are
    spooled to ``<state_dir>/uploads/`` and fsynced before they are reported received; clients,
    tasks, accepted-but-not-yet-flushed updates, remembered commit answers and events live in
    ``<state_dir>/state.sqlite`` (WAL, each call's changes committed before it answers); each
    model version is checkpointed atomically to ``<state_dir>/checkpoints/`` with the server
    optimizer's and hooks' state. A coordinator started on a folder that holds a run resumes it
    (see ``fedlink.coordinator.state``); the folder belongs to one run and one model size.

    ``tls`` (``TLSConfig``) and ``auth`` (``AuthConfig``): transport security and per-client
    tokens; ``join_token`` is the older shared secret checked at ``Join`` only (exclusive with
    ``auth``).

    ``hooks``: server-side stages around aggregation (``fedlink.aggregate.FlushHook``), one
    ``[[coordinator.hooks]]`` table each: ``name`` of a registered hook plus its options.

    ``aggregator`` (``fedlink.aggregate.ACCUMULATORS``) folds the accepted updates of a flush:
    ``"mean"`` (weighted mean, streaming), ``"fednova"`` (FedNova's step-normalised mean,
    streaming), ``"trimmed_mean"`` / ``"median"`` (robust, coordinate-wise; they buffer the
    updates of a flush). ``robust`` (``[coordinator.robust]``, on by default) is the flush
    guard (``fedlink.aggregate.flushguard``, docs/robust-aggregation.md): each update's weight
    capped at a small multiple of the flush's median claim, its norm clipped, updates opposed
    to the flush's coordinate-wise median dropped, a coordinate-wise trimmed mean for
    ``"mean"``, all computed over the flush's updates and folded in a canonical order, so a
    flush does not depend on the order its updates arrived in. ``norm_bound > 0`` clips every
    update to that L2 norm; with ``norm_bound = 0`` (the default) and ``norm_bound_adaptive``
    (on by default) every update is clipped to ``norm_bound_multiple`` times the lower-median
    norm of the flush's updates (of the recent ones too in a small flush; with the guard off,
    of the recent updates in arrival order: ``fedlink.aggregate.adaptive``); set without the
    adaptive bound (or with the guard on and a flush hook that needs the plain mean, which
    leaves it out), ``norm_bound_multiple`` is refused. Every new model
    version is checked finite first (``fedlink.aggregate.guard``).

    ``staleness_weight`` (``fedlink.aggregate.STALENESS_WEIGHTS``) and its options discount
    updates that are versions stale; with ``flush.max_staleness = 0`` every accepted update is
    fresh, so any weight but the default ``"constant"`` is refused. Likewise
    ``robust.warmup`` and ``robust.window`` are refused where ``norm_bound_multiple`` is, and
    ``robust.drop_min_updates`` where no update is dropped (``robust.drop_opposed = false``, or
    a flush hook that needs the plain mean).

    ``drop_partial``: refuse every update that reports less work than planned
    (``steps_completed < steps_planned``), with a reason, instead of weighting it by its work
    fraction: FedAvg's "drop the stragglers" (the FedProx paper's baseline). A dropped update
    still answers for its place (in rounds, when it is of the current version; in a
    continuous buffer, always): the version flushes once ``goal`` updates are in counting the
    dropped ones, from the accepted ones only; when every one was dropped the model is left
    unchanged (the version still advances, so new clients are asked, and the summary's
    ``warning`` counts such empty flushes). An update that did no work at all is refused
    (``no_work``) and answers for its place in the same way, with or without
    ``drop_partial``.

    ``downlink_codec``: how the model broadcast is encoded (``fedlink.compress``; a
    deterministic, unbiased codec: ``fp32``, ``fp16``, ``bf16`` or ``fp32-zlib``). Each
    version is encoded once; clients train from the decoded vector and send their update
    relative to it, so a lossy broadcast (``fp16``: half the bytes; values beyond +-65504
    saturate) perturbs where clients start, never how their updates are applied to the
    coordinator's exact float32 model. Delta downloads are exact between the served vectors.

    ``drain_s``: how long a stop (SIGTERM, SIGINT) may take. The run's summary and model are
    written first; then callers are told to come back (``UNAVAILABLE`` with a retry hint),
    calls already running get what is left of ``drain_s`` to finish, and the process exits
    (``fedlink.coordinator.stopping``). Keep the supervisor's stop timeout above it. Only
    ``fedlink serve`` stops so: ``fedlink simulate``, whose clients run in its process and stop
    with it, refuses it.

    ``metrics`` and ``netcheck``: the Prometheus endpoint and the ``Probe`` call that
    ``fedlink netcheck`` uses, both off by default (``fedlink.coordinator.operations``).
    ``evaluation``: federated evaluation tasks (``EvaluationConfig``), off by default.
    """

    run_name: str = "fedlink-run"
    rounds: int = 10
    flush: FlushRule = field(default_factory=FlushRule)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    server_optimizer: str = "fedavg"
    server_optimizer_options: Mapping[str, Any] = field(default_factory=dict)
    staleness_weight: str = "constant"
    staleness_weight_options: Mapping[str, Any] = field(default_factory=dict)
    aggregator: str = "mean"
    aggregator_options: Mapping[str, Any] = field(default_factory=dict)
    norm_bound: float = 0.0
    norm_bound_adaptive: bool = True
    norm_bound_multiple: float = 2.0
    robust: RobustConfig = field(default_factory=RobustConfig)
    drop_partial: bool = False
    join_token: str = ""
    tls: TLSConfig = field(default_factory=TLSConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    seed: int = 0
    state_dir: str = ""
    drain_s: float = 5.0
    hooks: tuple[Mapping[str, Any], ...] = ()
    downlink_codec: str = "fp32"
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    netcheck: NetcheckConfig = field(default_factory=NetcheckConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    secure: SecureConfig = field(default_factory=SecureConfig)

    def __post_init__(self) -> None:
        check_fields(self, "coordinator")
        self._check_hooks()
        require(self.rounds >= 1, "coordinator.rounds", f"must be >= 1, got {self.rounds}")
        require(math.isfinite(self.drain_s) and self.drain_s >= 0, "coordinator.drain_s",
                f"must be >= 0 seconds, got {self.drain_s}")
        self._check_inflight()
        require(bool(self.run_name), "coordinator.run_name", "must not be empty")
        require(not (self.join_token and self.auth.enabled), "coordinator.join_token",
                "per-client tokens ([coordinator.auth]) replace the shared join_token: "
                "set one or the other")
        built: dict[str, Any] = {}
        for name, registry, options in (
            ("server_optimizer", SERVER_OPTIMIZERS, self.server_optimizer_options),
            ("staleness_weight", STALENESS_WEIGHTS, self.staleness_weight_options),
            ("aggregator", ACCUMULATORS, self.aggregator_options),
        ):
            try:
                built[name] = registry.create(getattr(self, name), **dict(options))
            except ConfigError as exc:
                raise ConfigError(f"coordinator.{name}: {exc}") from exc
        self._check_staleness_weights(built["staleness_weight"])
        self._refuse_unread_staleness_weight()
        self._refuse_unread_min_updates()
        require(math.isfinite(self.norm_bound) and self.norm_bound >= 0, "coordinator.norm_bound",
                f"must be >= 0 (0: no bound), got {self.norm_bound}")
        require(math.isfinite(self.norm_bound_multiple) and self.norm_bound_multiple >= 1,
                "coordinator.norm_bound_multiple", f"must be >= 1, got {self.norm_bound_multiple}")
        self._check_robust()
        self._check_secure()
        try:
            broadcast_codec(self.downlink_codec)
        except ConfigError as exc:
            raise ConfigError(f"coordinator.downlink_codec: {exc}") from exc

    @property
    def message_cap(self) -> int:
        """The largest request message the coordinator reads: the largest upload chunk,
        inline payload or netcheck probe it accepts, plus ``MESSAGE_OVERHEAD_BYTES`` for the
        message's other fields (``fedlink.coordinator.inflight``)."""
        limits = self.limits
        payload = max(limits.max_chunk_bytes, limits.inline_limit, self.netcheck.max_bytes)
        return payload + MESSAGE_OVERHEAD_BYTES

    def _check_inflight(self) -> None:
        """Each bytes-in-flight budget holds at least one message of the largest kind."""
        cap = self.message_cap
        for name in ("max_inflight_bytes", "max_inflight_bytes_per_connection"):
            value = getattr(self.limits, name)
            require(value == 0 or value >= cap, f"coordinator.limits.{name}",
                    f"must hold one message of the largest kind ({cap} bytes: max_chunk_bytes, "
                    f"inline_bytes or netcheck.max_bytes, plus {MESSAGE_OVERHEAD_BYTES}), or be "
                    f"0 (no limit); got {value}")

    def _check_hooks(self) -> None:
        """Each ``[[coordinator.hooks]]`` table names a registered flush hook that builds."""
        for index, table in enumerate(self.hooks):
            if not isinstance(table, Mapping) or "name" not in table:
                raise ConfigError(f"coordinator.hooks[{index}]: must be a table with a 'name'")
            options = {k: v for k, v in table.items() if k != "name"}
            try:
                FLUSH_HOOKS.create(str(table["name"]), **options)
            except ConfigError as exc:
                raise ConfigError(f"coordinator.hooks[{index}]: {exc}") from exc

    @property
    def plain_mean(self) -> bool:
        """Whether a flush hook needs the plain weighted mean of every update (DP-FedAvg)."""
        return any(FLUSH_HOOKS.create(str(t["name"]), **{k: v for k, v in t.items()
                                                           if k != "name"}).plain_mean
                   for t in self.hooks)

    def _check_robust(self) -> None:
        """Robust settings that cannot take effect with the aggregator, the norm bound or the
        hooks are refused (with the guard off ``RobustConfig`` refuses its own keys)."""
        plain = self.plain_mean
        robust = self.robust
        robust.resolved_trim(self.aggregator, plain, sparse_uplink=False)
        drop = robust.resolved_drop(plain)
        # the guard leaves the adaptive bound out under a hook that needs the plain mean
        # (fedlink.coordinator.engine.build_guard); the guard-off chain keeps it
        adaptive = self.norm_bound_adaptive and self.norm_bound == 0 and not (
            robust.enabled and plain)
        needs = ("norm_bound_adaptive = true and norm_bound = 0 (a fixed bound replaces it)"
                 + (", and no flush hook that needs the plain mean (the guard then clips "
                    "nothing adaptively)" if robust.enabled and plain else ""))
        require(adaptive or "norm_bound_multiple" not in changed_fields(self),
                "coordinator.norm_bound_multiple",
                f"scales the adaptive norm bound: it needs {needs}, or remove it")
        if not robust.enabled:
            return
        changed = changed_fields(robust)
        for key in ("warmup", "window"):
            require(adaptive or key not in changed, f"coordinator.robust.{key}",
                    f"sizes the adaptive norm bound's statistic: it needs {needs}, or remove it")
        why = ("a flush hook in coordinator.hooks (differential privacy) keeps every update; "
               "remove drop_min_updates" if plain else "coordinator.robust.drop_opposed = "
               "false; set drop_opposed = true, or remove drop_min_updates")
        require(drop or "drop_min_updates" not in changed,
                "coordinator.robust.drop_min_updates",
                f"is the smallest flush that opposed updates are dropped from, and none is "
                f"dropped here: {why}")

    def _check_staleness_weights(self, weigh: Callable[[int], float]) -> None:
        """The staleness weight of every staleness a flush accepts (0 to ``max_staleness``):
        positive and finite, as the mean divides by their sum, and at most 1 in a secure run,
        whose masked updates carry the weight in ``[0, 1]`` (else every group would be lost
        when it formed, for as long as the run lasts)."""
        most = 1.0 if self.secure.enabled else math.inf
        for staleness in range(min(self.flush.max_staleness, MAX_WEIGHTS_CHECKED) + 1):
            weight = float(weigh(staleness))
            require(math.isfinite(weight) and 0 < weight <= most, "coordinator.staleness_weight",
                    f"{self.staleness_weight!r} weighs an update {staleness} versions stale "
                    f"{weight:g}; it must be > 0" + (" and <= 1 in a secure run (the weight "
                    "rides in the masked update)" if self.secure.enabled else ""))

    def _refuse_unread_staleness_weight(self) -> None:
        """With ``max_staleness = 0`` only fresh updates are accepted: a staleness weight
        would only ever weigh staleness 0, which is no discount at all."""
        # (the default "constant" takes no options: staleness_weight_options alone fails to build)
        require(self.flush.max_staleness > 0 or "staleness_weight" not in changed_fields(self),
                "coordinator.staleness_weight",
                f"{self.staleness_weight!r} discounts updates by how many versions stale they "
                f"are, and with coordinator.flush.max_staleness = 0 every accepted update is "
                f"fresh: set max_staleness >= 1, or remove staleness_weight and "
                f"staleness_weight_options")

    def _refuse_unread_min_updates(self) -> None:
        """Without a deadline a version flushes at ``goal`` updates and nothing else:
        ``min_updates``, what the deadline flushes with, is never read there, but in a secure
        run, where it is each group's floor."""
        flush = self.flush
        require(flush.deadline_s is not None or self.secure.enabled
                or flush.min_updates in (1, flush.goal), "coordinator.flush.min_updates",
                f"{flush.min_updates} is how many updates the deadline flushes with, and there "
                f"is no deadline (deadline_s = 0): every version waits for goal = {flush.goal} "
                f"updates. Set deadline_s, or remove min_updates")

    def _check_secure(self) -> None:
        """Settings that need each individual update cannot work with secure aggregation:
        refused with the keys to change, never ignored."""
        if not self.secure.enabled:
            require(self.secure.density == 1, "coordinator.secure.density",
                    "group random-k compresses secure groups' masked updates only: set "
                    "coordinator.secure.enabled = true, or remove density")
            require(self.secure.quorum == 1, "coordinator.secure.quorum",
                    "a quorum closes secure groups' phases only: set "
                    "coordinator.secure.enabled = true, or remove quorum")
            require(not self.secure.ddp, "coordinator.secure.noise_multiplier",
                    "distributed DP is added inside secure groups: set "
                    "coordinator.secure.enabled = true, or use the dp_fedavg hook")
            changed = changed_fields(self.secure)
            for key in ("modulus_bits", "quantization_bits", "clip", "neighbours", "threshold",
                        "phase_s"):  # recorded, and applied to nothing
                require(key not in changed,
                        f"coordinator.secure.{key}", "applies to secure groups only: set "
                        "coordinator.secure.enabled = true, or remove it")
            return
        if self.secure.ddp:
            require(self.secure.quantization_bits is None and self.secure.clip == 1.0,
                    "coordinator.secure.noise_multiplier",
                    "with distributed DP updates are clipped to clip_norm (L2) and counted in "
                    "units of clip_norm / 2**granularity_bits: remove clip and "
                    "quantization_bits")
        why = "a secure coordinator sees only the group's sum, never an individual update"
        require(not self.flush.continuous, "coordinator.secure.enabled",
                "asynchronous buffers (flush.continuous) are not supported with secure groups")
        require(not self.robust.enabled, "coordinator.secure.enabled",
                f"set coordinator.robust.enabled = false: the flush guard caps, clips, drops and "
                f"trims individual updates, and {why}")
        require(self.aggregator == "mean", "coordinator.secure.enabled",
                f"aggregator {self.aggregator!r} needs individual updates ({why}): use 'mean'")
        require(self.norm_bound == 0 and not self.norm_bound_adaptive,
                "coordinator.secure.enabled",
                f"set coordinator.norm_bound = 0 and norm_bound_adaptive = false: {why} (clients "
                f"clip every value to secure.clip)")
        require(not self.hooks, "coordinator.secure.enabled",
                f"flush hooks (coordinator.hooks) act on individual updates ({why})")
        require(not self.drop_partial, "coordinator.secure.enabled",
                f"drop_partial judges individual updates ({why})")
        require(self.flush.goal >= FEWEST_MEMBERS, "coordinator.flush.goal",
                f"a secure group needs at least {FEWEST_MEMBERS} members (each shares its "
                f"secrets among at least 2 others), got goal = {self.flush.goal}")
        require(self.flush.over_selection <= 1 or self.flush.max_staleness >= 1,
                "coordinator.flush.over_selection",
                f"over_selection = {self.flush.over_selection:g} with max_staleness = 0: a "
                f"secure group is the first flush.goal clients to start, not to finish, so "
                f"the over-selected tasks form later groups, each a version stale when it "
                f"flushes, and max_staleness = 0 refuses every one of them; set "
                f"max_staleness >= 1 to sum them (discounted by staleness_weight), or "
                f"over_selection = 1")
        require(self.secure.neighbours < self.flush.goal, "coordinator.secure.neighbours",
                f"{self.secure.neighbours} neighbours in a group of at most flush.goal = "
                f"{self.flush.goal} members: at most goal - 1 (0: every other member)")
        deadline = self.flush.deadline_s
        require(deadline is None or deadline >= 4 * self.secure.phase_s,
                "coordinator.flush.deadline_s",
                f"{deadline} s leaves no room for the four secure phases (two beside training, "
                f"two after it): at least 4 x coordinator.secure.phase_s "
                f"({4 * self.secure.phase_s} s), or lower phase_s")
        require(bool(deadline or self.limits.max_task_s), "coordinator.flush.deadline_s",
                "a secure group's masked phase waits for its first update at most "
                "flush.deadline_s (else limits.max_task_s): with both off, a group whose "
                "members all died after sharing would never end, and every later group would "
                "count it as ahead of it; set either")
        try:
            self.secagg()
        except ConfigError as exc:
            raise ConfigError(f"coordinator.secure: {exc}") from exc

    def secagg(self) -> SecAggConfig:
        """The ``fedlink.secagg.SecAggConfig`` of a group of ``flush.goal`` clients."""
        from fedlink.secagg.base import SecAggConfig  # deferred: cryptography is an extra

        return SecAggConfig(modulus_bits=self.secure.modulus_bits,
                            quantization_bits=self.secure.quantization_bits,
                            clip=self.secure.clip, max_clients=max(2, self.flush.goal),
                            neighbours=self.secure.neighbours or None,
                            threshold=self.secure.threshold)

    def implied_hooks(self, num_parameters: int) -> tuple[dict[str, Any], ...]:
        """Flush hooks the settings imply (not listed in ``hooks``): ``secure_ddp`` for a
        secure run with distributed DP, sized for a model of ``num_parameters`` values."""
        if not (self.secure.enabled and self.secure.ddp):
            return ()
        from fedlink.secagg.sparse import kept_size  # deferred: cryptography is an extra

        secure = self.secure
        return ({"name": "secure_ddp", "noise_multiplier": secure.noise_multiplier,
                 "clip_norm": secure.clip_norm, "noise_shares": self.flush.goal,
                 "size": kept_size(secure.density, num_parameters),
                 "granularity_bits": secure.granularity_bits,
                 "modulus_bits": secure.modulus_bits, "max_clients": max(2, self.flush.goal),
                 "delta": secure.delta, "max_epsilon": secure.max_epsilon,
                 "closing_shares": self._closing_shares()},)

    def _closing_shares(self) -> int:
        """The masked updates a full secure group closes its masked phase with: ``quorum`` of
        ``flush.goal``, never fewer than the phase needs (``min_updates``, 2), nor more than
        the group."""
        quorum = math.ceil(self.secure.quorum * self.flush.goal - 1e-9)
        return min(self.flush.goal, max(2, self.flush.min_updates, quorum))

    @classmethod
    def from_dict(cls, table: Mapping[str, Any]) -> CoordinatorConfig:
        """Build from a ``[coordinator]``-style table with ``flush``/``training``/``limits``."""
        nested = {"training": TrainingConfig, "limits": LimitsConfig, "tls": TLSConfig,
                  "auth": AuthConfig, "metrics": MetricsConfig, "netcheck": NetcheckConfig,
                  "evaluation": EvaluationConfig, "robust": RobustConfig,
                  "secure": SecureConfig}
        values = dict(table)
        for key, sub in nested.items():
            if key in values:
                values[key] = from_table(sub, values[key], f"coordinator.{key}")
        if "flush" in values:
            values["flush"] = FlushRule.from_table(values["flush"])
        return from_table(cls, values, "coordinator")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for event logs and summaries), secrets left out.

        A set ``join_token`` reads ``REDACTED``: the event log and summary are shared with
        people who must not be able to join (the auth secret and TLS keys are never in the
        config at all, only the paths to them).
        """
        plain = dataclasses.asdict(self)
        if plain["join_token"]:
            plain["join_token"] = REDACTED
        return plain
