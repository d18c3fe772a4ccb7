"""Builds what an experiment needs from its config: data, models, evaluator, trainers.

Shared by ``fedlink simulate`` (everything in one process), ``fedlink serve`` (initial model and
evaluator) and ``fedlink client`` (one client's trainer), so a deployment runs exactly the code
a simulation ran.

Plug points (each an import string in the config, or the object itself through ``Plugs``):

- model: ``[model] factory`` / ``Plugs.model``: an ``nn.Module`` (copied for every client) or a
  factory ``(**[model] options) -> nn.Module``, called with torch seeded by ``[run] seed``;
- data: ``[data] loader`` / ``Plugs.data``: ``loader(num_clients=, seed=, **options)`` returning
  a ``FederatedData`` (numpy, per client), a ``CentralData`` (fedlink partitions it), or a
  ``TorchFederatedData`` (torch datasets of any shape and dtype); ``Plugs.data`` may also be
  the data itself;
- trainer: ``[client] trainer`` / ``Plugs.trainer``: ``factory(model, data, *, seed) ->
  Trainer`` (``data`` is the client's share);
- evaluator: ``[coordinator] evaluator`` / ``Plugs.evaluate``: ``evaluate(model, test) ->
  {metric: value}``, run on every new global model;
- loss: ``[client] loss`` / ``Plugs.loss``: a name, an import string or ``(output, target) ->
  loss``, used by the built-in trainer and the default evaluator;
- optimizer: ``[client] optimizer`` (a name with ``optimizer_options``, or an import string).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedlink.atomic import write_atomic_with
from fedlink.client import Trainer
from fedlink.client.device import DEFAULT_DEVICE
from fedlink.client.lazy import LazyTrainer
from fedlink.client.torch_trainer import local_mask, resolve_device
from fedlink.data import CentralData, Dataset, FederatedData, loading
from fedlink.data.lazy import LazyDataset
from fedlink.data.loading import AnyData
from fedlink.data.torch_data import TorchFederatedData
from fedlink.errors import ConfigError
from fedlink.experiment.config import (
    ClientSection,
    ExperimentConfig,
    evaluate_train_refused,
    refuse_unread_trainer_options,
)
from fedlink.experiment.run_folder import MODEL_FILENAME, VECTOR_FILENAME
from fedlink.experiment.trainers import TRAINERS, TrainerFactory
from fedlink.metrics.distribution import label_distribution
from fedlink.models import Evaluator, UserEvaluator, build_model
from fedlink.params import ParamSpec, to_vector
from fedlink.params.flat import load_vector, spec_of
from fedlink.plug import describe, expect, keyword_names, resolve
from fedlink.private import private_dir

ModelPlug = nn.Module | Callable[..., nn.Module]



@dataclass(frozen=True)
class Plugs:
    """User objects that replace what the config names (``run_simulation(model=..., ...)``).

    ``None`` leaves the config in charge. Each may be the object or an import string.
    """

    model: ModelPlug | str | None = None
    data: AnyData | CentralData | Callable[..., Any] | str | None = None
    trainer: TrainerFactory | str | None = None
    evaluate: Callable[..., Mapping[str, float]] | str | None = None
    loss: Callable[..., Any] | str | None = None

    def describe(self) -> dict[str, str]:
        """What was plugged in, by import path, for the run's recorded config."""
        return {name: describe(value) for name, value in vars(self).items()
                if value is not None}


def load_data(config: ExperimentConfig, plug: Any = None) -> AnyData:
    """The experiment's federated data (``fedlink.data.loading.load_data`` of its ``[data]``
    section and ``[run] seed``)."""
    return loading.load_data(config.data, config.run.seed, plug)


def data_name(config: ExperimentConfig, plug: Any = None) -> str:
    """What the run's data is called in its record (``fedlink.data.loading.data_name``)."""
    return loading.data_name(config.data, plug)


