"""Staleness weights: how much an update trained on an old model still counts."""

from __future__ import annotations

from fedlink.aggregate.base import STALENESS_WEIGHTS, StalenessWeight
from fedlink.errors import ConfigError


@STALENESS_WEIGHTS.register("constant")
class ConstantWeight(StalenessWeight):
    """``s(tau) = 1``: every accepted update counts fully."""

    def __call__(self, tau: int) -> float:
        """Always 1."""
        return 1.0


@STALENESS_WEIGHTS.register("polynomial")
class PolynomialWeight(StalenessWeight):
    """``s(tau) = (1 + tau) ** -a`` (FedAsync's polynomial staleness), ``a >= 0``."""

    def __init__(self, a: float = 0.5) -> None:
        if a < 0:
            raise ConfigError(f"polynomial staleness exponent a must be >= 0, got {a}")
        self.a = a

    def __call__(self, tau: int) -> float:
        """``(1 + tau) ** -a``."""
        return float((1 + tau) ** -self.a)


@STALENESS_WEIGHTS.register("hinge")
class HingeWeight(StalenessWeight):
    """``s(tau) = 1`` while ``tau <= b``, then ``1 / (a * (tau - b) + 1)``; ``a, b >= 0``."""

    def __init__(self, a: float = 10.0, b: int = 4) -> None:
        if a < 0 or b < 0:
            raise ConfigError(f"hinge staleness needs a >= 0 and b >= 0, got a={a}, b={b}")
        self.a = a
        self.b = b

    def __call__(self, tau: int) -> float:
        """1 up to ``b``, then a hyperbolic decay with slope ``a``."""
        if tau <= self.b:
            return 1.0
        return 1.0 / (self.a * (tau - self.b) + 1.0)
