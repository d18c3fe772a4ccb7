"""Robust rules: norm bounding, coordinate-wise trimmed mean and median; FedNova normalisation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedlink.aggregate import ACCUMULATORS, FedNovaMean, NormBounded, StreamingMean
from fedlink.aggregate.flushguard import median_cosines
from fedlink.aggregate.robust import chunk_size, kept_by_rank
from fedlink.aggregate.streaming import CHUNK
from fedlink.errors import ConfigError


def fill(name: str, deltas: np.ndarray, weights: list[float] | None = None,
         **options: float | bool) -> np.ndarray:
    acc = ACCUMULATORS.create(name, **options)
    for i, delta in enumerate(deltas):
        acc.add(delta, 1.0 if weights is None else weights[i])
    return acc.mean()


# -- trimmed mean and median ----------------------------------------------------------------------

def test_trimmed_mean_with_equal_weights_is_scipys() -> None:
    rng = np.random.default_rng(0)
    deltas = rng.normal(size=(10, 37)).astype(np.float32)
    deltas[3] += 1000.0  # one attacker
    mean = fill("trimmed_mean", deltas, trim=0.1)
    np.testing.assert_allclose(mean, stats.trim_mean(deltas, 0.1, axis=0), rtol=1e-5, atol=1e-6)
    assert np.abs(mean).max() < 5  # the attacker's values are trimmed away


def test_trimmed_mean_by_hand_with_weights() -> None:
    # one coordinate, values 0, 1, 2, 10 with weights 1, 1, 1, 1 and trim 0.25: W = 4, the mass
    # kept is [1, 3]: all of 1 and 2 -> 1.5. Weights 2, 1, 1, 0.5 (W = 4.5), trim 0.2:
    # kept mass [0.9, 3.6]: 1.1 of value 0, 1 of value 1, 0.6 of value 2 -> 2.2 / 2.7.
    deltas = np.array([[0.0], [1.0], [2.0], [10.0]], np.float32)
    assert fill("trimmed_mean", deltas, trim=0.25)[0] == pytest.approx(1.5)
    weighted = fill("trimmed_mean", deltas, [2.0, 1.0, 1.0, 0.5], trim=0.2,
                    weighted=True)
    assert weighted[0] == pytest.approx(2.2 / 2.7, rel=1e-6)


def test_trim_zero_is_the_weighted_mean() -> None:
    rng = np.random.default_rng(1)
    deltas = rng.normal(size=(7, 20)).astype(np.float32)
    weights = list(rng.uniform(0.5, 3.0, size=7))
    expected = np.average(deltas, axis=0, weights=weights)
    np.testing.assert_allclose(fill("trimmed_mean", deltas, weights, trim=0.0, weighted=True),
                               expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 5, 6])
def test_median_with_equal_weights_is_numpys(n: int) -> None:
    deltas = np.random.default_rng(n).normal(size=(n, 33)).astype(np.float32)
    np.testing.assert_allclose(fill("median", deltas), np.median(deltas, axis=0), rtol=1e-6)


def test_weighted_median_by_hand() -> None:
    deltas = np.array([[0.0], [1.0], [5.0]], np.float32)
    assert fill("median", deltas, [1.0, 1.0, 3.0], weighted=True)[0] == 5.0  # 3/5 of the mass
    assert fill("median", deltas, [2.0, 1.0, 1.0], weighted=True)[0] == 0.5  # half at 0
    assert fill("median", deltas, [1.0, 1.0, 3.0])[0] == 1.0  # unweighted by default


def test_robust_rules_work_across_chunks_and_reset() -> None:
    deltas = np.random.default_rng(2).normal(size=(5, CHUNK + 17)).astype(np.float32)
    acc = ACCUMULATORS.create("median")
    for delta in deltas:
        acc.add(delta, 1.0)
    assert acc.count == 5 and acc.total_weight == 5.0  # type: ignore[attr-defined]
    np.testing.assert_allclose(acc.mean(), np.median(deltas, axis=0))
    acc.reset()
    assert acc.count == 0
    with pytest.raises(ValueError, match="no updates"):
        acc.mean()


def test_a_large_flush_is_worked_in_smaller_chunks_with_the_same_result() -> None:
    """Over many updates a chunk holds fewer coordinates (its scratch stays bounded); the
    rules' results cross those boundaries unchanged."""
    n = 2_100
    assert chunk_size(n) < 1_000 < chunk_size(10) == CHUNK
    deltas = np.random.default_rng(4).normal(size=(n, 1_000 + 17)).astype(np.float32)
    median, trimmed = ACCUMULATORS.create("median"), ACCUMULATORS.create("trimmed_mean",
                                                                           trim=0.1)
    for delta in deltas:
        median.add(delta, 1.0)
        trimmed.add(delta, 1.0)
    np.testing.assert_allclose(median.mean(), np.median(deltas, axis=0), rtol=1e-6)
    np.testing.assert_allclose(trimmed.mean(), stats.trim_mean(deltas, 0.1, axis=0),
                               rtol=1e-5, atol=1e-6)
    cosines = median_cosines(list(deltas), [1.0] * n)
    centre = np.median(deltas.astype(np.float64), axis=0)
    expected = deltas @ centre / (np.linalg.norm(deltas, axis=1) * np.linalg.norm(centre))
    np.testing.assert_allclose(cosines, expected, rtol=1e-5)


