"""Validation of the plain option values that reach datasets and partitioners from configs."""

from __future__ import annotations

import math
from numbers import Integral, Real

from fedlink.errors import ConfigError


def check_int(field: str, value: object, minimum: int) -> int:
    """``value`` as an ``int`` >= ``minimum`` (``ConfigError`` naming ``field`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ConfigError(f"{field}: must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{field}: must be >= {minimum}, got {value}")
    return int(value)


def check_positive(field: str, value: object) -> float:
    """``value`` as a finite ``float`` > 0."""
    number = _real(field, value)
    if not number > 0:
        raise ConfigError(f"{field}: must be > 0, got {value!r}")
    return number


def check_non_negative(field: str, value: object) -> float:
    """``value`` as a finite ``float`` >= 0."""
    number = _real(field, value)
    if not number >= 0:
        raise ConfigError(f"{field}: must be >= 0, got {value!r}")
    return number


def check_fraction(field: str, value: object) -> float:
    """``value`` as a ``float`` strictly between 0 and 1."""
    number = _real(field, value)
    if not 0 < number < 1:
        raise ConfigError(f"{field}: must be in (0, 1), got {value!r}")
    return number


def check_bool(field: str, value: object) -> bool:
    """``value`` when it is a ``bool``."""
    if not isinstance(value, bool):
        raise ConfigError(f"{field}: must be true or false, got {value!r}")
    return value


def _real(field: str, value: object) -> float:
    """``value`` as a finite ``float`` (booleans are refused)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigError(f"{field}: must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(f"{field}: must be finite, got {value!r}")
    return number
