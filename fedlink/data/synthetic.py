"""``synthetic``: FedProx's Synthetic(alpha, beta) (Li et al., 2020), naturally partitioned.

Device ``k`` draws ``u_k ~ N(0, alpha^2)``, ``W_k`` (10x60) and ``b_k`` (10) with entries
``~ N(u_k, 1)``, ``B_k ~ N(0, beta^2)``, ``v_k`` (60) with entries ``~ N(B_k, 1)``; its examples
are ``x ~ N(v_k, Sigma)`` with diagonal ``Sigma_jj = j^-1.2`` (j = 1..60) and labels
``y = argmax(softmax(W_k x + b_k))`` (the argmax of the logits). As in FedProx's reference
generator, ``alpha`` and ``beta`` are standard deviations: alpha controls how much the local
models differ, beta how much the local inputs differ; Synthetic(0, 0) is the mildest.

Device ``k`` holds ``int(lognormal(4, 2)) + 50`` examples, as in FedProx's generator. The
lognormal tail gives a rare device tens of thousands; ``max_samples`` (0, the default: no cap)
caps a device's examples to keep simulated local epochs short
(``examples/synthetic_fedprox.toml`` uses 2000). A
``test_fraction`` of each device (rounded, at least one example) is held out; the held-out
parts form the central test set.

There is one device per client: ``num_clients`` devices are generated (FedProx used 30), and
device ``k``'s data depends only on (seed, k, alpha, beta, max_samples, test_fraction), so the
first devices of a larger federation are the same. The default partition is ``"natural"`` (one
device per client); any other partitioner re-splits the pooled devices.
"""

from __future__ import annotations

import itertools

import numpy as np

from fedlink.config import check_fraction, check_int, check_non_negative
from fedlink.data.base import NATURAL, CentralData, Dataset, register_dataset
from fedlink.errors import ConfigError

NUM_FEATURES = 60
NUM_CLASSES = 10
MIN_SAMPLES = 50
_STD = np.arange(1, NUM_FEATURES + 1, dtype=np.float64) ** (-1.2 / 2)  # sqrt of Sigma_jj


def _device(
    rng: np.random.Generator, alpha: float, beta: float, max_samples: int
) -> tuple[np.ndarray, np.ndarray]:
    """One device's (x float32, y int64)."""
    u = rng.normal(0.0, alpha)
    weights = rng.normal(u, 1.0, size=(NUM_CLASSES, NUM_FEATURES))
    bias = rng.normal(u, 1.0, size=NUM_CLASSES)
    centre = rng.normal(rng.normal(0.0, beta), 1.0, size=NUM_FEATURES)
    extra = rng.lognormal(4.0, 2.0)
    if max_samples:
        extra = min(extra, max_samples - MIN_SAMPLES)
    count = int(extra) + MIN_SAMPLES
    x = centre + rng.standard_normal((count, NUM_FEATURES)) * _STD
    y = np.argmax(x @ weights.T + bias, axis=1)
    return x.astype(np.float32), y.astype(np.int64)


def _hold_out(
    count: int, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) positions within one device of ``count`` examples."""
    n_test = min(max(1, round(test_fraction * count)), count - 1)
    order = rng.permutation(count)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


@register_dataset("synthetic", default_partition=NATURAL)
def synthetic(
    num_clients: int,
    rng: np.random.Generator,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    test_fraction: float = 0.2,
    max_samples: int = 0,
) -> CentralData:
    """Synthetic(alpha, beta) with ``num_clients`` devices, pooled, with per-device groups."""
    devices = check_int("num_clients", num_clients, minimum=1)
    a, b = check_non_negative("alpha", alpha), check_non_negative("beta", beta)
    fraction = check_fraction("test_fraction", test_fraction)
    cap = check_int("max_samples", max_samples, minimum=0)
    if cap and cap < MIN_SAMPLES:
        raise ConfigError(f"max_samples must be 0 (no cap) or >= {MIN_SAMPLES}, got {cap}")
    xs_train, ys_train, xs_test, ys_test = [], [], [], []
    for device_rng in rng.spawn(devices):
        x, y = _device(device_rng, a, b, cap)
        train, test = _hold_out(len(y), fraction, device_rng)
        xs_train.append(x[train])
        ys_train.append(y[train])
        xs_test.append(x[test])
        ys_test.append(y[test])
    bounds = np.cumsum([0, *(len(y) for y in ys_train)])
    groups = tuple(np.arange(lo, hi) for lo, hi in itertools.pairwise(bounds))
    return CentralData(
        train=_pooled(xs_train, ys_train, "synthetic/train"),
        test=_pooled(xs_test, ys_test, "synthetic/test"),
        groups=groups,
    )


def _pooled(xs: list[np.ndarray], ys: list[np.ndarray], name: str) -> Dataset:
    """Concatenate per-device arrays into one ``Dataset``."""
    return Dataset(np.concatenate(xs), np.concatenate(ys), NUM_CLASSES, NUM_FEATURES, name=name)