@dataclass(frozen=True)
class Experiment:
    """An experiment's data and model, built once from its config (and any ``Plugs``).

    ``worker``: which training worker this process is (virtual mode's workers; 0 elsewhere),
    for ``[client] device`` to pick its device (``device``).
    """

    config: ExperimentConfig
    data: AnyData
    plugs: Plugs = field(default_factory=Plugs)
    worker: int = 0

    @classmethod
    def build(cls, config: ExperimentConfig, plugs: Plugs | None = None,
              worker: int = 0) -> Experiment:
        """Load and partition the data (seeded); check that the model factory builds a model,
        that the device is here, that the trainer factory resolves and that the update
        pipeline can treat the model's state, so a wrong plug fails here and not in round
        one."""
        plugs = plugs or Plugs()
        experiment = cls(config, load_data(config, plugs.data), plugs, worker)
        model = experiment.new_model()
        experiment.trainer_factory()
        experiment.check_model_state(model)
        return experiment

    def check_simulated_trainer_options(self) -> None:
        """Refuse ``trainer_options`` the simulated clients' trainer does not read
        (``refuse_unread_trainer_options``); a plugged trainer says nothing of what it reads
        and is not checked."""
        if self.plugs.trainer is None:
            refuse_unread_trainer_options(self.config)

    @functools.cached_property
    def device(self) -> Any:
        """The torch device ``[client] device`` means for this worker on this machine
        (``ConfigError`` naming the key when it is not here)."""
        return resolve_device(self.config.client.device, self.worker, "[client] device")

    def check_model_state(self, model: nn.Module) -> None:
        """Refuse, naming the keys, a model whose state the configured privacy cannot treat:
        DP-SGD with layers Opacus refuses (``check_dp_model``); clipping and noise with
        buffers that would leave the clients (``fedlink.client.pipeline.check_state``)."""
        from fedlink.client.pipeline import check_state

        section = self.config.client
        if section.trainer == "dp_sgd" and self.plugs.trainer is None:
            from fedlink.privacy.dp_sgd import check_dp_model

            check_dp_model(model)
        spec = spec_of(model)
        kept = local_mask(spec, section.keep_local, model) if section.keep_local else None
        check_state(section.pipeline(), spec, kept)

    def recorded_config(self) -> dict[str, Any]:
        """The config as it ran, for ``summary.json``: the plugs by import path, and the data
        under the name of what produced it (the loader's or plugged data's, not the default
        ``[data] dataset``)."""
        plain = self.config.to_dict()
        plain["data"]["dataset"] = data_name(self.config, self.plugs.data)
        plain["plugs"] = self.plugs.describe()
        return plain

    def new_model(self) -> nn.Module:
        """A freshly initialised model (the same weights on every call); with
        ``[client] dp_fix_model``, its batch norm replaced as DP-SGD needs."""
        model = self._new_model()
        if self.config.client.dp_fix_model:
            from fedlink.privacy.dp_sgd import fix_dp_model

            return fix_dp_model(model)
        return model

    def _new_model(self) -> nn.Module:
        plug = resolve(self.plugs.model or self.config.model.factory or None, "model factory")
        options = dict(self.config.model.options)
        if isinstance(plug, nn.Module):
            if options:
                raise ConfigError("[model] options apply to a model factory, not to a module")
            return copy.deepcopy(plug)
        if plug is not None:
            if not callable(plug):
                raise ConfigError(f"model factory {describe(plug)} is not callable")
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(self.config.run.seed)
                return expect(plug(**options), nn.Module, f"model factory {describe(plug)}")
        if not isinstance(self.data, FederatedData):
            raise ConfigError(f"built-in model {self.config.model.name!r} is sized from a "
                              f"fedlink Dataset; with torch data set [model] factory")
        return build_model(self.config.model.name, self.data.num_features,
                           self.data.num_classes, seed=self.config.run.seed, **options)

    def initial_vector(self) -> np.ndarray:
        """The global model at version 0: fresh weights, or ``[model] init`` when set."""
        model = self.new_model()
        if self.config.model.init:
            return load_saved(model, Path(self.config.model.init))
        return to_vector(model)

    def spec(self) -> ParamSpec:
        """The model's ``ParamSpec``, each tensor's kind recorded: what the coordinator's
        engine needs to treat buffers apart from weights (``docs/model-state.md``)."""
        return spec_of(self.new_model())

    def evaluator(self) -> Callable[[np.ndarray], Mapping[str, float]]:
        """Scores a global model vector on the central test set.

        The plugged or ``[coordinator] evaluator``; else accuracy (for class targets) and the
        ``[client] loss``. With ``[run] evaluate_train`` also on every client's training data,
        pooled (fedlink ``Dataset``s only; with ``[coordinator.evaluation] holdout``, less the
        part each client keeps out of its training).
        """
        plug = resolve(self.plugs.evaluate or self.config.evaluator or None, "evaluator")
        if plug is not None:
            if self.config.run.evaluate_train:  # a plug's: the config refuses the key's
                raise evaluate_train_refused("the evaluate plug passed to the run")
            return UserEvaluator(self.new_model(), self.data.test, plug, device=self.device)
        train = None
        if self.config.run.evaluate_train and isinstance(self.data, FederatedData):
            train = pooled_train(self.data, self.config.coordinator.evaluation.holdout,
                                 self.client_seed)
        return Evaluator(self.new_model(), self.data.test, train=train, loss=self.loss,
                         device=self.device)

    def checked_evaluator(self, initial: np.ndarray) -> Callable[[np.ndarray], Mapping[str, float]]:
        """``evaluator()``, having scored ``initial`` once: one that raises (a loss that does
        not fit the model's output, an evaluator bug) is refused before the run starts, not
        found as a missing accuracy after it; so is one that returns no ``accuracy`` beside
        ``[run] target_accuracy``, which could then never end the run."""
        evaluate = self.evaluator()
        try:
            scores = evaluate(initial)
        except ConfigError:
            raise
        except Exception as exc:
            keys = "[coordinator] evaluator" if (self.plugs.evaluate or self.config.evaluator) \
                else "[client] loss (the default evaluator scores the test set with it)"
            raise ConfigError(f"{keys}: scoring the initial model on the test set raised "
                              f"{type(exc).__name__}: {exc}") from exc
        if self.config.run.target_accuracy > 0 and "accuracy" not in scores:
            raise self._no_accuracy_for_a_target(sorted(scores))
        return evaluate

    def _no_accuracy_for_a_target(self, returned: list[str]) -> ConfigError:
        """Why ``[run] target_accuracy`` is refused beside an evaluator that scores no
        accuracy: no flush could ever reach it."""
        own = bool(self.plugs.evaluate or self.config.evaluator)
        which = ("the run's evaluator ([coordinator] evaluator)" if own else
                 "the built-in evaluator, which scores accuracy for class labels only,")
        fix = ("Return an 'accuracy' from it" if own else
               "Plug an evaluator that returns an 'accuracy' ([coordinator] evaluator)")
        return ConfigError(f"[run] target_accuracy: {which} returns no 'accuracy' (it returned "
                           f"{returned}), so no flush could reach the target. {fix}, or "
                           f"remove target_accuracy")

    @property
    def loss(self) -> Any:
        """The plugged loss, else ``[client] loss`` (a name or an import string)."""
        return self.plugs.loss if self.plugs.loss is not None else self.config.client.loss

    def trainer_factory(self) -> TrainerFactory:
        """The ``(model, data, *, seed) -> Trainer`` that builds each client's trainer.

        A plugged trainer replaces the built-in ``"torch"`` one only: with ``[client] trainer``
        set to another (``"dp_sgd"``: the run's privacy) it is refused, naming both, rather
        than silently training without what that key asked for."""
        plug = resolve(self.plugs.trainer, "trainer")
        name = self.config.client.trainer
        if plug is not None and name != ClientSection().trainer:
            raise ConfigError(f"run_simulation(trainer={describe(plug)}) and [client] trainer "
                              f"= {name!r}: the plugged trainer would replace {name!r} and "
                              f"what it does (DP-SGD's clipping and noise, say) would silently "
                              f"not happen. Unset one of them (a trainer of your own that does "
                              f"DP-SGD goes in run_simulation(trainer=...) alone)")
        if plug is None and TRAINERS.registered(name):
            return self._registered_factory(name)
        factory = plug if plug is not None else resolve(name, "trainer")
        return with_settings(factory, self.trainer_settings())

    def _registered_factory(self, name: str) -> TrainerFactory:
        """``TRAINERS``' builder ``name``, given the device when it takes one (refused when
        ``[client] device`` is set and it does not)."""
        builder = TRAINERS.get(name)
        accepted = keyword_names(builder)
        if accepted is None or "device" in accepted:
            return builder(self.config, self.loss, device=self.device)
        if self.config.client.device != DEFAULT_DEVICE:
            raise ConfigError(f"[client] device cannot apply: the trainer {name!r} "
                              f"({describe(builder)}) does not take device=. Give its builder "
                              f"a device parameter, or unset [client] device")
        return builder(self.config, self.loss)

    def trainer_settings(self) -> dict[str, Any]:
        """The ``[client]`` training settings set away from their defaults (and a plugged
        loss), by keyword: what a custom trainer factory must take or have refused."""
        section, defaults = self.config.client, ClientSection()
        settings: dict[str, Any] = {}
        if self.plugs.loss is not None or section.loss != defaults.loss:
            settings["loss"] = self.loss
        if section.optimizer != defaults.optimizer or section.optimizer_options:
            from fedlink.models.training import build_optimizer

            settings["optimizer"] = build_optimizer(section.optimizer,
                                                    section.optimizer_options)
        if section.keep_local:
            settings["keep_local"] = section.keep_local
        if section.device != DEFAULT_DEVICE:
            settings["device"] = self.device
        return settings

    @property
    def may_share_working_model(self) -> bool:
        """Whether trainers used one at a time may all train in one module (``trainer``'s
        ``model``): the built-in trainer loads every tensor that training changes from the
        task's vector before it trains, and a built-in model holds nothing else that changes."""
        built_in_model = self.plugs.model is None and not self.config.model.factory
        built_in_trainer = self.plugs.trainer is None and self.config.client.trainer == "torch"
        return built_in_model and built_in_trainer

    def client_seed(self, index: int) -> int:
        """The seed of client ``index``'s trainer and of its held-out split."""
        return self.config.run.seed * 7919 + index

    def trainer(self, index: int, *, model: nn.Module | None = None,
                factory: TrainerFactory | None = None) -> Trainer:
        """The trainer of client ``index``, over its local data (loaded on first use when the
        data loader made that client's share lazy).

        It trains in a fresh model, or in ``model`` when given: a working module that trainers
        used one after another share (see ``may_share_working_model``). ``factory`` (default:
        ``trainer_factory()``, built per call) builds it: a virtual run passes one it keeps
        (``WorkingModelTrainers``).
        """
        factory = factory or self.trainer_factory()
        seed = self.client_seed(index)

        def make(data: Any, working: nn.Module | None) -> Trainer:
            trainer = factory(self.new_model() if working is None else working, data,
                              seed=seed)
            if not isinstance(trainer, Trainer):
                raise ConfigError(f"trainer factory {describe(factory)} returned a "
                                  f"{type(trainer).__name__}, expected a fedlink.client.Trainer "
                                  f"(num_examples() and train(params, plan))")
            return trainer

        def build() -> Trainer:
            data = self.data.client(index) if isinstance(self.data, TorchFederatedData) \
                else self.data.clients[index]
            share = self.config.coordinator.evaluation.holdout
            if not share:
                return make(data, model)
            from fedlink.client.evaluation import HeldOutEvaluation
            train_part, held_out = split_holdout(data, share, seed)
            try:
                return HeldOutEvaluation(make(train_part, model), make(held_out, None))
            except AttributeError as exc:
                raise ConfigError(f"[coordinator.evaluation] holdout needs a trainer that "
                                  f"can evaluate (an evaluate(params) method): {exc}") from exc

        if self.data_is_lazy(index):
            # only the built-in torch trainer is known to evaluate without building it
            builtin_torch = self.plugs.trainer is None and self.config.client.trainer == "torch"
            return LazyTrainer(build, self._known_examples(index), evaluates=builtin_torch)
        return build()

    def _known_examples(self, index: int) -> int | None:
        """Client ``index``'s example count when it is known without reading its data: a
        built-in trainer over a fedlink ``Dataset`` trains on all of it."""
        built_in = self.plugs.trainer is None and self.config.client.trainer in TRAINERS
        if built_in and isinstance(self.data, FederatedData):
            examples = len(self.data.clients[index])
            return examples - held_out_count(examples, self.config.coordinator.evaluation.holdout)
        return None

    def data_is_lazy(self, index: int) -> bool:
        """Whether client ``index``'s data is read when it first trains (a torch loader's
        callable entry, or a file loader's ``LazyDataset`` not read yet)."""
        if isinstance(self.data, TorchFederatedData):
            return self.data.is_lazy(index)
        client = self.data.clients[index]
        return isinstance(client, LazyDataset) and not client.loaded

    def client_examples(self, index: int) -> int:
        """Client ``index``'s example count; for a built-in trainer over fedlink ``Dataset``s,
        read from its data without building the trainer (a plugged trainer is asked)."""
        known = self._known_examples(index)
        return known if known is not None else self.trainer(index).num_examples()

    def data_figures(self) -> dict[str, Any]:
        """Summary entries describing the partition: the clients x classes label counts
        (``fedlink.metrics.distribution``), for fedlink ``Dataset``s."""
        if not isinstance(self.data, FederatedData):
            return {}
        return {"label_distribution": label_distribution(
            [client.label_counts().tolist() for client in self.data.clients])}

    def fill_kept_local(self, vector: np.ndarray, trainers: Sequence[Any],
                        ) -> tuple[np.ndarray, dict[str, Any]]:
        """The central model with its ``[client] keep_local`` tensors filled, and the record
        of how (``summary.json``'s ``kept_local``).

        The coordinator never sees those tensors (each client keeps its own), so the global
        vector holds their initial values: scored centrally, or loaded from ``model.pt``, it
        would be a model nobody trained. Filled with the example-weighted mean of the values
        the clients (``trainers``, this process's) last kept, it is the natural central
        counterpart of FedBN's per-client models; ``({}, vector)`` without ``keep_local``.
        """
        patterns = self.config.client.keep_local
        if not patterns:
            return vector, {}
        from fedlink.client.torch_trainer import local_mask  # torch: as the trainers are

        model = self.new_model()
        spec = spec_of(model)
        mask = local_mask(spec, patterns, model)
        kept, weights = [], []
        for trainer in trainers:
            inner = _innermost(trainer)
            personalize = getattr(inner, "personalize", None)
            if personalize is None:
                continue
            mine = np.asarray(personalize(vector))[mask]
            if not np.array_equal(mine, vector[mask]):  # it trained, and kept these
                kept.append(mine)
                weights.append(max(1, int(inner.num_examples())))
        names = [n for n, o, k in zip(spec.names, spec.offsets, spec.numels, strict=True)
                 if mask[o:o + k].any()]
        filled = np.array(vector, dtype=np.float32, copy=True)
        if kept:
            filled[mask] = np.average(np.stack(kept), axis=0, weights=weights)
            _round_counters(filled, spec, mask)
            how = (f"the example-weighted mean of the values {len(kept)} clients kept "
                   f"after their last task")
        elif not trainers:  # a coordinator alone (fedlink serve): the clients hold them
            how = ("their initial values: the coordinator never receives the tensors its "
                   "clients keep (each client's own stay on the client)")
        else:
            how = "their initial values: no client kept values of its own"
        return filled, {"patterns": list(patterns), "tensors": names, "clients": len(kept),
                        "filled_with": how,
                        "central_accuracy": "final_accuracy scores the filled central model; "
                                            "the per-flush central accuracies score the "
                                            "global model with these tensors at their "
                                            "initial values, and mean little"}

    def state_dict(self, vector: np.ndarray) -> dict[str, torch.Tensor]:
        """``vector`` as the model's ``state_dict`` (what ``torch.save`` writes)."""
        model = self.new_model()
        load_vector(model, vector)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    def save_model(self, run_dir: Path, vector: np.ndarray) -> dict[str, torch.Tensor]:
        """Write the final model as ``model.pt`` (state_dict) and ``model.npy`` (vector),
        each atomically and ``0600`` (``fedlink.atomic``): a stop at any instant leaves the
        previous file or the new one, never a torn or world-readable one."""
        state = self.state_dict(vector)
        private_dir(run_dir)
        write_atomic_with(run_dir / MODEL_FILENAME, lambda f: torch.save(state, f))
        flat = np.asarray(vector, dtype=np.float32)
        write_atomic_with(run_dir / VECTOR_FILENAME, lambda f: np.save(f, flat))
        return state


