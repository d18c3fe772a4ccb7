"""Experiment configuration: one TOML file drives ``fedlink simulate``, ``serve`` and ``client``.

Sections (every key optional unless noted; unknown keys are an error)::

    [run]          name, seed, output_dir, train_workers, torch_threads, evaluate_train,
                   target_accuracy, tensorboard, mode, backend
    [data]         dataset, clients, partition, options = { alpha = 0.5, ... },
                   loader ("package.module:attr", your own data); options are checked
                   against the dataset's and partitioner's keyword parameters at parse time
    [model]        name, options = { hidden = [64, 64] }, factory ("package.module:attr"),
                   init (a saved model.pt or model.npy to start from)
    [client]       compression, compression_options = { density = 0.01 }, error_feedback,
                   density_bounds = [min, max], density_safety, privacy,
                   privacy_options = { ... }, trainer ("torch" | "dp_sgd" | import string),
                   loss, optimizer, optimizer_options, keep_local, device, dp_fix_model
    [coordinator]  rounds, server_optimizer, evaluator, ... with sub-tables
    [coordinator.flush]     preset, goal, min_updates, deadline_s, over_selection,
                            max_staleness, continuous
    [coordinator.training]  local_steps, local_epochs, batch_size, learning_rate
    [coordinator.limits]    chunk_bytes, long_poll_s, ...
    [coordinator.evaluation] fraction, every: federated evaluation tasks
                   (fedlink.coordinator.evaluations)
    [network]      preset | profile | fleet, speed, profiles (see fedlink.netem.fleet)
    [partial_work] fraction, seed: stragglers doing part of each task
                   (fedlink.experiment.partial_work)
    [virtual]      virtual-clock mode (fedlink.experiment.virtual)
    [ray]          address: the Ray cluster of [run] backend = "ray" ("": a local one)

``[coordinator] run_name`` defaults to ``[run] name``. Every ``"package.module:attr"`` is user
code (``fedlink.plug``): see ``fedlink.experiment.setup`` for what each plug point is called with.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlink.client import RetryPolicy, UpdatePipeline
from fedlink.client.density import DensityPolicy
from fedlink.client.device import DEFAULT_DEVICE, check_device
from fedlink.client.liveness import LivenessConfig
from fedlink.compress import Sparsifier
from fedlink.config import (
    changed_fields,
    check_fields,
    field_default,
    from_table,
    load_toml,
    require,
)
from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.data.federated import check_options, check_partition_options
from fedlink.errors import ConfigError
from fedlink.experiment.partial_work import PartialWorkSection
from fedlink.experiment.trainers import TRAINERS, options_read
from fedlink.experiment.virtual import RaySection, VirtualSection
from fedlink.netem import Fleet, parse_network
from fedlink.plug import is_import_string
from fedlink.privacy import setup as privacy_setup

RUN_MODES = ("grpc", "virtual")

VIRTUAL_LIMITS = frozenset({
    "inline_bytes", "chunk_bytes", "max_chunk_bytes", "max_examples_per_update",
    "delta_history", "retry_after_s", "heartbeat_interval_s", "long_poll_s",
    "liveness_timeout_s", "max_task_s", "task_quiet_multiple"})
"""The ``[coordinator.limits]`` a virtual run reads: what travels inline (``inline_bytes``, at
most one ``chunk_bytes``, itself at most ``max_chunk_bytes``), the examples an update may
claim, the delta history, the wait before asking again, the liveness timeout (by default
from the heartbeat interval and long poll) and the task-pace keys. The others bound a gRPC
server and its sessions."""

POPULATION_UNREAD_CLIENT = frozenset({
    "trainer", "loss", "optimizer", "optimizer_options", "keep_local", "device",
    "dp_fix_model"})
"""``[client]`` keys a synthetic population (``[virtual] population > 0``) never reads."""

POPULATION_UNREAD_RUN = frozenset({"evaluate_train", "torch_threads"})
"""``[run]`` keys a synthetic population never reads (no torch, no pooled training data)."""


@dataclass(frozen=True)
class RunSection:
    """Name, seed and where results go; how simulated clients train.

    ``train_workers = 0`` trains each simulated client on the event loop's thread (fastest for
    small models; no heartbeats while training); ``n >= 1`` uses a pool of ``n`` threads
    (gRPC mode only: virtual mode refuses it, see ``[virtual] workers``).

    ``evaluate_train = true`` also scores every new global model on the pooled training data
    of all clients (``train_loss`` and ``train_accuracy`` in each ``flush`` event, the
    training-loss curve of the FedProx paper); it costs one more pass over that data per flush.
    It is the built-in evaluator's: refused with ``[coordinator] evaluator`` (yours replaces
    it) and with ``[virtual] population > 0``.

    ``target_accuracy > 0`` ends a run (``simulate`` in either mode, and ``serve``) on the
    first flush whose central test accuracy reaches it; 0 (the default) runs all
    ``[coordinator] rounds``. For time-to-accuracy measurements. The evaluator must score an
    ``accuracy`` (the built-in one does for class labels; a target beside one that does not
    is refused).

    ``device_step_s > 0`` (gRPC mode) makes each simulated client train at a device's pace
    instead of this machine's: each local step takes ``device_step_s`` times the client's
    ``[network]`` speed in seconds, and a client stops at its task's deadline with the steps
    that fit (``fedlink.sim.stragglers.PacedTrainer``), as virtual mode's clients do with
    ``[virtual] step_cost_s``. On a fast machine clients train in milliseconds, so a
    simulation's time is almost all network; a device's pace (0.05 s per step is virtual
    mode's default) charges training what it costs on the fleet being simulated. 0 (the
    default): this machine's pace, stragglers slowed relative to the fastest client. Virtual
    mode refuses it (its steps take ``[virtual] step_cost_s``), and a ``train_workers`` pool
    smaller than the fleet is refused beside it (each client waits out its device time on a
    training thread of its own); ``fedlink serve`` and ``fedlink client`` say they do not
    apply it.

    ``tensorboard = true`` also writes TensorBoard scalars into ``<run folder>/tensorboard``
    (``fedlink.observe.tensorboard``; needs the ``tensorboard`` extra), for ``simulate`` and
    ``serve``; ``events.jsonl`` stays the source of truth.
    """

    name: str = "fedlink-run"
    seed: int = 0
    output_dir: str = "runs"
    train_workers: int = 0
    torch_threads: int = 1
    evaluate_train: bool = False
    target_accuracy: float = 0.0
    tensorboard: bool = False
    device_step_s: float = 0.0
    mode: str = "grpc"
    """``"grpc"``: real sessions over loopback; ``"virtual"``: the discrete-event loop of
    ``fedlink.sim.virtual`` (``[virtual]`` section), for populations up to 10^6. A gRPC run
    refuses keys set in ``[virtual]`` and ``[ray]``, and ``backend``; a virtual run refuses
    what it does not
    model: ``[coordinator.tls]``, ``[coordinator.auth]``, ``join_token``, ``state_dir``,
    ``drain_s``, ``[coordinator.metrics]``, ``[coordinator.netcheck]``, ``[coordinator.limits]``
    beyond the inline, liveness, task-pace and examples limits, ``train_workers``,
    ``[client.retry]``, ``[client.liveness]``, ``[client] density_safety`` (its clients
    measure no goodput: ``density_bounds`` only clamp the codec's density there)."""
    backend: str = "processes"
    """Where virtual mode trains with ``[virtual] workers > 0``: ``"processes"`` (spawned
    worker processes), ``"ray"`` (Ray actors; the ``ray`` extra, ``[ray]`` section),
    ``"inline"``, or an import string (``fedlink.sim.virtual.backends``). With ``workers = 0``
    every run trains inline: another backend is refused there."""

    def __post_init__(self) -> None:
        check_fields(self, "run")
        require(self.mode in RUN_MODES, "run.mode", f"must be one of {RUN_MODES}, "
                f"got {self.mode!r}")
        # the name is checked against the simulator's registry where a virtual run starts
        # (fedlink.sim.virtual.runner.check_backend): this module does not import fedlink.sim
        require(isinstance(self.backend, str) and bool(self.backend), "run.backend",
                f"must be a backend name or 'package.module:attr', got {self.backend!r}")
        require(bool(self.name) and "/" not in self.name, "run.name",
                "must be a non-empty name without '/'")
        require(self.seed >= 0, "run.seed", f"must be >= 0, got {self.seed}")
        require(self.train_workers >= 0, "run.train_workers", "must be >= 0")
        require(self.torch_threads >= 1, "run.torch_threads", "must be >= 1")
        require(math.isfinite(self.device_step_s) and self.device_step_s >= 0,
                "run.device_step_s", f"must be >= 0 (0: this machine's pace), got "
                f"{self.device_step_s!r}")
        require(0.0 <= self.target_accuracy <= 1.0, "run.target_accuracy",
                f"must be a number in [0, 1] (0: off), got {self.target_accuracy!r}")


@dataclass(frozen=True)
class DataSection:
    """Which dataset, split among how many clients, by which partitioner.

    ``loader = "package.module:attr"`` replaces ``dataset`` with your own function, called as
    ``loader(num_clients=..., seed=..., **options)`` (options a partitioner declares go to the
    partitioner instead); see ``fedlink.data.loading`` for what it may return.
    """

    dataset: str = "digits"
    clients: int = 10
    partition: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    loader: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "data")
        require(self.clients >= 1, "data.clients", f"must be >= 1, got {self.clients}")
        require(not self.loader or is_import_string(self.loader), "data.loader",
                f"must be 'package.module:attr', got {self.loader!r}")
        if self.loader:
            check_partition_options(self.partition, self.options)
        else:  # a typo in [data] options fails here, not when the data is loaded
            check_options(self.dataset, self.partition, self.options)