@pytest.mark.parametrize("trim", [-0.1, 0.5, 0.7])
def test_bad_trim(trim: float) -> None:
    with pytest.raises(ConfigError, match="trim"):
        ACCUMULATORS.create("trimmed_mean", trim=trim)


# -- norm bounding --------------------------------------------------------------------------------

def test_norm_bound_clips_each_update_before_the_mean() -> None:
    acc = NormBounded(StreamingMean(), bound=1.0)
    acc.add(np.array([3.0, 4.0], np.float32), 1.0)    # norm 5 -> [0.6, 0.8]
    acc.add(np.array([0.0, 0.5], np.float32), 1.0)    # within the bound: unchanged
    assert acc.clipped == 1 and acc.count == 2
    np.testing.assert_allclose(acc.mean(), [0.3, 0.65], rtol=1e-6)
    acc.reset()
    assert acc.clipped == 0 and acc.count == 0


def test_norm_bound_rejects_a_non_positive_bound() -> None:
    with pytest.raises(ConfigError, match="norm_bound"):
        NormBounded(StreamingMean(), bound=0.0)


# -- FedNova --------------------------------------------------------------------------------------

def test_fednova_by_hand() -> None:
    # client a: 4 steps, delta [4, 8], weight 1; client b: 1 step, delta [1, -1], weight 3.
    # d_a = [1, 2], d_b = [1, -1]; sum w d / W = ([1, 2] + [3, -3]) / 4 = [1, -0.25]
    # tau_eff = (1 * 4 + 3 * 1) / 4 = 1.75 -> mean = [1.75, -0.4375]
    acc = FedNovaMean()
    acc.add(np.array([4.0, 8.0], np.float32), 1.0, steps=4)
    acc.add(np.array([1.0, -1.0], np.float32), 3.0, steps=1)
    assert acc.effective_steps == pytest.approx(1.75)
    np.testing.assert_allclose(acc.mean(), [1.75, -0.4375], rtol=1e-6)
    assert acc.normalises_work and not StreamingMean.normalises_work


def test_fednova_with_equal_steps_is_the_weighted_mean() -> None:
    rng = np.random.default_rng(3)
    deltas = rng.normal(size=(6, 11)).astype(np.float32)
    weights = rng.uniform(1, 5, size=6)
    nova, plain = FedNovaMean(), StreamingMean()
    for delta, weight in zip(deltas, weights, strict=True):
        nova.add(delta, float(weight), steps=7)
        plain.add(delta, float(weight), steps=7)
    np.testing.assert_allclose(nova.mean(), plain.mean(), rtol=1e-6, atol=1e-7)
    nova.reset()
    assert nova.effective_steps == 0.0 and nova.count == 0


