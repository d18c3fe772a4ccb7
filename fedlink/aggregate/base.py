"""Contracts of aggregation: folding client deltas into one step of the global model.

- ``Accumulator``: folds weighted client deltas as they arrive (memory independent of how many).
- ``StalenessWeight``: discounts an update by how many versions old its base model is.
- ``ServerOptimizer``: turns the aggregated pseudo-gradient into the next global model, with a
  checkpointable ``state_dict``.

Each kind has a registry so configs name implementations (``server_optimizer = "fedavgm"``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedlink.params.base import ParamSpec
from fedlink.registry import Registry


class Accumulator(ABC):
    """Folds weighted deltas; ``mean()`` is their (weighted) aggregate.

    ``steps`` is the number of local steps the client completed (0: unknown). Accumulators that
    set ``normalises_work`` account for partial work themselves (FedNova); the engine then
    leaves the work fraction out of ``weight``. ``mean()`` returns a fresh float32 array that
    the caller owns (the engine hands it to the server optimizer, which may reuse it).
    """

    normalises_work: bool = False

    @abstractmethod
    def add(self, delta: np.ndarray, weight: float, steps: int = 0) -> None:
        """Fold in one client's delta with its (positive) weight."""

    @abstractmethod
    def mean(self) -> np.ndarray:
        """The weighted mean of the deltas folded in since the last reset."""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything folded in so far."""

    @property
    @abstractmethod
    def count(self) -> int:
        """Number of deltas folded in since the last reset."""

    @property
    @abstractmethod
    def total_weight(self) -> float:
        """Sum of the weights folded in since the last reset."""


class StalenessWeight(ABC):
    """``weight(tau)``: the factor applied to an update ``tau`` versions old (1 at tau=0)."""

    @abstractmethod
    def __call__(self, tau: int) -> float:
        """The factor for staleness ``tau`` >= 0."""


class ServerOptimizer(ABC):
    """Applies an aggregated pseudo-gradient (mean client delta) to the global model.

    The engine calls ``bind(spec)`` once, before the first step, with the model's
    ``ParamSpec`` (``None`` when the coordinator was given no spec): ``self.spec.kinds`` says
    which elements are trainable weights and which are buffers or counters. Whatever an
    optimizer does with non-trainable elements, the engine replaces them by the round's plain
    mean afterwards (``fedlink.aggregate.kinds``), so only the trainable elements of a step
    count; an optimizer that reduces over the whole vector (a global norm, say) should use
    ``self.spec.mask(TRAINABLE)`` to leave buffers out.
    """

    spec: ParamSpec | None = None

    def bind(self, spec: ParamSpec | None) -> None:
        """Learn the model's layout and kinds (stored as ``self.spec``)."""
        self.spec = spec

    @abstractmethod
    def step(self, model: np.ndarray, mean_delta: np.ndarray) -> np.ndarray:
        """The next global model (``model`` is left unchanged).

        ``mean_delta`` belongs to the caller's flush and is not used afterwards: an optimizer
        may write the result into it rather than allocate another model-sized array.
        """

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume this optimizer."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


ACCUMULATORS: Registry[Accumulator] = Registry("accumulator")
STALENESS_WEIGHTS: Registry[StalenessWeight] = Registry("staleness weight")
SERVER_OPTIMIZERS: Registry[ServerOptimizer] = Registry("server optimizer")


@dataclass(frozen=True)
class UpdateInfo:
    """What a flush hook learns about each accepted update (no model data)."""

    client_id: str
    staleness: int
    weight: float
    num_examples: int
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class FlushInfo:
    """What a flush hook learns about the flush it post-processes."""

    version: int
    num_updates: int
    total_weight: float


class FlushHook(ABC):
    """A server-side stage around aggregation (pfl-style server postprocessor).

    The engine calls ``on_update`` for each update a flush aggregates, ``on_flush`` on the mean
    delta before the server optimizer (central DP noise, for example), and ``stop_reason``
    before issuing a task: a non-empty reason ends the run (a spent privacy budget, say).
    ``report`` adds fields to the flush event.
    """

    plain_mean: bool = False
    """True when the hook's guarantee holds only for the weighted mean of every update of the
    flush (DP noise calibrated to it): the engine's flush guard then only caps weights and
    clips to ``update_bound()``, and refuses rules that depend on the updates' values
    (dropping, trimming, a norm bound from their statistics)."""

    def update_bound(self) -> float | None:
        """An L2 norm every update must meet for the hook's guarantee (a DP clip norm), which
        the flush guard enforces on each update before the flush (``None``: no such bound)."""
        return None

    def on_update(self, update: UpdateInfo) -> None:  # noqa: B027 (optional hook)
        """Note one update of the flush, as aggregated: called at the flush, in the flush's
        canonical order, with the weight it was folded with (after the guard's cap); an
        update the guard dropped is not reported."""

    @abstractmethod
    def on_flush(self, mean_delta: np.ndarray, flush: FlushInfo) -> np.ndarray:
        """The post-processed mean delta (a new array or ``mean_delta`` itself)."""

    def stop_reason(self) -> str:
        """Why the run must end before the next flush ("" to go on)."""
        return ""

    def wait_reason(self) -> str:
        """Why no new training task is issued for now ("" to issue them): the hook waits for
        something already under way (a secure sum being unmasked) before it can say whether
        the run goes on. Clients with an open task still get it."""
        return ""

    def report(self) -> dict[str, Any]:
        """Fields for the ``flush`` event (and so the report)."""
        return {}

    def task_options(self) -> dict[str, str]:
        """Settings every new task carries to the client's pipeline (``Task.options``)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume this hook."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Restore what ``state_dict`` returned."""


FLUSH_HOOKS: Registry[FlushHook] = Registry("flush hook")
