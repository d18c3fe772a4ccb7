"""Finding 1: a client declaring the largest count the protocol accepts must not steer the model.

``Join`` accepts up to ``limits.max_examples_per_update`` (100,000) examples, and each update's
weight is the count it claims, capped at that. Before the flush guard a client declaring and
claiming 100,000 beside honest clients of 10 examples took 99.98% of the flush's weight: its
sign-flipped step became the model's. The guard counts every claim at most 2 x the
flush's lower-median claim, so the liar counts like two honest clients; in a flush of 5 or more its
opposed update is also dropped.
"""

from __future__ import annotations

import numpy as np
import pytest
from _hostile import events_of, run_flushes
from conftest import CoordinatorFactory

from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig

pytestmark = pytest.mark.timeout(60)

DIM = 64
RNG = np.random.default_rng(11)
X0 = RNG.normal(size=DIM).astype(np.float32)
DIRECTION = (0.05 * RNG.normal(size=DIM)).astype(np.float32)  # where honest training goes
CAP = LimitsConfig().max_examples_per_update


def honest() -> np.ndarray:
    return (DIRECTION + 0.01 * RNG.normal(size=DIM)).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("goal", [4, 6])
def test_a_liar_at_the_join_cap_counts_like_two_median_clients(
        coordinator: CoordinatorFactory, goal: int) -> None:
    assert CAP == 100_000
    config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=goal, deadline_s=None))
    flip = -honest()  # the honest step reversed, at an honest norm: no norm bound catches it
    flush = [(f"honest{i}", honest(), 10) for i in range(goal - 1)] + [("liar", flip, CAP)]
    models, server = run_flushes(coordinator, config, X0, [flush])
    # The model moves with the honest clients (before: cosine -1, the liar's step).
    assert cosine(models[0] - X0, DIRECTION) > 0.5
    accepted = events_of(server, "update_accepted")
    assert accepted[-1]["num_examples"] == CAP  # the protocol took the claim...
    limited = {e["action"]: e for e in events_of(server, "update_limited")}
    assert limited["downweighted"]["weight"] == CAP  # ...and the guard capped its say
    assert limited["downweighted"]["limited_weight"] == 20.0
    if goal >= 5:  # a flush large enough to tell who pulls against the rest
        assert limited["dropped"]["cosine"] < 0
    flushed = events_of(server, "flush")[-1]
    assert flushed["updates_downweighted"] == 1
    honest_weight = 10.0 * (goal - 1)
    kept_liar = 0.0 if goal >= 5 else 20.0
    assert flushed["total_weight"] == pytest.approx(honest_weight + kept_liar)
