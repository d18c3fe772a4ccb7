"""Robust aggregation rules: norm bounding, coordinate-wise trimmed mean and median.

- ``NormBounded`` (``[coordinator] norm_bound = B``) clips each update to L2 norm ``B`` before
  any aggregator sees it: ``delta <- delta * min(1, B / ||delta||_2)`` (Sun et al. 2019,
  "Can you really backdoor federated learning?"). A per-update transform: no buffering; an
  update that is clipped costs one model-sized temporary while it is folded in.
- ``TrimmedMean`` (``aggregator = "trimmed_mean"``) and ``CoordinateMedian``
  (``aggregator = "median"``) are coordinate-wise rules (Yin et al. 2018). Unlike the mean they
  cannot be computed from a running sum, so **they buffer every update until the flush**:
  memory is ``n x 4 x P`` bytes for ``n`` updates per flush (at most ``flush.goal``) of a
  ``P``-parameter model (``n`` times the model, against about twice for the mean), plus
  a bounded scratch at the flush, which works through the coordinates a chunk at a time
  (``chunk_size``).

Both rules are **unweighted by default** (``weighted = false``): every update is one unit of
mass, whatever it claims. A weight is what a client says about itself (its example count), and
one lying client with a huge weight would otherwise *be* the weighted median. With
``weighted = true`` they honour the engine's weights (examples x staleness x work) by treating
update ``i`` as ``w_i`` units of probability mass at its value, per coordinate (the engine
already caps each claimed count: ``limits.max_examples_per_update``). With equal weights they
are the textbook rules: ``trim = 0.1`` over 10 updates drops the lowest and highest value of each
coordinate and averages the other 8; the median of an even number of values is the mean of
the middle two.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np

from fedlink.aggregate.base import ACCUMULATORS, Accumulator
from fedlink.aggregate.streaming import CHUNK, check_weight
from fedlink.errors import ConfigError

_HALF_TOLERANCE = 1e-9


SCRATCH_VALUES = 1 << 21
"""Values (float64: 16 MB) in one ``n x chunk`` block of a flush's coordinate-wise work."""


