"""DP-SGD trainer: Opacus's accounting, reported epsilon, validated options, determinism;
ghost clipping equals per-example clipping and Opacus's own ghost clipping."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModuleFastGradientClipping
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from opacus.optimizers import DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from torch import nn

from fedlink.client import TrainPlan
from fedlink.client.base import AccountsPrivacy
from fedlink.data import load_federated
from fedlink.errors import ConfigError
from fedlink.models import build_model
from fedlink.params import to_vector
from fedlink.privacy.dp_sgd import DPSGDTrainer, PrivacyBudgetExhausted
from fedlink.privacy.ghost_clipping import GhostClipping

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
    # dp-accounting's RDP differs from Opacus's only at fractional orders (1.3e-5 here).
    assert second.metrics["dp_epsilon"] == pytest.approx(reference.get_epsilon(delta=1e-5),
                                                         rel=1e-4)
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
    # misspelt: it would otherwise train at the default clip norm (a standalone client gets
    # its options from the coordinator, past the experiment config's check)
    {"dp_noise_multiplier": "1.0", "dp_max_grad_nrom": "0.5"},
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


def _per_example_clipped_sum(model, x, y, clip: float) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """Brute force: each example's gradient, clipped to ``clip``, summed."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    for i in range(len(y)):
        grads = torch.autograd.grad(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]), params)
        norm = float(torch.stack([(g.double() ** 2).sum() for g in grads]).sum().sqrt())
        factor = min(1.0, clip / (norm + 1e-6))
        for t, g in zip(total, grads, strict=True):
            t += factor * g
    return total


def _ghost_model() -> nn.Module:
    torch.manual_seed(0)  # Linear (its closed form); LayerNorm (Opacus's per-example gradients)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 3))


