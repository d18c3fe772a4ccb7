"""Streaming aggregation: one model-length buffer, whatever the number of clients.

``StreamingMean`` (``"mean"``) is FedAvg's weighted mean; ``FedNovaMean`` (``"fednova"``) is
FedNova's normalised average for clients that ran different numbers of local steps. Both fold
each delta in as it arrives, in chunks of ``CHUNK`` values, so folding allocates no
model-sized temporary: the only model-sized memory is the float64 running sum (8 bytes per
parameter, twice the float32 model) and the float32 array ``mean()`` returns.
"""

from __future__ import annotations

import numpy as np

from fedlink.aggregate.base import ACCUMULATORS, Accumulator

CHUNK = 1 << 16
"""Values folded per numpy call: bounds temporaries to ``CHUNK x 8`` bytes (512 KiB)."""


def fold(total: np.ndarray, delta: np.ndarray, scale: float) -> None:
    """``total += scale * delta`` on flat arrays in float64, chunk by chunk (no model-sized
    temporary)."""
    for start in range(0, total.size, CHUNK):
        piece = delta[start:start + CHUNK].astype(np.float64)
        piece *= scale
        total[start:start + CHUNK] += piece


def scaled(total: np.ndarray, divisor: float, factor: float = 1.0) -> np.ndarray:
    """``factor * total / divisor`` of a flat array as a new float32 array, chunk by chunk."""
    out = np.empty(total.shape, dtype=np.float32)
    for start in range(0, total.size, CHUNK):
        piece = total[start:start + CHUNK] / divisor
        if factor != 1.0:
            piece *= factor
        out[start:start + CHUNK] = piece
    return out


def check_weight(weight: float) -> None:
    """``ValueError`` unless ``weight`` is a positive finite number."""
    if not (weight > 0 and np.isfinite(weight)):
        raise ValueError(f"weight must be positive, got {weight}")


@ACCUMULATORS.register("mean")
class StreamingMean(Accumulator):
    """Weighted mean of deltas, folded in as they arrive: ``sum_i w_i d_i / sum_i w_i``.

    Sums in float64 so that the order updates arrive in barely changes the result. Memory: one
    float64 vector of the model's length (the buffer is kept across ``reset``).
    """

    def __init__(self) -> None:
        self._sum: np.ndarray | None = None
        self._shape: tuple[int, ...] = ()
        self._total_weight = 0.0
        self._count = 0

    def add(self, delta: np.ndarray, weight: float, steps: int = 0) -> None:
        """Fold in ``weight * delta`` (``steps`` is not used by the plain mean)."""
        check_weight(weight)
        self._fold(delta, weight)
        self._total_weight += weight
        self._count += 1

    def _fold(self, delta: np.ndarray, scale: float) -> None:
        if self._sum is None:
            self._sum = np.zeros(delta.size, dtype=np.float64)
            self._shape = delta.shape
        elif delta.shape != self._shape:
            raise ValueError(f"delta shape {delta.shape} != accumulated {self._shape}")
        fold(self._sum, delta.reshape(-1), scale)

    def mean(self) -> np.ndarray:
        """Weighted mean as float32 (``ValueError`` when nothing was added)."""
        if self._sum is None or self._count == 0:
            raise ValueError("no updates to average")
        return scaled(self._sum, self._total_weight).reshape(self._shape)

    def reset(self) -> None:
        """Drop the buffer contents (the buffer itself is reused)."""
        if self._sum is not None:
            self._sum.fill(0.0)
        self._total_weight = 0.0
        self._count = 0

    @property
    def count(self) -> int:
        """Deltas folded in since the last reset."""
        return self._count

    @property
    def total_weight(self) -> float:
        """Sum of the weights folded in since the last reset."""
        return self._total_weight


@ACCUMULATORS.register("fednova")
class FedNovaMean(StreamingMean):
    """FedNova (Wang et al. 2020): normalise each delta by its own local step count.

    With weights ``w_i`` (examples x staleness weight, *without* the work fraction) and
    ``tau_i`` local steps completed by client ``i``::

        d_i      = delta_i / tau_i                         (per-step direction)
        tau_eff  = sum_i w_i tau_i / sum_i w_i             (effective step count)
        mean     = tau_eff * sum_i w_i d_i / sum_i w_i

    A client that ran fewer steps is neither over-weighted (plain averaging lets clients with
    more steps dominate: objective inconsistency) nor discarded. With equal ``tau_i`` this is
    the plain weighted mean. ``steps = 0`` (unknown) counts as one step. Memory: as
    ``StreamingMean``, plus two scalars.
    """

    normalises_work = True

    def __init__(self) -> None:
        super().__init__()
        self._weighted_steps = 0.0

    def add(self, delta: np.ndarray, weight: float, steps: int = 0) -> None:
        """Fold in ``weight * delta / tau`` and note ``weight * tau``."""
        check_weight(weight)
        tau = max(1, int(steps))
        self._fold(delta, weight / tau)
        self._total_weight += weight
        self._weighted_steps += weight * tau
        self._count += 1

    @property
    def effective_steps(self) -> float:
        """``tau_eff = sum_i w_i tau_i / sum_i w_i`` (0 when empty)."""
        if self._total_weight == 0:
            return 0.0
        return self._weighted_steps / self._total_weight

    def mean(self) -> np.ndarray:
        """``tau_eff * sum_i w_i d_i / sum_i w_i`` as float32."""
        if self._sum is None or self._count == 0:
            raise ValueError("no updates to average")
        return scaled(self._sum, self._total_weight, self.effective_steps).reshape(self._shape)

    def reset(self) -> None:
        """Forget everything folded in (the buffer is reused)."""
        super().reset()
        self._weighted_steps = 0.0
