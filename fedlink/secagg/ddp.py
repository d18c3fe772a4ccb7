"""Distributed differential privacy: each client adds its share of integer noise (Skellam).

With secure aggregation the coordinator sees only the sum, so the noise that makes the sum
differentially private can be added by the clients themselves, in shares: nobody, not even
the coordinator, ever sees an update with less than its share of noise, and the sum carries
the whole of it. The noise must be integers (the sum is taken in Z_m) and closed under
summation, which is what the Skellam mechanism gives (Agarwal, Kairouz and Liu, NeurIPS
2021): ``Sk(mu) = Poisson(mu / 2) - Poisson(mu / 2)``, variance ``mu``, and the sum of ``n``
independent ``Sk(mu / n)`` is exactly ``Sk(mu)``.

A client, for one round:

1. clips its update to L2 norm ``clip_norm`` (``c``) and divides it by the granularity
   ``gamma = c / 2**granularity_bits`` (so ``c`` becomes ``2**granularity_bits`` integer units);
2. rounds each value stochastically to an integer, again until the rounded vector's norm is
   at most ``norm_bound`` (conditional randomized rounding, Kairouz, Liu and Steinke, ICML
   2021: with ``beta = exp(-1/2)`` a draw passes with probability at least ``1 - beta``), so
   one client's contribution to the sum has L2 norm at most ``Delta2 = norm_bound`` and L1
   norm at most ``Delta1 = min(sqrt(d) * Delta2, Delta2**2)`` in integer units;
3. adds ``Sk(mu / clients)`` to each value, ``mu = (noise_multiplier * c / gamma)**2``: the
   sum of ``clients`` shares has standard deviation ``noise_multiplier * c``, the noise of
   central DP-FedAvg at the same noise multiplier;
4. reduces it mod ``m = 2**modulus_bits`` for the secure sum.

The coordinator reads the unmasked sum as signed (``[-m/2, m/2)``) and multiplies by
``gamma``. ``SkellamConfig`` refuses a ring too small for the largest sum it may have to hold
(``max_clients * Delta2`` plus 20 noise standard deviations), so the sum cannot wrap.

Accounting: ``dp-accounting`` has no Skellam (or discrete Gaussian) event, so ``rdp`` is the
paper's bound (Agarwal et al. 2021, Theorem 3.5; integer orders ``alpha > 1``)

    eps(alpha) <= alpha * Delta2**2 / (2 mu)
                  + min(((2 alpha - 1) Delta2**2 + 6 Delta1) / (4 mu**2), 3 Delta1 / (2 mu))

composed over rounds by addition and turned into ``(epsilon, delta)`` by ``dp-accounting``'s
RDP conversion (``compute_epsilon``). Every client takes part in every round (no sampling
amplification is claimed), and the guarantee holds for the sum of the clients that added
noise: a round whose sum holds fewer than ``clients`` shares carries less noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedlink.errors import ConfigError
from fedlink.secagg.base import SecAggConfig, SecAggError

RDP_ORDERS: tuple[int, ...] = (*range(2, 129), 192, 256, 512, 1024)
"""The integer Rényi orders the bound holds at and the accountant searches."""

TAIL_STDDEVS = 20.0
"""Noise standard deviations the ring keeps room for (Skellam tails are sub-Gaussian-like at
this scale: the chance of one coordinate going further is far below 2**-100)."""

ROUNDING_TRIES = 1000
"""Conditional rounding draws before giving up (each passes with probability >= 1 - beta)."""


def skellam_rdp(alpha: int, l2: float, l1: float, variance: float) -> float:
    """The Skellam mechanism's RDP at integer order ``alpha > 1`` (Agarwal et al. 2021,
    Theorem 3.5) for L2/L1 sensitivities ``l2``, ``l1`` and noise variance ``variance``."""
    if alpha < 2 or int(alpha) != alpha:
        raise ValueError(f"the Skellam bound holds at integer orders > 1, got {alpha}")
    mu = variance
    return alpha * l2 ** 2 / (2 * mu) + min(((2 * alpha - 1) * l2 ** 2 + 6 * l1) / (4 * mu ** 2),
                                            3 * l1 / (2 * mu))


@dataclass(frozen=True)
class SkellamConfig:
    """Distributed Skellam noise for sums of ``clients`` updates of ``size`` values.

    ``clip_norm`` (``c``): the L2 bound of each update. ``noise_multiplier`` (``z``): the sum
    carries noise of standard deviation ``z * c`` (as central DP-FedAvg at ``z``).
    ``clients``: how many noise shares make up the whole (each client adds variance
    ``mu / clients``). ``granularity_bits``: ``c`` is this many bits of integer units.
    ``modulus_bits``: the ring (up to 32). ``max_clients``: the most updates one sum holds
    (``clients`` when not given). ``beta``: the conditional rounding's slack.
    """

    clip_norm: float
    noise_multiplier: float
    clients: int
    size: int
    granularity_bits: int = 16
    modulus_bits: int = 32
    max_clients: int | None = None
    beta: float = math.exp(-0.5)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ConfigError(f"ddp clip_norm: a positive number, got {self.clip_norm}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ConfigError(f"ddp noise_multiplier: a positive number, got "
                              f"{self.noise_multiplier}")
        if self.clients < 1 or self.size < 1:
            raise ConfigError(f"ddp clients and size: at least 1, got {self.clients}, "
                              f"{self.size}")
        if not 1 <= self.granularity_bits <= 24:
            raise ConfigError(f"ddp granularity_bits: 1..24, got {self.granularity_bits}")
        if not 0 < self.beta < 1:
            raise ConfigError(f"ddp beta: a fraction in (0, 1), got {self.beta}")
        if self.max_clients is None:
            object.__setattr__(self, "max_clients", self.clients)
        self.ring()  # the ring's own checks (modulus_bits, max_clients)
        self._check_fits()

    def _check_fits(self) -> None:
        assert self.max_clients is not None
        largest = self.max_clients * self.norm_bound + TAIL_STDDEVS * math.sqrt(self.variance)
        if largest >= 2 ** (self.modulus_bits - 1):
            need = math.ceil(math.log2(largest)) + 1
            raise ConfigError(
                f"ddp: a sum of {self.max_clients} updates ({self.norm_bound:.0f} units each) "
                f"plus its noise can reach {largest:.3g}, beyond the signed range of a "
                f"{self.modulus_bits}-bit ring: use modulus_bits >= {need} (at most 32) or "
                f"fewer granularity_bits")

    @property
    def gamma(self) -> float:
        """The real value of one integer unit: ``clip_norm / 2**granularity_bits``."""
        return self.clip_norm / (1 << self.granularity_bits)

    @property
    def variance(self) -> float:
        """``mu``: the sum's noise variance per value, in integer units."""
        return (self.noise_multiplier * self.clip_norm / self.gamma) ** 2

    @property
    def norm_bound(self) -> float:
        """``Delta2``: the L2 norm a rounded update may have, in integer units."""
        c, d = self.clip_norm / self.gamma, self.size
        slack = math.sqrt(2 * math.log(1 / self.beta))
        return math.sqrt(min(c ** 2 + d / 4 + slack * (c + math.sqrt(d) / 2),
                             (c + math.sqrt(d)) ** 2))

    @property
    def l1_bound(self) -> float:
        """``Delta1``: the L1 norm a rounded update may have (an integer vector's L1 norm is
        at most its squared L2 norm, and at most ``sqrt(d)`` times it)."""
        return min(math.sqrt(self.size) * self.norm_bound, self.norm_bound ** 2)

    def ring(self, neighbours: int | None = None, threshold: float = 0.5) -> SecAggConfig:
        """The secure sum's settings for these sums: the ring and the masking graph (values
        are encoded by ``encode``, not by ``SecAggConfig``'s quantization)."""
        assert self.max_clients is not None
        return SecAggConfig(modulus_bits=self.modulus_bits, max_clients=max(2, self.max_clients),
                            quantization_bits=1, neighbours=neighbours, threshold=threshold)

    def rdp(self, rounds: int = 1) -> np.ndarray:
        """RDP of ``rounds`` rounds at each of ``RDP_ORDERS``."""
        return rounds * np.array([skellam_rdp(a, self.norm_bound, self.l1_bound, self.variance)
                                  for a in RDP_ORDERS])

    def epsilon(self, rounds: int, delta: float) -> float:
        """``epsilon`` at ``delta`` after ``rounds`` rounds (dp-accounting's RDP conversion)."""
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        return float(compute_epsilon(RDP_ORDERS, self.rdp(rounds), delta)[0])

    def encode(self, update: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One client's noised integer vector in Z_m (uint32): clip, scale, round, add its
        share of the noise."""
        x = np.asarray(update, dtype=np.float64).reshape(-1)
        if x.size != self.size or not np.all(np.isfinite(x)):
            raise SecAggError(f"a ddp update is {self.size} finite values, got {x.size}")
        norm = float(np.linalg.norm(x))
        scaled = x * (min(1.0, self.clip_norm / norm) if norm > 0 else 1.0) / self.gamma
        integers = self._round(scaled, rng)
        share = self.variance / self.clients / 2
        integers += rng.poisson(share, x.size) - rng.poisson(share, x.size)
        return (integers % (1 << self.modulus_bits)).astype(np.uint32)

    def _round(self, scaled: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        floor = np.floor(scaled)
        for _ in range(ROUNDING_TRIES):
            rounded = (floor + (rng.random(scaled.shape) < scaled - floor)).astype(np.int64)
            if float(np.linalg.norm(rounded.astype(np.float64))) <= self.norm_bound:
                return rounded
        raise SecAggError(f"no rounding within the norm bound in {ROUNDING_TRIES} draws")

    def sum_norm_bound(self, count: int) -> float:
        """The L2 norm, in real units, beyond which a decoded sum of ``count`` updates is not
        one of honest clients': each rounded update within ``norm_bound``, plus the full
        noise's norm with 10 standard deviations of room (the norm of ``size`` values of
        variance ``mu`` exceeds ``sqrt(mu) * (sqrt(size) + t)`` with probability about
        ``exp(-t**2 / 2)``)."""
        noise = math.sqrt(self.variance) * (math.sqrt(self.size) + 10.0)
        return (count * self.norm_bound + noise) * self.gamma

    def decode_sum(self, total: np.ndarray) -> np.ndarray:
        """The float sum (with its noise) from the unmasked integer sum in Z_m."""
        m = 1 << self.modulus_bits
        signed = np.asarray(total, dtype=np.int64) % m
        signed[signed >= m // 2] -= m
        return signed.astype(np.float64) * self.gamma
