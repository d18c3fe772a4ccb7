"""Built-in partitioners: ``iid``, ``dirichlet`` and ``shards``.

Each takes the train pool's labels, the number of clients and a numpy ``Generator`` and returns
one sorted int64 array of indices per client. Together the arrays cover every index exactly
once.
"""

from __future__ import annotations

import numpy as np

from fedlink.data._checks import check_int, check_positive
from fedlink.data.base import register_partitioner
from fedlink.errors import ConfigError


def _check_labels(labels: np.ndarray, num_clients: int, need: int) -> np.ndarray:
    """Validated labels; ``need`` is the fewest examples the split can work with."""
    array = np.asarray(labels)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ConfigError(f"labels must be a 1-D integer array, got {array.dtype} {array.shape}")
    check_int("num_clients", num_clients, minimum=1)
    if len(array) < need:
        raise ConfigError(
            f"cannot split {len(array)} examples among {num_clients} clients (need >= {need})"
        )
    return array


def _groups_of(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Indices owned by each client (``owner[i]`` is example ``i``'s client), each sorted."""
    order = np.argsort(owner, kind="stable")
    bounds = np.cumsum(np.bincount(owner, minlength=num_clients))[:-1]
    return [part.astype(np.int64) for part in np.split(order, bounds)]


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Uniformly random split into ``num_clients`` parts whose sizes differ by at most one."""
    array = _check_labels(labels, num_clients, need=num_clients)
    parts = np.array_split(rng.permutation(len(array)), num_clients)
    return [np.sort(part).astype(np.int64) for part in parts]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    alpha: float = 0.5,
    min_samples: int = 10,
) -> list[np.ndarray]:
    """Label-skewed split: each class is shared out in proportions drawn from Dir(alpha).

    Smaller ``alpha`` gives more skew (alpha -> 0: each class goes to few clients; alpha -> inf:
    IID). Class counts per client are a multinomial draw with those proportions.

    Every client ends up with at least ``min_samples`` examples: after the single Dirichlet draw,
    each client below the floor is topped up with examples moved at random from the currently
    largest client. This keeps the draw reproducible (no resampling loop) and slightly dilutes
    the skew for very small ``alpha``. ``ConfigError`` when ``num_clients * min_samples``
    exceeds the number of examples.
    """
    concentration = check_positive("alpha", alpha)
    floor = check_int("min_samples", min_samples, minimum=0)
    array = _check_labels(labels, num_clients, need=max(1, num_clients * floor))
    owner = np.empty(len(array), dtype=np.int64)
    clients = np.arange(num_clients)
    for label in np.unique(array):
        members = rng.permutation(np.flatnonzero(array == label))
        shares = rng.dirichlet(np.full(num_clients, concentration))
        owner[members] = np.repeat(clients, rng.multinomial(len(members), shares))
    _top_up(owner, num_clients, floor, rng)
    return _groups_of(owner, num_clients)


def _top_up(owner: np.ndarray, num_clients: int, floor: int, rng: np.random.Generator) -> None:
    """Move examples from the largest clients until every client holds ``floor`` (in place)."""
    counts = np.bincount(owner, minlength=num_clients)
    for client in np.flatnonzero(counts < floor):
        while counts[client] < floor:
            donor = int(np.argmax(counts))
            take = min(floor - counts[client], counts[donor] - floor)
            if take <= 0:  # cannot happen when len(owner) >= num_clients * floor
                raise ConfigError("not enough examples to give every client min_samples")
            moved = rng.choice(np.flatnonzero(owner == donor), size=take, replace=False)
            owner[moved] = client
            counts[donor] -= take
            counts[client] += take


def shards(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    shards_per_client: int = 2,
) -> list[np.ndarray]:
    """Pathological non-IID split of McMahan et al.: few labels per client.

    Examples are sorted by label (random order within a label), cut into
    ``shards_per_client * num_clients`` contiguous shards of near-equal size, and each client
    is dealt ``shards_per_client`` shards at random. A client thus sees at most about
    ``shards_per_client`` labels (a shard may straddle a label boundary).
    """
    per_client = check_int("shards_per_client", shards_per_client, minimum=1)
    array = _check_labels(labels, num_clients, need=per_client * num_clients)
    total = per_client * num_clients
    shuffled = rng.permutation(len(array))
    by_label = shuffled[np.argsort(array[shuffled], kind="stable")]
    pieces = np.array_split(by_label, total)
    deal = rng.permutation(total).reshape(num_clients, per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])).astype(np.int64) for row in deal]


register_partitioner("iid", iid)
register_partitioner("dirichlet", dirichlet)
register_partitioner("shards", shards)
