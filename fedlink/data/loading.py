"""``[data]`` into federated data: a registered dataset, a user's loader, or plugged data.

Where the options of ``[data] options`` go (the dataset's or loader's keywords, or the
partitioner's), and what a loader may return: a ``FederatedData`` (numpy, already split per
client; it keeps its own split), a ``CentralData`` (fedlink partitions it as ``[data]
partition`` says), or a ``TorchFederatedData`` (torch datasets of any shape and dtype). A
loader is called as ``loader(num_clients=, seed=, **options)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fedlink.data.base import NATURAL, CentralData, FederatedData, partitioner_entry
from fedlink.data.federated import load_federated, partition_central
from fedlink.data.torch_data import TorchFederatedData
from fedlink.errors import ConfigError
from fedlink.plug import describe, expect, keyword_names, resolve

AnyData = FederatedData | TorchFederatedData
"""Federated data as a run trains on it."""


class DataSettings(Protocol):
    """The ``[data]`` keys loading reads (``fedlink.experiment.config.DataSection``)."""

    @property
    def dataset(self) -> str:
        """A registered dataset's name."""
        ...

    @property
    def clients(self) -> int:
        """How many clients the data is split among."""
        ...

    @property
    def partition(self) -> str | None:
        """The partitioner's name (``None``: the dataset's default)."""
        ...

    @property
    def options(self) -> Mapping[str, Any]:
        """The dataset's (or loader's) and the partitioner's keyword options."""
        ...

    @property
    def loader(self) -> str:
        """``"package.module:attr"`` of a user's loader (``""``: none)."""
        ...


def load_data(section: DataSettings, seed: int, plug: Any = None) -> AnyData:
    """A run's federated data: the plugged data or loader, ``[data] loader``, or the
    registered ``[data] dataset``, partitioned as ``[data] partition`` says (seeded)."""
    source = resolve(plug if plug is not None else section.loader or None, "data loader")
    if source is None:
        return load_federated(section.dataset, section.clients, seed,
                              section.partition, **dict(section.options))
    name = data_name(section, plug)
    if callable(source) and not isinstance(source, AnyData | CentralData):
        source = _call_loader(source, section, seed)
    data = expect(source, (FederatedData, TorchFederatedData, CentralData), "the data loader")
    if not isinstance(data, CentralData):
        _refuse_split_settings(section, data, name)
    if isinstance(data, CentralData):
        data = partition_central(data, section.clients, seed,
                                 section.partition or (NATURAL if data.groups else "iid"),
                                 _split_options(section), name=name)
    if data.num_clients != section.clients:
        raise ConfigError(f"the data loader made {data.num_clients} clients, [data] clients "
                          f"is {section.clients}")
    return data


def data_name(section: DataSettings, plug: Any = None) -> str:
    """What the run's data is called in its record: the registered ``[data] dataset``, else
    the loader's (or plugged data's) import path."""
    if plug is not None:
        return describe(plug)
    return section.loader or section.dataset


def _refuse_split_settings(section: DataSettings, data: AnyData, name: str) -> None:
    """A loader that returns data already split among clients keeps its own split: a
    ``[data] partition`` or partitioner option would be recorded but never applied."""
    options = sorted(_split_options(section)) if section.partition not in (None, NATURAL) else []
    if section.partition is None and not options:
        return
    keys = ["[data] partition"] + [f"[data] options.{k}" for k in options]
    where = "[data] loader" if section.loader else "the plugged data"
    raise ConfigError(f"{', '.join(keys)} cannot apply: {where} ({name}) returned a "
                      f"{type(data).__name__}, already split among its clients, which keeps "
                      f"its own split. Unset {' and '.join(keys)}, or have the loader return "
                      f"a fedlink.data.CentralData for fedlink to partition")


def _split_options(section: DataSettings) -> dict[str, Any]:
    """The ``[data] options`` that a partitioner (rather than the loader) takes."""
    scheme = section.partition
    names = frozenset() if scheme in (None, NATURAL) else partitioner_entry(scheme).options
    return {k: v for k, v in section.options.items() if k in names}


def _call_loader(loader: Callable[..., Any], section: DataSettings, seed: int) -> Any:
    """``loader(num_clients=..., seed=..., **options)`` minus the partitioner's options."""
    split = _split_options(section)
    options = {k: v for k, v in section.options.items() if k not in split}
    accepted = keyword_names(loader, exclude=("num_clients", "seed"))
    if accepted is not None and not set(options) <= accepted:
        raise ConfigError(f"data loader {describe(loader)} does not take options "
                          f"{sorted(set(options) - accepted)}; it takes {sorted(accepted)}")
    try:
        return loader(num_clients=section.clients, seed=seed, **options)
    except TypeError as exc:
        raise ConfigError(f"data loader {describe(loader)}: {exc} (it is called as "
                          f"loader(num_clients=, seed=, **[data] options))") from exc
