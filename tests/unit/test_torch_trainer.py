"""fedlink.client.torch_trainer: local SGD over flat parameter vectors."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import time
from collections.abc import Iterable

import numpy as np
import pytest
import torch
from torch import nn

from fedlink.client.base import Trainer, TrainPlan, proximal_mu
from fedlink.client.torch_trainer import TorchTrainer
from fedlink.data import Dataset, load_federated
from fedlink.errors import ConfigError
from fedlink.models import build_model, evaluate
from fedlink.params import load_vector, spec_of, to_vector


@pytest.fixture(scope="module")
def local_data() -> Dataset:
    return load_federated("digits", num_clients=2, seed=0).clients[0]


def make_trainer(data: Dataset, **kwargs: object) -> tuple[TorchTrainer, np.ndarray]:
    model = build_model("mlp", 64, 10, seed=0)
    return TorchTrainer(model, data, **kwargs), to_vector(model)  # type: ignore[arg-type]


def test_is_a_trainer(local_data: Dataset) -> None:
    trainer, _ = make_trainer(local_data)
    assert isinstance(trainer, Trainer)
    assert trainer.num_examples() == len(local_data)


def test_step_plan_runs_exactly_that_many_steps(local_data: Dataset) -> None:
    trainer, start = make_trainer(local_data)
    result = trainer.train(start, TrainPlan(local_steps=7, batch_size=16))
    assert (result.steps_completed, result.steps_planned) == (7, 7)
    assert result.num_examples == len(local_data)
    assert result.params.dtype == np.float32 and result.params.shape == start.shape
    assert not np.array_equal(result.params, start)
    assert set(result.metrics) == {"train_loss", "train_seconds"}


def test_steps_cycle_past_one_epoch(local_data: Dataset) -> None:
    trainer, start = make_trainer(local_data)
    steps = 2 * math.ceil(len(local_data) / 256) + 1
    result = trainer.train(start, TrainPlan(local_steps=steps, batch_size=256))
    assert result.steps_completed == steps


def test_epoch_plan_counts_batches_per_epoch(local_data: Dataset) -> None:
    trainer, start = make_trainer(local_data)
    result = trainer.train(start, TrainPlan(local_epochs=2, batch_size=100))
    expected = 2 * math.ceil(len(local_data) / 100)
    assert (result.steps_completed, result.steps_planned) == (expected, expected)


def test_deadline_stops_early(local_data: Dataset) -> None:
    ticks = itertools.count()
    trainer, start = make_trainer(local_data, clock=lambda: float(next(ticks)))
    result = trainer.train(start, TrainPlan(local_steps=50, deadline=4.5))
    assert (result.steps_completed, result.steps_planned) == (5, 50)
    assert "train_loss" in result.metrics


def test_passed_deadline_does_no_work(local_data: Dataset) -> None:
    trainer, start = make_trainer(local_data)
    plan = TrainPlan(local_steps=10, deadline=time.monotonic() - 1.0)
    result = trainer.train(start, plan)
    assert (result.steps_completed, result.steps_planned) == (0, 10)
    assert np.array_equal(result.params, start)
    assert "train_loss" not in result.metrics


def test_real_deadline_bounds_training_time(local_data: Dataset) -> None:
    trainer, start = make_trainer(local_data)
    began = time.monotonic()
    result = trainer.train(start, TrainPlan(local_steps=10**7, deadline=began + 0.2))
    assert 0 < result.steps_completed < 10**7
    assert time.monotonic() - began < 2.0


def test_training_reduces_loss(local_data: Dataset) -> None:
    trainer, start = make_trainer(local_data)
    model = build_model("mlp", 64, 10, seed=0)
    before = evaluate(model, local_data)["loss"]
    plan = TrainPlan(local_epochs=4, batch_size=32, learning_rate=0.2)
    first = trainer.train(start, plan)
    second = trainer.train(first.params, plan)
    load_vector(model, second.params)
    after = evaluate(model, local_data)
    assert after["loss"] < 0.5 * before
    assert second.metrics["train_loss"] < first.metrics["train_loss"]
    assert after["accuracy"] > 0.8


def test_input_vector_is_not_mutated(local_data: Dataset) -> None:
    trainer, start = make_trainer(local_data)
    frozen = start.copy()
    frozen.flags.writeable = False
    keep = start.copy()
    result = trainer.train(start, TrainPlan(local_steps=5))
    trainer.train(frozen, TrainPlan(local_steps=5))
    assert np.array_equal(start, keep)
    assert not np.shares_memory(result.params, start)


def test_same_seeds_same_result_different_seeds_differ(local_data: Dataset) -> None:
    trainer, start = make_trainer(local_data, seed=1)
    plan = TrainPlan(local_steps=5, seed=3)
    first = trainer.train(start, plan).params
    assert np.array_equal(trainer.train(start, plan).params, first)
    assert not np.array_equal(trainer.train(start, TrainPlan(local_steps=5, seed=4)).params, first)
    other, _ = make_trainer(local_data, seed=2)
    assert not np.array_equal(other.train(start, plan).params, first)


def test_optimizer_factory_is_used(local_data: Dataset) -> None:
    calls: list[float] = []

    def adam(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        calls.append(lr)
        return torch.optim.Adam(params, lr=lr)

    trainer, start = make_trainer(local_data, optimizer=adam)
    trainer.train(start, TrainPlan(local_steps=2, learning_rate=0.01))
    assert calls == [0.01]


def test_default_sgd_matches_torch_sgd_bit_for_bit(local_data: Dataset) -> None:
    def torch_sgd(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr)

    plan = TrainPlan(local_epochs=2, batch_size=16, learning_rate=0.3, seed=5,
                     options={"prox_mu": "0.1"})
    plain, start = make_trainer(local_data, seed=1)
    reference, _ = make_trainer(local_data, seed=1, optimizer=torch_sgd)
    np.testing.assert_array_equal(plain.train(start, plan).params,
                                  reference.train(start, plan).params)


def test_default_training_does_not_import_torch_dynamo() -> None:
    # torch.optim's first use imports torch._dynamo: seconds of a client's start
    code = """if True:
        import sys
        from fedlink.client import TrainPlan
        from fedlink.client.torch_trainer import TorchTrainer
        from fedlink.data import load_federated
        from fedlink.models import build_model
        from fedlink.params import to_vector
        model = build_model("mlp", 64, 10, seed=0)
        trainer = TorchTrainer(model, load_federated("digits", 2, seed=0).clients[0])
        trainer.train(to_vector(model), TrainPlan(local_steps=3))
        print("torch._dynamo" in sys.modules)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_frozen_layers_stay_fixed(local_data: Dataset) -> None:
    model = build_model("mlp", 64, 10, seed=0)
    first = model.get_submodule("0")
    first.requires_grad_(False)
    frozen = first.get_parameter("weight").detach().clone()
    trainer = TorchTrainer(model, local_data)
    start = to_vector(model)
    result = trainer.train(start, TrainPlan(local_steps=5))
    assert result.params.shape == (spec_of(model).size,)
    assert torch.equal(first.get_parameter("weight"), frozen)


