"""Coordinator configuration: the flush rule, the run, and the limits, as frozen dataclasses."""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedlink.aggregate import FLUSH_HOOKS, SERVER_OPTIMIZERS, STALENESS_WEIGHTS
from fedlink.config import from_table, require
from fedlink.errors import ConfigError


def _is_a(value: object, hint: Any) -> bool:
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint) or hint
    if origin in (int, float) and isinstance(value, bool):
        return False
    if origin is int:
        return isinstance(value, numbers.Integral)
    if origin is float:
        return isinstance(value, numbers.Real)
    return isinstance(value, origin)


def _check_types(config: object, section: str) -> None:
    """``ConfigError`` naming the field when a value has the wrong type (e.g. ``goal = "3"``)."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        hint = hints[f.name]
        options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        value = getattr(config, f.name)
        if not any(_is_a(value, option) for option in options):
            name = f"{section}.{f.name}" if section else f.name
            expected = " or ".join(getattr(o, "__name__", str(o)) for o in options)
            raise ConfigError(f"{name}: expected {expected.replace('NoneType', 'nothing')}, "
                              f"got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class FlushRule:
    """When the updates gathered so far become one step of the global model.

    A flush fires when ``goal`` updates are in, or when ``deadline_s`` seconds have passed since
    the current model version was published and at least ``min_updates`` are in. Tasks are
    issued for up to ``ceil(goal * over_selection)`` clients per version, so a few slow or dead
    clients do not hold a flush back. Updates more than ``max_staleness`` versions old are
    refused. Synchronous FedAvg is ``goal = cohort, max_staleness = 0`` (the default preset).
    ``deadline_s = 0`` (or ``None``) means no deadline: flush only at ``goal`` (FedBuff).
    If the deadline passes with fewer than ``min_updates`` in, the open tasks are released and
    their places offered to other clients; the deadline then starts again.
    """

    goal: int = 10
    min_updates: int = 1
    deadline_s: float | None = 60.0
    over_selection: float = 1.0
    max_staleness: int = 0

    def __post_init__(self) -> None:
        _check_types(self, "flush")
        require(self.goal >= 1, "flush.goal", f"must be >= 1, got {self.goal}")
        require(1 <= self.min_updates <= self.goal, "flush.min_updates",
                f"must be in [1, goal={self.goal}], got {self.min_updates}")
        require(self.deadline_s is None or self.deadline_s >= 0, "flush.deadline_s",
                f"must be > 0, or 0 for no deadline, got {self.deadline_s}")
        if self.deadline_s == 0:  # TOML has no null: 0 spells "no deadline"
            object.__setattr__(self, "deadline_s", None)
        require(self.over_selection >= 1.0, "flush.over_selection",
                f"must be >= 1.0, got {self.over_selection}")
        require(self.max_staleness >= 0, "flush.max_staleness",
                f"must be >= 0, got {self.max_staleness}")

    @property
    def cohort(self) -> int:
        """How many tasks may be open per model version."""
        return math.ceil(self.goal * self.over_selection)


@dataclass(frozen=True)
class TrainingConfig:
    """Local training every client is asked to do (served at ``Join``).

    ``trainer_options`` reach the client's trainer as strings; ``TorchTrainer`` reads
    ``prox_mu`` (FedProx's proximal coefficient).
    """

    local_steps: int = 0
    local_epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 0.05
    trainer_options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_types(self, "training")
        require(self.local_steps >= 0, "training.local_steps", "must be >= 0")
        require(self.local_steps > 0 or self.local_epochs >= 1, "training.local_epochs",
                "must be >= 1 when local_steps is 0")
        require(self.batch_size >= 1, "training.batch_size", "must be >= 1")
        require(self.learning_rate > 0, "training.learning_rate", "must be > 0")
        # Options travel as strings in the protocol; accept TOML numbers and booleans too.
        options = {str(k): str(v) for k, v in self.trainer_options.items()}
        object.__setattr__(self, "trainer_options", options)


@dataclass(frozen=True)
class LimitsConfig:
    """Size limits and timing knobs of the coordinator.

    ``liveness_timeout_s``: a client holding a task that the coordinator has not heard from
    (any call, heartbeats included) for this many seconds is presumed dead, and its task stops
    holding a place in the cohort (it may still deliver, like a task released at the
    deadline). ``None`` (the default) means ``3 x heartbeat_interval_s + long_poll_s``;
    ``0`` disables the check.

    ``delta_history``: how many recent model versions the coordinator keeps as raw vectors so
    that a client holding one of them downloads an exact ``xor-zlib`` delta instead of the
    whole model. Costs ``delta_history x model size`` of memory; ``0`` disables deltas.
    """

    chunk_bytes: int = 1 << 20
    max_chunk_bytes: int = 3 << 20
    max_update_bytes: int = 1 << 30
    heartbeat_interval_s: float = 5.0
    long_poll_s: float = 10.0
    retry_after_s: float = 1.0
    liveness_timeout_s: float | None = None
    delta_history: int = 4

    def __post_init__(self) -> None:
        _check_types(self, "limits")
        require(0 < self.chunk_bytes <= self.max_chunk_bytes, "limits.chunk_bytes",
                f"must be in (0, max_chunk_bytes={self.max_chunk_bytes}]")
        require(self.max_chunk_bytes < 4 << 20, "limits.max_chunk_bytes",
                "must stay under gRPC's 4 MiB message limit")
        require(self.max_update_bytes > 0, "limits.max_update_bytes", "must be > 0")
        require(self.heartbeat_interval_s > 0, "limits.heartbeat_interval_s", "must be > 0")
        require(self.long_poll_s >= 0, "limits.long_poll_s", "must be >= 0")
        require(self.retry_after_s > 0, "limits.retry_after_s", "must be > 0")
        require(self.liveness_timeout_s is None or self.liveness_timeout_s == 0
                or self.liveness_timeout_s > self.heartbeat_interval_s,
                "limits.liveness_timeout_s",
                f"must exceed heartbeat_interval_s={self.heartbeat_interval_s}, or be 0 to "
                f"disable the check, got {self.liveness_timeout_s}")
        require(self.delta_history >= 0, "limits.delta_history",
                f"must be >= 0, got {self.delta_history}")

    @property
    def liveness_timeout(self) -> float | None:
        """The effective liveness timeout in seconds, or ``None`` when the check is off."""
        if self.liveness_timeout_s is None:
            return 3 * self.heartbeat_interval_s + self.long_poll_s
        return self.liveness_timeout_s or None


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything a coordinator needs to run one federated training run.

    ``state_dir``: where the coordinator keeps what must survive a restart. Empty (the default)
    keeps everything in memory. With a folder, the bytes of every upload are spooled to
    ``<state_dir>/uploads/`` and fsynced before the coordinator reports them received, and a
    restarted coordinator reopens those spools, so ``UploadStatus`` still reports them. The
    rest of the state (client registry, remembered commit answers, the round in progress,
    model checkpoints) is still held in memory: making it durable is issue 8.

    ``hooks``: server-side stages around aggregation (``fedlink.aggregate.FlushHook``), one
    ``[[coordinator.hooks]]`` table each: ``name`` of a registered hook plus its options.
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
    join_token: str = ""
    seed: int = 0
    state_dir: str = ""
    hooks: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        _check_types(self, "")
        self._check_hooks()
        require(self.rounds >= 1, "rounds", f"must be >= 1, got {self.rounds}")
        require(bool(self.run_name), "run_name", "must not be empty")
        for name, registry, options in (
            ("server_optimizer", SERVER_OPTIMIZERS, self.server_optimizer_options),
            ("staleness_weight", STALENESS_WEIGHTS, self.staleness_weight_options),
        ):
            try:
                registry.create(getattr(self, name), **dict(options))
            except ConfigError as exc:
                raise ConfigError(f"{name}: {exc}") from exc

    def _check_hooks(self) -> None:
        """Each ``[[coordinator.hooks]]`` table names a registered flush hook that builds."""
        for index, table in enumerate(self.hooks):
            if not isinstance(table, Mapping) or "name" not in table:
                raise ConfigError(f"hooks[{index}]: must be a table with a 'name'")
            options = {k: v for k, v in table.items() if k != "name"}
            try:
                FLUSH_HOOKS.create(str(table["name"]), **options)
            except ConfigError as exc:
                raise ConfigError(f"hooks[{index}]: {exc}") from exc

    @classmethod
    def from_dict(cls, table: Mapping[str, Any]) -> CoordinatorConfig:
        """Build from a ``[coordinator]``-style table with ``flush``/``training``/``limits``."""
        nested = {"flush": FlushRule, "training": TrainingConfig, "limits": LimitsConfig}
        values = dict(table)
        for key, sub in nested.items():
            if key in values:
                values[key] = from_table(sub, values[key], f"coordinator.{key}")
        return from_table(cls, values, "coordinator")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for event logs and summaries)."""
        return dataclasses.asdict(self)
