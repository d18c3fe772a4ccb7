"""Contracts of the client SDK: the ``Trainer`` a device plugs in, and what it is asked to do.

Nothing here imports torch: a device with its own trainer (numpy, ONNX, ...) implements
``Trainer`` on flat float32 parameter vectors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from fedlink.errors import ConfigError
from fedlink.params import ParamSpec


@dataclass(frozen=True)
class TrainPlan:
    """How much local training one task asks for.

    ``local_steps`` > 0 means that many SGD steps; otherwise ``local_epochs`` passes over the
    local data. ``deadline`` is an instant on the session's clock (``ClientSession(clock=...)``,
    ``fedlink.clock.RealClock`` by default, whose ``now`` is ``time.monotonic``) after which
    the trainer should stop early and report the work it did (``None``: no deadline); a
    trainer compares it with the same clock (``TorchTrainer(clock=...)``: pass it the
    session's ``clock.now``). ``model_version`` is the version of the global model the task
    trains from (-1: unknown). ``seed`` is this task's seed for the trainer's randomness, a
    non-negative integer: below 2**31 from a seeded client (``ClientOptions.seed``), below
    2**63 from an unseeded one (``np.random.default_rng(plan.seed)`` and ``torch.manual_seed``
    take it whole; the legacy ``np.random.seed`` takes 32 bits only).
    """

    local_steps: int = 0
    local_epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 0.05
    deadline: float | None = None
    seed: int = 0
    options: Mapping[str, str] = field(default_factory=dict)
    model_version: int = -1

    @property
    def uses_steps(self) -> bool:
        """True when the plan counts SGD steps rather than epochs."""
        return self.local_steps > 0


def planned_steps(plan: TrainPlan, num_examples: int) -> int:
    """Optimizer steps ``plan`` asks for on ``num_examples`` examples (validates the plan).

    ``local_steps`` when positive, else ``local_epochs * ceil(num_examples / batch_size)``:
    an epoch is one pass over a fresh shuffle, the last batch possibly smaller.
    """
    if plan.local_steps < 0:
        raise ConfigError(f"local_steps: must be >= 0, got {plan.local_steps}")
    if plan.batch_size < 1:
        raise ConfigError(f"batch_size: must be >= 1, got {plan.batch_size}")
    if not (math.isfinite(plan.learning_rate) and plan.learning_rate > 0):
        raise ConfigError(f"learning_rate: must be finite and > 0, got {plan.learning_rate}")
    if plan.uses_steps:
        return plan.local_steps
    if plan.local_epochs < 1:
        raise ConfigError(
            f"local_epochs: must be >= 1 when local_steps is 0, got {plan.local_epochs}"
        )
    return plan.local_epochs * math.ceil(num_examples / plan.batch_size)


def steps_that_fit(deadline: float | None, now: float, steps: int, step_s: float) -> int:
    """How many of ``steps`` local steps of ``step_s`` seconds each a device starting at
    ``now`` completes before ``deadline`` (``None``: no deadline, all of them), as a trainer
    that stops early at its deadline does."""
    if deadline is None or step_s <= 0:
        return steps
    return max(0, min(steps, int((deadline - now) / step_s)))


PROX_MU = "prox_mu"
"""The trainer option that sets FedProx's ``mu`` (``proximal_mu``)."""


def proximal_mu(plan: TrainPlan) -> float:
    """FedProx's ``mu`` from ``plan.options["prox_mu"]`` (0 when absent: plain local SGD)."""
    raw = plan.options.get(PROX_MU, "0")
    try:
        mu = float(raw)
    except ValueError as exc:
        raise ConfigError(f"prox_mu: must be a number, got {raw!r}") from exc
    if not (math.isfinite(mu) and mu >= 0):
        raise ConfigError(f"prox_mu: must be finite and >= 0, got {raw!r}")
    return mu


@dataclass(frozen=True)
class TrainResult:
    """What local training produced: the new local parameters and how much work was done."""

    params: np.ndarray
    num_examples: int
    steps_completed: int
    steps_planned: int
    metrics: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class AccountsPrivacy(Protocol):
    """A trainer that noises its own training and accounts for it (``DPSGDTrainer``): its
    epsilon travels in its updates' metrics, to a coordinator hook that reads each update."""

    def epsilon(self) -> float:
        """Epsilon spent so far."""
        ...


@runtime_checkable
class Trainer(Protocol):
    """Local training on a device, over flat float32 parameter vectors."""

    def num_examples(self) -> int:
        """Number of local training examples (used to weight this client's updates)."""
        ...

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Train starting from ``params`` (not modified) as ``plan`` says."""
        ...


class TrainerWrapper:
    """Base of a trainer that wraps another (``self.trainer``) to change how it trains or
    scores (a simulation's stragglers and device pace, partial work, held-out scoring). It
    answers for the wrapped trainer's example count and model ``spec``, which a client session
    reads from the trainer it holds: a wrapper that hid the spec would have privacy and
    compression treat a BatchNorm's running statistics as weights (a lossy codec could make a
    running variance negative)."""

    trainer: Trainer

    def num_examples(self) -> int:
        """The wrapped trainer's example count."""
        return self.trainer.num_examples()

    @property
    def spec(self) -> ParamSpec | None:
        """The wrapped trainer's ``spec`` (``None`` when it has none)."""
        spec = getattr(self.trainer, "spec", None)
        return spec if isinstance(spec, ParamSpec) else None
