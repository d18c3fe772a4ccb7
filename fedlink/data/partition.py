"""Built-in partitioners: ``iid``, ``dirichlet``, ``shards``, ``kclasses`` and ``quantity``.

Each takes the train pool's labels, the number of clients and a numpy ``Generator`` and returns
one sorted int64 array of indices per client. Together the arrays cover every index exactly
once.
"""

from __future__ import annotations

import numpy as np

from fedlink.config import check_int, check_positive
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


def kclasses(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    k: int = 2,
) -> list[np.ndarray]:
    """Pathological label skew with exactly ``k`` classes per client.

    Classes are dealt round-robin over a seeded permutation (client ``i`` holds classes
    ``perm[(i k + j) mod C]`` for ``j < k``), so every class has a holder when
    ``num_clients * k >= C``; each class's examples are then split evenly at random among
    its holders. With fewer places than classes, the classes nobody holds are left out
    (``ConfigError`` when that would leave a client empty).
    """
    per_client = check_int("k", k, minimum=1)
    array = _check_labels(labels, num_clients, need=num_clients)
    classes = np.unique(array)
    if per_client > len(classes):
        raise ConfigError(f"k: {per_client} classes per client, the data has {len(classes)}")
    order = rng.permutation(classes)
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for client in range(num_clients):
        for j in range(per_client):
            holders[int(order[(client * per_client + j) % len(classes)])].append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label, owners in holders.items():
        if not owners:
            continue  # fewer places than classes: nobody holds this one
        members = rng.permutation(np.flatnonzero(array == label))
        for owner, piece in zip(owners, np.array_split(members, len(owners)), strict=True):
            parts[owner].append(piece)
    result = [np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, np.int64)
              for p in parts]
    if any(len(part) == 0 for part in result):
        raise ConfigError("kclasses: a client got no examples (more holders than examples)")
    return result


def quantity(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    exponent: float = 1.5,
    min_samples: int = 10,
) -> list[np.ndarray]:
    """Quantity skew: client sizes follow a power law, labels stay IID.

    Each client's share is drawn from a Pareto distribution with tail index ``exponent``
    (smaller: more skew; a few clients hold most of the data), then ``min_samples`` go to
    every client and the rest are dealt by a multinomial draw with those shares.
    """
    tail = check_positive("exponent", exponent)
    floor = check_int("min_samples", min_samples, minimum=0)
    array = _check_labels(labels, num_clients, need=max(num_clients, num_clients * floor))
    shares = rng.pareto(tail, size=num_clients) + 1.0
    counts = floor + rng.multinomial(len(array) - floor * num_clients, shares / shares.sum())
    owner = np.repeat(np.arange(num_clients), counts)
    owner = owner[rng.permutation(len(owner))]
    return _groups_of(owner, num_clients)


register_partitioner("iid", iid)
register_partitioner("kclasses", kclasses)
register_partitioner("quantity", quantity)
register_partitioner("dirichlet", dirichlet)
register_partitioner("shards", shards)
