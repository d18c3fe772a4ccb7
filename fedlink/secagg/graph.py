"""Who masks with whom: every pair (SecAgg) or a sparse regular graph (SecAgg+).

SecAgg+ (Bell et al. 2020) masks each client with ``k = O(log n)`` neighbours instead of all
``n - 1`` others, so a client's work and bytes grow with ``log n``. Here the graph is a
circulant graph on a random cycle: the clients in an order drawn from the round's seed, each
joined to the ``k / 2`` clients before and after it. Every client has exactly ``k`` neighbours
(``k`` rounded up to even), the graph is symmetric, and the coordinator and every client
compute the same graph from the same seed and roster.

The order is a rule any language states in a line (``cycle_order``): the ids sorted by
``SHA-256("fedlink-secagg/graph/{seed}/{id}")``, read as a big-endian integer, ties (never
seen) by id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection


def cycle_order(clients: Collection[int], seed: int) -> list[int]:
    """``clients`` in the cycle's order for ``seed`` (module docstring)."""
    def key(client: int) -> tuple[bytes, int]:
        return hashlib.sha256(f"fedlink-secagg/graph/{seed}/{client}".encode()).digest(), client

    return sorted(clients, key=key)


def neighbours(clients: Collection[int], k: int | None, seed: int) -> dict[int, tuple[int, ...]]:
    """Each client's neighbours (sorted): all others when ``k`` is None or ``k >= n - 1``."""
    ids = sorted(clients)
    n = len(ids)
    if k is None or k >= n - 1:
        return {c: tuple(i for i in ids if i != c) for c in ids}
    half = (k + 1) // 2
    order = cycle_order(ids, seed)
    graph: dict[int, set[int]] = {c: set() for c in ids}
    for position, c in enumerate(order):
        for step in range(1, half + 1):
            other = order[(position + step) % n]
            graph[c].add(other)
            graph[other].add(c)
    return {c: tuple(sorted(graph[c])) for c in ids}
