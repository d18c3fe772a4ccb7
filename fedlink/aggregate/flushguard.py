"""The flush guard: each client's influence on a flush bounded by the flush's own statistics.

A client's update reaches the model with two numbers it chose itself: its weight (the example
count it claims) and its size (the norm of its delta). The guard bounds both from what the
*other* updates of the same flush look like, and drops updates that pull against them:

1. **weight cap**: the example count an update claims counts at most ``weight_cap x`` the
   flush's lower-median claim, so no claim buys a client more than a small multiple of a
   typical client's say (the most the protocol accepts, 100,000 examples, counts like
   ``2 x`` a median client). The factors the coordinator computes itself (staleness, the
   work fraction) multiply the capped count as before;
2. **norm bound**: the trainable part of each delta is clipped to ``norm_multiple x`` the
   lower median of the flush's norms (Sun et al. 2019's norm bounding, with the bound taken
   from the updates themselves rather than tuned). Norms are taken per unit of work,
   ``||delta|| / work``: a client that completed a tenth of its steps is not measured against
   full-work updates, and what a claim of little work gains it in norm it loses in weight.
   Under an aggregator that normalises work (FedNova) they are per step, ``||delta|| /
   steps``. A flush of fewer than ``warmup`` updates adds the norms recent flushes kept, and
   before any history the bound is at most ``REFERENCE_MULTIPLE x`` the model's norm. A
   data-independent bound (``fixed_bound``, a DP clip norm) replaces or tightens it;
3. **opposed updates dropped**: in a flush of at least ``drop_min_updates`` updates, an update
   whose clipped delta has a negative cosine with the coordinate-wise median of the clipped
   deltas is left out (a sign-flipping client's is), the most opposed first and never more
   than a minority (``(n - 1) // 2``);
4. the kept updates are folded into the aggregator (``inner``: the weighted mean, a trimmed
   mean, ...) with their capped weights.

Everything is computed over the flush's buffered updates, and they are folded **in a canonical
order** (sorted by a digest of their content: delta, weight, claim, steps, work), so a flush's
result is bit-identical whatever order its updates arrived in: no client gains by committing
first, and a synchronous run is exact however its links reorder it. The price is memory: the
guard keeps a float32 copy of each update until the flush (``n x 4 x P`` bytes for ``n``
updates of a ``P``-parameter model); the streaming aggregators alone stay ``O(P)``
(``[coordinator.robust] enabled = false``).

Non-trainable state (``fedlink.aggregate.kinds``: frozen weights, buffers, counters) is the
weighted mean of the kept updates' values with the same capped weights; only the trainable
part is clipped, compared and given to ``inner``. Each clip, cap and drop is a ``Limited``
record (the engine turns them into ``update_limited`` events and flush counts).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np

from fedlink.aggregate.base import Accumulator
from fedlink.aggregate.robust import BufferedRule, chunk_size, l2_norm
from fedlink.aggregate.streaming import StreamingMean, check_weight
from fedlink.errors import ConfigError

REFERENCE_MULTIPLE = 10.0
"""Before any history, no update may be longer than this many times the model's norm."""

DEFAULT_TRIM = 0.2
"""The coordinate-wise trim the default ``mean`` aggregator gets under the guard."""

CLIPPED, DOWNWEIGHTED, DROPPED = "clipped", "downweighted", "dropped"

GUARD_ONLY = ("weight_cap", "drop_min_updates", "warmup", "window", "max_buffer_mb")
"""``RobustConfig`` keys that only the guard reads (``trim`` and ``drop_opposed`` may be set
off without it)."""


