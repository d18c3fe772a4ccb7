"""DP-SGD trainer: Opacus's accounting, reported epsilon, validated options, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from fedlink.client import TrainPlan
from fedlink.data import load_federated
from fedlink.errors import ConfigError
from fedlink.models import build_model
from fedlink.params import to_vector
from fedlink.privacy.dp_sgd import DPSGDTrainer, PrivacyBudgetExhausted

OPTIONS = {"dp_noise_multiplier": "1.2", "dp_max_grad_norm": "1.0", "dp_delta": "1e-5"}


@pytest.fixture(scope="module")
def data():  # type: ignore[no-untyped-def]
    return load_federated("digits", 4, 0, "iid")


def _trainer(data, seed: int = 0) -> DPSGDTrainer:  # type: ignore[no-untyped-def]
    model = build_model("mlp", data.num_features, data.num_classes, seed=0, hidden=[16])
    return DPSGDTrainer(model, data.clients[0], seed=seed)


def _plan(steps: int, options: dict[str, str], seed: int = 1, batch: int = 32) -> TrainPlan:
    return TrainPlan(local_steps=steps, batch_size=batch, learning_rate=0.1, seed=seed,
                     options=options)


@pytest.mark.parametrize("clipping", ["ghost", "per_sample"])
def test_reported_epsilon_is_opacus_accounting_over_all_tasks(data, clipping: str) -> None:  # type: ignore[no-untyped-def]
    trainer = _trainer(data)
    options = {**OPTIONS, "dp_clipping": clipping}
    w = to_vector(trainer.model)
    first = trainer.train(w, _plan(20, options))
    second = trainer.train(first.params, _plan(30, options, seed=2))

    q = 32 / trainer.num_examples()
    reference = RDPAccountant()
    for _ in range(50):
        reference.step(noise_multiplier=1.2, sample_rate=q)
    assert second.steps_completed == 30
    assert second.metrics["dp_steps"] == 50
    assert second.metrics["dp_sample_rate"] == pytest.approx(q)
    assert second.metrics["dp_epsilon"] == pytest.approx(reference.get_epsilon(delta=1e-5))
    assert first.metrics["dp_epsilon"] < second.metrics["dp_epsilon"]
    assert np.all(np.isfinite(second.params)) and not np.array_equal(second.params, w)


def test_ghost_and_per_sample_clipping_compute_the_same_step(data) -> None:  # type: ignore[no-untyped-def]
    results = []
    for clipping in ("ghost", "per_sample"):
        trainer = _trainer(data)
        plan = _plan(5, {**OPTIONS, "dp_clipping": clipping, "dp_max_grad_norm": "0.1"})
        results.append(trainer.train(to_vector(trainer.model), plan).params)
    np.testing.assert_allclose(results[0], results[1], atol=1e-5)


def test_same_plan_same_result(data) -> None:  # type: ignore[no-untyped-def]
    a, b = _trainer(data), _trainer(data)
    w = to_vector(a.model)
    np.testing.assert_array_equal(a.train(w, _plan(5, OPTIONS)).params,
                                  b.train(w, _plan(5, OPTIONS)).params)


def test_target_epsilon_sets_sigma_and_caps_the_steps(data) -> None:  # type: ignore[no-untyped-def]
    trainer = _trainer(data)
    options = {"dp_target_epsilon": "4.0", "dp_target_steps": "40", "dp_delta": "1e-5"}
    w = to_vector(trainer.model)
    result = trainer.train(w, _plan(30, options))
    q = 32 / trainer.num_examples()
    sigma = get_noise_multiplier(target_epsilon=4.0, target_delta=1e-5, sample_rate=q,
                                 steps=40, accountant="rdp")
    assert result.metrics["dp_noise_multiplier"] == pytest.approx(sigma)
    capped = trainer.train(result.params, _plan(30, options, seed=2))
    assert capped.steps_completed == 10 and capped.steps_planned == 30
    assert capped.metrics["dp_epsilon"] <= 4.0
    with pytest.raises(PrivacyBudgetExhausted):
        trainer.train(capped.params, _plan(30, options, seed=3))


def test_an_empty_poisson_sample_still_takes_a_noisy_step(data) -> None:  # type: ignore[no-untyped-def]
    trainer = _trainer(data)
    result = trainer.train(to_vector(trainer.model), _plan(20, OPTIONS, batch=1))
    assert result.steps_completed == 20 and np.all(np.isfinite(result.params))


@pytest.mark.parametrize("options", [
    {},  # neither sigma nor target
    {"dp_noise_multiplier": "1.0", "dp_target_epsilon": "2.0", "dp_target_steps": "5"},
    {"dp_target_epsilon": "2.0"},
    {"dp_noise_multiplier": "-1"},
    {"dp_noise_multiplier": "1.0", "dp_max_grad_norm": "0"},
    {"dp_noise_multiplier": "1.0", "dp_delta": "1"},
    {"dp_noise_multiplier": "1.0", "dp_accountant": "gdp"},
    {"dp_noise_multiplier": "1.0", "dp_clipping": "none"},
    {"dp_noise_multiplier": "abc"},
    {"dp_noise_multiplier": "1.0", "prox_mu": "0.1"},
])
def test_bad_options_are_config_errors(data, options: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    trainer = _trainer(data)
    with pytest.raises(ConfigError):
        trainer.train(to_vector(trainer.model), _plan(1, options))


def test_settings_cannot_change_mid_run(data) -> None:  # type: ignore[no-untyped-def]
    trainer = _trainer(data)
    w = to_vector(trainer.model)
    trainer.train(w, _plan(2, OPTIONS))
    with pytest.raises(ConfigError, match="must not change"):
        trainer.train(w, _plan(2, {**OPTIONS, "dp_noise_multiplier": "0.5"}))