def test_fednova_counts_unknown_steps_as_one() -> None:
    acc = FedNovaMean()
    acc.add(np.array([2.0], np.float32), 1.0, steps=0)
    np.testing.assert_allclose(acc.mean(), [2.0])


def _ranked_by_lexsort(values: np.ndarray, keys: np.ndarray, cut: int) -> np.ndarray:
    n = keys.shape[1]
    order = np.lexsort((values, keys), axis=1)[:, cut:n - cut]
    kept = np.zeros(keys.shape, dtype=bool)
    np.put_along_axis(kept, order, True, axis=1)
    return kept


@pytest.mark.parametrize("case", ["distinct", "rounded", "zeros", "all_zero", "parallel",
                                  "half_steps"])
def test_trim_by_count_keeps_the_full_rankings_middle_through_every_kind_of_tie(
        case: str) -> None:
    """The trim's partition-based choice is the (key, value, index) ranking's, ties included:
    zeros many updates share (ranked by index), parallel updates (ranked by value), one tie
    spanning the window."""
    rng = np.random.default_rng(["distinct", "rounded", "zeros", "all_zero", "parallel",
                                 "half_steps"].index(case))
    for _ in range(150):
        n, rows = int(rng.integers(3, 40)), int(rng.integers(1, 20))
        cut = int(rng.integers(1, (n + 1) // 2))
        values = rng.normal(size=(rows, n))
        lengths = rng.uniform(1, 2, size=n)
        if case == "rounded":
            values = np.round(values, 1)
        elif case == "zeros":
            values[rng.uniform(size=values.shape) < 0.6] = 0.0
        elif case == "all_zero":
            values[:] = 0.0
        elif case == "parallel":  # scaled copies of one direction, and a few others
            lengths = rng.uniform(0.5, 3, size=n)
            values = rng.normal(size=(rows, 1)) * lengths
            values[:, ::3] = rng.normal(size=values[:, ::3].shape)
        elif case == "half_steps":
            lengths[:] = 1.0
            values = np.round(values * 2) / 2
        keys = values / lengths
        kept = kept_by_rank(values, keys, cut)
        assert np.array_equal(kept, _ranked_by_lexsort(values, keys, cut))
        assert (kept.sum(axis=1) == n - 2 * cut).all()


def test_trim_by_count_is_the_weighted_mean_of_each_coordinates_middle_ranks() -> None:
    """By hand: per coordinate, rank the updates by direction (value / length), drop the
    ``floor(trim n)`` lowest and highest, and average the rest with their weights."""
    rng = np.random.default_rng(3)
    n, size = 12, 300
    deltas = rng.normal(size=(n, size)).astype(np.float32)
    deltas[:, :100] = np.round(deltas[:, :100]) * (rng.uniform(size=(n, 100)) < 0.5)
    weights, lengths = rng.uniform(1, 30, size=n), rng.uniform(0.5, 2, size=n)
    rule = ACCUMULATORS.create("trimmed_mean", trim=0.25, weighted=True, trim_by_count=True)
    for delta, weight, length in zip(deltas, weights, lengths, strict=True):
        rule.keep(delta, float(weight), float(length))
    expected = np.empty(size)
    for j in range(size):
        column = deltas[:, j].astype(np.float64)
        ranked = sorted(range(n), key=lambda i: (column[i] / lengths[i], column[i], i))[3:-3]
        expected[j] = sum(weights[i] * column[i] for i in ranked) / weights[ranked].sum()
    np.testing.assert_allclose(rule.mean(), expected.astype(np.float32), rtol=1e-6,
                               atol=1e-7)
