"""Who masks with whom: every pair (SecAgg) or a sparse regular graph (SecAgg+).

SecAgg+ (Bell et al. 2020) masks each client with ``k = O(log n)`` neighbours instead of all
``n - 1`` others, so a client's work and bytes grow with ``log n``. Here the graph is a
circulant graph on a random cycle: the clients in an order drawn from the round's seed, each
joined to the ``k / 2`` clients before and after it. Every client has exactly ``k`` neighbours
(``k`` rounded up to even), the graph is symmetric, and the coordinator and every client
compute the same graph from the same seed and roster.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np


def neighbours(clients: Collection[int], k: int | None, seed: int) -> dict[int, tuple[int, ...]]:
    """Each client's neighbours (sorted): all others when ``k`` is None or ``k >= n - 1``."""
    ids = sorted(clients)
    n = len(ids)
    if k is None or k >= n - 1:
        return {c: tuple(i for i in ids if i != c) for c in ids}
    half = (k + 1) // 2
    order = [ids[i] for i in np.random.default_rng(seed).permutation(n)]
    graph: dict[int, set[int]] = {c: set() for c in ids}
    for position, c in enumerate(order):
        for step in range(1, half + 1):
            other = order[(position + step) % n]
            graph[c].add(other)
            graph[other].add(c)
    return {c: tuple(sorted(graph[c])) for c in ids}