@dataclass(frozen=True)
class RobustConfig:
    """``[coordinator.robust]``: the flush guard's settings (module docstring).

    ``enabled``: the guard (on by default); off, updates stream into the aggregator in arrival
    order behind the older per-update norm bound (``norm_bound`` / ``norm_bound_adaptive``),
    in ``O(model)`` memory and with neither weight cap nor drops. ``weight_cap``: multiple of
    the flush's lower-median claimed count (0: no cap). ``drop_opposed``: drop updates opposed to
    the coordinate-wise median (unset: on, except under a flush hook that needs the plain
    mean, such as DP-FedAvg's). ``drop_min_updates``: the smallest flush that drop applies
    to (refused when drop is off). ``trim``: the fraction of the updates (``floor(trim x n)``
    whole ones) trimmed at each end of every coordinate when the ``aggregator`` is ``"mean"``
    (unset: ``DEFAULT_TRIM``, or 0 under a hook that needs the plain mean or with a
    sparsifying uplink codec).
    ``warmup``/``window``: a flush of fewer than ``warmup`` updates takes its norm statistic
    over the last ``window`` norms kept too (adaptive norm bound only: refused where
    ``norm_bound_multiple`` is, by ``CoordinatorConfig``).
    ``max_buffer_mb``: the most memory the buffered updates of one flush may take
    (``flush.goal x 4 x model size``); a larger configuration is refused at start.
    With ``enabled = false`` the guard's own keys (``GUARD_ONLY``) are refused unless left at
    their defaults (``weight_cap = 0``, no cap, is accepted): they would apply to nothing.
    """

    enabled: bool = True
    weight_cap: float = 2.0
    drop_opposed: bool | None = None
    drop_min_updates: int = 5
    trim: float | None = None
    warmup: int = 5
    window: int = 64
    max_buffer_mb: float = 2048.0

    def __post_init__(self) -> None:
        def check(ok: bool, key: str, message: str) -> None:
            if not ok:
                raise ConfigError(f"coordinator.robust.{key}: {message}")

        check(math.isfinite(self.weight_cap) and (self.weight_cap == 0 or self.weight_cap >= 1),
              "weight_cap", f"must be >= 1 (0: no cap), got {self.weight_cap}")
        check(self.drop_min_updates >= 3, "drop_min_updates",
              f"must be >= 3 (a median of fewer says nothing), got {self.drop_min_updates}")
        check(self.trim is None or 0 <= self.trim < 0.5, "trim",
              f"must be in [0, 0.5), got {self.trim}")
        check(1 <= self.warmup <= self.window, "warmup",
              f"need 1 <= warmup <= window, got {self.warmup} and {self.window}")
        check(self.max_buffer_mb > 0, "max_buffer_mb", f"must be > 0, got {self.max_buffer_mb}")
        if not self.enabled:  # set to anything but off, they would be recorded, not applied
            defaults = {f.name: f.default for f in fields(self)}
            for key in GUARD_ONLY:
                value = getattr(self, key)
                check(value == defaults[key] or (key == "weight_cap" and value == 0), key,
                      "applies under the flush guard: it needs coordinator.robust.enabled = "
                      "true, or remove it")

    def resolved_trim(self, aggregator: str, plain_mean: bool, sparse_uplink: bool) -> float:
        """The trim in force: ``ConfigError`` naming the keys when a set one cannot apply."""
        if self.trim is None:
            if aggregator != "mean" or plain_mean or sparse_uplink or not self.enabled:
                return 0.0
            return DEFAULT_TRIM
        if self.trim > 0:
            if not self.enabled:
                raise ConfigError("coordinator.robust.trim applies under the flush guard: "
                                  "it needs coordinator.robust.enabled = true")
            if aggregator != "mean":
                raise ConfigError(f"coordinator.robust.trim applies to aggregator = 'mean'; "
                                  f"coordinator.aggregator = {aggregator!r} is its own rule")
            if plain_mean:
                raise ConfigError("coordinator.robust.trim: a flush hook in coordinator.hooks "
                                  "(differential privacy) calibrates its noise to the plain "
                                  "weighted mean; set trim = 0")
            if sparse_uplink:
                raise ConfigError("coordinator.robust.trim with a sparsifying client.compression "
                                  "(topk, randk): most coordinates of each update are zero, and "
                                  "a coordinate-wise trim would average the zeros; set trim = 0")
        return float(self.trim)

    def resolved_drop(self, plain_mean: bool) -> bool:
        """Whether opposed updates are dropped: ``ConfigError`` when set where it cannot be."""
        if self.drop_opposed is None:
            return self.enabled and not plain_mean
        if self.drop_opposed and plain_mean:
            raise ConfigError("coordinator.robust.drop_opposed: a flush hook in "
                              "coordinator.hooks (differential privacy) calibrates its noise "
                              "to the plain weighted mean of every update; set it false")
        if self.drop_opposed and not self.enabled:
            raise ConfigError("coordinator.robust.drop_opposed needs "
                              "coordinator.robust.enabled = true")
        return bool(self.drop_opposed)


