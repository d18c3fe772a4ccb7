"""``LazyDataset``: a ``Dataset`` whose features are read from its files when first used.

A loader of large local files (``fedlink.data.files``) holds the labels, which are small and
all that partitioners, example counts and the label-distribution summary read, and a ``Rows``
reader for the features. ``subset`` composes indices without reading anything, so
partitioning a lazy train pool gives every client a lazy share; a share's features are read
the first time its ``x`` is used, when that client trains (``fedlink.sim`` builds the trainer
of a client whose data is lazy only then, through ``fedlink.client.lazy.LazyTrainer``). A
client that never trains never reads its share.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from fedlink.data.base import Dataset, check_labels
from fedlink.errors import ConfigError


class Rows(Protocol):
    """Reads the features of some examples of one file-backed split."""

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """The features of the examples at ``indices`` (positions in the split, in that
        order), one row each: ``(len(indices), ...)``, flattened by the caller."""
        ...


class LazyDataset(Dataset):
    """A ``Dataset`` over ``rows``: labels held, ``x`` read (once) when first used.

    ``indices`` are the examples' positions in the split ``rows`` reads (all of it when
    ``None``). Reading is idempotent: two threads reading a share for the first time at once
    may both read it, and get the same array.
    """

    _rows: Rows
    _indices: np.ndarray
    _x: np.ndarray | None

    def __init__(self, rows: Rows, y: np.ndarray, num_classes: int, num_features: int,
                 name: str = "", indices: np.ndarray | None = None) -> None:
        labels, classes = check_labels(y, len(np.asarray(y)), num_classes, name)
        positions = np.arange(len(labels)) if indices is None else np.asarray(indices, np.int64)
        if len(positions) != len(labels):
            raise ConfigError(f"dataset {name!r}: {len(positions)} indices for {len(labels)} "
                              f"labels")
        labels = labels.view()  # read-only, without touching the caller's array
        labels.flags.writeable = False
        for key, value in (("y", labels), ("num_classes", classes), ("name", name),
                           ("num_features", int(num_features)), ("_rows", rows),
                           ("_indices", positions), ("_x", None)):
            object.__setattr__(self, key, value)

    @property
    def x(self) -> np.ndarray:
        """The features, ``(len(self), num_features)`` float32, read on first use."""
        x = self._x
        if x is None:
            x = self._read()
            object.__setattr__(self, "_x", x)
        return x

    def _read(self) -> np.ndarray:
        """This share's features from ``rows``, flattened, checked and read-only."""
        shape = (len(self), self.num_features)
        if not len(self):
            return np.zeros(shape, np.float32)
        read = np.asarray(self._rows(self._indices), dtype=np.float32)
        if len(read) != len(self) or read.size != len(self) * self.num_features:
            raise ConfigError(f"dataset {self.name!r}: read features of shape {read.shape}, "
                              f"expected {shape} (flattened)")
        flat = np.ascontiguousarray(read.reshape(shape))
        flat.flags.writeable = False
        return flat

    @property
    def loaded(self) -> bool:
        """Whether the features have been read."""
        return self._x is not None

    def subset(self, indices: np.ndarray, name: str | None = None) -> Dataset:
        """The examples at ``indices``, still unread (a copy of read ones once ``x`` is)."""
        if self.loaded:
            return super().subset(indices, name)
        index = np.asarray(indices, dtype=np.int64)
        return LazyDataset(self._rows, self.y[index], self.num_classes, self.num_features,
                           self.name if name is None else name, self._indices[index])