@dataclass(frozen=True)
class ModelSection:
    """Which registered model, with which options.

    ``factory = "package.module:attr"`` replaces ``name`` with your own model: the factory is
    called as ``factory(**options)`` (seeded with ``[run] seed``) and must return an
    ``nn.Module``. ``init`` is a saved model (``model.pt``, a state_dict, or ``model.npy``, the
    flat vector; both are written by every run) to start from instead of fresh weights.
    With ``[virtual] population > 0`` the whole table is refused: synthetic clients train a
    softmax regression of ``[virtual] features`` and ``classes``.
    """

    name: str = "mlp"
    options: Mapping[str, Any] = field(default_factory=dict)
    factory: str = ""
    init: str = ""

    def __post_init__(self) -> None:
        check_fields(self, "model")
        require(not self.factory or is_import_string(self.factory), "model.factory",
                f"must be 'package.module:attr', got {self.factory!r}")


@dataclass(frozen=True)
class ClientSection:
    """The client update pipeline: privacy stage and compression codec, by registry name.

    ``compression_options`` go to the codec (``density`` for ``topk``/``randk``, ``bits`` and
    ``norm`` for ``qsgd``, ...); ``error_feedback`` is on for biased codecs unless set (and
    refused with a lossless codec, which leaves no error to feed back);
    ``density_bounds = [min, max]`` turns on bandwidth-aware density (``fedlink.client.density``)
    with the ``density_safety`` margin (in (0, 1]; refused without ``density_bounds``), for a
    sparsifying codec (``topk``, ``randk``; refused with another). In virtual mode the clients
    measure no goodput or time left, so the bounds only clamp the codec's density, and
    ``density_safety`` is refused there.

    ``retry`` (``[client.retry]``, ``fedlink.client.RetryPolicy``) and ``liveness``
    (``[client.liveness]``, ``fedlink.client.liveness.LivenessConfig``): how clients retry and
    how long they wait for a link before calling it dead (real sessions only: virtual mode
    refuses both).

    ``download_connections``: how many connections a client stripes a large download over
    (``fedlink.client.ClientOptions``). Unset: 2 for ``fedlink client`` (a device on a real
    link), 1 for the clients ``fedlink simulate`` runs (over an emulated ``[network]`` a
    client's connections share its link's bandwidth). Virtual mode, which times one transfer
    per payload, refuses more than 1.

    A ``keep_local`` pattern is ``"batchnorm"`` (every BatchNorm layer's tensors), a glob over
    the full tensor names of ``model.state_dict()`` (``"1.*"``, ``"head.*"``,
    ``"*.running_*"``), or a bare word matching any dotted part that starts with it (``"bn"``:
    ``bn1.weight``, ``features.bn.bias``). A pattern ending in ``"."`` names a module's
    tensors: ``"1."`` is read as the glob ``"1.*"`` (and recorded so). A pattern that matches
    no tensor is refused when the model is built. With ``[run] mode = "virtual"`` it is
    refused: a virtual client's trainer is built afresh for each task and could not keep them.

    ``privacy`` names the privacy stage (``"dp_fedavg"`` for user-level DP; its options come
    from the coordinator's ``dp_fedavg`` hook, see ``fedlink.privacy.setup``, and
    ``privacy_options`` may repeat them); ``trainer`` is ``"torch"`` (local SGD) or
    ``"dp_sgd"`` (sample-level DP-SGD through Opacus, settings in
    ``[coordinator.training] trainer_options``), a name registered in
    ``fedlink.experiment.trainers.TRAINERS``, or an import string naming a factory
    ``(model, data, *, seed) -> Trainer``.

    The ``"torch"`` trainer's ``loss`` (``cross_entropy``, ``mse``, ``bce_with_logits``, ``l1``,
    ``huber``, ``nll``, or an import string), ``optimizer`` (``sgd``, ``adam``, ``adamw``,
    ``rmsprop``, ``adagrad``, or an import string) with ``optimizer_options`` (``momentum``,
    ``weight_decay``, ...), and ``keep_local``: tensors that never leave the client
    (``["batchnorm"]`` is FedBN; see ``fedlink.client.torch_trainer.local_mask``). With
    ``trainer = "dp_sgd"`` these four are refused (it trains with cross-entropy and its own
    optimizer, sharing everything); with ``[virtual] population > 0`` so are they and
    ``trainer``, ``device`` (its synthetic clients train a numpy softmax regression).

    ``device`` (``"cpu"`` by default, ``"auto"``, ``"cuda"``, ``"cuda:<i>"``, ``"mps"``;
    ``fedlink.client.device``) is where clients train and the central evaluator scores;
    ``dp_fix_model = true`` (with ``trainer = "dp_sgd"`` only) replaces the layers DP-SGD
    refuses (batch norm) by Opacus's ``ModuleValidator.fix`` (``GroupNorm``) in every copy of
    the model, the coordinator's included.
    """

    compression: str = "fp32"
    compression_options: Mapping[str, Any] = field(default_factory=dict)
    error_feedback: bool | None = None
    density_bounds: tuple[float, float] | None = None
    density_safety: float = 0.5
    privacy: str = "none"
    privacy_options: Mapping[str, Any] = field(default_factory=dict)
    trainer: str = "torch"
    loss: str = "cross_entropy"
    optimizer: str = "sgd"
    optimizer_options: Mapping[str, Any] = field(default_factory=dict)
    keep_local: tuple[str, ...] = ()
    device: str = DEFAULT_DEVICE
    dp_fix_model: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    download_connections: int | None = None

    @classmethod
    def from_table(cls, table: Mapping[str, Any], section: str = "client") -> ClientSection:
        """Build from ``[client]`` with its ``retry`` and ``liveness`` sub-tables."""
        values = dict(table) if isinstance(table, Mapping) else table
        if isinstance(values, dict):
            if "retry" in values:
                values["retry"] = RetryPolicy.from_dict(values["retry"], f"{section}.retry")
            if "liveness" in values:
                values["liveness"] = LivenessConfig.from_dict(values["liveness"],
                                                              f"{section}.liveness")
        return from_table(cls, values, section)

    def __post_init__(self) -> None:
        check_fields(self, "client")
        # "1." (a module's tensors, as a prefix) reads as the glob "1.*": as a bare word it
        # would match nothing, since no dotted part of a name holds a dot
        object.__setattr__(self, "keep_local", tuple(
            f"{p}*" if isinstance(p, str) and p.endswith(".") else p for p in self.keep_local))
        require(self.trainer in TRAINERS, "client.trainer",
                f"must be one of {', '.join(TRAINERS.names())} (fedlink.experiment.trainers) or "
                f"'package.module:attr', got {self.trainer!r}")
        require(all(isinstance(p, str) and p for p in self.keep_local), "client.keep_local",
                f"must be a list of non-empty names or patterns, got {self.keep_local!r}")
        check_device(self.device, "client.device")
        require(self.download_connections is None or self.download_connections >= 1,
                "client.download_connections",
                f"must be >= 1 (1: no striping), got {self.download_connections}")
        require(not self.dp_fix_model or self.trainer == "dp_sgd", "client.dp_fix_model",
                f"replaces layers for DP-SGD; it needs [client] trainer = 'dp_sgd', not "
                f"{self.trainer!r}")
        require(isinstance(self.density_safety, int | float)
                and 0.0 < self.density_safety <= 1.0, "client.density_safety",
                f"must be a number in (0, 1], got {self.density_safety!r}")
        codec = self.pipeline().codec  # unknown codec names and bad options fail at load time
        require(not (self.error_feedback and codec.lossless), "client.error_feedback",
                f"{self.compression!r} is lossless: no error is left to feed back. Unset it, "
                f"or pick a lossy codec")
        require(self.density_bounds is None or isinstance(codec, Sparsifier),
                "client.density_bounds",
                f"chooses the density of a sparsifying codec (topk, randk), which "
                f"{self.compression!r} is not. Unset it, or pick one")
        require(self.density_bounds is not None
                or self.density_safety == field_default(ClientSection, "density_safety"),
                "client.density_safety",
                "is the safety margin of bandwidth-aware density, which only "
                "[client] density_bounds turns on: without it the codec's own density is "
                "used and the margin could not take effect. Unset it, or set density_bounds")
        self._refuse_what_dp_sgd_does_not_read()

    def _refuse_what_dp_sgd_does_not_read(self) -> None:
        """DP-SGD trains with cross-entropy and its own optimizer (plain SGD at the task's
        learning rate), sharing every tensor: the torch trainer's settings would change
        nothing (``fedlink.experiment.trainers.dp_sgd_trainer`` says so again when built)."""
        if self.trainer != "dp_sgd":
            return
        for key in ("loss", "optimizer", "optimizer_options", "keep_local"):
            if getattr(self, key) != field_default(ClientSection, key):
                raise ConfigError(
                    f"client.{key}: [client] trainer = 'dp_sgd' trains with cross_entropy and "
                    f"its own DP-SGD optimizer (plain SGD at [coordinator.training] "
                    f"learning_rate), sharing every tensor, so it never reads {key}. Unset "
                    f"{key}, or use trainer = 'torch'")

    def pipeline(self) -> UpdatePipeline:
        """A fresh update pipeline for one client (each client keeps its own residual)."""
        density = None if self.density_bounds is None else DensityPolicy(
            float(self.density_bounds[0]), float(self.density_bounds[1]), self.density_safety)
        return UpdatePipeline.from_names(self.privacy, self.compression,
                                         self.compression_options, self.error_feedback,
                                         density, privacy_options=self.privacy_options)