@dataclass(frozen=True)
class GuardRules:
    """What a ``FlushGuard`` does, resolved from the configuration (0 or False: off)."""

    weight_cap: float = 2.0
    norm_multiple: float = 2.0
    fixed_bound: float = 0.0
    drop_opposed: bool = True
    drop_min_updates: int = 5
    warmup: int = 5
    window: int = 64


@dataclass(frozen=True)
class Limited:
    """One update the guard clipped, down-weighted or dropped, and why."""

    source: str
    action: str
    reason: str
    norm: float
    bound: float
    weight: float
    limited_weight: float
    cosine: float | None = None


@dataclass
class _Entry:
    train: np.ndarray
    rest: np.ndarray | None
    weight: float
    claim: float
    work: float
    steps: int
    source: str
    digest: bytes
    norm: float = 0.0
    length: float = 0.0
    scale: float = 1.0
    final_weight: float = 0.0
    dropped: bool = False


@dataclass
class GuardReport:
    """The statistics of one flush: the bound and cap used, and what was limited."""

    norm_bound: float | None = None
    weight_cap: float | None = None
    limited: list[Limited] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """``updates_clipped``, ``updates_downweighted``, ``updates_dropped``."""
        return {f"updates_{action}": sum(1 for x in self.limited if x.action == action)
                for action in (CLIPPED, DOWNWEIGHTED, DROPPED)}


