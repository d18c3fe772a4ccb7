"""User-level DP on the client (DP-FedAvg): clip each update to L2 norm ``S``, maybe add noise.

DP-FedAvg (McMahan et al., 2018) bounds one user's influence on a flush by clipping the user's
whole update to ``||delta||_2 <= S``, then adds Gaussian noise of standard deviation ``z * S``
to the *sum* of the clipped updates. Where that noise is added is one switch, ``noise``:

- ``"central"``: the client only clips; the coordinator's ``dp_fedavg`` flush hook
  (``fedlink.privacy.hooks``) adds the noise to the aggregate. The coordinator is trusted.
- ``"clients"``: each of the ``clients_per_flush = n`` clients of a flush adds its share
  ``N(0, (z * S)^2 / n)`` to its own clipped update, so the sum of ``n`` updates carries
  ``N(0, (z * S)^2)``: the same total noise, and no update leaves a device un-noised (the
  guarantee for the aggregate holds as long as ``n`` honest clients contribute; a flush with
  fewer updates carries less noise).

Privacy runs before compression (``fedlink.client.pipeline``), so the codec only
post-processes a clipped, noised vector.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fedlink.errors import ConfigError
from fedlink.privacy.base import PRIVACY_STAGES, UpdatePrivacy

NOISE_MODES = ("central", "clients")
"""Where DP-FedAvg's noise is added: by the coordinator, or in shares by the clients."""

CLIP_NORM_OPTION = "dp_clip_norm"
"""Task option carrying the current (adaptive) clip norm to the client."""

CLIPPED_METRIC = "dp_clipped"
"""Commit metric: 1.0 when the update was clipped, else 0.0 (adaptive clipping's signal)."""


def clip_to_norm(delta: np.ndarray, clip_norm: float) -> tuple[np.ndarray, bool]:
    """``delta`` scaled down to L2 norm ``<= clip_norm`` (float32), and whether it was scaled.

    The result's norm, computed in float64, never exceeds ``clip_norm`` (float32 rounding of
    the scaled vector is corrected). A vector already within the norm is copied unchanged.
    Raises ``ValueError`` on non-finite values (a NaN update cannot be bounded).
    """
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be finite and > 0, got {clip_norm}")
    values = np.asarray(delta, dtype=np.float64).reshape(np.shape(delta))
    norm = float(np.linalg.norm(values))
    if not math.isfinite(norm):
        raise ValueError("cannot clip an update with non-finite values")
    if norm <= clip_norm:
        return np.array(delta, dtype=np.float32, copy=True), False
    clipped = (values * (clip_norm / norm)).astype(np.float32)
    shrink = np.float32(1 - 2.0 ** -20)
    while float(np.linalg.norm(clipped.astype(np.float64))) > clip_norm:
        clipped *= shrink
    return clipped, True


def share_stddev(noise_multiplier: float, clip_norm: float, clients_per_flush: int) -> float:
    """Standard deviation of one client's noise share: ``z * S / sqrt(n)``."""
    return noise_multiplier * clip_norm / math.sqrt(clients_per_flush)


@PRIVACY_STAGES.register("dp_fedavg")
class ClipAndNoise(UpdatePrivacy):
    """DP-FedAvg's client side: clip to ``clip_norm``; with ``noise = "clients"``, add a share.

    Options: ``clip_norm`` (``S`` > 0; the initial norm when the coordinator adapts it, see
    ``configure``), ``noise`` (``"central"`` or ``"clients"``), ``noise_multiplier`` (``z``,
    used in ``"clients"`` mode, > 0 there), ``clients_per_flush`` (``n``, the number of
    updates a flush sums, >= 1; in ``"clients"`` mode each share has variance
    ``(z * S)^2 / n``).

    ``metrics()`` reports ``dp_clipped`` (1.0 or 0.0) for the last update, the bit adaptive
    clipping aggregates (with noise) on the coordinator, and ``dp_clip_norm``. The update's
    norm is never reported.
    """

    name = "dp_fedavg"

    def __init__(self, clip_norm: float = 1.0, noise: str = "central",
                 noise_multiplier: float = 0.0, clients_per_flush: int = 1) -> None:
        if noise not in NOISE_MODES:
            raise ConfigError(f"noise: must be one of {', '.join(NOISE_MODES)}, got {noise!r}")
        _check_clip_norm(clip_norm)
        if not (isinstance(clients_per_flush, int) and clients_per_flush >= 1):
            raise ConfigError(f"clients_per_flush: must be an integer >= 1, "
                              f"got {clients_per_flush!r}")
        z = float(noise_multiplier)
        if not (math.isfinite(z) and z >= 0) or (noise == "clients" and z == 0):
            raise ConfigError(f"noise_multiplier: must be finite and > 0 when noise = "
                              f"'clients' (>= 0 otherwise), got {noise_multiplier!r}")
        self.clip_norm = float(clip_norm)
        self.noise = noise
        self.noise_multiplier = z
        self.clients_per_flush = clients_per_flush
        self._clipped: bool | None = None

    def configure(self, options: Mapping[str, str]) -> None:
        """Adopt the coordinator's current clip norm (``dp_clip_norm``) when the task has one."""
        raw = options.get(CLIP_NORM_OPTION)
        if raw is not None:
            self.clip_norm = _check_clip_norm(_as_float(raw, CLIP_NORM_OPTION))

    @property
    def share_stddev(self) -> float:
        """This client's noise standard deviation (0 in ``"central"`` mode)."""
        if self.noise != "clients":
            return 0.0
        return share_stddev(self.noise_multiplier, self.clip_norm, self.clients_per_flush)

    def apply(self, delta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Clip ``delta`` to ``clip_norm``; add this client's noise share in ``"clients"`` mode."""
        clipped, self._clipped = clip_to_norm(delta, self.clip_norm)
        std = self.share_stddev
        if std > 0:
            clipped += rng.normal(0.0, std, size=clipped.shape).astype(np.float32)
        return clipped

    def metrics(self) -> dict[str, float]:
        """After an ``apply``: ``dp_clipped`` (1.0 or 0.0) and ``dp_clip_norm`` (the ``S`` used).

        ``S`` is public (the coordinator chose it); reporting it lets the coordinator calibrate
        its noise to the largest norm a flush's updates were actually clipped to.
        """
        if self._clipped is None:
            return {}
        return {CLIPPED_METRIC: float(self._clipped), CLIP_NORM_OPTION: self.clip_norm}


def _as_float(raw: object, what: str) -> float:
    try:
        return float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what}: must be a number, got {raw!r}") from exc


def _check_clip_norm(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise ConfigError(f"clip_norm: must be finite and > 0, got {value!r}")
    return float(value)
