"""FedOpt server optimizers (Reddi et al. 2021) against hand-computed steps, and their state.

Two steps from ``w = [0, 1]`` with pseudo-gradients ``d1 = [1, -2]`` and ``d2 = [-0.5, 0.5]``,
``lr = 0.1, beta1 = 0.9, beta2 = 0.99, tau = 1e-3``, ``m_(-1) = 0``, ``v_(-1) = tau^2``:

    m1 = 0.1 d1 = [0.1, -0.2]               m2 = 0.9 m1 + 0.1 d2 = [0.04, -0.13]
    Adagrad  v1 = tau^2 + d1^2              v2 = v1 + d2^2
    Adam     v1 = 0.99 tau^2 + 0.01 d1^2    v2 = 0.99 v1 + 0.01 d2^2
    Yogi     v1 = tau^2 + 0.01 d1^2         v2 = v1 - 0.01 d2^2 sign(v1 - d2^2) = v1 + 0.01 d2^2
    w_(t+1) = w_t + 0.1 m_t / (sqrt(v_t) + tau)
"""

from __future__ import annotations

import numpy as np
import pytest

from fedlink.aggregate import SERVER_OPTIMIZERS
from fedlink.errors import ConfigError

W0 = np.array([0.0, 1.0], np.float32)
D1 = np.array([1.0, -2.0], np.float32)
D2 = np.array([-0.5, 0.5], np.float32)
HYPER = {"lr": 0.1, "beta1": 0.9, "tau": 1e-3}

EXPECTED = {  # (w1, v1, w2, v2), computed by hand from the formulas above
    "fedadagrad": ([0.009990005, 0.990004999], [1.000001, 4.000001],
                   [0.013564515, 0.983702131], [1.250001, 4.250001]),
    "fedadam": ([0.099005049, 0.900498738], [0.01000099, 0.04000099],
                [0.134605005, 0.837448636], [0.0124009801, 0.0421009801]),
    "fedyogi": ([0.099004999875, 0.900498750008], [0.010001, 0.040001],
                [0.134463519, 0.837744628], [0.012501, 0.042501]),
}


def make(name: str) -> object:
    options = dict(HYPER) if name == "fedadagrad" else {**HYPER, "beta2": 0.99}
    return SERVER_OPTIMIZERS.create(name, **options)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_two_steps_match_hand_computation(name: str) -> None:
    w1_expected, v1, w2_expected, v2 = EXPECTED[name]
    opt = make(name)
    w1 = opt.step(W0, D1.copy())  # type: ignore[attr-defined]
    np.testing.assert_allclose(w1, w1_expected, rtol=1e-5)
    np.testing.assert_allclose(opt.state_dict()["m"], [0.1, -0.2], rtol=1e-5)  # type: ignore[attr-defined]
    np.testing.assert_allclose(opt.state_dict()["v"], v1, rtol=1e-5)  # type: ignore[attr-defined]
    w2 = opt.step(w1, D2.copy())  # type: ignore[attr-defined]
    np.testing.assert_allclose(w2, w2_expected, rtol=1e-5)
    np.testing.assert_allclose(opt.state_dict()["m"], [0.04, -0.13], rtol=1e-5)  # type: ignore[attr-defined]
    np.testing.assert_allclose(opt.state_dict()["v"], v2, rtol=1e-5)  # type: ignore[attr-defined]
    assert w2.dtype == np.float32
    np.testing.assert_array_equal(W0, [0.0, 1.0])  # the model passed in is untouched


def test_yogi_shrinks_v_slower_than_adam() -> None:
    """Once d^2 < v, Adam decays v multiplicatively, Yogi subtracts (1 - beta2) d^2 at most."""
    adam, yogi = make("fedadam"), make("fedyogi")
    big, small = np.array([10.0], np.float32), np.array([0.01], np.float32)
    w = np.zeros(1, np.float32)
    for opt in (adam, yogi):
        opt.step(w, big.copy())  # type: ignore[attr-defined]
        for _ in range(50):
            opt.step(w, small.copy())  # type: ignore[attr-defined]
    assert yogi.state_dict()["v"][0] > adam.state_dict()["v"][0]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_state_dict_round_trip_resumes_identically(name: str) -> None:
    opt = make(name)
    w = opt.step(W0, D1.copy())  # type: ignore[attr-defined]
    state = opt.state_dict()  # type: ignore[attr-defined]
    resumed = SERVER_OPTIMIZERS.create(name)
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(resumed.step(w, D2.copy()), opt.step(w, D2.copy()))  # type: ignore[attr-defined]
    before = np.array(state["m"], copy=True)
    opt.step(w, D2.copy())  # type: ignore[attr-defined]
    np.testing.assert_array_equal(state["m"], before)  # the saved state is a copy


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fresh_state_round_trip(name: str) -> None:
    state = make(name).state_dict()  # type: ignore[attr-defined]
    assert state["m"] is None and state["v"] is None and state["lr"] == 0.1
    other = SERVER_OPTIMIZERS.create(name)
    other.load_state_dict(state)
    np.testing.assert_allclose(other.step(W0, D1.copy()), make(name).step(W0, D1.copy()))  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "options"), [
    ("fedadam", {"lr": 0.0}),
    ("fedadam", {"beta1": 1.0}),
    ("fedyogi", {"beta2": -0.1}),
    ("fedyogi", {"tau": 0.0}),
    ("fedadagrad", {"beta2": 0.9}),  # Adagrad has no beta2
])
def test_bad_options(name: str, options: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        SERVER_OPTIMIZERS.create(name, **options)


def test_fedavg_may_reuse_the_mean_delta_but_not_the_model() -> None:
    model = np.array([1.0, 2.0], np.float32)
    delta = np.array([2.0, -4.0], np.float32)
    new = SERVER_OPTIMIZERS.create("fedavg", lr=0.5).step(model, delta)
    np.testing.assert_allclose(new, [2.0, 0.0])
    np.testing.assert_array_equal(model, [1.0, 2.0])