def held_out_count(examples: int, share: float) -> int:
    """How many of a client's ``examples`` ``[coordinator.evaluation] holdout = share``
    keeps out of training: ``share`` of them rounded, at least one, and never all (a client
    of one example trains on it and scores nothing apart)."""
    if share <= 0 or examples < 2:
        return 0
    return min(examples - 1, max(1, round(share * examples)))


def split_holdout(data: Any, share: float, seed: int) -> tuple[Any, Any]:
    """``(training part, held-out part)`` of one client's data, a seeded random split
    (``held_out_count``); a fedlink ``Dataset`` or a torch ``Dataset``."""
    if isinstance(data, torch.utils.data.DataLoader):
        raise ConfigError("[coordinator.evaluation] holdout cannot split a client's "
                          "DataLoader: have the data loader return torch Datasets")
    examples = len(data)
    order = np.random.default_rng([seed & (2**63 - 1), 0x401D]).permutation(examples)
    held = held_out_count(examples, share)
    parts = np.sort(order[held:]), np.sort(order[:held])
    if isinstance(data, Dataset):
        return data.subset(parts[0]), data.subset(parts[1], f"{data.name}-held-out")
    return (torch.utils.data.Subset(data, parts[0].tolist()),
            torch.utils.data.Subset(data, parts[1].tolist()))


