"""Losses and optimizers by name (or import string, or the object itself) for local training.

``build_loss("mse")`` and ``build_optimizer("sgd", {"momentum": 0.9})`` turn a config's words
into what ``fedlink.client.torch_trainer.TorchTrainer`` calls. Register more with
``@LOSSES.register("name")`` (a factory returning ``(output, target) -> scalar tensor``) or
``@OPTIMIZERS.register("name")`` (an optimizer class or ``(params, lr, **options)`` factory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from fedlink.errors import ConfigError
from fedlink.plug import is_import_string, load
from fedlink.registry import Registry

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(model output, target) -> scalar loss`` (mean over the batch)."""


@runtime_checkable
class LocalOptimizer(Protocol):
    """What local training calls on an optimizer: a ``torch.optim.Optimizer`` or ``PlainSGD``."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients."""
        ...

    def step(self) -> Any:
        """Update the parameters from their gradients."""
        ...


OptimizerFactory = Callable[[Iterable[nn.Parameter], float], LocalOptimizer]
"""``(parameters, learning_rate) -> optimizer``."""


class PlainSGD:
    """Plain SGD: ``p -= lr * p.grad`` for each parameter with a gradient.

    The same arithmetic, bit for bit, as ``torch.optim.SGD`` with its defaults (no momentum,
    dampening, weight decay or Nesterov), and what ``"sgd"`` without options builds. It is not
    a ``torch.optim.Optimizer`` on purpose: the first use of one imports ``torch._dynamo``,
    about 3 s of every process's start on a small box, which a client doing plain local SGD,
    or a simulation of thousands of them, has no use for. For param groups, ``state_dict`` or
    an LR scheduler, name ``"torch.optim:SGD"`` or give ``"sgd"`` an option.
    """

    def __init__(self, params: Iterable[nn.Parameter], lr: float) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        if lr < 0:
            raise ValueError(f"invalid learning rate: {lr}")
        self.lr = lr

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every parameter's gradient."""
        for param in self.params:
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One descent step on the gradients there are."""
        stepped: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        for param in self.params:
            if param.grad is not None:
                stepped.append(param)
                grads.append(param.grad)
        # one call for all tensors: the same ``add_`` per tensor (torch.optim.SGD's foreach
        # path does the same), without a Python round trip per tensor of a small model
        if stepped:
            torch._foreach_add_(stepped, grads, alpha=-self.lr)


def sgd(params: Iterable[nn.Parameter], lr: float, **options: Any) -> LocalOptimizer:
    """``PlainSGD`` without options; ``torch.optim.SGD`` with any (``momentum``,
    ``weight_decay``, ``nesterov``, ...)."""
    return torch.optim.SGD(params, lr=lr, **options) if options else PlainSGD(params, lr)


LOSSES: Registry[LossFn] = Registry("loss")
OPTIMIZERS: Registry[LocalOptimizer] = Registry("optimizer")

CLASSIFICATION_LOSSES = frozenset({"cross_entropy", "nll"})
"""Built-in losses whose targets are class indices (the evaluator then reports accuracy)."""


def _like_target(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``output`` reshaped to ``target``'s shape when only singleton dimensions differ: a
    regression head of shape ``(n, 1)`` against targets of shape ``(n,)`` would otherwise
    broadcast to ``(n, n)`` and train silently wrong."""
    if output.shape != target.shape and output.numel() == target.numel():
        return output.reshape(target.shape)
    return output


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error (targets cast to the output's dtype)."""
    return F.mse_loss(_like_target(output, target), target.to(output.dtype))


def l1(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean absolute error."""
    return F.l1_loss(_like_target(output, target), target.to(output.dtype))


def huber(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Huber loss with delta 1."""
    return F.huber_loss(_like_target(output, target), target.to(output.dtype))


def bce_with_logits(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy on logits (targets 0/1, any shape matching the output)."""
    return F.binary_cross_entropy_with_logits(_like_target(output, target),
                                              target.to(output.dtype))


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy of logits ``(n, classes)`` against class indices ``(n,)``."""
    return F.cross_entropy(output, target.long())


def nll(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of log-probabilities against class indices."""
    return F.nll_loss(output, target.long())


for _name, _fn in (("cross_entropy", cross_entropy), ("nll", nll), ("mse", mse), ("l1", l1),
                   ("huber", huber), ("bce_with_logits", bce_with_logits)):
    LOSSES.register(_name)(lambda fn=_fn: fn)


def build_loss(loss: str | LossFn) -> LossFn:
    """A loss function from a registered name, an import string naming one, or the callable."""
    if is_import_string(loss):
        loss = load(loss, "loss")  # type: ignore[arg-type]
    elif isinstance(loss, str):
        loss = LOSSES.create(loss)
    if not callable(loss):
        raise ConfigError(f"loss must be a name, an import string or a callable, got {loss!r}")
    return loss


OPTIMIZERS.register("sgd")(sgd)
OPTIMIZERS.register("adam")(torch.optim.Adam)
OPTIMIZERS.register("adamw")(torch.optim.AdamW)
OPTIMIZERS.register("rmsprop")(torch.optim.RMSprop)
OPTIMIZERS.register("adagrad")(torch.optim.Adagrad)


def build_optimizer(optimizer: str | OptimizerFactory,
                    options: Mapping[str, Any] | None = None) -> OptimizerFactory:
    """An ``(params, lr) -> Optimizer`` factory from a name with options (``"sgd"`` with
    ``{"momentum": 0.9, "weight_decay": 5e-4}``, ``"adam"``, ...), an import string naming an
    optimizer class or such a factory, or the factory itself.

    ``"sgd"`` without options is ``PlainSGD`` (the class itself, which trainers recognise as
    needing no ``torch.optim`` warm-up). Options are checked here, on a throwaway parameter,
    so a misspelt one fails at start.
    """
    extra = dict(options or {})
    if optimizer == "sgd" and not extra and OPTIMIZERS.get("sgd") is sgd:
        return PlainSGD
    if isinstance(optimizer, str):
        name = optimizer

        def factory(params: Iterable[nn.Parameter], lr: float) -> LocalOptimizer:
            return OPTIMIZERS.create(name, params=params, lr=lr, **extra)
    elif callable(optimizer):
        if extra:
            raise ConfigError("optimizer options apply only to an optimizer given by name")
        factory = optimizer  # type: ignore[assignment]
    else:
        raise ConfigError(f"optimizer must be a name, an import string or a factory, "
                          f"got {optimizer!r}")
    probe = factory([nn.Parameter(torch.zeros(1))], 0.01)
    if not isinstance(probe, LocalOptimizer):
        raise ConfigError(f"optimizer factory {optimizer!r} returned a "
                          f"{type(probe).__name__}, expected a torch.optim.Optimizer (or "
                          f"anything with zero_grad and step)")
    return factory
