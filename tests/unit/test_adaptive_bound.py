"""The adaptive norm bound and the finite-step guard (``fedlink.aggregate.adaptive``/``guard``)."""

from __future__ import annotations

import numpy as np
import pytest

from fedlink.aggregate import ACCUMULATORS
from fedlink.aggregate.adaptive import AdaptiveNormBound
from fedlink.aggregate.guard import step_problem

RNG = np.random.default_rng(5)


def honest(n: int, dim: int = 50) -> list[np.ndarray]:
    return [(0.1 * RNG.normal(size=dim)).astype(np.float32) for _ in range(n)]


def bounded(reference: float = 0.0) -> AdaptiveNormBound:
    return AdaptiveNormBound(ACCUMULATORS.create("mean"), lambda: reference)


def test_honest_updates_of_similar_norms_are_never_clipped() -> None:
    acc, deltas = bounded(), honest(40)
    for delta in deltas:
        acc.add(delta, 1.0)
    assert acc.clipped == 0
    np.testing.assert_allclose(acc.mean(), np.mean(deltas, axis=0), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("position", [0, 2, 4])
def test_a_huge_update_is_clipped_wherever_it_comes_in_the_warm_up(position: int) -> None:
    deltas = honest(5)
    deltas[position] = np.full(50, 1e6, np.float32)
    acc = bounded()
    for delta in deltas:
        acc.add(delta, 1.0)
    assert acc.count == 5 and acc.clipped == 1
    median = np.median([np.linalg.norm(d) for i, d in enumerate(deltas) if i != position])
    assert np.linalg.norm(acc.mean()) <= 3 * median


def test_after_the_warm_up_the_bound_follows_the_median() -> None:
    acc = bounded()
    for delta in honest(10):
        acc.add(delta, 1.0)
    bound = acc.bound()
    acc.reset()
    acc.add(np.full(50, 1e6, np.float32), 1.0)
    assert np.linalg.norm(acc.mean()) == pytest.approx(bound, rel=1e-5)


def test_a_flush_before_the_warm_up_ends_folds_what_it_holds() -> None:
    acc = bounded(reference=1.0)  # at most 10 x the model's norm meanwhile
    acc.add(np.full(4, 100.0, np.float32), 1.0)
    assert acc.count == 1
    assert np.linalg.norm(acc.mean()) == pytest.approx(10.0, rel=1e-5)


def test_the_guard_refuses_non_finite_and_exploding_steps() -> None:
    old = np.ones(8, np.float32)
    assert step_problem(old, old + 0.1) == ""
    assert "non-finite" in step_problem(old, np.full(8, np.inf, np.float32))
    assert "norm" in step_problem(old, np.full(8, 1e30, np.float32))
