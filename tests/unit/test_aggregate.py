"""fedlink.aggregate: streaming mean, staleness weights, server optimizers, registries."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlink.aggregate import (
    ACCUMULATORS,
    SERVER_OPTIMIZERS,
    STALENESS_WEIGHTS,
    StreamingMean,
)
from fedlink.errors import ConfigError


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 12),
    dim=st.integers(1, 50),
)
def test_streaming_mean_matches_numpy_weighted_mean(seed: int, n: int, dim: int) -> None:
    rng = np.random.default_rng(seed)
    deltas = rng.normal(scale=10, size=(n, dim)).astype(np.float32)
    weights = rng.uniform(0.01, 1000, size=n)
    acc = StreamingMean()
    for delta, weight in zip(deltas, weights, strict=True):
        acc.add(delta, float(weight))
    assert acc.count == n
    assert acc.total_weight == pytest.approx(weights.sum())
    expected = np.average(deltas.astype(np.float64), axis=0, weights=weights)
    mean = acc.mean()
    assert mean.dtype == np.float32
    np.testing.assert_allclose(mean, expected, rtol=1e-5, atol=1e-5)


def test_streaming_mean_is_order_independent() -> None:
    rng = np.random.default_rng(1)
    deltas = rng.normal(size=(20, 100)).astype(np.float32) * 1e4
    weights = rng.integers(1, 1000, size=20).astype(float)
    forward, backward = StreamingMean(), StreamingMean()
    for i in range(20):
        forward.add(deltas[i], weights[i])
        backward.add(deltas[19 - i], weights[19 - i])
    np.testing.assert_array_equal(forward.mean(), backward.mean())


def test_streaming_mean_reset_and_errors() -> None:
    acc = StreamingMean()
    with pytest.raises(ValueError, match="no updates"):
        acc.mean()
    acc.add(np.ones(3, np.float32), 2.0)
    with pytest.raises(ValueError, match="shape"):
        acc.add(np.ones(4, np.float32), 1.0)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive"):
            acc.add(np.ones(3, np.float32), bad)
    acc.reset()
    assert acc.count == 0 and acc.total_weight == 0.0
    with pytest.raises(ValueError):
        acc.mean()
    acc.add(np.full(3, 5.0, np.float32), 1.0)  # nothing of the first round leaks in
    np.testing.assert_array_equal(acc.mean(), np.full(3, 5.0, np.float32))


# -- staleness weights ----------------------------------------------------------------------------

def test_constant_weight() -> None:
    weight = STALENESS_WEIGHTS.create("constant")
    assert [weight(t) for t in (0, 1, 7, 1000)] == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(("a", "tau", "expected"), [
    (0.5, 0, 1.0),
    (0.5, 3, 0.5),            # (1 + 3) ** -0.5
    (1.0, 4, 0.2),            # 1 / 5
    (2.0, 1, 0.25),           # 2 ** -2
    (0.0, 9, 1.0),
])
def test_polynomial_weight(a: float, tau: int, expected: float) -> None:
    assert STALENESS_WEIGHTS.create("polynomial", a=a)(tau) == pytest.approx(expected)


@pytest.mark.parametrize(("a", "b", "tau", "expected"), [
    (10.0, 4, 0, 1.0),
    (10.0, 4, 4, 1.0),
    (10.0, 4, 5, 1 / 11),     # 1 / (10 * 1 + 1)
    (10.0, 4, 7, 1 / 31),     # 1 / (10 * 3 + 1)
    (0.5, 0, 2, 0.5),         # 1 / (0.5 * 2 + 1)
])
def test_hinge_weight(a: float, b: int, tau: int, expected: float) -> None:
    assert STALENESS_WEIGHTS.create("hinge", a=a, b=b)(tau) == pytest.approx(expected)


def test_default_staleness_parameters() -> None:
    assert STALENESS_WEIGHTS.create("polynomial")(3) == pytest.approx(0.5)  # a = 0.5
    assert STALENESS_WEIGHTS.create("hinge")(5) == pytest.approx(1 / 11)  # a = 10, b = 4


@pytest.mark.parametrize(("name", "options"), [
    ("polynomial", {"a": -1.0}),
    ("hinge", {"a": -1.0}),
    ("hinge", {"b": -1}),
])
def test_bad_staleness_parameters(name: str, options: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        STALENESS_WEIGHTS.create(name, **options)


# -- server optimizers ----------------------------------------------------------------------------

def test_fedavg_step() -> None:
    opt = SERVER_OPTIMIZERS.create("fedavg", lr=0.5)
    model = np.array([1.0, 2.0], np.float32)
    new = opt.step(model, np.array([2.0, -4.0], np.float32))
    np.testing.assert_allclose(new, [2.0, 0.0])
    np.testing.assert_array_equal(model, [1.0, 2.0])  # input untouched
    assert new.dtype == np.float32
    default = SERVER_OPTIMIZERS.create("fedavg")
    np.testing.assert_allclose(default.step(model, np.array([1.0, 1.0], np.float32)), [2.0, 3.0])


def test_fedavgm_steps_match_hand_computation() -> None:
    opt = SERVER_OPTIMIZERS.create("fedavgm", lr=0.5, momentum=0.9)
    w = np.array([0.0, 1.0], np.float32)
    d1 = np.array([1.0, 2.0], np.float32)
    d2 = np.array([-1.0, 0.0], np.float32)
    w1 = opt.step(w, d1)       # m = d1 = [1, 2];            w = [0.5, 2.0]
    np.testing.assert_allclose(w1, [0.5, 2.0])
    w2 = opt.step(w1, d2)      # m = 0.9*[1, 2] + d2 = [-0.1, 1.8]; w = w1 + 0.5 m
    np.testing.assert_allclose(w2, [0.45, 2.9], rtol=1e-6)


def test_fedavgm_state_dict_round_trip_resumes_identically() -> None:
    opt = SERVER_OPTIMIZERS.create("fedavgm", lr=0.7, momentum=0.8)
    w = np.zeros(3, np.float32)
    w = opt.step(w, np.array([1.0, -1.0, 2.0], np.float32))
    state = opt.state_dict()
    resumed = SERVER_OPTIMIZERS.create("fedavgm")
    resumed.load_state_dict(state)
    d = np.array([0.5, 0.5, -3.0], np.float32)
    np.testing.assert_array_equal(resumed.step(w, d), opt.step(w, d))
    # the state is a copy: stepping the optimizer does not change a saved state
    before = np.array(state["velocity"], copy=True)
    opt.step(w, d)
    np.testing.assert_array_equal(state["velocity"], before)


def test_fedavgm_fresh_state_round_trip() -> None:
    state = SERVER_OPTIMIZERS.create("fedavgm", lr=2.0, momentum=0.5).state_dict()
    assert state == {"lr": 2.0, "momentum": 0.5, "velocity": None}
    other = SERVER_OPTIMIZERS.create("fedavgm")
    other.load_state_dict(state)
    np.testing.assert_allclose(other.step(np.zeros(1, np.float32), np.ones(1, np.float32)), [2.0])


def test_fedavg_state_dict_round_trip() -> None:
    opt = SERVER_OPTIMIZERS.create("fedavg", lr=0.25)
    other = SERVER_OPTIMIZERS.create("fedavg")
    other.load_state_dict(opt.state_dict())
    np.testing.assert_allclose(other.step(np.zeros(1, np.float32), np.ones(1, np.float32)), [0.25])


@pytest.mark.parametrize(("name", "options"), [
    ("fedavg", {"lr": 0.0}),
    ("fedavg", {"lr": -1.0}),
    ("fedavgm", {"momentum": 1.0}),
    ("fedavgm", {"momentum": -0.1}),
])
def test_bad_optimizer_options(name: str, options: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        SERVER_OPTIMIZERS.create(name, **options)


# -- registries -----------------------------------------------------------------------------------

@pytest.mark.parametrize("registry", [ACCUMULATORS, STALENESS_WEIGHTS, SERVER_OPTIMIZERS],
                         ids=lambda r: r.kind)
def test_unknown_name_is_config_error_listing_known(registry: object) -> None:
    with pytest.raises(ConfigError, match=r"unknown .* 'no-such-thing'; known: ") as err:
        registry.create("no-such-thing")  # type: ignore[attr-defined]
    for name in registry.names():  # type: ignore[attr-defined]
        assert name in str(err.value)


def test_unknown_option_is_config_error() -> None:
    with pytest.raises(ConfigError, match="bad options for server optimizer 'fedavg'"):
        SERVER_OPTIMIZERS.create("fedavg", momentum=0.9)


def test_registered_names() -> None:
    assert {"fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad"} <= set(
        SERVER_OPTIMIZERS.names())
    assert {"constant", "polynomial", "hinge"} <= set(STALENESS_WEIGHTS.names())
    assert {"mean", "fednova", "trimmed_mean", "median"} <= set(ACCUMULATORS.names())


def test_streaming_mean_folds_large_vectors_in_chunks_without_model_sized_temporaries() -> None:
    import tracemalloc

    size = 1 << 20  # 4 MB of float32; the float64 buffer is 8 MB
    deltas = [np.full(size, float(i), np.float32) for i in range(1, 4)]
    acc = StreamingMean()
    acc.add(deltas[0], 1.0)  # allocates the buffer
    tracemalloc.start()
    try:
        for delta in deltas[1:]:
            acc.add(delta, 2.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * size  # two chunks of scratch: under half of one float32 model
    np.testing.assert_allclose(acc.mean(), np.full(size, (1 + 2 * 2 + 2 * 3) / 5))
