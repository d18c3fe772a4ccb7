"""``TorchTrainer``: the ``Trainer`` protocol for a torch ``nn.Module`` on a local ``Dataset``.

Import it explicitly (``from fedlink.client.torch_trainer import TorchTrainer``): it is the one
part of the client SDK that needs torch, and ``fedlink.client`` does not import it.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlink.client.base import TrainPlan, TrainResult, planned_steps, proximal_mu
from fedlink.data.base import Dataset
from fedlink.errors import ConfigError
from fedlink.params import ParamSpec
from fedlink.params.flat import load_vector, spec_of, to_vector

OptimizerFactory = Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer]
"""``(parameters, learning_rate) -> optimizer``."""

_SEED_MASK = (1 << 64) - 1


def sgd(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Plain SGD (no momentum): the default optimizer factory."""
    return torch.optim.SGD(params, lr=lr)


@functools.cache
def _warm_up_torch_optim() -> None:
    """Pay torch's one-off cost of a first optimizer (a lazy import of about a second).

    Done once per process when a trainer is built, so it does not eat into the first task's
    deadline.
    """
    weight = torch.zeros(1, requires_grad=True)
    weight.grad = torch.zeros(1)
    torch.optim.SGD([weight], lr=1.0).step()  # the first step() is what pays the cost


def _proximal_term(params: list[nn.Parameter], anchor: list[torch.Tensor]) -> torch.Tensor:
    """``||w - w_global||^2`` over all trainable parameters."""
    return sum(((p - a) ** 2).sum() for p, a in zip(params, anchor, strict=True))  # type: ignore[return-value]


def _check_fits(model: nn.Module, x: torch.Tensor, num_classes: int) -> None:
    """``ConfigError`` unless ``model`` maps a batch of ``x`` to ``num_classes`` logits.

    Runs one small forward pass in eval mode (restoring the mode), so a model built for other
    data fails here, with a clear message, rather than inside the first task.
    """
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


@dataclass(frozen=True)
class LocalData:
    """A model moved to its device, its trainable parameters, and the local data as tensors.

    Built once per trainer, so no training step converts numpy data again.
    """

    model: nn.Module
    spec: ParamSpec
    params: list[nn.Parameter]
    x: torch.Tensor
    y: torch.Tensor

    @classmethod
    def bind(cls, model: nn.Module, data: Dataset, device: torch.device | str) -> LocalData:
        """``ConfigError`` on an empty dataset or a model without trainable parameters."""
        if len(data) == 0:
            raise ConfigError(f"cannot train on empty dataset {data.name!r}")
        model = model.to(device)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError("the model has no trainable parameters")
        x = torch.tensor(data.x, dtype=params[0].dtype, device=device)
        y = torch.tensor(data.y, dtype=torch.int64, device=device)
        return cls(model, spec_of(model), params, x, y)


class TorchTrainer:
    """Local SGD on a torch model over flat float32 parameter vectors.

    The dataset is converted to tensors on ``device`` once, here; each step slices them with a
    shuffled index (no ``DataLoader``). ``model`` is moved to ``device`` and used as the working
    copy: ``train`` overwrites its trainable parameters (see ``fedlink.params`` for which
    tensors the vector holds; buffers are not exchanged).

    Each ``train`` call builds a fresh optimizer from ``optimizer`` (so no momentum or Adam
    state carries over between tasks; each task starts from a new global model). Minibatch
    order comes from a generator seeded by (``seed``, ``plan.seed``): the same plan gives the
    same shuffles, and trainers built with different seeds shuffle differently. Models that draw
    random numbers themselves (dropout) use torch's global generator.
    ``plan.options["prox_mu"]`` adds FedProx's proximal term ``mu / 2 * ||w - w_global||^2``
    to each step's loss (the reported ``train_loss`` stays the plain cross-entropy). ``clock``
    (default ``time.monotonic``) is what ``plan.deadline`` is compared with.

    Raises ``ConfigError`` when the dataset is empty or the model does not map its features to
    ``num_classes`` logits. Attributes: ``model`` (the working module), ``spec`` (its
    ``ParamSpec``).
    """

    def __init__(
        self,
        model: nn.Module,
        data: Dataset,
        *,
        optimizer: OptimizerFactory = sgd,
        device: torch.device | str = "cpu",
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        local = LocalData.bind(model, data, device)
        self.model, self.spec, self._params = local.model, local.spec, local.params
        self._x, self._y = local.x, local.y
        _check_fits(self.model, self._x, data.num_classes)
        self._optimizer = optimizer
        self._seed = seed
        self._clock = clock
        _warm_up_torch_optim()

    def num_examples(self) -> int:
        """Number of local training examples."""
        return len(self._y)

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Train from ``params`` (not modified) as ``plan`` says; see the class docstring.

        Stops before the next step once ``clock() > plan.deadline`` and reports the steps it
        completed. ``metrics`` holds ``train_seconds`` and, when at least one step ran,
        ``train_loss`` (the mean minibatch cross-entropy over the steps).
        """
        started = time.perf_counter()
        steps_planned = planned_steps(plan, self.num_examples())
        load_vector(self.model, params, self.spec)
        loss_sum, steps = self._run(plan, steps_planned)
        metrics = {"train_seconds": time.perf_counter() - started}
        if steps:
            metrics["train_loss"] = loss_sum / steps
        return TrainResult(
            params=to_vector(self.model),
            num_examples=self.num_examples(),
            steps_completed=steps,
            steps_planned=steps_planned,
            metrics=metrics,
        )

    def _run(self, plan: TrainPlan, steps_planned: int) -> tuple[float, int]:
        """Run up to ``steps_planned`` steps; (summed loss, steps completed)."""
        optimizer = self._optimizer(self._params, plan.learning_rate)
        mu = proximal_mu(plan)
        anchor = [p.detach().clone() for p in self._params] if mu > 0 else []
        batches = itertools.islice(self._batches(plan), steps_planned)
        total = torch.zeros((), dtype=torch.float64, device=self._x.device)
        steps = 0
        self.model.train()
        with torch.enable_grad():
            for index in batches:
                if plan.deadline is not None and self._clock() > plan.deadline:
                    break
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(self.model(self._x[index]), self._y[index])
                objective = loss + mu / 2 * _proximal_term(self._params, anchor) if mu else loss
                objective.backward()
                optimizer.step()
                total += loss.detach()
                steps += 1
        return total.item(), steps

    def _batches(self, plan: TrainPlan) -> Iterator[torch.Tensor]:
        """Endless minibatch indices: a fresh shuffle per epoch, split into ``batch_size``."""
        state = np.random.SeedSequence([self._seed & _SEED_MASK, plan.seed & _SEED_MASK])
        generator = torch.Generator().manual_seed(int(state.generate_state(1, np.uint64)[0]))
        while True:
            order = torch.randperm(self.num_examples(), generator=generator)
            yield from torch.split(order.to(self._x.device), plan.batch_size)
