"""Issue 26: a flush's result does not depend on the order its updates arrived in.

The flush guard computes its statistics (weight cap, norm bound, opposed updates) over the
flush's buffered updates and folds them sorted by a digest of their content, so every
permutation of a flush's arrivals gives the bit-identical model: in sync rounds (a lossy link
that reorders commits), with stale updates in elastic rounds, with buffers beside weights, with
a server optimizer, and across several versions (the norms kept for small flushes included).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from conftest import FakeClock

from fedlink.aggregate.flushguard import RobustConfig
from fedlink.coordinator import CoordinatorConfig, FlushRule, RoundEngine
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.messages import Task
from fedlink.metrics import EventLog
from fedlink.params import BUFFER, TRAINABLE, ParamSpec

DIM = 40
SPEC = ParamSpec(names=("w", "running_mean"), shapes=((36,), (4,)),
                 dtypes=("float32", "float32"), kinds=(TRAINABLE, BUFFER))
CLIENTS = 8


def updates(rounds: int, seed: int = 0) -> list[list[tuple[np.ndarray, int, int]]]:
    """Per round, each client's (delta, examples, steps): honest ones of unequal sizes, a
    sign-flipper claiming a huge count and a norm blow-up, so every rule has work to do."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rounds):
        direction = rng.normal(size=DIM)
        flush = [((0.01 * (direction + rng.normal(size=DIM))).astype(np.float32),
                  int(rng.integers(5, 40)), int(rng.integers(1, 5))) for _ in range(CLIENTS)]
        flush[1] = ((-0.05 * direction).astype(np.float32), 100_000, 4)
        flush[2] = ((1e4 * rng.normal(size=DIM)).astype(np.float32), 20, 4)
        out.append(flush)
    return out


def run(order: list[int], config: CoordinatorConfig, spec: ParamSpec | None,
        rounds: list[list[tuple[np.ndarray, int, int]]], clock: FakeClock) -> np.ndarray:
    engine = RoundEngine(config, np.linspace(-1, 1, DIM, dtype=np.float32), EventLog(None),
                         clock=clock, spec=spec)
    for flush in rounds:
        tasks = {}
        for i in range(CLIENTS):
            task = engine.issue(f"c{i}")
            assert isinstance(task, Task)
            tasks[i] = task
        for i in order:
            delta, examples, steps = flush[i]
            engine.submit(ReceivedUpdate(f"c{i}", tasks[i].task_id, tasks[i].model_version,
                                         delta, examples, steps, 4, 4 * DIM))
    return engine.model.copy()


CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "fedadam": {"server_optimizer": "fedadam"},
    "median": {"aggregator": "median"},
    "fednova": {"aggregator": "fednova"},
    "no trim": {"robust": RobustConfig(trim=0.0)},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("spec", [None, SPEC], ids=["weights", "with-buffers"])
def test_every_arrival_order_gives_the_bit_identical_model(
        fake_clock: FakeClock, name: str, spec: ParamSpec | None) -> None:
    config = CoordinatorConfig(rounds=10, flush=FlushRule(goal=CLIENTS, deadline_s=None),
                               **CONFIGS[name])
    rounds = updates(3)
    orders = [list(range(CLIENTS)), list(reversed(range(CLIENTS)))]
    rng = np.random.default_rng(1)
    orders += [list(rng.permutation(CLIENTS)) for _ in range(3)]
    models = [run(order, config, spec, rounds, fake_clock) for order in orders]
    for model in models[1:]:
        np.testing.assert_array_equal(model, models[0])
    assert np.isfinite(models[0]).all()


def test_small_flushes_are_order_free_through_the_kept_norms(fake_clock: FakeClock) -> None:
    """Flushes of 3 (below the warm-up) take the norms of earlier flushes too: those are
    kept in the canonical order, so later flushes stay order-free."""
    config = CoordinatorConfig(rounds=10, flush=FlushRule(goal=3, deadline_s=None))
    rounds = [flush[:3] for flush in updates(4, seed=5)]

    def small(order: tuple[int, ...]) -> np.ndarray:
        engine = RoundEngine(config, np.zeros(DIM, np.float32), EventLog(None),
                             clock=fake_clock)
        for flush in rounds:
            tasks = [engine.issue(f"c{i}") for i in range(3)]
            for i in order:
                delta, examples, steps = flush[i]
                task = tasks[i]
                assert isinstance(task, Task)
                engine.submit(ReceivedUpdate(f"c{i}", task.task_id, task.model_version,
                                             delta, examples, steps, 4, 4 * DIM))
        return engine.model.copy()

    models = [small(order) for order in itertools.permutations(range(3))]
    for model in models[1:]:
        np.testing.assert_array_equal(model, models[0])
