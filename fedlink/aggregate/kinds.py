"""Aggregation by kind of model state: the rule each kind of tensor gets in a flush.

A model's vector holds trainable weights and, beside them, state that is not a weight
(``fedlink.params.base``: frozen weights, float buffers such as BatchNorm's running statistics,
integer counters). Only trainable weights are a gradient-like signal:

- **trainable**: the configured aggregator (norm bound, robust rule), the flush hooks
  (central DP noise) and the server optimizer (momentum, Adam, Yogi, ...) act on them;
- **frozen, buffer, counter**: the new value is the weighted mean of the round's client
  values (``model + mean delta``), whatever the server optimizer is. A running variance
  stepped by an adaptive optimizer can go negative; an average of variances cannot.

``KindSplit`` routes each delta's two parts to two accumulators; ``step_by_kind`` runs the
server optimizer and then puts the averaged state back. Without a spec, or with a spec whose
tensors are all trainable, both are what they were before kinds existed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedlink.aggregate.base import Accumulator, ServerOptimizer
from fedlink.aggregate.streaming import StreamingMean
from fedlink.params.base import ParamSpec


class KindSplit(Accumulator):
    """``inner`` aggregates the trainable part of each delta; the rest is a weighted mean.

    ``mask`` is True at the trainable elements (``ParamSpec.mask(TRAINABLE)``). The weight
    each update brings is the same for both parts (the engine's examples x staleness x work).
    """

    def __init__(self, inner: Accumulator, mask: np.ndarray) -> None:
        self.inner = inner
        self.mask = np.asarray(mask, dtype=bool)
        self._rest = StreamingMean()
        self.normalises_work = inner.normalises_work

    def add(self, delta: np.ndarray, weight: float, steps: int = 0) -> None:
        """Fold the trainable part into ``inner`` and the rest into the plain mean."""
        flat = delta.reshape(-1)
        if flat.size != self.mask.size:
            raise ValueError(f"delta has {flat.size} elements, the model {self.mask.size}")
        self.inner.add(flat[self.mask], weight, steps)
        self._rest.add(flat[~self.mask], weight, steps)

    def mean(self) -> np.ndarray:
        """Both parts, back in the model's layout."""
        out = np.empty(self.mask.size, dtype=np.float32)
        out[self.mask] = self.inner.mean()
        out[~self.mask] = self._rest.mean()
        return out

    def reset(self) -> None:
        """Forget both parts."""
        self.inner.reset()
        self._rest.reset()

    @property
    def count(self) -> int:
        """Deltas folded in since the last reset."""
        return self.inner.count

    @property
    def total_weight(self) -> float:
        """Their total weight (as ``inner`` counts it)."""
        return self.inner.total_weight


def hooks_on_trainable(mean_delta: np.ndarray, mask: np.ndarray | None,
                       hook: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``hook`` applied to the trainable part of ``mean_delta`` only (all of it without a
    mask); the rest is left as the plain mean."""
    if mask is None:
        return hook(mean_delta)
    out = np.array(mean_delta, dtype=np.float32, copy=True).reshape(-1)
    out[mask] = hook(out[mask])
    return out


def step_by_kind(optimizer: ServerOptimizer, model: np.ndarray, mean_delta: np.ndarray,
                 mask: np.ndarray | None) -> np.ndarray:
    """The next model: the optimizer's step on the trainable elements, ``model + mean_delta``
    on the others.

    The optimizer still sees whole vectors, so a ``ServerOptimizer`` written before kinds
    keeps working (its state over non-trainable elements is simply not used); it can read
    ``optimizer.spec`` to treat the kinds itself.
    """
    if mask is None:
        return optimizer.step(model, mean_delta)
    rest = ~mask
    averaged = model[rest] + mean_delta.reshape(-1)[rest]  # before step may reuse mean_delta
    new = np.array(optimizer.step(model, mean_delta), dtype=np.float32, copy=False)
    new[rest] = averaged
    return new


def trainable_mask(spec: ParamSpec | None, size: int) -> np.ndarray | None:
    """``spec``'s trainable mask, checked against a model of ``size`` elements (``None``:
    no spec, or nothing but trainable weights)."""
    if spec is None:
        return None
    if spec.size != size:
        raise ValueError(f"the parameter spec describes {spec.size} elements, the model has "
                         f"{size}")
    return spec.trainable_mask()
