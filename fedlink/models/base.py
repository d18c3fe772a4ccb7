"""Model builders, registered by name in ``MODELS``, and ``build_model``.

A builder is ``(num_features, num_classes, *, <options>) -> nn.Module`` mapping a float32 batch
``(n, num_features)`` to logits ``(n, num_classes)``. Register one with
``@MODELS.register("name")``; configs then say ``model = "name"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import torch
from torch import nn

from fedlink.errors import ConfigError
from fedlink.registry import Registry

MODELS: Registry[nn.Module] = Registry("model")


def build_model(
    name: str, num_features: int, num_classes: int, seed: int = 0, **options: object
) -> nn.Module:
    """Build model ``name`` with its weights initialised from ``seed``.

    The same arguments give bit-identical weights. Initialisation runs inside
    ``torch.random.fork_rng``, so torch's global CPU generator is left as it was (the builders
    run on CPU; move the model afterwards). ``ConfigError`` on an unknown name or option.
    """
    features = _positive("num_features", num_features)
    classes = _positive("num_classes", num_classes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_non_negative("seed", seed))
        return MODELS.create(name, num_features=features, num_classes=classes, **options)


@MODELS.register("logreg")
def logreg(*, num_features: int, num_classes: int) -> nn.Module:
    """Multinomial logistic regression: one linear layer to the logits."""
    return nn.Linear(num_features, num_classes)


@MODELS.register("mlp")
def mlp(*, num_features: int, num_classes: int, hidden: Sequence[int] = (64, 64)) -> nn.Module:
    """Fully connected network with ReLU after each ``hidden`` layer (default 64-64)."""
    if isinstance(hidden, str | bytes) or not isinstance(hidden, Sequence):
        raise ConfigError(f"mlp.hidden: must be a list of layer widths, got {hidden!r}")
    widths = [_positive("mlp.hidden", width) for width in hidden]
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip([num_features, *widths], widths, strict=False):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    layers.append(nn.Linear(widths[-1] if widths else num_features, num_classes))
    return nn.Sequential(*layers)


def _positive(field: str, value: object) -> int:
    """``value`` as an int >= 1 (``ConfigError`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ConfigError(f"{field}: must be a positive integer, got {value!r}")
    return int(value)


def _non_negative(field: str, value: object) -> int:
    """``value`` as an int >= 0 (``ConfigError`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ConfigError(f"{field}: must be a non-negative integer, got {value!r}")
    return int(value)
