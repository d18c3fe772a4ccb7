"""``digits``: scikit-learn's bundled 8x8 handwritten digits (1797 images, 64 features, 10
classes; no download).

Pixel intensities 0..16 are scaled to [0, 1]. A seeded train/test split holds out
``ceil(test_fraction * 1797)`` images (360 for the default 0.2, leaving 1437 to train on),
stratified by class unless ``stratify = false``. The train pool is then split among clients
by a partitioner (default ``iid``).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import math
from pathlib import Path

import numpy as np

from fedlink.config import check_bool, check_fraction, check_int
from fedlink.data.base import CentralData, Dataset, register_dataset
from fedlink.errors import ConfigError

NUM_FEATURES = 64
NUM_CLASSES = 10


@functools.cache
def _raw() -> tuple[np.ndarray, np.ndarray]:
    """All digits as (features in [0, 1] float32, int64 labels); loaded once per process."""
    table = _bundled_table()
    x = (table[:, :-1].astype(np.float32) / np.float32(16.0)).astype(np.float32)
    y = table[:, -1].astype(np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def _bundled_table() -> np.ndarray:
    """scikit-learn's ``digits.csv.gz`` (64 pixel columns, then the label), read directly.

    Importing sklearn costs about 3 s here, most of a small simulation's start, for a file
    that numpy reads in milliseconds; ``find_spec`` locates the package without importing it.
    Falls back to ``load_digits`` should the file ever move.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("dataset 'digits' needs scikit-learn: pip install 'fedlink[datasets]'")
    bundled = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if bundled.is_file():
        with gzip.open(bundled, "rt") as rows:
            return np.loadtxt(rows, delimiter=",", dtype=np.float64)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.column_stack([bunch.data, bunch.target])


def _stratified_counts(labels: np.ndarray, n_test: int) -> np.ndarray:
    """Test examples per class, proportional to class sizes and summing to ``n_test``."""
    sizes = np.bincount(labels)
    exact = sizes * n_test / len(labels)
    counts = np.floor(exact).astype(np.int64)
    leftover = n_test - int(counts.sum())
    counts[np.argsort(counts - exact, kind="stable")[:leftover]] += 1
    return counts


def split_indices(
    labels: np.ndarray, test_fraction: float, stratify: bool, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) index arrays holding out ``ceil(test_fraction * n)`` examples.

    With ``stratify`` each class contributes to the test set in proportion to its size.
    """
    n_test = math.ceil(test_fraction * len(labels))
    if not stratify:
        order = rng.permutation(len(labels))
        return np.sort(order[n_test:]), np.sort(order[:n_test])
    test_parts = [
        rng.permutation(np.flatnonzero(labels == label))[:count]
        for label, count in enumerate(_stratified_counts(labels, n_test))
    ]
    test = np.sort(np.concatenate(test_parts))
    train = np.setdiff1d(np.arange(len(labels)), test, assume_unique=True)
    return train, test


@register_dataset("digits")
def digits(
    num_clients: int,
    rng: np.random.Generator,
    *,
    test_fraction: float = 0.2,
    stratify: bool = True,
) -> CentralData:
    """The digits train pool and test set (``num_clients`` is unused: data is pooled)."""
    check_int("num_clients", num_clients, minimum=1)
    fraction = check_fraction("test_fraction", test_fraction)
    x, y = _raw()
    train, test = split_indices(y, fraction, check_bool("stratify", stratify), rng)
    full = Dataset(x, y, NUM_CLASSES, NUM_FEATURES, name="digits")
    return CentralData(
        train=full.subset(train, name="digits/train"),
        test=full.subset(test, name="digits/test"),
    )