@pytest.mark.parametrize(
    "plan",
    [
        TrainPlan(batch_size=0),
        TrainPlan(learning_rate=0.0),
        TrainPlan(learning_rate=float("nan")),
        TrainPlan(local_steps=-1),
        TrainPlan(local_steps=0, local_epochs=0),
    ],
)
def test_bad_plans_are_config_errors(local_data: Dataset, plan: TrainPlan) -> None:
    trainer, start = make_trainer(local_data)
    with pytest.raises(ConfigError):
        trainer.train(start, plan)


def test_wrong_vector_length_is_a_config_error(local_data: Dataset) -> None:
    trainer, start = make_trainer(local_data)
    with pytest.raises(ConfigError, match="elements"):
        trainer.train(start[:-1], TrainPlan(local_steps=1))


def test_empty_dataset_is_refused(local_data: Dataset) -> None:
    with pytest.raises(ConfigError, match="empty"):
        make_trainer(local_data.subset(np.array([], dtype=np.int64)))


def test_model_for_other_data_is_refused(local_data: Dataset) -> None:
    with pytest.raises(ConfigError, match="features"):
        TorchTrainer(build_model("mlp", 60, 10, seed=0), local_data)
    with pytest.raises(ConfigError, match="expected 10 class logits"):
        TorchTrainer(build_model("mlp", 64, 3, seed=0), local_data)


def test_fedprox_proximal_term_keeps_local_model_closer_to_global() -> None:
    data = load_federated("digits", 2, seed=0)
    model = build_model("mlp", data.num_features, data.num_classes, seed=0)
    start = to_vector(model)
    distances = []
    for mu in ("0", "1.0", "10.0"):
        trainer = TorchTrainer(build_model("mlp", data.num_features, data.num_classes),
                               data.clients[0], seed=1)
        plan = TrainPlan(local_epochs=3, learning_rate=0.1, seed=3, options={"prox_mu": mu})
        distances.append(float(np.linalg.norm(trainer.train(start, plan).params - start)))
    assert distances[0] > distances[1] > distances[2] > 0


def test_bad_prox_mu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="prox_mu"):
        proximal_mu(TrainPlan(options={"prox_mu": "-1"}))
    with pytest.raises(ConfigError, match="prox_mu"):
        proximal_mu(TrainPlan(options={"prox_mu": "lots"}))


def test_the_check_that_a_model_fits_its_data_runs_once_per_trainer(local_data: Dataset) -> None:
    """Each trainer built checks that its model fits its data (one small forward pass); the
    trainers derived from it (``for_client``, a virtual run's tasks) check it once between
    them, per input shape and class count."""
    model = build_model("mlp", 64, 10, seed=0)
    calls: list[tuple[int, ...]] = []
    model.register_forward_hook(lambda module, args, out: calls.append(tuple(args[0].shape)))
    trainer = TorchTrainer(model, local_data)
    for seed in range(3):
        trainer.for_client(local_data, seed)
    assert len(calls) == 1
    TorchTrainer(model, local_data)
    assert len(calls) == 2
    with pytest.raises(ConfigError, match="expected 3 class logits"):  # still checked
        trainer.for_client(Dataset(local_data.x, local_data.y % 3, 3, 64, "three"), 0)


def test_a_submodule_left_in_eval_mode_trains_in_training_mode(local_data: Dataset) -> None:
    # training skips model.train() when every module already trains: a submodule in eval
    # mode (a reused working module) must still be switched back
    trainer, start = make_trainer(local_data)
    trainer.model.train()
    next(iter(trainer.model.children())).eval()  # the root trains, a submodule does not
    trainer.train(start, TrainPlan(local_steps=1))
    assert all(module.training for module in trainer.model.modules())


def test_plain_sgd_skips_parameters_without_gradients() -> None:
    from fedlink.models.training import PlainSGD

    frozen, moving = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))
    reference = [nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))]
    moving.grad = torch.tensor([0.5, -1.0])
    reference[1].grad = moving.grad.clone()
    PlainSGD([frozen, moving], lr=0.1).step()
    torch.optim.SGD(reference, lr=0.1).step()
    assert torch.equal(frozen, reference[0]) and torch.equal(moving, reference[1])
    PlainSGD([frozen], lr=0.1).step()  # no gradient at all: nothing to do, no error
    assert torch.equal(frozen, torch.ones(3))
