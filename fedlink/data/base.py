"""The data contract: ``Dataset``, ``CentralData``, ``FederatedData`` and the name registries.

Datasets are plain numpy (float32 features, int64 labels); nothing here imports torch.

Two registries (``fedlink.registry.Registry``) map names to plain functions:

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
from typing import Any, TypeVar, overload

import numpy as np

from fedlink.config import check_int
from fedlink.errors import ConfigError
from fedlink.registry import Registry

DatasetBuilder = Callable[..., "CentralData"]
"""``(num_clients: int, rng: np.random.Generator, *, <options>) -> CentralData``."""

Partitioner = Callable[..., list[np.ndarray]]
"""``(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, <params>)
-> list[np.ndarray]``: one array of train indices per client."""

B = TypeVar("B", bound=DatasetBuilder)
P = TypeVar("P", bound=Partitioner)

NATURAL = "natural"
"""Partition name meaning "one client per device, as the dataset comes" (``CentralData.groups``)."""


def _frozen_view(array: np.ndarray) -> np.ndarray:
    """A read-only view of ``array`` (the caller's array itself stays writeable)."""
    view = array.view()
    view.flags.writeable = False
    return view


def check_labels(labels: np.ndarray, count: int, num_classes: int,
                 name: str) -> tuple[np.ndarray, int]:
    """``labels`` as contiguous int64 and ``num_classes`` checked, or ``ConfigError`` unless
    they are ``count`` integers in ``[0, num_classes)``."""
    y = np.asarray(labels)
    if y.ndim != 1 or len(y) != count:
        raise ConfigError(f"dataset {name!r}: y must be 1-D with {count} labels, got shape "
                          f"{y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(f"dataset {name!r}: labels must be integers, got {y.dtype}")
    classes = check_int("num_classes", num_classes, minimum=1)
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise ConfigError(f"dataset {name!r}: labels must lie in [0, {classes})")
    return np.ascontiguousarray(y, dtype=np.int64), classes


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
        if x.ndim != 2:
            raise ConfigError(f"dataset {self.name!r}: x must be 2-D, got shape {x.shape}")
        y, classes = check_labels(self.y, len(x), self.num_classes, self.name)
        if self.num_features != x.shape[1]:
            raise ConfigError(
                f"dataset {self.name!r}: num_features={self.num_features} but x has "
                f"{x.shape[1]} columns"
            )
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
        """The examples at ``indices`` (a copy), named ``name`` (default: this name).

        Not checked again: rows of a checked dataset are valid (a simulation takes a subset
        per task, and checking the labels cost as much as a small client's data)."""
        index = np.asarray(indices, dtype=np.int64)
        subset = object.__new__(Dataset)
        for attribute, value in (("x", _frozen_view(self.x[index])),
                                 ("y", _frozen_view(self.y[index])),
                                 ("num_classes", self.num_classes),
                                 ("num_features", self.num_features),
                                 ("name", self.name if name is None else name)):
            object.__setattr__(subset, attribute, value)
        return subset

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
    """A registered dataset: its builder, accepted options, and default partition.

    Calling the entry calls the builder, so the entry is what ``DATASETS`` holds.
    """

    name: str
    build: DatasetBuilder
    options: frozenset[str]
    default_partition: str = "iid"

    def __call__(self, num_clients: int, rng: np.random.Generator,
                 **options: Any) -> CentralData:
        """``build(num_clients, rng, **options)``."""
        return self.build(num_clients, rng, **options)


@dataclass(frozen=True)
class PartitionerEntry:
    """A registered partitioner and the parameters it accepts (calling it splits)."""

    name: str
    split: Partitioner
    options: frozenset[str] = field(default_factory=frozenset)

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator,
                 **options: Any) -> list[np.ndarray]:
        """``split(labels, num_clients, rng, **options)``."""
        return self.split(labels, num_clients, rng, **options)


DATASETS: Registry[CentralData] = Registry("dataset")
"""Dataset name -> ``DatasetEntry`` (``register_dataset`` adds one)."""
PARTITIONERS: Registry[list[np.ndarray]] = Registry("partitioner")
"""Partition name -> ``PartitionerEntry`` (``register_partitioner`` adds one)."""


@overload
def register_dataset(name: str, *, default_partition: str = "iid",
                     replace: bool = False) -> Callable[[B], B]: ...


@overload
def register_dataset(name: str, builder: B, *, default_partition: str = "iid",
                     replace: bool = False) -> B: ...


def register_dataset(name: str, builder: DatasetBuilder | None = None, *,
                     default_partition: str = "iid", replace: bool = False) -> Any:
    """Make ``builder`` loadable as ``name``; returns ``builder``. Without ``builder``, a
    decorator: ``@register_dataset("mine")``.

    ``default_partition`` is the partition ``load_federated`` uses when none is asked for
    (``"natural"`` for data that comes split by device). The builder's options are its
    keyword-only parameters (``**kwargs`` is refused: its names cannot be checked).
    """

    def add(target: B) -> B:
        entry = DatasetEntry(name, target, keyword_options(target), default_partition)
        DATASETS.add(name, entry, replace=replace)
        return target

    return add if builder is None else add(builder)


def get_dataset(name: str) -> DatasetEntry:
    """The dataset registered as ``name``, or the builder an import string names
    (``ConfigError`` listing the known names)."""
    item = DATASETS.get(name)
    if isinstance(item, DatasetEntry):
        return item
    return DatasetEntry(name, item, keyword_options(item))


@overload
def register_partitioner(name: str, *, replace: bool = False) -> Callable[[P], P]: ...


@overload
def register_partitioner(name: str, partitioner: P, *, replace: bool = False) -> P: ...


def register_partitioner(name: str, partitioner: Partitioner | None = None, *,
                         replace: bool = False) -> Any:
    """Make ``partitioner`` usable as ``partition=name``; returns ``partitioner``. Without
    it, a decorator: ``@register_partitioner("mine")``."""
    if name == NATURAL:
        raise ConfigError(f"partitioner name {NATURAL!r} is reserved for natural partitions")

    def add(target: P) -> P:
        entry = PartitionerEntry(name, target, keyword_options(target))
        PARTITIONERS.add(name, entry, replace=replace)
        return target

    return add if partitioner is None else add(partitioner)


def partitioner_entry(name: str) -> PartitionerEntry:
    """The partitioner registered as ``name`` with its declared options (or the function an
    import string names)."""
    item = PARTITIONERS.get(name)
    if isinstance(item, PartitionerEntry):
        return item
    return PartitionerEntry(name, item, keyword_options(item))


def get_partitioner(name: str) -> Partitioner:
    """The partitioner registered as ``name`` (``ConfigError`` listing the known names)."""
    return partitioner_entry(name).split