def _innermost(trainer: Any) -> Any:
    """The trainer a simulation's wrappers hold (slowed, partial work, lazy): the one that
    keeps a client's state (``None`` for a lazy trainer never built)."""
    while True:
        if hasattr(trainer, "built") and hasattr(trainer, "_trainer"):  # a LazyTrainer
            trainer = trainer._trainer
        elif hasattr(trainer, "trainer") and not hasattr(trainer, "personalize"):
            trainer = trainer.trainer
        else:
            return trainer


def _round_counters(vector: np.ndarray, spec: ParamSpec, mask: np.ndarray) -> None:
    """Integer counters (``num_batches_tracked``) among the filled entries, rounded: a mean
    of counters is a counter again only once it is a whole number."""
    from fedlink.params.base import COUNTER

    for offset, numel, kind in zip(spec.offsets, spec.numels, spec.kinds, strict=True):
        if kind == COUNTER and mask[offset:offset + numel].any():
            vector[offset:offset + numel] = np.round(vector[offset:offset + numel])


SETTING_KEYS = {"loss": "[client] loss", "optimizer": "[client] optimizer / optimizer_options",
                "keep_local": "[client] keep_local", "device": "[client] device"}


def with_settings(factory: Any, settings: Mapping[str, Any]) -> TrainerFactory:
    """``factory`` given the ``settings`` it takes by keyword (``loss=``, ``optimizer=``,
    ``keep_local=``, ``device=`` (a ``torch.device``), or ``**kwargs``); a setting it cannot
    take is refused, naming the key and the factory, rather than dropped."""
    if not settings:
        return factory  # type: ignore[no-any-return]
    accepted = keyword_names(factory)
    refused = [] if accepted is None else sorted(set(settings) - accepted)
    if refused:
        keys = ", ".join(SETTING_KEYS[k] for k in refused)
        raise ConfigError(f"{keys} cannot apply: the trainer factory {describe(factory)} "
                          f"([client] trainer) does not take {', '.join(f'{k}=' for k in refused)}"
                          f". Give the factory those keyword parameters, or unset {keys}")

    def build(model: Any, data: Any, *, seed: int) -> Trainer:
        return factory(model, data, seed=seed, **settings)  # type: ignore[no-any-return]

    build.__qualname__ = getattr(factory, "__qualname__", "trainer")
    build.__module__ = getattr(factory, "__module__", __name__)
    return build


