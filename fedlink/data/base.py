"""The data contract: ``Dataset``, ``CentralData``, ``FederatedData`` and the name registries.

Datasets are plain numpy (float32 features, int64 labels); nothing here imports torch.

Two registries map names to plain functions:

- a **dataset builder** ``(num_clients, rng, *, option=default, ...) -> CentralData`` makes
  the train pool and the central test set (plus, for naturally partitioned data, one group of
  train indices per device);
- a **partitioner** ``(labels, num_clients, rng, *, param=default, ...) -> list[np.ndarray]``
  splits the train pool's indices among clients.

Both declare their options as keyword-only parameters. ``load_federated`` reads those names
from the signatures to route each option to the dataset or the partitioner and to refuse
unknown ones, so registered functions may not take ``**kwargs``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from fedlink.config import check_int
from fedlink.errors import ConfigError

DatasetBuilder = Callable[..., "CentralData"]
"""``(num_clients: int, rng: np.random.Generator, *, <options>) -> CentralData``."""

Partitioner = Callable[..., list[np.ndarray]]
"""``(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, <params>)
-> list[np.ndarray]``: one array of train indices per client."""

NATURAL = "natural"
"""Partition name meaning "one client per device, as the dataset comes" (``CentralData.groups``)."""


def _frozen_view(array: np.ndarray) -> np.ndarray:
    """A read-only view of ``array`` (the caller's array itself stays writeable)."""
    view = array.view()
    view.flags.writeable = False
    return view


@dataclass(frozen=True, eq=False)
class Dataset:
    """Labelled examples: ``x`` (n, num_features) float32 and ``y`` (n,) int64 in
    ``[0, num_classes)``.

    Arrays are converted on construction (copied only when the dtype or layout differs) and
    held as read-only views, so a ``Dataset`` can be shared between clients and threads.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    num_features: int
    name: str = ""

    def __post_init__(self) -> None:
        x = np.ascontiguousarray(self.x, dtype=np.float32)
        y = np.asarray(self.y)
        if x.ndim != 2:
            raise ConfigError(f"dataset {self.name!r}: x must be 2-D, got shape {x.shape}")
        if y.ndim != 1 or len(y) != len(x):
            raise ConfigError(
                f"dataset {self.name!r}: y must be 1-D with {len(x)} labels, got shape {y.shape}"
            )
        if y.size and not np.issubdtype(y.dtype, np.integer):
            raise ConfigError(f"dataset {self.name!r}: labels must be integers, got {y.dtype}")
        classes = check_int("num_classes", self.num_classes, minimum=1)
        if self.num_features != x.shape[1]:
            raise ConfigError(
                f"dataset {self.name!r}: num_features={self.num_features} but x has "
                f"{x.shape[1]} columns"
            )
        if y.size and (y.min() < 0 or y.max() >= classes):
            raise ConfigError(f"dataset {self.name!r}: labels must lie in [0, {classes})")
        y = np.ascontiguousarray(y, dtype=np.int64)
        object.__setattr__(self, "x", _frozen_view(x))
        object.__setattr__(self, "y", _frozen_view(y))
        object.__setattr__(self, "num_classes", classes)

    def __len__(self) -> int:
        """Number of examples."""
        return len(self.y)

    def __repr__(self) -> str:
        """Name and sizes (the arrays themselves are left out)."""
        return (
            f"Dataset(name={self.name!r}, examples={len(self)}, "
            f"num_features={self.num_features}, num_classes={self.num_classes})"
        )

    def subset(self, indices: np.ndarray, name: str | None = None) -> Dataset:
        """The examples at ``indices`` (a copy), named ``name`` (default: this name)."""
        index = np.asarray(indices, dtype=np.int64)
        return Dataset(
            x=self.x[index],
            y=self.y[index],
            num_classes=self.num_classes,
            num_features=self.num_features,
            name=self.name if name is None else name,
        )

    def label_counts(self) -> np.ndarray:
        """How many examples of each class, as an int64 array of length ``num_classes``."""
        return np.bincount(self.y, minlength=self.num_classes)


@dataclass(frozen=True, eq=False)
class CentralData:
    """A dataset before partitioning: the train pool and the central test set.

    ``groups`` holds, for a naturally partitioned dataset, one array of ``train`` indices per
    device (partition ``"natural"``); it is ``None`` for pooled data.
    """

    train: Dataset
    test: Dataset
    groups: tuple[np.ndarray, ...] | None = None

    def __post_init__(self) -> None:
        _check_compatible(self.train, (self.test,))
        if self.groups is not None:
            groups = tuple(_frozen_view(np.asarray(g, dtype=np.int64)) for g in self.groups)
            object.__setattr__(self, "groups", groups)


@dataclass(frozen=True, eq=False)
class FederatedData:
    """One ``Dataset`` per client plus the central test set used to evaluate the global model."""

    clients: tuple[Dataset, ...]
    test: Dataset
    name: str = ""
    partition: str = ""

    def __post_init__(self) -> None:
        clients = tuple(self.clients)
        if not clients:
            raise ConfigError(f"federated data {self.name!r} has no clients")
        _check_compatible(self.test, clients)
        object.__setattr__(self, "clients", clients)

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.clients)

    @property
    def num_classes(self) -> int:
        """Number of classes (shared by every client and the test set)."""
        return self.test.num_classes

    @property
    def num_features(self) -> int:
        """Number of input features (shared by every client and the test set)."""
        return self.test.num_features

    def client_sizes(self) -> tuple[int, ...]:
        """Number of training examples of each client."""
        return tuple(len(client) for client in self.clients)


def _check_compatible(reference: Dataset, others: Sequence[Dataset]) -> None:
    """``ConfigError`` unless every dataset has ``reference``'s classes and features."""
    for other in others:
        if (other.num_classes, other.num_features) != (
            reference.num_classes,
            reference.num_features,
        ):
            raise ConfigError(
                f"dataset {other.name!r} has {other.num_classes} classes and "
                f"{other.num_features} features; {reference.name!r} has "
                f"{reference.num_classes} and {reference.num_features}"
            )


T = TypeVar("T")


class Catalog(Generic[T]):
    """Name -> registered item, with errors that list the known names.

    Unlike ``fedlink.registry.Registry`` (name -> factory called with options), a catalog hands
    back the item itself: dataset builders and partitioners are called with data arguments, and
    their declared options must be known before the call to route and check them.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T, replace: bool) -> None:
        """Register ``item`` as ``name`` (``ConfigError`` on a taken name unless ``replace``)."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items and not replace:
            raise ConfigError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item

    def get(self, name: str) -> T:
        """The item registered as ``name`` (``ConfigError`` listing the known names)."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ConfigError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}"
            ) from None

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._items))


def keyword_options(function: Callable[..., Any]) -> frozenset[str]:
    """The option names ``function`` accepts: its keyword-only parameters.

    Raises ``ConfigError`` when it takes ``**kwargs``, whose names cannot be checked.
    """
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        raise ConfigError(
            f"{getattr(function, '__name__', function)!r} takes **kwargs; declare its options "
            f"as keyword-only parameters"
        )
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


@dataclass(frozen=True)
class DatasetEntry:
    """A registered dataset: its builder, accepted options, and default partition."""

    name: str
    build: DatasetBuilder
    options: frozenset[str]
    default_partition: str = "iid"


@dataclass(frozen=True)
class PartitionerEntry:
    """A registered partitioner and the parameters it accepts."""

    name: str
    split: Partitioner
    options: frozenset[str] = field(default_factory=frozenset)


DATASETS: Catalog[DatasetEntry] = Catalog("dataset")
PARTITIONERS: Catalog[PartitionerEntry] = Catalog("partitioner")


def register_dataset(
    name: str,
    builder: DatasetBuilder,
    *,
    default_partition: str = "iid",
    replace: bool = False,
) -> DatasetBuilder:
    """Make ``builder`` loadable as ``name``; returns ``builder``.

    ``default_partition`` is the partition ``load_federated`` uses when none is asked for
    (``"natural"`` for data that comes split by device).
    """
    entry = DatasetEntry(name, builder, keyword_options(builder), default_partition)
    DATASETS.add(name, entry, replace)
    return builder


def get_dataset(name: str) -> DatasetEntry:
    """The dataset registered as ``name`` (``ConfigError`` listing the known names)."""
    return DATASETS.get(name)


def register_partitioner(
    name: str, partitioner: Partitioner, *, replace: bool = False
) -> Partitioner:
    """Make ``partitioner`` usable as ``partition=name``; returns ``partitioner``."""
    if name == NATURAL:
        raise ConfigError(f"partitioner name {NATURAL!r} is reserved for natural partitions")
    PARTITIONERS.add(name, PartitionerEntry(name, partitioner, keyword_options(partitioner)),
                     replace)
    return partitioner


def get_partitioner(name: str) -> Partitioner:
    """The partitioner registered as ``name`` (``ConfigError`` listing the known names)."""
    return PARTITIONERS.get(name).split
