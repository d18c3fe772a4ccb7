"""Model builders, registered by name in ``MODELS``, and ``build_model``: ``logreg``, ``mlp``,
``cnn``.

A builder is ``(num_features, num_classes, *, <options>) -> nn.Module`` mapping a float32 batch
``(n, num_features)`` to logits ``(n, num_classes)``. Register one with
``@MODELS.register("name")``; configs then say ``model = "name"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from fedlink.config import check_int
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
    Only the CPU generator is seeded: ``torch.manual_seed`` would also queue a lazy seeding of
    every accelerator backend, recording a stack trace each time (about 4 ms a model, which
    thousands of simulated clients each pay).
    """
    features = check_int("num_features", num_features, minimum=1)
    classes = check_int("num_classes", num_classes, minimum=1)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(check_int("seed", seed, minimum=0))
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
    widths = [check_int("mlp.hidden", width, minimum=1) for width in hidden]
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip([num_features, *widths], widths, strict=False):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    layers.append(nn.Linear(widths[-1] if widths else num_features, num_classes))
    return nn.Sequential(*layers)


@MODELS.register("cnn")
def cnn(*, num_features: int, num_classes: int, channels: int = 1,
        widths: Sequence[int] = (32, 64), batchnorm: bool = True) -> nn.Module:
    """A small CNN for square images given as flat ``channels x side x side`` rows (the file
    datasets' layout): per width a 3x3 convolution, BatchNorm (unless ``batchnorm = false``),
    ReLU and 2x2 max-pooling, then a linear layer to the logits."""
    side = math.isqrt(num_features // max(channels, 1))
    if channels < 1 or channels * side * side != num_features:
        raise ConfigError(f"cnn: {num_features} features are not {channels} square channels")
    layers: list[nn.Module] = [nn.Unflatten(1, (channels, side, side))]
    fan_in = channels
    for width in (check_int("cnn.widths", w, minimum=1) for w in widths):
        layers += [nn.Conv2d(fan_in, width, 3, padding=1),
                   nn.BatchNorm2d(width) if batchnorm else nn.Identity(), nn.ReLU(),
                   nn.MaxPool2d(2)]
        fan_in, side = width, side // 2
    if side < 1:
        raise ConfigError(f"cnn: {len(widths)} poolings shrink the image below one pixel")
    layers += [nn.Flatten(), nn.Linear(fan_in * side * side, num_classes)]
    return nn.Sequential(*layers)