class _Tokens(nn.Module):
    """Embedding (Opacus's norm sampler) and a Linear on 3-D inputs (Opacus's norm sampler)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.mix, self.head = nn.Embedding(10, 6), nn.Linear(6, 6), nn.Linear(24, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(x))).flatten(1))


@pytest.mark.parametrize("kind", ["mlp", "tokens"])
def test_ghost_clipping_leaves_the_sum_of_clipped_per_example_gradients(kind: str) -> None:
    if kind == "mlp":
        model, x, clip = _ghost_model(), torch.randn(12, 8), 3.0
    else:
        model, x, clip = _Tokens(), torch.randint(0, 10, (12, 4)), 2.3
    y = torch.randint(0, 3, (12,))
    expected = _per_example_clipped_sum(model, x, y, clip=clip)
    ghost = GhostClipping(model, max_grad_norm=clip)
    with ghost.recording():
        logits = model(x)
    coef = ghost.backward(F.cross_entropy(logits, y, reduction="none"))
    assert 0 < float(coef.min()) < 1 and float(coef.max()) == 1.0  # some clipped, some not
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, e, atol=1e-5, rtol=1e-4)


def test_ghost_clipping_matches_opacus_own_ghost_clipping() -> None:
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    mine, theirs = _ghost_model(), _ghost_model()
    ghost = GhostClipping(mine, max_grad_norm=0.3)
    with ghost.recording():
        logits = mine(x)
    ghost.backward(F.cross_entropy(logits, y, reduction="none"))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gsm = GradSampleModuleFastGradientClipping(theirs, loss_reduction="mean",
                                                   max_grad_norm=0.3, use_ghost_clipping=True)
        optimizer = DPOptimizerFastGradientClipping(
            torch.optim.SGD(theirs.parameters(), lr=0.1), noise_multiplier=1.0,
            max_grad_norm=0.3, expected_batch_size=16)
        loss = DPLossFastGradientClipping(gsm, optimizer, nn.CrossEntropyLoss(),
                                          loss_reduction="mean")(gsm(x), y)
        loss.backward()
    for a, b in zip(mine.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("model", [
    nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 3)),  # mixes examples
    nn.Sequential(nn.Linear(8, 16), nn.PReLU(), nn.Linear(16, 3)),  # no Opacus sampler
])
def test_ghost_clipping_refuses_layers_it_cannot_clip(model: nn.Module) -> None:
    with pytest.raises(ConfigError):
        GhostClipping(model, max_grad_norm=1.0)


def test_ghost_clipping_refuses_in_place_changes_to_a_layer_output() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 3))
    ghost = GhostClipping(model, max_grad_norm=1.0)
    with ghost.recording():
        logits = model(torch.randn(4, 8))
    with pytest.raises(ConfigError, match="in place"):
        ghost.backward(F.cross_entropy(logits, torch.zeros(4, dtype=torch.int64),
                                       reduction="none"))


def test_ghost_clipping_refuses_a_layer_called_twice() -> None:
    layer = nn.Linear(4, 4)
    ghost = GhostClipping(layer, max_grad_norm=1.0)
    with pytest.raises(ConfigError, match="twice"), ghost.recording():
        layer(layer(torch.randn(2, 4)))


def test_the_noise_is_opacus_own_draw() -> None:
    from fedlink.privacy.dp_sgd import _GhostOptimizer

    def noised(kind: type) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
        optimizer = kind(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.3,
                         max_grad_norm=0.7, expected_batch_size=8, loss_reduction="mean")
        optimizer.generator = torch.Generator().manual_seed(5)
        for p in model.parameters():
            p.summed_grad = torch.full_like(p, 0.25)
        if kind is _GhostOptimizer:
            optimizer.add_noise()
        else:
            DPOptimizerFastGradientClipping.add_noise(optimizer)
        return [p.grad.clone() for p in model.parameters()]

    ours, opacus = noised(_GhostOptimizer), noised(DPOptimizerFastGradientClipping)
    assert all(torch.equal(a, b) for a, b in zip(ours, opacus, strict=True))
    assert not torch.equal(ours[0], torch.full_like(ours[0], 0.25))  # noise was added


@pytest.mark.parametrize("options", [{}, {"momentum": 0.9}, {"weight_decay": 0.01}],
                         ids=["plain", "momentum", "weight-decay"])
def test_two_steps_are_opacus_own_steps(options: dict[str, float]) -> None:
    """Accumulate, noise, scale, descend and clear, twice (the rate changed in between, as a
    scheduler does): the same parameters, bit for bit, as Opacus's ghost-clipping optimizer
    over the same ``torch.optim.SGD``."""
    from fedlink.privacy.dp_sgd import _GhostOptimizer

    def stepped(kind: type) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
        optimizer = kind(torch.optim.SGD(model.parameters(), lr=0.1, **options),
                         noise_multiplier=1.3, max_grad_norm=0.7, expected_batch_size=8,
                         loss_reduction="mean")
        optimizer.generator = torch.Generator().manual_seed(5)
        for value, rate in ((0.25, 0.1), (-0.5, 0.03)):
            optimizer.param_groups[0]["lr"] = rate
            optimizer.zero_grad(set_to_none=True)
            for p in model.parameters():
                p.grad = torch.full_like(p, value)
            optimizer.step()
            assert all(p.summed_grad is not None for p in model.parameters())
        optimizer.zero_grad(set_to_none=True)
        assert all(p.grad is None and p.summed_grad is None for p in model.parameters())
        return [p.detach().clone() for p in model.parameters()]

    ours, opacus = stepped(_GhostOptimizer), stepped(DPOptimizerFastGradientClipping)
    assert all(torch.equal(a, b) for a, b in zip(ours, opacus, strict=True))


def test_the_dp_sgd_trainer_says_it_accounts_its_own_privacy(data) -> None:  # type: ignore[no-untyped-def]
    """What a client joining a secure run checks, to refuse it (its epsilon would go
    unaccounted there)."""
    assert isinstance(_trainer(data), AccountsPrivacy)
