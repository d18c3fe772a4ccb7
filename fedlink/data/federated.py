"""``load_federated``: one call from a dataset name to per-client data plus a test set."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from fedlink.config import check_int, check_values
from fedlink.data.base import (
    NATURAL,
    PARTITIONERS,
    CentralData,
    FederatedData,
    PartitionerEntry,
    get_dataset,
    partitioner_entry,
)
from fedlink.errors import ConfigError

T = TypeVar("T")


def load_federated(
    name: str,
    num_clients: int,
    seed: int,
    partition: str | None = None,
    **options: Any,
) -> FederatedData:
    """Build dataset ``name`` and split its train pool among ``num_clients`` clients.

    ``partition`` names a registered partitioner (``"iid"``, ``"dirichlet"``, ``"shards"``) or
    ``"natural"`` (one client per device, for data that comes split by device); ``None`` means
    the dataset's default (``"iid"`` for ``digits``, ``"natural"`` for ``synthetic``).

    Each option goes to whichever of the dataset builder and the partitioner declares it
    (e.g. ``test_fraction`` to ``digits``, ``alpha`` to ``dirichlet``). An option neither
    declares, or both declare, raises ``ConfigError``, as do unknown names and bad values.

    The same arguments give the same data. The train/test split depends only on the dataset's
    options and ``seed``, not on the partition, so partitions of one seed are comparable.
    """
    count = check_int("num_clients", num_clients, minimum=1)
    base_seed = check_int("seed", seed, minimum=0)
    dataset = get_dataset(name)
    scheme = dataset.default_partition if partition is None else partition
    splitter = None if scheme == NATURAL else _partitioner(scheme)
    data_options, split_options = _route(
        options, dataset.options, splitter.options if splitter else frozenset(), name, scheme
    )
    data_rng, split_rng = np.random.default_rng(base_seed).spawn(2)
    central = dataset.build(count, data_rng, **data_options)
    return _split(central, count, split_rng, scheme, splitter, split_options, name)


def check_options(name: str, partition: str | None, options: Mapping[str, Any],
                  section: str = "data") -> None:
    """Check a ``[data]`` table's dataset, partition and options before anything is loaded:
    both names are registered, every option is declared by the dataset or the partitioner,
    and every value fits the type its parameter is annotated with. Errors name the key
    (``data.dataset``, ``data.options.alpha``); ranges are checked where the values are used.
    """
    dataset = _named(get_dataset, name, f"{section}.dataset")
    scheme = dataset.default_partition if partition is None else partition
    splitter = None if scheme == NATURAL else _named(_partitioner, scheme, f"{section}.partition")
    data_options, split_options = _named(
        lambda _: _route(options, dataset.options, splitter.options if splitter else frozenset(),
                         name, scheme), None, f"{section}.options")
    check_values(dataset.build, data_options, f"{section}.options")
    if splitter is not None:
        check_values(splitter.split, split_options, f"{section}.options")


def check_partition_options(partition: str | None, options: Mapping[str, Any],
                            section: str = "data") -> None:
    """Check ``partition`` and the options its partitioner declares (the rest go to a user's
    data loader, which is only known once it is imported)."""
    if partition in (None, NATURAL):
        return
    splitter = _named(_partitioner, partition, f"{section}.partition")
    check_values(splitter.split, {k: v for k, v in options.items() if k in splitter.options},
                 f"{section}.options")


def _named(lookup: Callable[[Any], T], value: Any, key: str) -> T:
    """``lookup(value)``, its ``ConfigError`` prefixed with the config key it is about."""
    try:
        return lookup(value)
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from exc


def partition_central(central: CentralData, num_clients: int, seed: int, partition: str,
                      options: Mapping[str, Any], name: str = "") -> FederatedData:
    """Split data a user's loader built among ``num_clients`` clients with ``partition``
    (``"natural"``: its own groups) and the partitioner's ``options``; seeded like
    ``load_federated``, so the same seed gives the same split."""
    count = check_int("num_clients", num_clients, minimum=1)
    splitter = None if partition == NATURAL else _partitioner(partition)
    _, split_rng = np.random.default_rng(check_int("seed", seed, minimum=0)).spawn(2)
    _route(options, frozenset(), splitter.options if splitter else frozenset(), name, partition)
    return _split(central, count, split_rng, partition, splitter, dict(options), name)


def _split(central: CentralData, count: int, rng: np.random.Generator, scheme: str,
           splitter: PartitionerEntry | None, options: Mapping[str, Any],
           name: str) -> FederatedData:
    """Partition ``central``'s train pool into one ``Dataset`` per client."""
    if splitter is None:
        parts = _natural(central, count, name)
    else:
        parts = splitter.split(central.train.y, count, rng, **options)
    _check_parts(parts, count, len(central.train), scheme)
    clients = tuple(
        central.train.subset(part, name=f"{name}/client{i}") for i, part in enumerate(parts)
    )
    return FederatedData(clients=clients, test=central.test, name=name, partition=scheme)


def _partitioner(scheme: str) -> PartitionerEntry:
    """The registered partitioner ``scheme``; the error also mentions ``"natural"``."""
    try:
        return partitioner_entry(scheme)
    except ConfigError:
        known = ", ".join(sorted((*PARTITIONERS.names(), NATURAL)))
        raise ConfigError(f"unknown partition {scheme!r}; known: {known}") from None


def _route(
    options: Mapping[str, Any],
    data_names: frozenset[str],
    split_names: frozenset[str],
    name: str,
    scheme: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``options`` into (dataset options, partitioner options)."""
    ambiguous = sorted(set(options) & data_names & split_names)
    if ambiguous:
        raise ConfigError(
            f"options {ambiguous} are accepted by both dataset {name!r} and partition "
            f"{scheme!r}; they cannot be routed"
        )
    unknown = sorted(set(options) - data_names - split_names)
    if unknown:
        raise ConfigError(
            f"unknown options {unknown} for dataset {name!r} with partition {scheme!r}; "
            f"accepted: {sorted(data_names | split_names)}"
        )
    data = {k: v for k, v in options.items() if k in data_names}
    split = {k: v for k, v in options.items() if k in split_names}
    return data, split


def _natural(central: CentralData, num_clients: int, name: str) -> Sequence[np.ndarray]:
    """The dataset's own per-device groups, one per client."""
    if central.groups is None:
        raise ConfigError(
            f"dataset {name!r} has no natural partition; use one of: "
            f"{', '.join(PARTITIONERS.names())}"
        )
    if len(central.groups) != num_clients:
        raise ConfigError(
            f"dataset {name!r} has {len(central.groups)} devices but {num_clients} clients "
            f"were asked for"
        )
    return central.groups


def _check_parts(parts: Sequence[np.ndarray], num_clients: int, size: int, scheme: str) -> None:
    """``ConfigError`` unless ``parts`` is one in-range integer index array per client."""
    if len(parts) != num_clients:
        raise ConfigError(f"partition {scheme!r} made {len(parts)} parts for {num_clients} clients")
    for part in parts:
        array = np.asarray(part)
        if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
            raise ConfigError(f"partition {scheme!r} returned a non-index array {array.dtype}")
        if array.size and (array.min() < 0 or array.max() >= size):
            raise ConfigError(f"partition {scheme!r} returned indices outside [0, {size})")