class FlushGuard(Accumulator):
    """Buffers a flush's updates and folds them order-free, influence bounded (module doc).

    ``inner`` aggregates the trainable part of the kept, clipped deltas with capped weights
    (it is reset and refilled at every flush); ``mask`` marks the trainable elements (``None``:
    all); ``reference()`` is the current model's trainable norm.
    """

    def __init__(self, inner: Accumulator, rules: GuardRules | None = None,
                 mask: np.ndarray | None = None,
                 reference: Callable[[], float] = lambda: 0.0) -> None:
        self.inner = inner
        self.rules = rules if rules is not None else GuardRules()
        self.mask = None if mask is None else np.asarray(mask, dtype=bool)
        self.normalises_work = inner.normalises_work
        self._reference = reference
        self._entries: list[_Entry] = []
        self._norms: deque[float] = deque(maxlen=self.rules.window)
        self._plan: list[_Entry] | None = None
        self._folded = False
        self._shape: tuple[int, ...] = ()
        self.report = GuardReport()

    # -- folding in ---------------------------------------------------------------------------

    def add(self, delta: np.ndarray, weight: float, steps: int = 0, source: str = "",
            claim: float | None = None, work: float = 1.0) -> None:
        """Keep a float32 copy of ``delta`` until the flush (``source`` names it in reports).

        ``claim``: the example count the client claimed (the part of ``weight`` the cap
        applies to; ``None``: all of it); ``work``: its work fraction in (0, 1].
        """
        check_weight(weight)
        claim = float(weight if claim is None else claim)
        check_weight(claim)
        if not 0 < work <= 1:
            raise ValueError(f"work must be in (0, 1], got {work}")
        if self._plan is not None:
            raise ValueError("the flush was already aggregated: reset() first")
        flat = np.asarray(delta, dtype=np.float32).reshape(-1)
        if self._entries and delta.shape != self._shape:
            raise ValueError(f"delta shape {delta.shape} != buffered {self._shape}")
        if self.mask is not None and flat.size != self.mask.size:
            raise ValueError(f"delta has {flat.size} elements, the model {self.mask.size}")
        self._shape = delta.shape
        digest = hashlib.blake2b(flat.tobytes(), digest_size=20)
        digest.update(struct.pack("<dddq", float(weight), claim, float(work), int(steps)))
        if self.mask is None:
            train, rest = flat.copy(), None
        else:
            train, rest = flat[self.mask], flat[~self.mask]  # boolean indexing copies
        self._entries.append(_Entry(train, rest, float(weight), claim, float(work), int(steps),
                                    source, digest.digest()))

    # -- the flush ----------------------------------------------------------------------------

    def plan(self, bound: float | None = None) -> list[_Entry]:
        """Decide each update's clip, weight and fate, in canonical order (idempotent).

        ``bound``: a data-independent L2 bound to enforce besides the rules' (a hook's).
        """
        if self._plan is not None:
            return self._plan
        if not self._entries:
            raise ValueError("no updates to average")
        entries = sorted(self._entries, key=lambda e: e.digest)  # the canonical order
        for entry in entries:
            entry.length = entry.norm = l2_norm(entry.train)
            if self.normalises_work:  # FedNova compares per-step directions, not raw deltas
                entry.norm /= max(1, entry.steps)
            else:  # per unit of work: partial work is not clipped for being partial
                entry.norm /= entry.work
        report = GuardReport()
        report.norm_bound = self._norm_bound([e.norm for e in entries], bound)
        report.weight_cap = self._weight_cap([e.claim for e in entries])
        for entry in entries:
            self._limit(entry, report)
        self._drop_opposed(entries, report)
        for entry in entries:
            if not entry.dropped:
                self._norms.append(entry.norm * entry.scale)
        self._plan, self.report = entries, report
        return entries

    def _norm_bound(self, norms: list[float], extra: float | None) -> float | None:
        rules, bounds = self.rules, []
        if rules.fixed_bound > 0:
            bounds.append(rules.fixed_bound)
        if extra is not None and extra > 0:
            bounds.append(float(extra))
        if rules.norm_multiple > 0:
            cold = len(self._norms) < rules.warmup
            pool = norms if len(norms) >= rules.warmup else [*norms, *self._norms]
            median = lower_median(pool)
            if median > 0:
                bounds.append(rules.norm_multiple * median)
            reference = self._reference() if cold else 0.0
            if reference > 0:
                bounds.append(REFERENCE_MULTIPLE * reference)
        return min(bounds) if bounds else None

    def _weight_cap(self, weights: list[float]) -> float | None:
        if self.rules.weight_cap <= 0:
            return None
        return self.rules.weight_cap * lower_median(weights)

    def _limit(self, entry: _Entry, report: GuardReport) -> None:
        bound, cap = report.norm_bound, report.weight_cap
        entry.final_weight = entry.weight
        if cap is not None and entry.claim > cap:
            entry.final_weight = entry.weight * cap / entry.claim
            report.limited.append(Limited(
                entry.source, DOWNWEIGHTED, f"claimed {entry.claim:.6g} examples, counted as "
                f"{cap:.6g} ({self.rules.weight_cap:g} x the flush's median claim)",
                entry.norm, bound or 0.0, entry.weight, entry.final_weight))
        if bound is not None and entry.norm > bound:
            entry.scale = bound / entry.norm
            report.limited.append(Limited(
                entry.source, CLIPPED, f"norm {entry.norm:.6g} clipped to {bound:.6g}",
                entry.norm, bound, entry.weight, entry.final_weight))

    def _drop_opposed(self, entries: list[_Entry], report: GuardReport) -> None:
        """Drop up to a minority of updates whose cosine with the coordinate median is < 0."""
        rules = self.rules
        if not rules.drop_opposed or len(entries) < rules.drop_min_updates:
            return
        cosines = median_cosines([e.train for e in entries], [e.scale for e in entries])
        if cosines is None:  # the median is zero (sparse updates that rarely overlap)
            return
        opposed = sorted((c, i) for i, c in enumerate(cosines) if c < 0)
        for cosine, i in opposed[:(len(entries) - 1) // 2]:
            entry = entries[i]
            entry.dropped = True
            report.limited.append(Limited(
                entry.source, DROPPED, f"opposed to the flush's coordinate-wise median "
                f"(cosine {cosine:.3f})", entry.norm, report.norm_bound or 0.0,
                entry.weight, 0.0, float(cosine)))

    def kept(self) -> list[tuple[str, float]]:
        """``(source, final weight)`` of each kept update, in canonical order."""
        return [(e.source, e.final_weight) for e in self.plan() if not e.dropped]

    def mean(self) -> np.ndarray:
        """The inner aggregate of the kept, clipped updates (plus the non-trainable mean).

        Once per flush: folding hands the buffered copies to ``inner`` and lets them go.
        """
        if self._folded:
            raise ValueError("the flush was already folded: reset() first")
        self._folded = True
        return self._fold(self.plan())

    def _fold(self, plan: list[_Entry]) -> np.ndarray:
        self.inner.reset()
        rest = StreamingMean()
        for entry in plan:
            if entry.dropped:
                continue
            train = entry.train
            if entry.scale < 1.0:
                train = (train * np.float32(entry.scale)).astype(np.float32, copy=False)
            if isinstance(self.inner, BufferedRule):  # hand the copy over, not another
                self.inner.keep(train, entry.final_weight, _length(entry))
            else:
                self.inner.add(train, entry.final_weight, entry.steps)
            if entry.rest is not None and entry.rest.size:
                rest.add(entry.rest, entry.final_weight, entry.steps)
            entry.train, entry.rest = _EMPTY, None  # the buffered copy is no longer needed
        trained = self.inner.mean()
        self.inner.reset()
        if self.mask is None:
            return np.asarray(trained, dtype=np.float32).reshape(self._shape)
        out = np.empty(self.mask.size, dtype=np.float32)
        out[self.mask] = trained
        if rest.count:
            out[~self.mask] = rest.mean()
        return out.reshape(self._shape)

    def reset(self) -> None:
        """Forget the flush (the recent norms are kept across flushes)."""
        self._entries.clear()
        self._plan, self._folded = None, False
        self.inner.reset()
        self.report = GuardReport()

    @property
    def count(self) -> int:
        """Updates buffered since the last reset (dropped ones included)."""
        return len(self._entries)

    @property
    def total_weight(self) -> float:
        """Claimed weights before the flush is planned; the kept, capped weights after."""
        if self._plan is None:
            return float(sum(e.weight for e in self._entries))
        return float(sum(e.final_weight for e in self._plan if not e.dropped))

    def buffered_bytes(self) -> int:
        """Bytes of update copies held now."""
        return sum(e.train.nbytes + (0 if e.rest is None else e.rest.nbytes)
                   for e in self._entries)

    def state_dict(self) -> list[float]:
        """The recent kept norms (for a checkpoint)."""
        return list(self._norms)

    def load_state_dict(self, norms: list[float]) -> None:
        """Restore what ``state_dict`` returned."""
        self._norms.clear()
        self._norms.extend(float(n) for n in norms)


_EMPTY = np.zeros(0, dtype=np.float32)


def _length(entry: _Entry) -> float:
    """The clipped update's L2 length (what a rule ranking directions divides by; a zero
    update is its own direction)."""
    length = entry.length * entry.scale
    return length if length > 0 else 1.0


def lower_median(values: list[float]) -> float:
    """The lower median (an element of ``values``; of two, the smaller): 0 when empty."""
    if not values:
        return 0.0
    return float(sorted(values)[(len(values) - 1) // 2])


def median_cosines(deltas: list[np.ndarray], scales: list[float]) -> list[float] | None:
    """Each ``scale x delta``'s cosine with their coordinate-wise median (``None`` when the
    median is zero), a chunk of coordinates at a time (no model-sized temporary but one
    ``n x chunk`` block: ``robust.chunk_size``)."""
    n, size = len(deltas), deltas[0].size
    factors = np.asarray(scales, dtype=np.float64)[:, None]
    dots = np.zeros(n, dtype=np.float64)
    squares = np.zeros(n, dtype=np.float64)
    median_square = 0.0
    chunk = chunk_size(n)
    for start in range(0, size, chunk):
        # a row per coordinate: the median's partitions run in contiguous memory
        block = np.stack([d[start:start + chunk] for d in deltas], axis=1).astype(np.float64)
        block *= factors.T
        median = np.median(block, axis=1)
        # einsum, not matmul: it stays on this thread (see robust.squares)
        dots += np.einsum("ji,j->i", block, median)
        squares += np.einsum("ji,ji->i", block, block)
        median_square += float(np.einsum("j,j->", median, median))
    if median_square <= 0:
        return None
    norms = np.sqrt(squares) * math.sqrt(median_square)
    return [float(d / m) if m > 0 else 0.0 for d, m in zip(dots, norms, strict=True)]
