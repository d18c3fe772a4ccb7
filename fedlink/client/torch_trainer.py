"""``TorchTrainer``: the ``Trainer`` protocol for any torch ``nn.Module`` on local data (a fedlink
``Dataset``, a torch ``Dataset`` or a ``DataLoader``), with its loss, optimizer and ``keep_local``.

Import it explicitly (``from fedlink.client.torch_trainer import TorchTrainer``): it is the one
part of the client SDK that needs torch, and ``fedlink.client`` does not import it.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import functools
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedlink.client.base import TrainPlan, TrainResult, planned_steps, proximal_mu
from fedlink.client.device import DEFAULT_DEVICE, check_device
from fedlink.clock import RealClock
from fedlink.data.base import Dataset
from fedlink.errors import ConfigError
from fedlink.models.evaluate import generic_scores
from fedlink.models.training import (
    LossFn,
    OptimizerFactory,
    PlainSGD,
    build_loss,
)
from fedlink.params import ParamSpec
from fedlink.params.flat import BoundVector

TorchData = Dataset | torch.utils.data.Dataset | torch.utils.data.DataLoader
"""What a ``TorchTrainer`` trains on: fedlink's numpy ``Dataset``, a torch ``Dataset`` (batched
here, shuffled by the plan's seed) or a torch ``DataLoader`` (used as it is: the user's batch
size, sampler, transforms and collate)."""

Batch = tuple[torch.Tensor, torch.Tensor]

_SEED_MASK = (1 << 64) - 1
EVAL_BATCH = 1024
"""Examples per forward pass when a client evaluates the global model on its data."""


sgd = PlainSGD
"""The default optimizer factory: plain SGD (no momentum), which needs no ``torch.optim``."""


@functools.cache
def _warm_up_torch_optim() -> None:
    """Pay torch's one-off cost of a first ``torch.optim`` optimizer (a lazy import of
    ``torch._dynamo``: seconds).

    Done once per process when a trainer with such an optimizer is built, so it does not eat
    into the first task's deadline.
    """
    weight = torch.zeros(1, requires_grad=True)
    weight.grad = torch.zeros(1)
    torch.optim.SGD([weight], lr=1.0).step()  # the first step() is what pays the cost


def _proximal_term(params: list[nn.Parameter], anchor: list[torch.Tensor]) -> torch.Tensor:
    """``||w - w_global||^2`` over all trainable parameters."""
    return sum(((p - a) ** 2).sum() for p, a in zip(params, anchor, strict=True))  # type: ignore[return-value]


FitKey = tuple[tuple[int, ...], torch.dtype, torch.device, int]
"""What ``_check_fits`` found a model to fit: (example shape, dtype, device, classes)."""


def _check_fits(model: nn.Module, x: torch.Tensor, num_classes: int,
                fitted: set[FitKey]) -> None:
    """``ConfigError`` unless ``model`` maps a batch of ``x`` to ``num_classes`` logits.

    Runs one small forward pass in eval mode (restoring the mode), so a model built for other
    data fails here, with a clear message, rather than inside the first task. Skipped for a
    key already in ``fitted`` (the trainer's, shared with those derived from it by
    ``for_client``): the pass reads no weights that matter to the answer.
    """
    key = (tuple(x.shape[1:]), x.dtype, x.device, num_classes)
    if key in fitted:
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x[:2])
    except RuntimeError as exc:
        raise ConfigError(f"the model cannot take inputs of {x.shape[1]} features: {exc}") from exc
    finally:
        model.train(was_training)
    if tuple(out.shape) != (len(x[:2]), num_classes):
        raise ConfigError(
            f"the model maps {x.shape[1]} features to shape {tuple(out.shape)[1:]}, "
            f"expected {num_classes} class logits"
        )
    fitted.add(key)


def resolve_device(setting: str | torch.device = DEFAULT_DEVICE, worker: int = 0,
                   key: str = "device") -> torch.device:
    """The torch device a device setting (``fedlink.client.device``) means on this machine,
    for training worker ``worker`` (``"cuda"`` and ``"auto"`` spread workers over the visible
    CUDA devices); ``ConfigError`` naming ``key`` when that device is not here."""
    if isinstance(setting, torch.device):
        setting = str(setting)
    check_device(setting, key)
    if setting == "cpu":  # a trainer per simulated task asks: no accelerator probing
        return _CPU
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if setting == "auto":
        setting = "cuda" if cuda else "mps" if mps else "cpu"
    if setting == "cpu":
        return _CPU
    if setting == "mps":
        if not mps:
            raise ConfigError(f"{key} = 'mps': this machine has no MPS device (torch "
                              f"{torch.__version__}); set {key} = \"cpu\", or \"auto\" to use "
                              f"an accelerator where there is one")
        return torch.device("mps")
    index = worker % cuda if cuda and setting == "cuda" else int(setting.partition(":")[2] or 0)
    if index >= cuda:
        found = f"{cuda} CUDA device{'s' if cuda != 1 else ''}" if cuda else \
            f"no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})"
        raise ConfigError(f"{key} = {setting!r}: this machine has {found}; set {key} = "
                          f"\"cpu\", or \"auto\" to use a GPU where there is one")
    return torch.device("cuda", index)


_CPU = torch.device("cpu")


def _bound_on(model: nn.Module, device: torch.device) -> BoundVector:
    """``model``'s ``BoundVector`` with every parameter and buffer on ``device``, moving the
    model there first when one is elsewhere."""
    bound = BoundVector.of(model)
    if bound.devices <= {device}:
        return bound
    return BoundVector.of(model.to(device))


def _new_tensor(array: np.ndarray, dtype: torch.dtype,
                device: torch.device | str) -> torch.Tensor:
    """A copy of ``array`` as a tensor of ``dtype`` on ``device``: numpy's copy wrapped, then
    converted only where it differs (``torch.tensor`` on an array costs several times more,
    once per simulated task)."""
    return torch.from_numpy(np.array(array)).to(dtype=dtype, device=device)


class _TensorBatches:
    """A numpy ``Dataset`` as tensors on the device, sliced by a shuffled index (fast path)."""

    def __init__(self, data: Dataset, dtype: torch.dtype, device: torch.device | str) -> None:
        if len(data) == 0:
            raise ConfigError(f"cannot train on empty dataset {data.name!r}")
        self.x = _new_tensor(data.x, dtype, device)
        self.y = _new_tensor(data.y, torch.int64, device)

    def __len__(self) -> int:
        return len(self.y)

    def batch_size(self, plan: TrainPlan) -> int:
        return plan.batch_size

    def in_order(self, batch_size: int) -> Iterator[Batch]:
        """One pass in order (for evaluation)."""
        for start in range(0, len(self), batch_size):
            yield self.x[start: start + batch_size], self.y[start: start + batch_size]

    def batches(self, plan: TrainPlan, generator: torch.Generator) -> Iterator[Batch]:
        """Endless minibatches: a fresh shuffle per epoch, split into ``batch_size``."""
        on_cpu = self.x.device.type == "cpu"  # the shuffle is drawn on the CPU
        while True:
            order = torch.randperm(len(self), generator=generator)
            if not on_cpu:
                order = order.to(self.x.device)
            # a small client's epoch is one batch: the whole shuffle, no split
            parts = (order,) if len(order) <= plan.batch_size else \
                torch.split(order, plan.batch_size)
            for index in parts:  # index_select: x[index]'s values, without parsing an index
                yield self.x.index_select(0, index), self.y.index_select(0, index)


class _LoaderBatches:
    """A torch ``Dataset`` (batched with the plan's batch size) or the user's ``DataLoader``."""

    def __init__(self, data: torch.utils.data.Dataset | torch.utils.data.DataLoader,
                 device: torch.device | str) -> None:
        self.loader = data if isinstance(data, torch.utils.data.DataLoader) else None
        self.dataset: Any = data.dataset if isinstance(data, torch.utils.data.DataLoader) \
            else data
        if not hasattr(self.dataset, "__len__"):
            raise ConfigError("a torch dataset to train on must have a length (an iterable "
                              "dataset cannot say how many examples weight its updates)")
        if len(self.dataset) == 0:
            raise ConfigError("cannot train on an empty torch dataset")
        self.device = device

    def __len__(self) -> int:
        return len(self.dataset)

    def batch_size(self, plan: TrainPlan) -> int:
        own = None if self.loader is None else self.loader.batch_size
        return plan.batch_size if own is None else own

    def in_order(self, batch_size: int) -> Iterator[Batch]:
        """One pass (the user's loader as it is, else the dataset in order), for evaluation."""
        loader = self.loader or torch.utils.data.DataLoader(self.dataset, batch_size=batch_size)
        for x, y in loader:
            yield x.to(self.device), y.to(self.device)

    def batches(self, plan: TrainPlan, generator: torch.Generator) -> Iterator[Batch]:
        """Endless batches, moved to the device: epoch after epoch of the loader."""
        loader = self.loader or torch.utils.data.DataLoader(
            self.dataset, batch_size=plan.batch_size, shuffle=True, generator=generator)
        while True:
            for batch in loader:
                if not isinstance(batch, tuple | list) or len(batch) != 2:
                    raise ConfigError("each batch must be (inputs, targets), got a "
                                      f"{type(batch).__name__}")
                yield batch[0].to(self.device), batch[1].to(self.device)


def _bind_data(data: TorchData, dtype: torch.dtype,
               device: torch.device | str) -> _TensorBatches | _LoaderBatches:
    if isinstance(data, Dataset):
        return _TensorBatches(data, dtype, device)
    if isinstance(data, torch.utils.data.Dataset | torch.utils.data.DataLoader):
        return _LoaderBatches(data, device)
    raise ConfigError(f"cannot train on a {type(data).__name__}: expected a fedlink Dataset, "
                      f"a torch Dataset or a torch DataLoader")


def local_mask(spec: ParamSpec, patterns: Sequence[str], model: nn.Module) -> np.ndarray:
    """Boolean mask over the vector: the entries of tensors that ``patterns`` keep local.

    A pattern is ``"batchnorm"`` (every tensor of every BatchNorm layer: FedBN), a glob matched
    against the full name (``"head.*"``), or a bare word matching any name with a dotted part
    that starts with it (``"bn"`` keeps ``bn1.weight`` and ``features.bn.running_mean``).
    ``ConfigError`` when a pattern matches nothing (a typo would otherwise share everything).
    """
    mask = np.zeros(spec.size, dtype=bool)
    if not patterns:  # the common case, once per simulated task: no walk of the module
        return mask
    batchnorm = {f"{module_name}.{tensor}" if module_name else tensor
                 for module_name, module in model.named_modules()
                 if isinstance(module, nn.modules.batchnorm._BatchNorm)
                 for tensor in (*dict(module.named_parameters(recurse=False)),
                                *dict(module.named_buffers(recurse=False)))}

    def matches(name: str, pattern: str) -> bool:
        if pattern == "batchnorm":
            return name in batchnorm
        if any(ch in pattern for ch in "*?["):
            return fnmatch.fnmatchcase(name, pattern)
        return any(part.startswith(pattern) for part in name.split("."))

    for pattern in patterns:
        hits = [i for i, name in enumerate(spec.names) if matches(name, pattern)]
        if not hits:
            raise ConfigError(f"keep_local pattern {pattern!r} matches none of {spec.names}")
        for i in hits:
            mask[spec.offsets[i]: spec.offsets[i] + spec.numels[i]] = True
    return mask


class TorchTrainer:
    """Local training of any torch ``nn.Module`` over flat float32 parameter vectors.

    ``data`` is a fedlink ``Dataset`` (converted to tensors on ``device`` once; each step slices
    them with a shuffled index), a torch ``Dataset`` of ``(input, target)`` pairs of any shape
    and dtype (batched with the plan's batch size, shuffled by a seeded generator), or a torch
    ``DataLoader`` (used as it is, with its own batch size, sampler, transforms and collate).
    ``model`` is moved to ``device`` and used as the working copy: ``train`` overwrites its
    trainable parameters and buffers (``fedlink.params`` says which tensors the vector holds).

    ``loss`` is a name of ``fedlink.models.training.LOSSES`` (``cross_entropy``, ``mse``,
    ``bce_with_logits``, ``l1``, ``huber``, ``nll``), an import string, or a callable
    ``(output, target) -> loss``. ``optimizer`` is an ``(params, lr) -> Optimizer`` factory
    (``fedlink.models.training.build_optimizer`` makes one from a name and options); each
    ``train`` call builds a fresh one (no momentum or Adam state carries over between tasks;
    each task starts from a new global model).

    ``keep_local`` (see ``local_mask``; ``["batchnorm"]`` is FedBN) names tensors that stay on
    this client: each task starts from the global vector with these entries replaced by this
    client's own values, and the vector sent back carries the global values for them, so their
    delta is zero and the coordinator never moves them. ``personalize(vector)`` is a global
    vector with this client's local entries in it.

    Minibatch order comes from a generator seeded by (``seed``, ``plan.seed``): the same plan
    gives the same shuffles. ``plan.options["prox_mu"]`` adds FedProx's proximal term
    ``mu / 2 * ||w - w_global||^2``; subclasses add an algorithm's own local terms by
    overriding ``objective`` and keep per-client state in ``after_task`` (see
    ``examples/custom_algorithm.py``). The reported ``train_loss`` is the plain loss.
    ``clock`` (a function returning seconds; default ``RealClock().now``, the session's
    default) is what ``plan.deadline`` is compared with: give it the ``ClientSession``'s.
    ``device``: a ``torch.device`` or a setting of ``fedlink.client.device`` (``"cpu"``,
    ``"cuda:0"``, ``"auto"``, ...; ``resolve_device``); the model and the data go there.

    Raises ``ConfigError`` when the dataset is empty, when the device is not on this machine,
    or, for a fedlink ``Dataset`` with the cross-entropy loss, when the model does not map its
    features to ``num_classes`` logits.
    Attributes: ``model`` (the working module), ``spec`` (its ``ParamSpec``).
    """

    def __init__(
        self,
        model: nn.Module,
        data: TorchData,
        *,
        optimizer: OptimizerFactory = PlainSGD,
        loss: str | LossFn = "cross_entropy",
        keep_local: Sequence[str] = (),
        device: torch.device | str = DEFAULT_DEVICE,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        device = resolve_device(device)
        # one walk of the module, cached while its tensors stay (a simulation builds a trainer
        # per task on one working module, already on the device): .to() would walk it again
        self._vector = _bound_on(model, device)
        self.model = model
        self._params = self._vector.trainable
        if not self._params:
            raise ConfigError("the model has no trainable parameters")
        self.spec = self._vector.spec
        self._device = device
        self._checks_fit = isinstance(loss, str) and loss == "cross_entropy"
        self._fitted: set[FitKey] = set()  # shared with the trainers for_client derives
        self._data = self._bind(data)
        self._loss = build_loss(loss)
        self._optimizer = optimizer
        self._local_mask = local_mask(self.spec, keep_local, self.model)
        self._keeps_local = bool(keep_local) and bool(self._local_mask.any())
        self._local: np.ndarray | None = None  # this client's kept entries, after a task
        self._seed = seed
        self._clock = clock or RealClock().now  # the clock plan.deadline is on
        if optimizer is not PlainSGD:
            _warm_up_torch_optim()

    def for_client(self, data: TorchData, seed: int) -> TorchTrainer:
        """A trainer over another client's ``data`` with its ``seed``, as building one with
        this one's other arguments gives, without finding and checking the module again.

        It shares this trainer's working module (and its ``BoundVector``), loss, optimizer
        factory, ``keep_local`` mask, device and clock, none of which a task changes, and holds
        none of this one's per-client state (data, seed, kept-local entries). For trainers used
        one at a time in one working module whose tensors stay the same objects meanwhile
        (``WorkingModelTrainers``). A subclass may keep per-client state of its own that a copy
        would share: ``TypeError`` unless this is a plain ``TorchTrainer``.
        """
        if type(self) is not TorchTrainer:
            raise TypeError(f"for_client derives plain TorchTrainers only, not a "
                            f"{type(self).__name__} (its own state would be shared)")
        derived = copy.copy(self)  # shallow: what is shared is never changed by a task
        derived._data = derived._bind(data)
        derived._seed = seed
        derived._local = None
        return derived

    def _bind(self, data: TorchData) -> _TensorBatches | _LoaderBatches:
        """``data`` ready to train on; for a fedlink ``Dataset`` with the cross-entropy loss,
        checked to fit the model (once per example shape: ``_check_fits``)."""
        bound = _bind_data(data, self._params[0].dtype, self._device)
        if isinstance(bound, _TensorBatches) and self._checks_fit:
            assert isinstance(data, Dataset)
            _check_fits(self.model, bound.x, data.num_classes, self._fitted)
        return bound

    def num_examples(self) -> int:
        """Number of local training examples."""
        return len(self._data)

    def personalize(self, vector: np.ndarray) -> np.ndarray:
        """``vector`` (a global model) with this client's ``keep_local`` entries put in."""
        mine = self.spec.check(vector).copy()
        if self._local is not None:
            mine[self._local_mask] = self._local
        return mine

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Train from ``params`` (not modified) as ``plan`` says; see the class docstring.

        Stops before the next step once ``clock() > plan.deadline`` and reports the steps it
        completed. ``metrics`` holds ``train_seconds`` and, when at least one step ran,
        ``train_loss`` (the mean minibatch loss over the steps).
        """
        started = time.perf_counter()
        batch_size = self._data.batch_size(plan)
        sized = plan if batch_size == plan.batch_size else dataclasses.replace(
            plan, batch_size=batch_size)
        steps_planned = planned_steps(sized, self.num_examples())
        # nothing kept local: the global vector as it is (load copies it; no copy of our own)
        self._vector.load(self.personalize(params) if self._keeps_local else params)
        loss_sum, steps = self._run(plan, steps_planned)
        metrics = {"train_seconds": time.perf_counter() - started}
        if steps:
            metrics["train_loss"] = loss_sum / steps
        trained = self._vector.read()
        if self._keeps_local:
            self._local = trained[self._local_mask].copy()
            trained[self._local_mask] = self.spec.check(params)[self._local_mask]
        return TrainResult(params=trained, num_examples=self.num_examples(),
                           steps_completed=steps, steps_planned=steps_planned, metrics=metrics)

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """``loss``, ``accuracy`` (classification) and ``examples`` of the model ``params``
        (with this client's ``keep_local`` entries) on the local data, in eval mode.

        Federated evaluation (``fedlink.client.evaluation``) calls it on the global model of
        an evaluation task.
        """
        self._vector.load(self.personalize(params))
        self.model.eval()
        scores = generic_scores(self.model, self._data.in_order(EVAL_BATCH), self._loss)
        return {**scores, "examples": float(self.num_examples())}

    def objective(self, loss: torch.Tensor, anchor: list[torch.Tensor],
                  plan: TrainPlan) -> torch.Tensor:
        """What a step minimises: ``loss`` plus FedProx's proximal term when ``prox_mu > 0``.

        ``anchor`` holds the trainable parameters as the task started (the global model).
        Override to add an algorithm's local regulariser.
        """
        mu = proximal_mu(plan)
        return loss + mu / 2 * _proximal_term(self._params, anchor) if mu else loss

    def after_task(self, anchor: list[torch.Tensor], plan: TrainPlan) -> None:
        """Called after local training, with the model trained; override to update an
        algorithm's per-client state (the default keeps none)."""

    def _run(self, plan: TrainPlan, steps_planned: int) -> tuple[float, int]:
        """Run up to ``steps_planned`` steps; (summed loss, steps completed)."""
        optimizer = self._optimizer(self._params, plan.learning_rate)
        anchor = [p.detach().clone() for p in self._params] if self._uses_anchor(plan) else []
        batches = itertools.islice(self._data.batches(plan, self._generator(plan)),
                                   steps_planned)
        # the losses summed in float64: on the CPU as a Python float (the same sum, without
        # two tensor ops per step), else in a CPU tensor (MPS has no float64)
        on_cpu = self._params[0].device.type == "cpu"
        total: float | torch.Tensor = 0.0 if on_cpu else torch.zeros((), dtype=torch.float64)
        steps = 0
        if not all(module.training for module in self.model.modules()):
            self.model.train()  # a simulation's working module stays in training mode
        with torch.enable_grad():
            for x, y in batches:
                if plan.deadline is not None and self._clock() > plan.deadline:
                    break
                optimizer.zero_grad(set_to_none=True)
                loss = self._loss(self.model(x), y)
                self.objective(loss, anchor, plan).backward()
                optimizer.step()
                total += loss.item() if on_cpu else loss.detach().cpu()
                steps += 1
        self.after_task(anchor, plan)
        return float(total), steps

    def _uses_anchor(self, plan: TrainPlan) -> bool:
        """Whether this task needs the starting weights: FedProx's term, or a subclass's
        ``objective`` or ``after_task`` (which may read them)."""
        own = type(self)
        return bool(proximal_mu(plan)) or own.objective is not TorchTrainer.objective \
            or own.after_task is not TorchTrainer.after_task

    def _generator(self, plan: TrainPlan) -> torch.Generator:
        """The shuffling generator of one task, seeded by (``seed``, ``plan.seed``)."""
        state = np.random.SeedSequence([self._seed & _SEED_MASK, plan.seed & _SEED_MASK])
        return torch.Generator().manual_seed(int(state.generate_state(1, np.uint64)[0]))


class WorkingModelTrainers:
    """A trainer factory ``(model, data, *, seed) -> Trainer`` for trainers used one at a
    time in one working module, ``model`` (a virtual run's tasks, in one process), built by
    ``factory`` (of the same signature).

    The first trainer in ``model`` is the factory's; when that is a plain ``TorchTrainer``,
    the next ones are derived from it (``TorchTrainer.for_client``): each task still gets a
    trainer of its own, without the per-task cost of finding and checking the module's
    tensors, resolving the device and building the loss. Only where the factory is known to
    build plain ``TorchTrainer``\\ s from fixed settings (the built-in trainer: the run's loss,
    optimizer, ``keep_local`` and device), so a derived trainer is the one the factory would
    build. Called with another model (a held-out evaluation's own), it calls the factory.

    It lives as long as the working module is used this way (a virtual run's population, a
    worker's) and owns it: nothing else may replace the module's tensors meanwhile (loading
    values into them, as an evaluator does, is fine; every task loads all of them first).
    """

    def __init__(self, factory: Callable[..., Any], model: nn.Module) -> None:
        self.model = model
        self._factory = factory
        self._first: TorchTrainer | None = None

    def __call__(self, model: nn.Module, data: TorchData, *, seed: int) -> Any:
        """The trainer of a client over ``data`` with ``seed``, in ``model``."""
        if model is not self.model:
            return self._factory(model, data, seed=seed)
        if self._first is not None:
            return self._first.for_client(data, seed)
        trainer = self._factory(model, data, seed=seed)
        if type(trainer) is TorchTrainer and trainer.model is model:
            self._first = trainer
            BoundVector.of(model).adopt()  # owned here: one copy per load and per read
        return trainer
