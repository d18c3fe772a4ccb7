"""Built-in datasets and partitioners, registered by name; numpy only (no torch).

>>> from fedlink.data import load_federated
>>> fed = load_federated("digits", num_clients=10, seed=0, partition="dirichlet", alpha=0.3)
>>> fed.num_clients, fed.num_features, fed.num_classes
(10, 64, 10)

Datasets: ``digits`` (pooled, default partition ``iid``), ``synthetic`` (FedProx
Synthetic(alpha, beta), default partition ``natural``), and from local files
(``fedlink.data.files``): ``cifar10``, ``cifar100``, ``femnist``, ``shakespeare`` (natural),
``image_folder``, ``npz``, ``hf_disk``. Partitioners: ``iid``, ``dirichlet``, ``shards``,
``kclasses``, ``quantity``, plus ``natural`` for per-device data.
"""

from fedlink.data import digits as _digits  # noqa: F401  (registers)
from fedlink.data import files as _files  # noqa: F401  (registers)
from fedlink.data import partition as _partition  # noqa: F401  (registers)
from fedlink.data import synthetic as _synthetic  # noqa: F401  (registers)
from fedlink.data.base import (
    DATASETS,
    NATURAL,
    PARTITIONERS,
    CentralData,
    Dataset,
    DatasetBuilder,
    DatasetEntry,
    FederatedData,
    Partitioner,
    get_dataset,
    get_partitioner,
    register_dataset,
    register_partitioner,
)
from fedlink.data.federated import load_federated
from fedlink.data.partition import dirichlet, iid, kclasses, quantity, shards

__all__ = [
    "DATASETS",
    "NATURAL",
    "PARTITIONERS",
    "CentralData",
    "Dataset",
    "DatasetBuilder",
    "DatasetEntry",
    "FederatedData",
    "Partitioner",
    "dirichlet",
    "get_dataset",
    "get_partitioner",
    "iid",
    "kclasses",
    "load_federated",
    "quantity",
    "register_dataset",
    "register_partitioner",
    "shards",
]
