"""Updates as integers in Z_m, and the sum back to floats.

A client clips each value to ``[-clip, clip]``, maps it to ``[0, levels]`` and rounds it
stochastically (up with probability equal to the fraction, so the expected integer is the
exact scaled value: the sum is unbiased). The coordinator's unmasked sum of ``count`` vectors
is below ``count * levels < m`` in every coordinate (``SecAggConfig`` checks the modulus holds
it), so the integer sum is exact and decodes to the sum of the quantized values:
``total * step - count * clip``. Each value is off by less than one ``step`` (the report states
the step); the error of a sum of ``count`` values has standard deviation at most
``step * sqrt(count) / 2``.

A weighted mean travels as ``[w * update, w]`` with ``w`` in ``[0, 1]``: the sum's last
coordinate is the total weight, and ``weighted_mean`` divides by it. ``w`` is clipped like every
other value, so a weighted sum needs ``clip`` at least 1 (``encode_weighted`` refuses a weight
beyond it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedlink.secagg.base import SecAggConfig, SecAggError


@dataclass(frozen=True)
class Encoded:
    """A client's integer vector (uint32 in ``[0, levels]``) and how many values were clipped."""

    values: np.ndarray
    clipped: int


def encode(values: np.ndarray, config: SecAggConfig, rng: np.random.Generator) -> Encoded:
    """``values`` (float) clipped, scaled to ``[0, levels]`` and stochastically rounded."""
    x = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise SecAggError("an update to encode has non-finite values")
    clipped = int(np.count_nonzero(np.abs(x) > config.clip))
    scaled = (np.clip(x, -config.clip, config.clip) + config.clip) / config.step
    floor = np.floor(scaled)
    up = rng.random(x.shape) < (scaled - floor)
    integers = np.minimum(floor + up, config.levels).astype(np.uint32)
    return Encoded(integers, clipped)


def encode_weighted(update: np.ndarray, weight: float, config: SecAggConfig,
                    rng: np.random.Generator) -> Encoded:
    """``[weight * update, weight]`` encoded (``weight`` in ``[0, 1]``)."""
    if not 0.0 <= weight <= 1.0:
        raise SecAggError(f"a secure update's weight is a fraction in [0, 1], got {weight}")
    if weight > config.clip:  # it would be clipped, and every mean scaled by 1 / clip
        raise SecAggError(f"a weight of {weight} does not fit the ring's range [-{config.clip}, "
                          f"{config.clip}]: a weighted sum needs clip >= 1")
    return encode(np.append(np.asarray(update, np.float64) * weight, weight), config, rng)


def decode_sum(total: np.ndarray, count: int, config: SecAggConfig) -> np.ndarray:
    """The float sum of ``count`` encoded vectors from their integer sum in Z_m."""
    return np.asarray(total, dtype=np.float64) * config.step - count * config.clip


def weighted_mean(total: np.ndarray, count: int, config: SecAggConfig,
                  named: float | None = None) -> tuple[np.ndarray, float]:
    """``(sum w * update / sum w, sum w)`` from the sum of ``encode_weighted`` vectors.

    ``named``: the total weight the clients were given, when the caller knows it; a sum
    whose weight differs by more than the quantization (``count`` steps) is refused, as no
    honest clients could have made it (a wrong mask, packing or share unmasks to such a
    sum)."""
    decoded = decode_sum(total, count, config)
    weight = float(decoded[-1])
    if named is not None and abs(weight - named) > count * config.step:
        raise SecAggError(f"the unmasked sum carries weight {weight:.6g} where its clients "
                          f"were named {named:.6g}: a client's masked update or unmask "
                          f"answer is wrong")
    if weight <= 0:
        raise SecAggError("the secure sum carries no weight")
    return decoded[:-1] / weight, weight
