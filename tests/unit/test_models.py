"""fedlink.models: model builders by name and test-set evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlink.data import FederatedData, load_federated
from fedlink.errors import ConfigError
from fedlink.models import Evaluator, build_model, evaluate
from fedlink.params import spec_of, to_vector


@pytest.fixture(scope="module")
def digits() -> FederatedData:
    return load_federated("digits", num_clients=1, seed=0)


@pytest.fixture(scope="module")
def trained(digits: FederatedData) -> torch.nn.Module:
    """An MLP trained centrally on the digits train pool for a few epochs."""
    model = build_model("mlp", 64, 10, seed=0)
    train = digits.clients[0]
    x, y = torch.tensor(train.x), torch.tensor(train.y)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(0)
    for _ in range(10):
        for batch in torch.randperm(len(y), generator=generator).split(32):
            optimizer.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return model


def test_mlp_default_is_64_64() -> None:
    spec = spec_of(build_model("mlp", 64, 10, seed=0))
    assert spec.shapes == ((64, 64), (64,), (64, 64), (64,), (10, 64), (10,))


def test_mlp_hidden_sizes_are_configurable() -> None:
    assert spec_of(build_model("mlp", 5, 3, seed=0, hidden=[7])).shapes == (
        (7, 5),
        (7,),
        (3, 7),
        (3,),
    )
    assert spec_of(build_model("mlp", 5, 3, seed=0, hidden=[])).shapes == ((3, 5), (3,))


def test_logreg_is_one_linear_layer() -> None:
    model = build_model("logreg", 60, 10, seed=0)
    assert spec_of(model).shapes == ((10, 60), (10,))
    assert model(torch.zeros(4, 60)).shape == (4, 10)


def test_same_seed_same_weights_without_touching_global_rng() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = to_vector(build_model("mlp", 64, 10, seed=5))
    second = to_vector(build_model("mlp", 64, 10, seed=5))
    assert torch.equal(torch.rand(3), expected_next)
    assert np.array_equal(first, second)
    assert not np.array_equal(first, to_vector(build_model("mlp", 64, 10, seed=6)))


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("resnet", {}),
        ("mlp", {"depth": 3}),
        ("mlp", {"hidden": [0]}),
        ("mlp", {"hidden": "64"}),
        ("logreg", {"hidden": [4]}),
    ],
)
def test_bad_model_names_and_options_are_config_errors(
    name: str, options: dict[str, object]
) -> None:
    with pytest.raises(ConfigError):
        build_model(name, 64, 10, seed=0, **options)


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(ConfigError, match="cnn, logreg, mlp"):
        build_model("resnet", 64, 10)


def test_evaluator_scores_trained_model_above_90_percent(
    digits: FederatedData, trained: torch.nn.Module
) -> None:
    evaluator = Evaluator("mlp", digits.test, spec=spec_of(trained))
    scores = evaluator(to_vector(trained))
    assert set(scores) == {"accuracy", "loss"}
    assert scores["accuracy"] > 0.9
    assert scores["loss"] < 0.5
    assert scores == pytest.approx(evaluate(trained, digits.test))


def test_untrained_model_scores_near_chance(digits: FederatedData) -> None:
    scores = Evaluator("mlp", digits.test)(to_vector(build_model("mlp", 64, 10, seed=1)))
    assert scores["accuracy"] < 0.3
    assert scores["loss"] == pytest.approx(np.log(10), rel=0.1)


def test_evaluator_loss_is_mean_cross_entropy(
    digits: FederatedData, trained: torch.nn.Module
) -> None:
    with torch.no_grad():
        logits = trained(torch.tensor(digits.test.x))
        target = torch.tensor(digits.test.y)
        expected_loss = F.cross_entropy(logits, target).item()
        expected_acc = (logits.argmax(1) == target).float().mean().item()
    small_batches = Evaluator("mlp", digits.test, batch_size=7)(to_vector(trained))
    assert small_batches["loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert small_batches["accuracy"] == pytest.approx(expected_acc)


def test_evaluator_from_module_leaves_it_untouched(
    digits: FederatedData, trained: torch.nn.Module
) -> None:
    before = to_vector(trained)
    evaluator = Evaluator(trained, digits.test)
    evaluator(np.zeros_like(before))
    assert np.array_equal(to_vector(trained), before)


def test_evaluate_restores_training_mode(
    digits: FederatedData, trained: torch.nn.Module
) -> None:
    trained.train()
    evaluate(trained, digits.test)
    assert trained.training


def test_evaluator_refuses_mismatched_spec_and_vector(digits: FederatedData) -> None:
    logreg_spec = spec_of(build_model("logreg", 64, 10))
    with pytest.raises(ConfigError, match="does not match"):
        Evaluator("mlp", digits.test, spec=logreg_spec)
    evaluator = Evaluator("mlp", digits.test, options={"hidden": [8]})
    with pytest.raises(ConfigError, match="elements"):
        evaluator(np.zeros(logreg_spec.size, dtype=np.float32))


def test_evaluator_refuses_empty_test_set(digits: FederatedData) -> None:
    with pytest.raises(ConfigError, match="empty"):
        Evaluator("mlp", digits.test.subset(np.array([], dtype=np.int64)))
