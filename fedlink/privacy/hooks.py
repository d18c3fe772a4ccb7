"""User-level DP on the coordinator: DP-FedAvg's noise, adaptive clipping, accounting, a budget.

The ``dp_fedavg`` flush hook is the coordinator half of DP-FedAvg (McMahan et al., 2018); the
client half is the ``dp_fedavg`` privacy stage (``fedlink.privacy.clipping``), which clips each
update to L2 norm ``S``. Configure it as::

    [[coordinator.hooks]]
    name = "dp_fedavg"
    clip_norm = 1.0          # S
    noise_multiplier = 1.0   # z
    noise = "central"        # or "clients": where the N(0, (z S)^2) on the sum is added
    delta = 1e-5
    accountant = "rdp"       # or "prv"
    max_epsilon = 8.0        # 0: no budget
    population = 100         # q = cohort / population (or give sample_rate)
    cohort = 10

**Noise and weighting.** The engine hands the hook the weighted mean
``sum_i w_i delta_i / W`` with ``W = sum_i w_i``. One user changes the weighted sum by at most
``w_max * S``, so in ``"central"`` mode the hook adds Gaussian noise of standard deviation
``z * S * w_max / W`` to the mean: noise of std ``z * S`` on the sum measured in units of the
largest weight. With uniform weights (every client reports the same ``num_examples``, constant
staleness weight, full work) that is exactly DP-FedAvg's ``z * S / n`` for ``n`` updates, the
estimator this hook is designed for; with unequal weights it is conservative for every client
but the heaviest. The denominator is the realised number of updates, which is public when a
flush waits for ``goal`` updates (synchronous FedAvg, FedBuff). The analysis is for the
weighted ``mean`` aggregator: robust rules (median, trimmed mean) and FedNova have other
sensitivities, and ``fedlink.privacy.setup`` refuses them with this hook. In ``"clients"`` mode the
clients add the noise in shares (``N(0, (z S)^2 / n)`` each) and the hook adds none; with
uniform weights the aggregate carries the same total noise as in ``"central"`` mode.

Importing this module registers ``dp_fedavg`` and ``dp_sgd`` in ``FLUSH_HOOKS``, without
importing torch; ``fedlink.coordinator`` imports it, so a ``CoordinatorConfig`` can always name
them (``import fedlink.privacy`` alone does not: a device that imports the package for its
privacy stage does not pay for the coordinator's half).

**Accounting.** Each flush is one Poisson-subsampled Gaussian mechanism with sampling rate
``q`` (``sample_rate``, or ``cohort / population``) and noise multiplier ``z``; epsilon at
``delta`` comes from Opacus's RDP or PRV analysis (``fedlink.privacy.accounting``). The
amplification by sampling assumes that which clients take part in a flush is random with rate
``q``; when check-ins are not, set ``sample_rate = 1`` for a guarantee without amplification.

**Budget.** With ``max_epsilon > 0``, ``stop_reason`` ends the run (the engine stops issuing
tasks) as soon as one more flush would push epsilon above ``max_epsilon``. A flush that would
still exceed it (updates already in flight in asynchronous mode) releases nothing: the hook
replaces its mean delta by zeros, so the budget is never exceeded.

**Adaptive clipping** (Andrew et al., 2021), ``target_quantile > 0``: clients report
``dp_clipped`` (1 if their update was clipped); the hook counts the unclipped updates, adds
``N(0, sigma_b^2)`` to the count (``clipped_count_stddev``, default ``cohort / 20``), and
moves ``S <- S * exp(-clip_learning_rate * (unclipped_fraction - target_quantile))``. To keep
the total noise multiplier at ``z`` (which is what is accounted), the updates then get
``z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``. The new ``S`` reaches clients as the task option
``dp_clip_norm``; clients report the norm they clipped to (``dp_clip_norm`` metric) and the
hook calibrates its noise to the largest norm reported in the flush, so a client still
clipping to an older, larger ``S`` never receives too little noise. Updates that report no
``dp_clipped`` teach the hook nothing: ``S`` then stays where it is.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from fedlink.aggregate import FLUSH_HOOKS, FlushHook, FlushInfo, UpdateInfo
from fedlink.errors import ConfigError
from fedlink.privacy.accounting import Accountant, check_accountant, check_mechanism
from fedlink.privacy.clipping import CLIPPED_METRIC, NOISE_MODES

log = logging.getLogger(__name__)

CLIP_NORM_METRIC = "dp_clip_norm"
"""Commit metric: the clip norm the client clipped its update to."""
CLIP_LEARNING_RATE = 0.2
"""Default ``clip_learning_rate`` of adaptive clipping (Andrew et al.'s eta_C)."""


def update_noise_multiplier(noise_multiplier: float, clipped_count_stddev: float) -> float:
    """Andrew et al.'s ``z_delta``: the updates' share of a total noise multiplier ``z``.

    ``(z^-2 - (2 sigma_b)^-2)^(-1/2)``; ``ConfigError`` unless ``2 sigma_b > z``.
    """
    if 2 * clipped_count_stddev <= noise_multiplier:
        raise ConfigError(f"clipped_count_stddev: must exceed noise_multiplier / 2 = "
                          f"{noise_multiplier / 2:g} for adaptive clipping, got "
                          f"{clipped_count_stddev:g}")
    return float((noise_multiplier ** -2 - (2 * clipped_count_stddev) ** -2) ** -0.5)


@FLUSH_HOOKS.register("dp_fedavg")
class DPFedAvgHook(FlushHook):
    """DP-FedAvg on the coordinator: noise, adaptive clip norm, accounting, budget (module doc).

    Options: ``clip_norm`` (S > 0), ``noise_multiplier`` (z > 0), ``noise`` (``"central"`` or
    ``"clients"``), ``delta`` (in (0, 1)), ``accountant`` (``"rdp"`` or ``"prv"``),
    ``max_epsilon`` (0: no budget), ``sample_rate`` (q in (0, 1]) or ``population`` and
    ``cohort`` (q = cohort / population), ``target_quantile`` (0: fixed S; else in (0, 1)),
    ``clip_learning_rate`` (> 0), ``clipped_count_stddev`` (0: ``cohort / 20``, or
    ``population / 20 * q`` without a cohort; these two apply to adaptive clipping only and are
    refused with ``target_quantile = 0`` unless left at their defaults), ``seed``: of the
    central noise (and the clipped count's); ``None`` (the default) draws fresh entropy from
    the operating system, so that nobody who reads the config can take the noise out of a
    released model again. Simulations fill in the run's seed (``with_run_seed``), which makes
    them reproducible.
    """

    def __init__(self, clip_norm: float = 1.0, noise_multiplier: float = 1.0,
                 noise: str = "central", delta: float = 1e-5, accountant: str = "rdp",
                 max_epsilon: float = 0.0, sample_rate: float = 0.0, population: int = 0,
                 cohort: int = 0, target_quantile: float = 0.0,
                 clip_learning_rate: float = CLIP_LEARNING_RATE,
                 clipped_count_stddev: float = 0.0, seed: int | None = None) -> None:
        if noise not in NOISE_MODES:
            raise ConfigError(f"noise: must be one of {', '.join(NOISE_MODES)}, got {noise!r}")
        if not (math.isfinite(clip_norm) and clip_norm > 0):
            raise ConfigError(f"clip_norm: must be finite and > 0, got {clip_norm!r}")
        q = _sample_rate(sample_rate, population, cohort)
        check_mechanism(noise_multiplier, q, delta)
        if not (math.isfinite(max_epsilon) and max_epsilon >= 0):
            raise ConfigError(f"max_epsilon: must be >= 0 (0: no budget), got {max_epsilon!r}")
        if not 0 <= target_quantile < 1:
            raise ConfigError(f"target_quantile: must be in (0, 1), or 0 for a fixed clip "
                              f"norm, got {target_quantile!r}")
        if target_quantile and noise != "central":
            raise ConfigError("target_quantile: adaptive clipping needs noise = 'central' (the "
                              "updates' noise multiplier then depends on the count's noise)")
        if not clip_learning_rate > 0:
            raise ConfigError(f"clip_learning_rate: must be > 0, got {clip_learning_rate!r}")
        if not target_quantile:  # a fixed clip norm: neither is ever read
            for key, value, default in (
                    ("clip_learning_rate", clip_learning_rate, CLIP_LEARNING_RATE),
                    ("clipped_count_stddev", clipped_count_stddev, 0.0)):
                if value != default:
                    raise ConfigError(
                        f"{key}: applies to adaptive clipping only, and target_quantile = 0 "
                        f"keeps clip_norm fixed: set target_quantile in (0, 1), or remove "
                        f"{key}")
        self.noise = noise
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.delta = float(delta)
        self.sample_rate = q
        self.max_epsilon = float(max_epsilon)
        self.target_quantile = float(target_quantile)
        self.clip_learning_rate = float(clip_learning_rate)
        self.accountant = Accountant(check_accountant(accountant))
        self.clipped_count_stddev = 0.0
        self.update_noise_multiplier = self.noise_multiplier
        if self.adaptive:
            expected = cohort if cohort > 0 else max(1.0, q * max(population, 1))
            self.clipped_count_stddev = float(clipped_count_stddev or expected / 20)
            self.update_noise_multiplier = update_noise_multiplier(
                self.noise_multiplier, self.clipped_count_stddev)
        self._rng = np.random.default_rng(seed)
        self._epsilon = 0.0
        self._next_epsilon: tuple[int, float] | None = None  # (steps, epsilon after one more)
        self._withheld = 0
        self._announced = False
        self._clipped_fraction: float | None = None
        self._max_weight = 0.0
        self._max_clip_norm = 0.0
        self._bits = 0
        self._unclipped = 0

    # -- properties ------------------------------------------------------------------------

    @property
    def adaptive(self) -> bool:
        """Whether the clip norm tracks a quantile of update norms."""
        return self.target_quantile > 0

    @property
    def epsilon(self) -> float:
        """Epsilon spent so far at ``delta``."""
        return self._epsilon

    @property
    def steps(self) -> int:
        """Flushes accounted so far."""
        return self.accountant.steps

    @property
    def mode(self) -> str:
        """``user_central`` or ``user_clients``: user-level DP, and who adds the noise."""
        return f"user_{self.noise}"

    # -- FlushHook ---------------------------------------------------------------------------

    plain_mean = True  # the noise is calibrated to the weighted mean of every update

    def update_bound(self) -> float | None:
        """``S`` in ``"central"`` mode: the coordinator enforces the sensitivity its noise is
        calibrated to, whatever a client sends. ``None`` in ``"clients"`` mode: each update
        carries its share of the noise, which scaling it down would remove."""
        return self.clip_norm if self.noise == "central" else None

    def on_update(self, update: UpdateInfo) -> None:
        """Track the largest weight, the clip norms used and the clipped bits of the flush."""
        self._max_weight = max(self._max_weight, float(update.weight))
        used = _finite(update.metrics.get(CLIP_NORM_METRIC))
        if used is not None and used > 0:
            self._max_clip_norm = max(self._max_clip_norm, used)
        bit = _finite(update.metrics.get(CLIPPED_METRIC))
        if bit is not None:
            self._bits += 1
            self._unclipped += 1 if bit < 0.5 else 0

    def on_flush(self, mean_delta: np.ndarray, flush: FlushInfo) -> np.ndarray:
        """Noise the mean (``"central"``), account one step, adapt ``S``; zeros past budget."""
        try:
            if self._would_exceed():
                self._withheld += 1
                log.warning("privacy budget: flush to version %d withheld (epsilon would "
                            "exceed max_epsilon %g)", flush.version, self.max_epsilon)
                return np.zeros_like(mean_delta)
            noisy = self._noised(mean_delta, flush)
            self._epsilon = self._peek()[1]  # epsilon after this step (computed once)
            self.accountant.step(self.noise_multiplier, self.sample_rate)
            self._adapt(flush)
            log.info("flush to version %d: epsilon %.4g at delta %g after %d flushes (%s)",
                     flush.version, self._epsilon, self.delta, self.steps, self.mode)
            return noisy
        finally:
            self._reset_flush()

    def stop_reason(self) -> str:
        """Non-empty once one more flush would push epsilon past ``max_epsilon``."""
        if not self._would_exceed():
            return ""
        _, after = self._peek()
        reason = (f"privacy budget exhausted: epsilon {self._epsilon:.4g} after "
                  f"{self.steps} flushes would reach {after:.4g} > max_epsilon "
                  f"{self.max_epsilon:g} (delta {self.delta:g}, {self.accountant.kind})")
        if not self._announced:
            self._announced = True
            log.warning("%s: no more tasks", reason)
        return reason

    def report(self) -> dict[str, Any]:
        """``epsilon`` (flat, for tables and plots) and a ``privacy`` record for the flush."""
        return {"epsilon": self._epsilon, "privacy": self.privacy_record()}

    def privacy_record(self) -> dict[str, Any]:
        """The guarantee so far, in ``summary.json``'s ``privacy`` shape."""
        record: dict[str, Any] = {
            "epsilon": self._epsilon, "delta": self.delta,
            "noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate,
            "steps": self.steps, "accountant": self.accountant.kind,
            "clip_norm": self.clip_norm, "mode": self.mode,
            "max_epsilon": self.max_epsilon or None, "flushes_withheld": self._withheld,
        }
        if self.adaptive:
            record.update(target_quantile=self.target_quantile,
                          update_noise_multiplier=self.update_noise_multiplier,
                          unclipped_fraction=self._clipped_fraction)
        return record

    def state_dict(self) -> dict[str, Any]:
        """Clip norm, accountant history, withheld flushes and the noise generator's state."""
        return {"clip_norm": self.clip_norm, "accountant": self.accountant.state_dict(),
                "withheld": self._withheld, "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.clip_norm = float(state["clip_norm"])
        self.accountant.load_state_dict(state["accountant"])
        self._withheld = int(state["withheld"])
        self._rng.bit_generator.state = state["rng"]
        self._epsilon = self.accountant.epsilon(self.delta)
        self._next_epsilon = None

    def task_options(self) -> dict[str, str]:
        """What each task should tell the client's privacy stage (the current ``S``)."""
        return {CLIP_NORM_METRIC: repr(self.clip_norm)}

    # -- internals ---------------------------------------------------------------------------

    def noise_stddev(self, flush: FlushInfo, max_weight: float | None = None,
                     clip_norm: float | None = None) -> float:
        """Std of the central noise on the weighted mean: ``z_delta * S * w_max / W``."""
        if self.noise != "central" or flush.num_updates == 0 or flush.total_weight <= 0:
            return 0.0
        w_max = self._max_weight if max_weight is None else max_weight
        if w_max <= 0:  # no on_update seen (direct use): treat weights as uniform
            w_max = flush.total_weight / flush.num_updates
        s = max(self.clip_norm, self._max_clip_norm) if clip_norm is None else clip_norm
        return self.update_noise_multiplier * s * w_max / flush.total_weight

    def _noised(self, mean_delta: np.ndarray, flush: FlushInfo) -> np.ndarray:
        std = self.noise_stddev(flush)
        if std == 0:
            return mean_delta
        noise = self._rng.normal(0.0, std, size=mean_delta.shape)
        return (np.asarray(mean_delta, dtype=np.float64) + noise).astype(np.float32)

    def _adapt(self, flush: FlushInfo) -> None:
        """Geometric update of ``S`` toward the target quantile from the noised bit count."""
        if not self.adaptive or self._bits == 0:
            return
        noisy = self._unclipped + self._rng.normal(0.0, self.clipped_count_stddev)
        fraction = float(noisy / self._bits)
        self._clipped_fraction = fraction
        self.clip_norm *= math.exp(-self.clip_learning_rate * (fraction - self.target_quantile))

    def _peek(self) -> tuple[int, float]:
        """(steps, epsilon after one more flush), computed once per step count."""
        if self._next_epsilon is None or self._next_epsilon[0] != self.steps:
            after = self.accountant.epsilon_after(1, self.noise_multiplier, self.sample_rate,
                                                  self.delta)
            self._next_epsilon = (self.steps, after)
        return self._next_epsilon

    def _would_exceed(self) -> bool:
        """Whether one more flush would take epsilon past the budget."""
        if self.max_epsilon <= 0:
            return False
        return self._peek()[1] > self.max_epsilon

    def _reset_flush(self) -> None:
        self._max_weight = 0.0
        self._max_clip_norm = 0.0
        self._bits = 0
        self._unclipped = 0


def _sample_rate(sample_rate: float, population: int, cohort: int) -> float:
    if sample_rate:
        return float(sample_rate)
    if population >= 1 and cohort >= 1:
        if cohort > population:
            raise ConfigError(f"cohort: must be <= population={population}, got {cohort}")
        return cohort / population
    raise ConfigError("dp_fedavg: give sample_rate, or population and cohort "
                      "(q = cohort / population)")


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


@FLUSH_HOOKS.register("dp_sgd")
class DPSGDReportHook(FlushHook):
    """Sample-level DP-SGD on the coordinator: collects the epsilon clients report.

    Each client running ``fedlink.privacy.dp_sgd.DPSGDTrainer`` accounts its own epsilon (its
    examples are its own) and reports it with every update (``dp_epsilon`` and the settings
    behind it). The run's guarantee is the largest of them: every example is protected at
    least that well. ``report`` puts it on each flush event; with ``max_epsilon > 0`` the run
    ends once a client reports an epsilon at or above it (an after-the-fact stop: each client
    enforces its own budget before the fact with ``dp_target_epsilon``/``dp_target_steps``).
    The mean delta passes through unchanged. Options: ``max_epsilon``, ``accountant`` (the
    name recorded in the report; the clients' ``dp_accountant``).
    """

    def __init__(self, max_epsilon: float = 0.0, accountant: str = "rdp") -> None:
        if not (math.isfinite(max_epsilon) and max_epsilon >= 0):
            raise ConfigError(f"max_epsilon: must be >= 0 (0: no budget), got {max_epsilon!r}")
        self.max_epsilon = float(max_epsilon)
        self.accountant = check_accountant(accountant)
        self._record: dict[str, Any] = {}

    @property
    def epsilon(self) -> float:
        """The largest epsilon any client has reported (0 before any)."""
        return float(self._record.get("epsilon", 0.0))

    def on_update(self, update: UpdateInfo) -> None:
        """Keep the settings of the update with the largest ``dp_epsilon`` seen so far."""
        eps = _finite(update.metrics.get("dp_epsilon"))
        if eps is None or (self._record and eps < self.epsilon):
            return
        fields = {"delta": "dp_delta", "noise_multiplier": "dp_noise_multiplier",
                  "sample_rate": "dp_sample_rate", "steps": "dp_steps",
                  "clip_norm": "dp_max_grad_norm"}
        self._record = {"epsilon": eps, **{k: _finite(update.metrics.get(m))
                                           for k, m in fields.items()}}
        if self._record["steps"] is not None:
            self._record["steps"] = int(self._record["steps"])

    def on_flush(self, mean_delta: np.ndarray, flush: FlushInfo) -> np.ndarray:
        """The mean delta, unchanged (the clients' DP-SGD already privatised it)."""
        return mean_delta

    def stop_reason(self) -> str:
        """Non-empty once a client reported ``epsilon >= max_epsilon``."""
        if self.max_epsilon > 0 and self.epsilon >= self.max_epsilon:
            return (f"privacy budget exhausted: a client reported DP-SGD epsilon "
                    f"{self.epsilon:.4g} >= max_epsilon {self.max_epsilon:g}")
        return ""

    def report(self) -> dict[str, Any]:
        """``epsilon`` and the ``privacy`` record (empty before any DP-SGD update)."""
        if not self._record:
            return {}
        return {"epsilon": self.epsilon, "privacy": self.privacy_record()}

    def privacy_record(self) -> dict[str, Any]:
        """The run's DP-SGD guarantee, in ``summary.json``'s ``privacy`` shape."""
        return {"epsilon": self.epsilon, "delta": self._record.get("delta"),
                "noise_multiplier": self._record.get("noise_multiplier"),
                "sample_rate": self._record.get("sample_rate"),
                "steps": self._record.get("steps"), "accountant": self.accountant,
                "clip_norm": self._record.get("clip_norm"), "mode": "sample_dp_sgd",
                "max_epsilon": self.max_epsilon or None}

    def state_dict(self) -> dict[str, Any]:
        """The largest reported epsilon and its settings."""
        return {"record": dict(self._record)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self._record = dict(state["record"])
