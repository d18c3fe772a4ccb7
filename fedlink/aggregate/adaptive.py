"""Streaming norm bounding: an adaptive bound from the norms of recent updates, in arrival order.

This is the norm bound of the streaming path (``[coordinator.robust] enabled = false``); the
default flush guard (``fedlink.aggregate.flushguard``) takes its bound over each flush's own
updates instead, whatever order they arrive in.

A fixed ``norm_bound`` must be tuned per model and learning rate; left at 0 it is off and a
single update of norm 1e8 moves the model as far as it likes. ``AdaptiveNormBound`` clips each
update to ``multiple x`` the median L2 norm of the last ``window`` updates it folded in, the
adaptive-clipping idea (Andrew et al. 2021, "Differentially private learning with adaptive
clipping") used as a robustness bound rather than for privacy: the median moves only when
most of the recent updates move it, so a minority of hostile clients cannot raise it, while a
``multiple`` well above 1 leaves honest updates alone (their norms rarely stray that far from
the median). What the window records is the norm *after* clipping, so an attacker's updates
count at most at the bound.

Until ``warmup`` norms are known the median means little, and an attacker that commits at
once (it has nothing to train) would set it. So the first ``warmup`` updates of a run are held
(``warmup`` float32 copies, once per run) and folded together, clipped to ``multiple x`` the
median of *their* norms, whatever order they came in; a flush that comes before ``warmup``
updates folds what it has the same way. During the warm-up the bound is also at most
``REFERENCE_MULTIPLE x`` the norm of the current global model (``reference()``, when it is not
0): no honest step of a sane learning rate is many times the size of the model itself. The
finite-step check (``fedlink.aggregate.guard``) stands behind all of it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from fedlink.aggregate.base import Accumulator
from fedlink.aggregate.robust import l2_norm
from fedlink.errors import ConfigError

DEFAULT_MULTIPLE = 2.0
DEFAULT_WINDOW = 64
DEFAULT_WARMUP = 5
REFERENCE_MULTIPLE = 10.0


class AdaptiveNormBound(Accumulator):
    """Clips each delta to ``multiple x`` the recent median norm, then hands it to ``inner``."""

    def __init__(self, inner: Accumulator, reference: Callable[[], float],
                 multiple: float = DEFAULT_MULTIPLE, window: int = DEFAULT_WINDOW,
                 warmup: int = DEFAULT_WARMUP) -> None:
        if not (np.isfinite(multiple) and multiple >= 1.0):
            raise ConfigError(f"norm_bound_multiple must be >= 1, got {multiple}")
        if not 1 <= warmup <= window:
            raise ConfigError(f"adaptive norm bound: need 1 <= warmup <= window, got "
                              f"{warmup} and {window}")
        self.inner = inner
        self.multiple = float(multiple)
        self.normalises_work = inner.normalises_work
        self._reference = reference
        self._norms: deque[float] = deque(maxlen=window)
        self._warmup = warmup
        self._held: list[tuple[np.ndarray, float, int]] = []
        self.clipped = 0

    def bound(self) -> float:
        """The bound an update is clipped to once the warm-up is over."""
        return self.multiple * float(np.median(np.asarray(self._norms)))

    def add(self, delta: np.ndarray, weight: float, steps: int = 0) -> None:
        """Clip ``delta`` to the bound and fold it into ``inner`` (held during the warm-up)."""
        if len(self._norms) < self._warmup:
            self._held.append((np.array(delta, dtype=np.float32, copy=True), weight, steps))
            if len(self._norms) + len(self._held) >= self._warmup:
                self.fold_held()
            return
        self._fold(delta, weight, steps, self.bound())

    def _fold(self, delta: np.ndarray, weight: float, steps: int, bound: float) -> None:
        norm = l2_norm(delta)
        if norm > bound:
            delta = (delta * np.float32(bound / norm)).astype(np.float32, copy=False)
            norm = bound
            self.clipped += 1
        self.inner.add(delta, weight, steps)
        self._norms.append(norm)

    def fold_held(self) -> None:
        """Fold the held warm-up updates, clipped to ``multiple x`` the median of them all (a
        flush before the warm-up ends calls it before it reads the clip count)."""
        if not self._held:
            return
        norms = [*self._norms, *(l2_norm(d) for d, _, _ in self._held)]
        bound = self.multiple * float(np.median(np.asarray(norms)))
        reference = self._reference()
        if reference > 0:
            bound = min(bound, REFERENCE_MULTIPLE * reference)
        held, self._held = self._held, []
        for delta, weight, steps in held:
            self._fold(delta, weight, steps, bound)

    def mean(self) -> np.ndarray:
        """The inner aggregate of the clipped deltas (held ones folded first)."""
        self.fold_held()
        return self.inner.mean()

    def reset(self) -> None:
        """Reset ``inner`` and the clip counter; the recent norms are kept across flushes."""
        self._held.clear()
        self.inner.reset()
        self.clipped = 0

    @property
    def count(self) -> int:
        """Deltas folded in (or held) since the last reset."""
        return self.inner.count + len(self._held)

    @property
    def total_weight(self) -> float:
        """The total weight folded in (or held)."""
        return self.inner.total_weight + sum(w for _, w, _ in self._held)

    def state_dict(self) -> list[float]:
        """The recent norms (for a checkpoint)."""
        return list(self._norms)

    def load_state_dict(self, norms: list[float]) -> None:
        """Restore what ``state_dict`` returned."""
        self._norms.clear()
        self._norms.extend(float(n) for n in norms)