def chunk_size(n: int) -> int:
    """Coordinates per chunk of coordinate-wise work over ``n`` updates: ``CHUNK``, fewer
    when ``n`` is large, so that each ``n x chunk`` temporary stays near ``SCRATCH_VALUES``
    (a temporary that size is reused by the allocator; a larger one is fresh pages from the
    kernel each time, which cost more than the work on them)."""
    return max(256, min(CHUNK, SCRATCH_VALUES // max(n, 1)))


def squares(piece: np.ndarray) -> float:
    """``sum(piece ** 2)`` of a 1-D chunk, on this thread.

    Not ``np.dot``: numpy hands a long dot product to OpenBLAS's thread pool, and with every
    core busy (a simulation's training workers, other processes) waiting for those threads
    turned a 50 us sum into 10-30 ms per update. ``einsum``'s own loop never leaves the thread.
    """
    return float(np.einsum("i,i->", piece, piece))


def l2_norm(vector: np.ndarray) -> float:
    """``||vector||_2`` in float64, one chunk at a time (no model-sized temporary)."""
    flat = vector.reshape(-1)
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, flat.size, CHUNK):
            total += squares(flat[start:start + CHUNK].astype(np.float64))
    return float(np.sqrt(total))


def clip_to_norm(delta: np.ndarray, bound: float) -> np.ndarray:
    """``delta * min(1, bound / ||delta||_2)`` (``delta`` itself when within the bound)."""
    norm = l2_norm(delta)
    if norm <= bound:
        return delta
    return (delta * np.float32(bound / norm)).astype(np.float32, copy=False)


class NormBounded(Accumulator):
    """Clips each delta to L2 norm ``bound``, then hands it to ``inner``."""

    def __init__(self, inner: Accumulator, bound: float) -> None:
        if not bound > 0:
            raise ConfigError(f"norm_bound must be > 0, got {bound}")
        self.inner = inner
        self.bound = float(bound)
        self.normalises_work = inner.normalises_work
        self.clipped = 0

    def add(self, delta: np.ndarray, weight: float, steps: int = 0) -> None:
        """Clip ``delta`` to the bound and fold it into ``inner``."""
        bounded = clip_to_norm(delta, self.bound)
        self.clipped += bounded is not delta
        self.inner.add(bounded, weight, steps)

    def mean(self) -> np.ndarray:
        """The inner aggregate of the clipped deltas."""
        return self.inner.mean()

    def reset(self) -> None:
        """Reset ``inner`` (and the clip counter)."""
        self.inner.reset()
        self.clipped = 0

    @property
    def count(self) -> int:
        """Deltas folded in since the last reset."""
        return self.inner.count

    @property
    def total_weight(self) -> float:
        """The inner accumulator's total weight."""
        return self.inner.total_weight


class BufferedRule(Accumulator):
    """Keeps every delta (float32) and weight until the flush; subclasses reduce a chunk.

    ``weighted``: use the weights as probability mass (else every update counts once).
    """

    def __init__(self, weighted: bool = False) -> None:
        if not isinstance(weighted, bool):
            raise ConfigError(f"weighted must be true or false, got {weighted!r}")
        self.weighted = weighted
        self._deltas: list[np.ndarray] = []
        self._weights: list[float] = []
        self._lengths: list[float] = []

    def add(self, delta: np.ndarray, weight: float, steps: int = 0) -> None:
        """Keep a float32 copy of ``delta`` with its weight."""
        check_weight(weight)
        if self._deltas and delta.shape != self._deltas[0].shape:
            raise ValueError(f"delta shape {delta.shape} != buffered {self._deltas[0].shape}")
        self._deltas.append(np.array(delta, dtype=np.float32, copy=True))
        self._weights.append(float(weight))
        self._lengths.append(1.0)

    def keep(self, delta: np.ndarray, weight: float, length: float = 1.0) -> None:
        """``add`` without the copy: the rule takes ``delta`` (float32) over, and the caller
        must not change it until ``reset`` (the flush guard hands over its own copies).

        ``length``: the update's size as the caller measures it (> 0); a rule that ranks
        directions rather than values (``TrimmedMean`` by count) ranks ``delta / length``.
        """
        check_weight(weight)
        if not length > 0:
            raise ValueError(f"length must be > 0, got {length}")
        if self._deltas and delta.shape != self._deltas[0].shape:
            raise ValueError(f"delta shape {delta.shape} != buffered {self._deltas[0].shape}")
        self._deltas.append(np.asarray(delta, dtype=np.float32))
        self._weights.append(float(weight))
        self._lengths.append(float(length))

    def mean(self) -> np.ndarray:
        """The rule applied coordinate-wise, a chunk of coordinates at a time (``chunk_size``)."""
        if not self._deltas:
            raise ValueError("no updates to average")
        shape = self._deltas[0].shape
        flat = [d.reshape(-1) for d in self._deltas]
        weights = (np.asarray(self._weights, dtype=np.float64) if self.weighted
                   else np.ones(len(self._weights)))
        lengths = np.asarray(self._lengths, dtype=np.float64)[:, None]
        out = np.empty(flat[0].size, dtype=np.float32)
        chunk = chunk_size(len(flat))
        for start in range(0, out.size, chunk):
            pieces = [d[start:start + chunk] for d in flat]
            out[start:start + chunk] = self._reduce_pieces(pieces, weights, lengths)
        return out.reshape(shape)

    def _reduce_pieces(self, pieces: list[np.ndarray], weights: np.ndarray,
                       lengths: np.ndarray) -> np.ndarray:
        """The rule on one chunk of each update (``lengths``: ``n x 1``, what ``keep`` was
        told)."""
        block = np.stack(pieces).astype(np.float64)
        return self._reduce(*_sorted_mass(block, weights))

    @abstractmethod
    def _reduce(self, values: np.ndarray, cum: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """The rule on one chunk: ``values`` sorted per column, ``cum`` their cumulative
        weights, ``mass`` the weights (all ``n x c``)."""

    def reset(self) -> None:
        """Drop the buffered deltas."""
        self._deltas.clear()
        self._weights.clear()
        self._lengths.clear()

    @property
    def count(self) -> int:
        """Deltas buffered since the last reset."""
        return len(self._deltas)

    @property
    def total_weight(self) -> float:
        """Sum of the buffered weights."""
        return float(sum(self._weights))


def _sorted_mass(block: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each column of ``block`` sorted, with the cumulative weight and weight of each value."""
    order = np.argsort(block, axis=0, kind="stable")
    values = np.take_along_axis(block, order, axis=0)
    mass = weights[order]
    return values, np.cumsum(mass, axis=0), mass


@ACCUMULATORS.register("trimmed_mean")
class TrimmedMean(BufferedRule):
    """Coordinate-wise trimmed mean: drop the ``trim`` fraction of weight at each end.

    Per coordinate, with values sorted ``v_(1) <= ... <= v_(n)``, weights ``w_(k)``, cumulative
    weights ``c_k`` (``c_0 = 0``) and total ``W``, each value keeps the part of its mass that
    lies in ``[trim W, (1 - trim) W]``::

        m_k  = max(0, min(c_k, (1 - trim) W) - max(c_(k-1), trim W))
        mean = sum_k m_k v_(k) / ((1 - 2 trim) W)

    ``trim = 0`` is the weighted mean; ``0 <= trim < 0.5``. Buffers updates (module docstring).

    ``trim_by_count`` (with ``weighted``): *which* values are trimmed is decided by count,
    ``floor(trim x n)`` whole updates at each end, and the values kept are averaged with their
    weights: the flush guard's rule, under which no weight a client claims keeps its extreme
    value from being trimmed, while the others keep FedAvg's weighting by examples (a flush of
    fewer than ``1 / trim`` updates is not trimmed at all). Updates handed over with
    ``keep(delta, weight, length)`` are ranked by direction, ``delta / length``: honest
    updates differ in length with the work behind them (more examples, more local steps),
    and ranking raw values would trim the longest, most-trained ones at both ends and shrink
    the step toward the shortest. Parallel updates, equal in direction, are ranked by value.
    The kept values themselves are averaged unscaled.
    """

    def __init__(self, trim: float = 0.1, weighted: bool = False,
                 trim_by_count: bool = False) -> None:
        if not 0 <= trim < 0.5:
            raise ConfigError(f"trimmed_mean: trim must be in [0, 0.5), got {trim}")
        if not isinstance(trim_by_count, bool):
            raise ConfigError(f"trim_by_count must be true or false, got {trim_by_count!r}")
        super().__init__(weighted)
        self.trim = float(trim)
        self.trim_by_count = trim_by_count

    def _reduce_pieces(self, pieces: list[np.ndarray], weights: np.ndarray,
                       lengths: np.ndarray) -> np.ndarray:
        """By count: each coordinate's ranks, no cumulative weights; else the sorted-mass
        rule of ``_reduce``."""
        if not self.trim_by_count:
            return super()._reduce_pieces(pieces, weights, lengths)
        n = len(pieces)
        cut = int(np.floor(self.trim * n + _HALF_TOLERANCE))  # whole updates
        block = np.stack(pieces, axis=1).astype(np.float64)  # a row per coordinate: the
        if cut == 0:                                          # partitions run in contiguous
            return np.asarray(np.einsum("ij,j->i", block, weights) / weights.sum())  # memory
        kept = kept_by_rank(block, block / lengths.T, cut)
        block *= kept  # the trimmed values zeroed in place: no other n x chunk temporary
        # summed in the order the updates were kept, as with no trim (the flush guard keeps
        # them in a canonical order: its flush does not depend on their arrival)
        return np.asarray(np.einsum("ij,j->i", block, weights)
                          / np.einsum("ij,j->i", kept, weights))

    def _reduce(self, values: np.ndarray, cum: np.ndarray, mass: np.ndarray) -> np.ndarray:
        total = cum[-1]
        low, high = self.trim * total, (1.0 - self.trim) * total
        kept = np.clip(np.minimum(cum, high) - np.maximum(cum - mass, low), 0.0, None)
        return np.asarray((kept * values).sum(axis=0) / kept.sum(axis=0))


def kept_by_rank(values: np.ndarray, keys: np.ndarray, cut: int) -> np.ndarray:
    """Which entries of each row are ranked ``cut`` to ``n - cut - 1`` by (key, value,
    index): a boolean ``n``-wide mask per row, ``n - 2 cut`` true.

    The ranking of ``np.lexsort((values, keys))``, without sorting: a partition finds the
    keys at ranks ``cut - 1`` and ``n - cut``, and the keys strictly between are kept. A row
    where that leaves the window short has keys tied with a boundary key: among tied entries
    of one value (coordinates many updates leave at zero) the index ranks, so the first
    ones are trimmed at the low end and the last ones at the high end; a row whose tied
    entries differ in value (parallel updates: their values break the tie, so the same
    shortest and longest ones are trimmed at every coordinate) is ranked in full.
    """
    n = keys.shape[1]
    bounds = np.partition(keys, (cut - 1, n - cut), axis=1)
    low, high = bounds[:, cut - 1:cut].copy(), bounds[:, n - cut:n - cut + 1].copy()
    del bounds  # an n x chunk copy: not kept while the masks are made
    kept = (keys > low) & (keys < high)
    short = np.flatnonzero(kept.sum(axis=1) < n - 2 * cut)
    if short.size:
        rows = short if short.size < len(keys) else slice(None)  # every row: views, no copies
        kept[rows] = _kept_at_ties(values[rows], keys[rows], low[rows], high[rows], cut,
                                   kept[rows])
    return kept


def _kept_at_ties(values: np.ndarray, keys: np.ndarray, low: np.ndarray, high: np.ndarray,
                  cut: int, between: np.ndarray) -> np.ndarray:
    """``kept_by_rank`` for rows with keys tied at a boundary (``between``: the entries
    strictly between the boundary keys)."""
    n = keys.shape[1]
    at_low, at_high = keys == low, keys == high
    trim_low = (cut - (keys < low).sum(axis=1))[:, None]  # tied entries trimmed per end
    trim_high = (cut - (keys > high).sum(axis=1))[:, None]
    counter = np.int16 if n < 2**15 else np.int32
    rank_low = np.cumsum(at_low, axis=1, dtype=counter)  # its place in its tie, by index
    rank_high = np.cumsum(at_high, axis=1, dtype=counter)
    keep_low = at_low & (rank_low > trim_low)
    keep_high = at_high & (rank_high <= rank_high[:, -1:] - trim_high)
    # one tie spanning the window is trimmed at both ends
    kept = between | np.where(low == high, keep_low & keep_high, keep_low | keep_high)
    mixed = np.flatnonzero(_spread(values, at_low) | _spread(values, at_high))
    if mixed.size:
        order = np.lexsort((values[mixed], keys[mixed]), axis=1)[:, cut:n - cut]
        ranked = np.zeros((mixed.size, n), dtype=bool)
        np.put_along_axis(ranked, order, True, axis=1)
        kept[mixed] = ranked
    return kept


def _spread(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per row, whether the ``values`` at ``where`` differ (from the first of them)."""
    first = values[np.arange(len(values)), np.argmax(where, axis=1)][:, None]
    return (where & (values != first)).any(axis=1)


@ACCUMULATORS.register("median")
class CoordinateMedian(BufferedRule):
    """Coordinate-wise weighted median.

    Per coordinate, the smallest sorted value ``v_(k)`` whose cumulative weight ``c_k`` reaches
    ``W / 2``; when ``c_k`` equals ``W / 2`` exactly, the mean of ``v_(k)`` and ``v_(k+1)`` (so
    equal weights give ``numpy.median``). Buffers updates (module docstring).
    """

    def _reduce(self, values: np.ndarray, cum: np.ndarray, mass: np.ndarray) -> np.ndarray:
        half = cum[-1] / 2.0
        reached = cum >= half * (1.0 - _HALF_TOLERANCE)
        k = np.argmax(reached, axis=0)
        columns = np.arange(values.shape[1])
        lower = values[k, columns]
        upper = values[np.minimum(k + 1, len(values) - 1), columns]
        exact = np.isclose(cum[k, columns], half, rtol=_HALF_TOLERANCE, atol=0.0)
        return np.where(exact, (lower + upper) / 2.0, lower)