@dataclass(frozen=True)
class ExperimentConfig:
    """A whole experiment: run, data, model, client pipeline and coordinator."""

    run: RunSection = field(default_factory=RunSection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    client: ClientSection = field(default_factory=ClientSection)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    network: Fleet | None = None
    partial_work: PartialWorkSection = field(default_factory=PartialWorkSection)
    virtual: VirtualSection = field(default_factory=VirtualSection)
    ray: RaySection = field(default_factory=RaySection)
    evaluator: str = ""
    """``[coordinator] evaluator = "package.module:attr"``: your ``evaluate(model, test) ->
    {metric: value}`` scoring each new global model (kept here, not in ``CoordinatorConfig``,
    because the coordinator only ever sees the callback). It replaces the built-in evaluator
    (``[run] evaluate_train`` is refused with it); ``[virtual] population > 0`` refuses it
    (synthetic clients are scored on their own held-out set)."""

    def __post_init__(self) -> None:
        check_fields(self, "")
        require(not self.evaluator or is_import_string(self.evaluator), "coordinator.evaluator",
                f"must be 'package.module:attr', got {self.evaluator!r}")
        self._refuse_virtual_settings_in_grpc_mode()
        self._refuse_what_a_synthetic_population_never_reads()
        self._refuse_what_virtual_mode_does_not_model()
        self._refuse_a_backend_that_never_trains()
        self._refuse_evaluate_train_with_an_evaluator()
        self._refuse_state_virtual_clients_lose()
        self._refuse_noise_on_kept_tensors()
        self._refuse_striping_a_simulation_cannot_model()
        self._refuse_partial_work_of_a_single_step()
        self._refuse_a_pool_too_small_for_paced_devices()

    def _refuse_virtual_settings_in_grpc_mode(self) -> None:
        """A gRPC run (``fedlink.sim.runner``) never reads ``[virtual]``, ``[ray]`` or
        ``[run] backend``: the mirror of ``[partial_work]`` refused in virtual mode."""
        if self.run.mode != "grpc":
            return
        unread = [f"virtual.{k}" for k in changed_fields(self.virtual)]
        unread += [f"ray.{k}" for k in changed_fields(self.ray)]
        unread += ["run.backend"] if "backend" in changed_fields(self.run) else []
        if unread:
            raise ConfigError(f"{', '.join(unread)}: read only with [run] mode = 'virtual'; "
                              f"a gRPC run (the default mode) runs the [data] clients over "
                              f"loopback and could not apply them. Set [run] mode = "
                              f"'virtual', or remove them")

    def _refuse_what_a_synthetic_population_never_reads(self) -> None:
        """``[virtual] population > 0`` trains lazily generated synthetic clients with a numpy
        softmax regression (``fedlink.sim.virtual.population.SoftmaxTrainer``) and scores it on
        their own held-out set: the experiment's data, model, trainer and evaluator are never
        built. It reads ``[coordinator.training]``'s learning rate, local steps or epochs and
        batch size, ``[virtual] features``/``classes``, the client pipeline (codec, privacy),
        ``[network]`` and federated evaluation's ``fraction``/``every``."""
        if self.run.mode != "virtual" or self.virtual.population == 0:
            return
        unread = [f"client.{k}" for k in changed_fields(self.client)
                  if k in POPULATION_UNREAD_CLIENT]
        unread += [f"model.{k}" for k in changed_fields(self.model)]
        unread += [f"data.{k}" for k in changed_fields(self.data)]
        unread += [f"run.{k}" for k in changed_fields(self.run) if k in POPULATION_UNREAD_RUN]
        if self.coordinator.training.trainer_options:
            unread.append("coordinator.training.trainer_options")
        if self.coordinator.evaluation.holdout:
            unread.append("coordinator.evaluation.holdout")
        if self.evaluator:
            unread.append("coordinator.evaluator")
        if unread:
            them = _them(unread)
            raise ConfigError(f"{', '.join(unread)}: [virtual] population > 0 trains synthetic "
                              f"clients (a numpy softmax regression on generated data, scored "
                              f"on its own held-out set) and never reads {them}. Remove "
                              f"{them}, or set [virtual] population = 0 to train the "
                              f"experiment's [data] and [model]")

    def _refuse_what_virtual_mode_does_not_model(self) -> None:
        """The virtual loop (``fedlink.sim.virtual``) runs the coordinator's engine on a model
        clock with no server, socket or client session: transport, security, operations and
        session settings would be recorded and never read."""
        if self.run.mode != "virtual":
            return
        require("device_step_s" not in changed_fields(self.run), "run.device_step_s",
                "paces gRPC mode's clients: in virtual mode a local step takes [virtual] "
                "step_cost_s model seconds (times the client's speed). Remove "
                "device_step_s, or set [virtual] step_cost_s")
        coordinator, unread = self.coordinator, []
        for key in ("tls", "auth", "metrics", "netcheck", "join_token", "state_dir", "drain_s"):
            if getattr(coordinator, key) != field_default(CoordinatorConfig, key):
                unread.append(f"coordinator.{key}")
        unread += [f"coordinator.limits.{k}" for k in changed_fields(coordinator.limits)
                   if k not in VIRTUAL_LIMITS]
        unread += ["run.train_workers"] if "train_workers" in changed_fields(self.run) else []
        unread += [f"client.{k}" for k in ("retry", "liveness", "density_safety")
                   if k in changed_fields(self.client)]
        if unread:
            why = ("its clients measure no goodput to size a density by: density_bounds only "
                   "clamp the codec's density there"
                   if unread == ["client.density_safety"] else
                   "it runs no server, sockets or client sessions")
            raise ConfigError(f"{', '.join(unread)}: [run] mode = 'virtual' does not model "
                              f"{_them(unread)} ({why}), so none could take effect. Remove "
                              f"{_them(unread)}, or use [run] mode = 'grpc'")
        self._refuse_a_liveness_derivation_overridden()

    def _refuse_a_liveness_derivation_overridden(self) -> None:
        """In virtual mode ``long_poll_s`` only derives the liveness timeout (there are no
        long polls), so a ``liveness_timeout_s`` of its own leaves it unread.
        ``heartbeat_interval_s`` is kept: the timeout must exceed it, so a short timeout
        needs a shorter interval."""
        limits = self.coordinator.limits
        if limits.liveness_timeout_s is None or "long_poll_s" not in changed_fields(limits):
            return
        raise ConfigError(f"coordinator.limits.long_poll_s: [run] mode = 'virtual' has no long "
                          f"polls; it only derives the liveness timeout there, which "
                          f"coordinator.limits.liveness_timeout_s = "
                          f"{limits.liveness_timeout_s:g} sets itself. Remove long_poll_s, or "
                          f"liveness_timeout_s")

    def _refuse_a_backend_that_never_trains(self) -> None:
        """``[run] backend`` trains with ``[virtual] workers > 0`` only (0: inline), and the
        built-in ``processes`` and ``inline`` backends never read ``[ray]``."""
        if self.run.mode != "virtual":
            return
        if self.virtual.workers == 0 and self.run.backend not in ("processes", "inline"):
            raise ConfigError(f"run.backend: {self.run.backend!r} trains with [virtual] "
                              f"workers > 0; with workers = 0 every client trains inline, in "
                              f"the loop's process, so it could not take effect. Set [virtual] "
                              f"workers, or unset run.backend")
        if self.ray.address and (self.virtual.workers == 0
                                 or self.run.backend in ("processes", "inline")):
            why = ("[virtual] workers = 0 trains inline" if self.virtual.workers == 0
                   else f"[run] backend = {self.run.backend!r} starts no Ray")
            raise ConfigError(f"ray.address: read by [run] backend = 'ray' with [virtual] "
                              f"workers > 0; {why}, so it could not take effect. Unset it, or "
                              f"set backend = 'ray' and workers")

    def _refuse_evaluate_train_with_an_evaluator(self) -> None:
        """``evaluate_train`` is the built-in evaluator's pass over the pooled training data;
        ``[coordinator] evaluator`` replaces that evaluator (``fedlink.experiment.setup``)."""
        if self.run.evaluate_train and self.evaluator:
            raise evaluate_train_refused("[coordinator] evaluator")

    def _refuse_partial_work_of_a_single_step(self) -> None:
        """A straggler does ``w`` of the task's ``E`` epochs (or steps), ``w`` in ``1..E``:
        with ``E = 1`` every task is done in full, and ``[partial_work]`` would change nothing."""
        training = self.coordinator.training
        full, unit = ((training.local_steps, "local_steps") if training.local_steps > 0
                      else (training.local_epochs, "local_epochs"))
        if self.partial_work.enabled and full == 1:
            raise ConfigError(f"partial_work.fraction: a task of one step of work "
                              f"(coordinator.training.{unit} = 1) cannot be done in part. "
                              f"Raise {unit}, or remove [partial_work]")

    def _refuse_a_pool_too_small_for_paced_devices(self) -> None:
        """A paced client waits out its device's time on its training thread: a pool of fewer
        threads than clients would queue devices that are only waiting, and charge each the
        time others spent."""
        workers, clients = self.run.train_workers, self.data.clients
        if self.run.device_step_s > 0 and 0 < workers < clients:
            raise ConfigError(f"run.train_workers = {workers} with run.device_step_s: each of "
                              f"the {clients} clients waits out its device's time on a "
                              f"training thread, so a pool of {workers} would queue devices "
                              f"that are only waiting. Unset train_workers (a thread per "
                              f"client), or raise it to {clients}")

    def _refuse_striping_a_simulation_cannot_model(self) -> None:
        """Virtual mode times one transfer per payload: more than one download connection
        could not take effect there."""
        if self.run.mode == "virtual" and (self.client.download_connections or 1) > 1:
            raise ConfigError("[client] download_connections > 1 with [run] mode = 'virtual': "
                              "virtual links time one transfer per payload, so striping "
                              "could not take effect. Unset it, or set it to 1")

    def _refuse_state_virtual_clients_lose(self) -> None:
        """Virtual mode builds each task's trainer afresh (a population of 10^6 keeps no
        trainer per client): ``keep_local``'s tensors would be lost between tasks without a
        word (and each task would start them from the global model's initial values)."""
        if self.run.mode == "virtual" and self.client.keep_local:
            raise ConfigError("[client] keep_local with [run] mode = 'virtual': a virtual "
                              "client's trainer is built afresh for each task, so the tensors "
                              "it keeps local would be lost between tasks. Use [run] mode = "
                              "'grpc', or unset [client] keep_local")

    def _refuse_noise_on_kept_tensors(self) -> None:
        """Distributed DP noises every coordinate a member sends, the zero deltas of its
        ``keep_local`` tensors included: the coordinator's copy of them would drift with the
        noise, and a client whose first task comes later would start its own from it."""
        secure = self.coordinator.secure
        if secure.enabled and secure.ddp and self.client.keep_local:
            raise ConfigError("[client] keep_local with distributed DP ([coordinator.secure] "
                              "noise_multiplier > 0): each member adds noise to every "
                              "coordinate it sends, its kept tensors' too, so the "
                              "coordinator's copy of them would drift and a client joining "
                              "later would start its own from noise. Unset keep_local, or "
                              "noise_multiplier")

    @classmethod
    def from_dict(cls, table: Mapping[str, Any],
                  base_dir: Path | None = None) -> ExperimentConfig:
        """Build from a parsed TOML document (``base_dir``: where relative paths start)."""
        sections = {"run": RunSection, "data": DataSection, "model": ModelSection,
                    "client": ClientSection, "partial_work": PartialWorkSection,
                    "virtual": VirtualSection, "ray": RaySection}
        unknown = sorted(set(table) - set(sections) - {"coordinator", "network"})
        if unknown:
            raise ConfigError(f"unknown sections {unknown}; allowed: "
                              f"{sorted([*sections, 'coordinator', 'network'])}")
        values: dict[str, Any] = {k: from_table(c, table.get(k, {}), k)
                                  for k, c in sections.items() if k != "client"}
        data_table = table.get("data", {})
        if isinstance(data_table, Mapping) and data_table.get("loader") and "dataset" in data_table:
            raise ConfigError("[data] dataset and [data] loader: the loader replaces the "
                              "registered dataset (the run records the loader's import path "
                              "as its dataset); set one of them")
        values["client"] = ClientSection.from_table(table.get("client", {}))
        coordinator = dict(table.get("coordinator", {}))
        values["evaluator"] = coordinator.pop("evaluator", "")
        coordinator.setdefault("run_name", values["run"].name)
        coordinator.setdefault("seed", values["run"].seed)
        goal = FlushRule.from_table(coordinator.get("flush", {}), "coordinator.flush").goal
        _refuse_client_privacy_with_secure(coordinator, values["client"])
        if "hooks" in coordinator:  # sampled from the synthetic population when there is one
            synthetic = values["run"].mode == "virtual" and values["virtual"].population
            coordinator["hooks"] = privacy_setup.with_sampling_defaults(
                list(coordinator["hooks"]), synthetic or values["data"].clients, goal)
        training = coordinator.get("training", {})
        hooks = privacy_setup.with_dp_sgd_report(
            list(coordinator.get("hooks", [])), values["client"].trainer,
            training.get("trainer_options", {}) if isinstance(training, Mapping) else {})
        if hooks:
            coordinator["hooks"] = hooks
        values["coordinator"] = _robust_for_uplink(CoordinatorConfig.from_dict(coordinator),
                                                   values["client"])
        _check_secure_uplink(values["coordinator"], values["client"])
        client = values["client"]
        values["client"] = dataclasses.replace(client, privacy_options=privacy_setup.stage_options(
            client.privacy, client.privacy_options, values["coordinator"].hooks, goal,
            values["coordinator"].aggregator))
        if "network" in table:
            values["network"] = parse_network(table["network"], seed=values["run"].seed,
                                              base_dir=base_dir)
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | Path) -> ExperimentConfig:
        """Load and validate a TOML experiment file."""
        try:
            return cls.from_dict(load_toml(path), base_dir=Path(path).parent)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (written into ``summary.json``)."""
        plain: dict[str, Any] = {f.name: _plain(getattr(self, f.name))
                                 for f in dataclasses.fields(self)
                                 if f.name not in ("network", "evaluator")}
        plain["network"] = None if self.network is None else self.network.to_dict()
        plain["evaluator"] = self.evaluator
        if self.data.loader:  # the data that ran is the loader's, not the default dataset
            plain["data"]["dataset"] = self.data.loader
        return plain


def _them(keys: list[str]) -> str:
    """The pronoun for ``keys`` in an error message."""
    return "it" if len(keys) == 1 else "them"


def evaluate_train_refused(evaluator: str) -> ConfigError:
    """Why ``[run] evaluate_train`` is refused beside ``evaluator``, an evaluator of the
    user's own (configured or plugged), which replaces the built-in one that scores the
    training data."""
    return ConfigError(f"run.evaluate_train: the built-in evaluator scores the training data, "
                       f"and {evaluator} replaces it, so evaluate_train could not take "
                       f"effect. Unset it, or score the training data in your evaluator")


def refuse_unread_trainer_options(config: ExperimentConfig) -> None:
    """A trainer option the simulated clients' trainer (``[client] trainer``) does not read
    would change nothing: a misspelt ``prox_mu`` would train without FedProx, DP-SGD's
    options under the ``torch`` trainer without DP. Refused, for the trainers that say what
    they read. A simulation checks it when its clients train with the configured trainer
    (not a plugged one); a served coordinator's clients bring their own trainers."""
    client, training = config.client, config.coordinator.training
    read = options_read(client.trainer)
    unread = sorted(set(training.trainer_options) - (read or set()))
    if read is not None and unread:
        raise ConfigError(f"coordinator.training.trainer_options: [client] trainer = "
                          f"{client.trainer!r} does not read {', '.join(unread)}, which would "
                          f"change nothing (it reads: {', '.join(sorted(read)) or 'no option'})")


