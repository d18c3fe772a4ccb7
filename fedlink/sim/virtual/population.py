"""Who the simulated clients are, kept compactly: a population of 10^6 costs a few bytes each.

A ``Population`` answers, for client ``index``: its link profile, its compute speed, its
example count and (only while it is selected) a trainer over its data. Per client it stores a
profile code (one byte) and a speed (four bytes); data and trainers are made on demand.

- ``ExperimentPopulation``: the clients of an ``Experiment`` (its partitioned data and the
  configured trainer, built when a client is selected and dropped when its task ends) - what
  the equivalence with real gRPC runs on;
- ``SyntheticPopulation``: ``[virtual] population`` clients of seeded synthetic data (client
  ``i``'s examples are drawn from a generator seeded by (seed, i) when it is selected), trained
  by a numpy softmax regression: the 10^6-client scale runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedlink.client import Trainer, TrainPlan, TrainResult
from fedlink.client.base import planned_steps
from fedlink.netem import Fleet, LinkProfile


class Population(Protocol):
    """The simulated clients, by index."""

    @property
    def size(self) -> int:
        """How many clients there are."""
        ...

    def profile(self, index: int) -> LinkProfile | None:
        """Client ``index``'s link (``None``: an ideal one)."""
        ...

    def speed(self, index: int) -> float:
        """Client ``index``'s compute-time multiplier (2 = twice as slow)."""
        ...

    def trainer(self, index: int) -> Trainer:
        """A trainer over client ``index``'s data (made now; drop it after the task)."""
        ...

    def num_examples(self, index: int) -> int:
        """Client ``index``'s example count (what its trainer's ``num_examples`` says)."""
        ...


class Links:
    """A fleet's assignment kept as one byte (profile) and four bytes (speed) per client."""

    def __init__(self, fleet: Fleet | None, size: int) -> None:
        self.fleet = fleet
        if fleet is None:
            self._names: list[str] = []
            self._codes = np.zeros(0, dtype=np.uint8)
            self._speeds = np.ones(0, dtype=np.float32)
            return
        names, speeds = fleet.assign(size)
        self._names = list(fleet.mix)
        code = {name: i for i, name in enumerate(self._names)}
        self._codes = np.fromiter((code[n] for n in names), dtype=np.uint8, count=size)
        self._speeds = np.asarray(speeds, dtype=np.float32)

    def profile(self, index: int) -> LinkProfile | None:
        """Client ``index``'s profile, with the seed ``Fleet.sample`` would give it."""
        if self.fleet is None:
            return None
        return self.fleet.client_profile(self._names[self._codes[index]], index)

    def profile_name(self, index: int) -> str:
        """The fleet entry client ``index`` was drawn from (``"ideal"`` without a fleet)."""
        return "ideal" if self.fleet is None else self._names[self._codes[index]]

    def speed(self, index: int) -> float:
        """Client ``index``'s speed multiplier (1 without a fleet)."""
        return 1.0 if self.fleet is None else float(self._speeds[index])

    @property
    def nbytes(self) -> int:
        """Memory held per population, in bytes."""
        return int(self._codes.nbytes + self._speeds.nbytes)


@dataclass
class ExperimentPopulation:
    """An experiment's clients: its data partition and its trainer factory."""

    links: Links
    build_trainer: Callable[[int], Trainer]
    num_clients: int
    count_examples: Callable[[int], int] | None = None

    @property
    def size(self) -> int:
        """The experiment's ``[data] clients``."""
        return self.num_clients

    def profile(self, index: int) -> LinkProfile | None:
        """From the fleet."""
        return self.links.profile(index)

    def speed(self, index: int) -> float:
        """From the fleet."""
        return self.links.speed(index)

    def trainer(self, index: int) -> Trainer:
        """The experiment's trainer for ``index`` (built now)."""
        return self.build_trainer(index)

    def num_examples(self, index: int) -> int:
        """From ``count_examples`` when given, else from a trainer built for it."""
        if self.count_examples is not None:
            return self.count_examples(index)
        return self.build_trainer(index).num_examples()


@dataclass
class TracedSpeeds:
    """``base`` with the compute speeds of a device trace, where the trace has one."""

    base: Population
    speeds: Mapping[int, float]

    @property
    def size(self) -> int:
        """The base population's."""
        return self.base.size

    @property
    def links(self) -> Links | None:
        """The base population's link assignment, if it has one."""
        return getattr(self.base, "links", None)

    def profile(self, index: int) -> LinkProfile | None:
        """The base population's."""
        return self.base.profile(index)

    def speed(self, index: int) -> float:
        """The trace's speed for ``index``, else the base population's."""
        return self.speeds.get(index) or self.base.speed(index)

    def trainer(self, index: int) -> Trainer:
        """The base population's."""
        return self.base.trainer(index)

    def num_examples(self, index: int) -> int:
        """The base population's."""
        return self.base.num_examples(index)


