"""``TorchFederatedData``: per-client torch datasets (any input shape and target dtype).

What a user's ``[data] loader`` returns when fedlink's numpy ``Dataset`` (2-D float features,
integer labels) does not fit: images kept as ``(C, H, W)``, token ids, regression targets, the
user's transforms and augmentation. Each client's entry is a torch ``Dataset``, a
``DataLoader``, or a zero-argument callable returning one, which is called when that client
first trains (lazy loading of large data).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fedlink.errors import ConfigError

TorchSplit = torch.utils.data.Dataset | torch.utils.data.DataLoader
ClientSource = TorchSplit | Callable[[], TorchSplit]
"""A client's data: a torch ``Dataset``/``DataLoader``, or a callable loading one lazily."""


@dataclass(frozen=True, eq=False)
class TorchFederatedData:
    """One torch data source per client plus the central test set (``Dataset``/``DataLoader``).

    ``name`` is reported in the run's config; ``num_classes`` (0: not a classification task)
    is informational.
    """

    clients: Sequence[ClientSource]
    test: TorchSplit
    name: str = "torch-data"
    num_classes: int = 0

    def __post_init__(self) -> None:
        clients = tuple(self.clients)
        if not clients:
            raise ConfigError(f"federated data {self.name!r} has no clients")
        for index, source in enumerate(clients):
            if not (isinstance(source, TorchSplit) or callable(source)):
                raise ConfigError(f"client {index} of {self.name!r} is a "
                                  f"{type(source).__name__}, expected a torch Dataset, a "
                                  f"DataLoader or a callable returning one")
        if not isinstance(self.test, TorchSplit):
            raise ConfigError(f"the test set of {self.name!r} is a {type(self.test).__name__}, "
                              f"expected a torch Dataset or DataLoader")
        object.__setattr__(self, "clients", clients)

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.clients)

    def is_lazy(self, index: int) -> bool:
        """Whether client ``index``'s data is loaded on first use."""
        return not isinstance(self.clients[index], TorchSplit)

    def client(self, index: int) -> TorchSplit:
        """Client ``index``'s data, loading it now when its entry is a callable."""
        source = self.clients[index]
        if isinstance(source, TorchSplit):
            return source
        loaded = source()
        if not isinstance(loaded, TorchSplit):
            raise ConfigError(f"the loader of client {index} of {self.name!r} returned a "
                              f"{type(loaded).__name__}, expected a torch Dataset or DataLoader")
        return loaded
