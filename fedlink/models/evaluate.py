"""Test-set accuracy and cross-entropy of a model or of a flat parameter vector."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlink.data.base import Dataset
from fedlink.errors import ConfigError
from fedlink.models.base import build_model
from fedlink.params import ParamSpec
from fedlink.params.flat import load_vector, spec_of

DEFAULT_BATCH = 8192
"""Examples per forward pass when evaluating (bounds memory on large test sets)."""


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
        test: Dataset,
        *,
        options: Mapping[str, object] | None = None,
        spec: ParamSpec | None = None,
        device: torch.device | str = "cpu",
        batch_size: int = DEFAULT_BATCH,
        train: Dataset | None = None,
    ) -> None:
        for data in (test,) if train is None else (test, train):
            if len(data) == 0:
                raise ConfigError(f"cannot evaluate on empty dataset {data.name!r}")
        if batch_size < 1:
            raise ConfigError(f"batch_size: must be >= 1, got {batch_size}")
        self._model = self._prepare(model, test, dict(options or {})).to(device).eval()
        self.spec = spec_of(self._model)
        if spec is not None and spec != self.spec:
            raise ConfigError(f"spec {spec} does not match the model's {self.spec}")
        dtype = next(self._model.parameters()).dtype
        self._x, self._y = dataset_tensors(test, device, dtype)
        self._train = None if train is None else dataset_tensors(train, device, dtype)
        self._batch = batch_size

    @staticmethod
    def _prepare(model: str | nn.Module, test: Dataset, options: dict[str, object]) -> nn.Module:
        """Build a registered model, or copy a given one (options apply only to names)."""
        if isinstance(model, nn.Module):
            if options:
                raise ConfigError("options apply only when the model is given by name")
            return copy.deepcopy(model)
        return build_model(model, test.num_features, test.num_classes, seed=0, **options)

    def __call__(self, vector: np.ndarray) -> dict[str, float]:
        """Accuracy and mean cross-entropy of the parameters ``vector`` on the test set.

        With a ``train`` set, also ``train_accuracy`` and ``train_loss`` on it.
        """
        load_vector(self._model, vector, self.spec)
        scores = _scores(self._model, self._x, self._y, self._batch)
        if self._train is not None:
            train = _scores(self._model, *self._train, self._batch)
            scores.update({f"train_{key}": value for key, value in train.items()})
        return scores