@dataclass(frozen=True)
class SyntheticSpec:
    """Seeded synthetic classification data: ``num_classes`` Gaussian clusters in
    ``num_features`` dimensions; each client leans towards two classes of its own (label skew)
    and holds between ``min_examples`` and ``max_examples`` examples."""

    num_features: int = 32
    num_classes: int = 10
    min_examples: int = 8
    max_examples: int = 64
    seed: int = 0

    @property
    def num_parameters(self) -> int:
        """Weights and biases of the softmax regression."""
        return self.num_classes * self.num_features + self.num_classes

    def centres(self) -> np.ndarray:
        """The class means (the same for every client)."""
        rng = np.random.default_rng([self.seed, 0xC0DE])
        return rng.normal(0.0, 1.0, size=(self.num_classes, self.num_features))

    def client_examples(self, index: int) -> int:
        """Client ``index``'s example count: the first draw ``client_data`` makes."""
        return self._count(np.random.default_rng([self.seed, index]))

    def _count(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.min_examples, self.max_examples + 1))

    def client_data(self, index: int, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Client ``index``'s (x float32, y int64), drawn from its own seeded generator."""
        rng = np.random.default_rng([self.seed, index])
        count = self._count(rng)
        favourite = rng.integers(self.num_classes, size=2)
        y = np.where(rng.random(count) < 0.8, rng.choice(favourite, count),
                     rng.integers(self.num_classes, size=count))
        x = centres[y] + rng.normal(0.0, 1.0, size=(count, self.num_features))
        return x.astype(np.float32), y.astype(np.int64)

    def test_set(self, count: int = 2000) -> tuple[np.ndarray, np.ndarray]:
        """A balanced held-out set drawn from the same clusters."""
        rng = np.random.default_rng([self.seed, 0x7E57])
        y = rng.integers(self.num_classes, size=count)
        x = self.centres()[y] + rng.normal(0.0, 1.0, size=(count, self.num_features))
        return x.astype(np.float32), y.astype(np.int64)


def softmax_logits(params: np.ndarray, x: np.ndarray, spec: SyntheticSpec) -> np.ndarray:
    """``x @ W.T + b`` for the flat ``params`` (W row-major, then b)."""
    k, d = spec.num_classes, spec.num_features
    weights = params[:k * d].reshape(k, d)
    return np.asarray(x @ weights.T + params[k * d:])


class SoftmaxTrainer:
    """Minibatch SGD of a softmax regression in numpy, over one client's data."""

    def __init__(self, x: np.ndarray, y: np.ndarray, spec: SyntheticSpec) -> None:
        self.x, self.y, self.spec = x, y, spec

    def num_examples(self) -> int:
        """The client's example count."""
        return len(self.y)

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """``planned_steps`` SGD steps from ``params`` on seeded minibatches."""
        steps = planned_steps(plan, len(self.y))
        rng = np.random.default_rng(plan.seed)
        w = np.array(params, dtype=np.float32)
        k, d = self.spec.num_classes, self.spec.num_features
        for _ in range(steps):
            batch = rng.integers(len(self.y), size=min(plan.batch_size, len(self.y)))
            x, y = self.x[batch], self.y[batch]
            logits = softmax_logits(w, x, self.spec)
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(y)), y] -= 1.0
            p /= len(y)
            w[:k * d] -= plan.learning_rate * (p.T @ x).reshape(-1)
            w[k * d:] -= plan.learning_rate * p.sum(axis=0)
        return TrainResult(w, self.num_examples(), steps, steps)

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """Cross-entropy ``loss``, ``accuracy`` and ``examples`` of ``params`` on this client's
        data (federated evaluation, ``fedlink.sim.virtual.evaluations``)."""
        logits = softmax_logits(np.asarray(params, dtype=np.float32), self.x, self.spec)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        rows = np.arange(len(self.y))
        return {"loss": float(-log_p[rows, self.y].mean()),
                "accuracy": float(np.mean(np.argmax(logits, axis=1) == self.y)),
                "examples": float(len(self.y))}


class SyntheticPopulation:
    """``size`` lazily generated clients of ``SyntheticSpec`` data on a fleet's links."""

    def __init__(self, spec: SyntheticSpec, size: int, links: Links) -> None:
        self.spec = spec
        self._size = size
        self.links = links
        self._centres = spec.centres()

    @property
    def size(self) -> int:
        """The population."""
        return self._size

    def profile(self, index: int) -> LinkProfile | None:
        """From the fleet."""
        return self.links.profile(index)

    def speed(self, index: int) -> float:
        """From the fleet."""
        return self.links.speed(index)

    def num_examples(self, index: int) -> int:
        """Drawn as the trainer's data would be, without drawing the data."""
        return self.spec.client_examples(index)

    def trainer(self, index: int) -> Trainer:
        """A softmax trainer over client ``index``'s freshly drawn data."""
        x, y = self.spec.client_data(index, self._centres)
        return SoftmaxTrainer(x, y, self.spec)

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """Accuracy of ``params`` on the held-out set."""
        x, y = self._test
        return {"accuracy": float(np.mean(np.argmax(softmax_logits(params, x, self.spec),
                                                    axis=1) == y))}

    @property
    def _test(self) -> tuple[np.ndarray, np.ndarray]:
        cached = getattr(self, "_cached_test", None)
        if cached is None:
            cached = self.spec.test_set()
            self._cached_test = cached
        return cached