def load_saved(model: nn.Module, path: Path) -> np.ndarray:
    """The vector of a saved model (``.pt`` state_dict or ``.npy`` vector) for ``model``'s
    architecture (``ConfigError`` naming the file when it is missing or does not fit)."""
    if not path.is_file():
        raise ConfigError(f"model.init: no saved model at {path}")
    if path.suffix == ".npy":
        return spec_of(model).check(np.load(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ConfigError(f"model.init: {path} does not fit the model: {exc}") from exc
    return to_vector(model)


def pooled_train(data: FederatedData, holdout: float = 0.0,
                 client_seed: Callable[[int], int] | None = None) -> Dataset:
    """Every client's training examples in one dataset (the federation's training set): with
    ``holdout``, only the part each client trains on (``split_holdout`` with the client's
    seed, ``client_seed(index)``), since the part it keeps out is not training data."""
    clients: Sequence[Dataset] = data.clients
    if holdout:
        if client_seed is None:
            raise ValueError("pooled_train: a holdout needs the clients' seeds")
        clients = [split_holdout(c, holdout, client_seed(i))[0] for i, c in enumerate(clients)]
    return Dataset(x=np.concatenate([c.x for c in clients]),
                   y=np.concatenate([c.y for c in clients]),
                   num_classes=data.num_classes, num_features=data.num_features,
                   name=f"{data.name}-train")