def _refuse_client_privacy_with_secure(coordinator: Mapping[str, Any],
                                       client: ClientSection) -> None:
    """A client privacy stage (``privacy``) or DP-SGD trainer reports to a coordinator hook
    that reads each update, which a secure coordinator never sees: said here, by its own
    name, before the hook it implies is refused as a flush hook."""
    secure = coordinator.get("secure", {})
    if not (isinstance(secure, Mapping) and secure.get("enabled")):
        return
    if client.privacy != "none":
        key, value = "privacy", client.privacy
    elif client.trainer == "dp_sgd":
        key, value = "trainer", client.trainer
    else:
        return
    raise ConfigError(f"client.{key}: {value!r} cannot be used with coordinator.secure.enabled "
                      f"(its coordinator hook accounts for each update, which a secure "
                      f"coordinator never sees); for differential privacy in a secure run, set "
                      f"[coordinator.secure] noise_multiplier (distributed DP)")


def _check_secure_uplink(coordinator: CoordinatorConfig, client: ClientSection) -> None:
    """Secure aggregation sums integers encoded from the plain float update: an uplink codec
    would be applied to nothing (masks destroy sparsity and quantization), so it is refused."""
    if coordinator.secure.enabled and client.compression != "fp32":
        raise ConfigError(f"client.compression: {client.compression!r} cannot be used with "
                          f"coordinator.secure.enabled (masked updates are integers in Z_m; "
                          f"use 'fp32', the secure encoding sets the bits per value)")


def _robust_for_uplink(coordinator: CoordinatorConfig,
                       client: ClientSection) -> CoordinatorConfig:
    """The flush guard's trim off by default with a sparsifying uplink codec (most coordinates
    of each update are zero: a coordinate-wise trim would average zeros); a set one refused."""
    from fedlink.compress import get_codec
    from fedlink.compress.sparse import Sparsifier

    codec = get_codec(client.compression, **dict(client.compression_options))
    if not isinstance(codec, Sparsifier):
        return coordinator
    robust = coordinator.robust
    robust.resolved_trim(coordinator.aggregator, coordinator.plain_mean, sparse_uplink=True)
    if robust.trim is not None:
        return coordinator
    return dataclasses.replace(coordinator, robust=dataclasses.replace(robust, trim=0.0))


def _plain(section: Any) -> dict[str, Any]:
    """A config section as a dict; the coordinator's through its own ``to_dict`` (secrets)."""
    if isinstance(section, CoordinatorConfig):
        return section.to_dict()
    return dataclasses.asdict(section)
