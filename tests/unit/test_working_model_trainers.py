"""``WorkingModelTrainers`` / ``TorchTrainer.for_client``: a virtual run's tasks, one at a
time in one working module, each trained by a trainer derived from the first. A derived
trainer must train exactly as one the factory builds afresh: nothing of an earlier task (its
data, optimizer state, buffers, kept-local entries, learning rate) may reach a later one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedlink.client.base import TrainPlan
from fedlink.client.torch_trainer import TorchTrainer, WorkingModelTrainers
from fedlink.data import Dataset, load_federated
from fedlink.errors import ConfigError
from fedlink.models.training import build_optimizer
from fedlink.params import to_vector


def _bn_model() -> nn.Module:
    """An MLP with a BatchNorm layer (running statistics travel in the vector)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


@pytest.fixture(scope="module")
def clients() -> list[Dataset]:
    return list(load_federated("digits", num_clients=3, seed=0).clients)


def _factory(**settings: Any) -> Callable[..., TorchTrainer]:
    """The built-in trainer's factory shape: fixed settings, ``(model, data, *, seed)``."""
    def build(model: nn.Module, data: Any, *, seed: int) -> TorchTrainer:
        return TorchTrainer(model, data, seed=seed, **settings)

    return build


SETTINGS = [
    {},
    {"optimizer": build_optimizer("sgd", {"momentum": 0.9})},
    {"optimizer": build_optimizer("adam"), "keep_local": ("batchnorm",)},
]


def _mlp() -> nn.Module:
    """All float32 tensors: the working module's binding adopts them (one copy per load)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


CASES = [pytest.param(settings, _bn_model, id=name) for settings, name in
         zip(SETTINGS, ["plain", "momentum", "adam-fedbn"], strict=True)] + [
    pytest.param(SETTINGS[0], _mlp, id="plain-adopted"),
    pytest.param(SETTINGS[1], _mlp, id="momentum-adopted")]


@pytest.mark.parametrize(("settings", "make"), CASES)
def test_a_derived_trainer_trains_as_a_fresh_one(clients: list[Dataset],
                                                 settings: dict[str, Any],
                                                 make: Callable[[], nn.Module]) -> None:
    """Clients A, B, A, C in turn, each task from another global model with its own learning
    rate, seed and length, the working module left in eval mode between some: every result
    is bit-identical to a trainer built afresh in a new module."""
    factory = _factory(**settings)
    working = WorkingModelTrainers(factory, make())
    model = to_vector(make())
    tasks = [(0, 7, TrainPlan(local_steps=5, batch_size=8, learning_rate=0.05, seed=1)),
             (1, 8, TrainPlan(local_epochs=1, batch_size=16, learning_rate=0.3, seed=2)),
             (0, 7, TrainPlan(local_steps=3, batch_size=8, learning_rate=0.01, seed=3)),
             (2, 9, TrainPlan(local_steps=4, batch_size=32, learning_rate=0.1, seed=4))]
    for number, (client, seed, plan) in enumerate(tasks):
        reused = working(working.model, clients[client], seed=seed)
        if number:
            assert reused is not working(working.model, clients[client], seed=seed)
        fresh = factory(make(), clients[client], seed=seed)
        got, want = reused.train(model, plan), fresh.train(model, plan)
        assert got.num_examples == want.num_examples == len(clients[client])
        assert got.steps_completed == want.steps_completed
        assert np.array_equal(got.params, want.params)
        assert got.metrics["train_loss"] == want.metrics["train_loss"]
        assert np.array_equal(reused.evaluate(got.params)["loss"],
                              fresh.evaluate(want.params)["loss"])
        if number % 2:
            working.model.eval()  # as an evaluation task leaves it
        model = got.params  # the next task starts from another global model


def test_derived_trainers_hold_their_own_kept_local_entries(clients: list[Dataset]) -> None:
    """A trainer that kept its client's BatchNorm entries does not hand them to the next."""
    working = WorkingModelTrainers(_factory(keep_local=("batchnorm",)), _bn_model())
    model = to_vector(_bn_model())
    first = working(working.model, clients[0], seed=1)
    first.train(model, TrainPlan(local_steps=2, batch_size=8))
    second = working(working.model, clients[1], seed=2)
    assert np.array_equal(second.personalize(model), model)
    assert not np.array_equal(first.personalize(model), model)


def test_only_plain_torch_trainers_are_derived(clients: list[Dataset]) -> None:
    """A subclass may keep per-client state: its factory builds every trainer."""
    class Custom(TorchTrainer):
        pass

    built: list[Custom] = []

    def factory(model: nn.Module, data: Any, *, seed: int) -> Custom:
        built.append(Custom(model, data, seed=seed))
        return built[-1]

    working = WorkingModelTrainers(factory, _bn_model())
    for seed in range(3):
        assert working(working.model, clients[seed], seed=seed) is built[-1]
    assert len(built) == 3
    with pytest.raises(TypeError, match="Custom"):
        built[0].for_client(clients[1], 1)


def test_another_model_gets_the_factorys_trainer(clients: list[Dataset]) -> None:
    """A held-out evaluation's trainer trains in a module of its own: built by the factory."""
    calls: list[nn.Module] = []
    plain = _factory()

    def factory(model: nn.Module, data: Any, *, seed: int) -> TorchTrainer:
        calls.append(model)
        return plain(model, data, seed=seed)

    working = WorkingModelTrainers(factory, _bn_model())
    working(working.model, clients[0], seed=0)
    working(working.model, clients[1], seed=1)
    own = _bn_model()
    assert working(own, clients[2], seed=2).model is own
    assert calls == [working.model, own]


def test_a_derived_trainer_still_checks_its_data_fits(clients: list[Dataset]) -> None:
    """The fit check's forward pass runs once per example shape and class count for a trainer
    and those derived from it, and still refuses data the model does not fit."""
    model = _bn_model()
    calls: list[int] = []
    model.register_forward_hook(lambda module, args, out: calls.append(len(args[0])))
    working = WorkingModelTrainers(_factory(), model)
    for client in clients:
        working(model, client, seed=0)
    assert len(calls) == 1
    three = Dataset(clients[0].x, clients[0].y % 3, 3, 64, "three")
    with pytest.raises(ConfigError, match="expected 3 class logits"):
        working(model, three, seed=0)
