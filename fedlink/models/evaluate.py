"""Test-set accuracy and loss of a model or of a flat parameter vector."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlink.data.base import Dataset
from fedlink.errors import ConfigError
from fedlink.models.base import build_model
from fedlink.models.training import LossFn, build_loss
from fedlink.params import ParamSpec
from fedlink.params.flat import load_vector, spec_of

DEFAULT_BATCH = 8192
"""Examples per forward pass when evaluating (bounds memory on large test sets)."""

TestData = Dataset | torch.utils.data.Dataset | torch.utils.data.DataLoader
"""A test set: fedlink's numpy ``Dataset``, a torch ``Dataset`` of ``(input, target)`` pairs, or
a torch ``DataLoader`` yielding ``(inputs, targets)`` batches."""

UserEvaluate = Callable[[nn.Module, object], Mapping[str, float]]
"""``evaluate(model, test) -> {"metric": value, ...}``: a user's own evaluation, given the
global model loaded into a module and the run's test set."""


def dataset_tensors(
    data: Dataset, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``data`` as (features, labels) tensors on ``device`` (copied once)."""
    x = torch.tensor(data.x, dtype=dtype, device=device)
    y = torch.tensor(data.y, dtype=torch.int64, device=device)
    return x, y


def _scores(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on (x, y), in eval mode, without grad."""
    loss = torch.zeros((), dtype=torch.float64, device=x.device)
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    with torch.no_grad():
        for start in range(0, len(y), batch):
            logits = model(x[start : start + batch])
            target = y[start : start + batch]
            loss += F.cross_entropy(logits, target, reduction="sum").double()
            correct += (logits.argmax(dim=1) == target).sum()
    count = len(y)
    return {"accuracy": correct.item() / count, "loss": loss.item() / count}


def generic_scores(model: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
                    loss_fn: LossFn) -> dict[str, float]:
    """Mean ``loss_fn`` over every batch (weighted by batch size) and, when the targets are
    class indices and the outputs one score per class, accuracy; eval mode, no grad."""
    loss, correct, count, classified = 0.0, 0, 0, True
    with torch.no_grad():
        for x, y in batches:
            out = model(x)
            loss += float(loss_fn(out, y)) * len(y)
            count += len(y)
            classified = classified and not y.is_floating_point() and out.ndim == 2 \
                and out.shape[1] > 1
            if classified:
                correct += int((out.argmax(dim=1) == y).sum())
    if count == 0:
        raise ConfigError("cannot evaluate on an empty test set")
    scores = {"loss": loss / count}
    if classified:
        scores["accuracy"] = correct / count
    return scores


def _torch_batches(test: torch.utils.data.Dataset | torch.utils.data.DataLoader,
                   device: torch.device | str,
                   batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(inputs, targets)`` batches of a torch test set, in order, on ``device``."""
    loader = test if isinstance(test, torch.utils.data.DataLoader) else \
        torch.utils.data.DataLoader(test, batch_size=batch)
    for x, y in loader:
        yield x.to(device), y.to(device)


def evaluate(model: nn.Module, data: Dataset, batch_size: int = DEFAULT_BATCH) -> dict[str, float]:
    """``{"accuracy", "loss"}`` of ``model``'s current weights on ``data``.

    ``loss`` is the mean cross-entropy. Runs in eval mode without gradients, on the device of
    the model's parameters, and restores the model's train/eval mode afterwards.
    """
    if len(data) == 0:
        raise ConfigError(f"cannot evaluate on empty dataset {data.name!r}")
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None else torch.float32
    x, y = dataset_tensors(data, device, dtype)
    was_training = model.training
    model.eval()
    try:
        return _scores(model, x, y, batch_size)
    finally:
        model.train(was_training)


class Evaluator:
    """Scores flat parameter vectors on a fixed test set: ``evaluator(vector)``.

    ``test`` is a fedlink ``Dataset`` or a torch ``Dataset``/``DataLoader`` (any input shape and
    dtype); ``loss`` (a name of ``fedlink.models.training.LOSSES``, an import string or a
    callable) is the reported ``loss``, and ``accuracy`` is reported whenever the targets are
    class indices and the model scores classes. A fedlink ``Dataset`` with the default
    cross-entropy takes the fast path described next.

    Built once: the model and the test tensors are prepared in the constructor, so each call
    only copies the vector into the model and runs batched forward passes under ``no_grad``.
    This is the callback a coordinator runs after each model update; it returns
    ``{"accuracy": ..., "loss": ...}`` (mean cross-entropy). Given ``train`` (a dataset, say
    every client's training data pooled), it also returns ``train_accuracy`` and ``train_loss``
    on it, at the cost of one more pass over it per call. Not thread-safe: one evaluator holds
    one model, so use one per thread.

    ``model`` is a registered model name (built with ``options``) or a module, which is
    deep-copied (the caller's module is never written to). When ``spec`` is given it must match
    the model, catching a config that names another architecture.
    """

    def __init__(
        self,
        model: str | nn.Module,
        test: TestData,
        *,
        loss: str | LossFn = "cross_entropy",
        options: Mapping[str, object] | None = None,
        spec: ParamSpec | None = None,
        device: torch.device | str = "cpu",
        batch_size: int = DEFAULT_BATCH,
        train: Dataset | None = None,
    ) -> None:
        for data in (test,) if train is None else (test, train):
            if isinstance(data, Dataset) and len(data) == 0:
                raise ConfigError(f"cannot evaluate on empty dataset {data.name!r}")
        if batch_size < 1:
            raise ConfigError(f"batch_size: must be >= 1, got {batch_size}")
        self._model = self._prepare(model, test, dict(options or {})).to(device).eval()
        self.spec = spec_of(self._model)
        if spec is not None and spec != self.spec:
            raise ConfigError(f"spec {spec} does not match the model's {self.spec}")
        dtype = next(self._model.parameters()).dtype
        self._loss = build_loss(loss)
        self._fast = isinstance(test, Dataset) and loss == "cross_entropy"
        self._test = test
        self._device = device
        self._x: torch.Tensor | None = None
        self._y: torch.Tensor | None = None
        if isinstance(test, Dataset):
            self._x, self._y = dataset_tensors(test, device, dtype)
        self._train = None if train is None else dataset_tensors(train, device, dtype)
        self._batch = batch_size

    @staticmethod
    def _prepare(model: str | nn.Module, test: TestData, options: dict[str, object]) -> nn.Module:
        """Build a registered model, or copy a given one (options apply only to names)."""
        if isinstance(model, nn.Module):
            if options:
                raise ConfigError("options apply only when the model is given by name")
            return copy.deepcopy(model)
        if not isinstance(test, Dataset):
            raise ConfigError("a model given by name needs a fedlink Dataset to size it; "
                              "with torch data, pass the model itself")
        return build_model(model, test.num_features, test.num_classes, seed=0, **options)

    def _score(self, x: torch.Tensor | None, y: torch.Tensor | None) -> dict[str, float]:
        """Scores on tensors (x, y), or on the torch test set when they are ``None``."""
        if self._fast and x is not None and y is not None:
            return _scores(self._model, x, y, self._batch)
        if x is not None and y is not None:
            batches: Iterator[tuple[torch.Tensor, torch.Tensor]] = (
                (x[i: i + self._batch], y[i: i + self._batch]) for i in range(0, len(y),
                                                                                self._batch))
        else:
            batches = _torch_batches(self._test, self._device, self._batch)  # type: ignore[arg-type]
        return generic_scores(self._model, batches, self._loss)

    def __call__(self, vector: np.ndarray) -> dict[str, float]:
        """Accuracy and mean cross-entropy of the parameters ``vector`` on the test set.

        With a ``train`` set, also ``train_accuracy`` and ``train_loss`` on it.
        """
        load_vector(self._model, vector, self.spec)
        scores = self._score(self._x, self._y)
        if self._train is not None:
            train = self._score(*self._train)
            scores.update({f"train_{key}": value for key, value in train.items()})
        return scores


class UserEvaluator:
    """A user's ``evaluate(model, test) -> metrics`` as a vector evaluator.

    Each call loads the vector into a private copy of ``model`` (in eval mode, without grad)
    and hands it with ``test`` to ``evaluate``, whose answer must map metric names to finite
    numbers (``ConfigError`` otherwise: a silent ``None`` would plot as nothing).
    The model is on ``device`` (``[client] device``): move each batch to
    ``next(model.parameters()).device``.
    """

    def __init__(self, model: nn.Module, test: object, evaluate: UserEvaluate,
                 device: torch.device | str = "cpu") -> None:
        if not callable(evaluate):
            raise ConfigError(f"evaluator must be callable, got {type(evaluate).__name__}")
        self._model = copy.deepcopy(model).to(device).eval()
        self.spec = spec_of(self._model)
        self._test = test
        self._evaluate = evaluate

    def __call__(self, vector: np.ndarray) -> dict[str, float]:
        """The user's metrics of the parameters ``vector``."""
        load_vector(self._model, vector, self.spec)
        with torch.no_grad():
            metrics = self._evaluate(self._model, self._test)
        if not isinstance(metrics, Mapping):
            raise ConfigError(f"evaluator {self._evaluate!r} returned a "
                              f"{type(metrics).__name__}, expected a mapping of metric names "
                              f"to numbers")
        scores = {str(k): float(v) for k, v in metrics.items()}
        bad = sorted(k for k, v in scores.items() if not math.isfinite(v))
        if bad:
            raise ConfigError(f"evaluator returned non-finite metrics {bad}")
        return scores
