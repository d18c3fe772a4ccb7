"""DP-SGD on any data and any model it can protect (issue 24, finding 8).

``[client] trainer = "dp_sgd"`` trains on a loader's ``TorchFederatedData`` (torch datasets and
data loaders, not only fedlink's numpy ``Dataset``); a BatchNorm model is refused before the run
with the fix named, and ``[client] dp_fix_model = true`` applies that fix (Opacus's
``ModuleValidator.fix``: GroupNorm) to every copy of the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fedlink.client import TrainPlan
from fedlink.data import load_federated
from fedlink.data.torch_data import TorchFederatedData
from fedlink.errors import ConfigError
from fedlink.experiment.setup import Experiment, Plugs
from fedlink.params import to_vector
from fedlink.privacy.dp_sgd import DPSGDTrainer
from fedlink.sim import ExperimentConfig
from fedlink.sim.runner import run_simulation

DP = {"dp_noise_multiplier": "0.5", "dp_max_grad_norm": "1.0"}


def dp_config(rounds: int = 8, **client: Any) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": "dpsgd-data", "seed": 2, "mode": "virtual"},
        "data": {"dataset": "digits", "clients": 4} if "loader" not in client else
        {"clients": 4},
        "client": {"trainer": "dp_sgd", **client},
        "coordinator": {"rounds": rounds, "flush": {"goal": 4, "min_updates": 4},
                        "training": {"local_steps": 30, "batch_size": 32, "learning_rate": 0.5,
                                     "trainer_options": DP}},
    })


class Pairs(Dataset):  # type: ignore[type-arg]
    """A torch dataset that is not a TensorDataset: read example by example."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.as_tensor(self.x[i]), torch.as_tensor(int(self.y[i]))


def _digits(num_clients: int, seed: int) -> Any:
    return load_federated("digits", num_clients, seed, "iid")


def tensors(*, num_clients: int, seed: int) -> TorchFederatedData:
    """Digits as TensorDatasets, already split."""
    data = _digits(num_clients, seed)

    def ds(d: Any) -> TensorDataset:
        return TensorDataset(torch.as_tensor(np.array(d.x)), torch.as_tensor(np.array(d.y)))

    return TorchFederatedData([ds(c) for c in data.clients], ds(data.test), num_classes=10)


def pairs(*, num_clients: int, seed: int) -> TorchFederatedData:
    """Digits as map-style datasets of pairs, one client behind a DataLoader."""
    data = _digits(num_clients, seed)
    clients: list[Any] = [Pairs(c.x, c.y) for c in data.clients]
    clients[0] = DataLoader(clients[0], batch_size=16, shuffle=True)
    return TorchFederatedData(clients, Pairs(data.test.x, data.test.y), num_classes=10)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def bn_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))


def bn_cnn() -> nn.Module:
    """A small CNN with BatchNorm2d for the 8x8 digits (which arrive flat)."""
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8 * 4 * 4, 10))


@pytest.mark.parametrize("loader", [tensors, pairs])
def test_dp_sgd_learns_on_torch_federated_data(tmp_path: Path, loader: Any) -> None:
    result = run_simulation(dp_config(), tmp_path, progress=False, data=loader, model=mlp)
    assert result.summary["final_accuracy"] >= 0.6
    # DP-SGD ran and the record says so, though the config lists no dp_sgd hook: the
    # clients' epsilon is collected into the summary
    privacy = result.summary["privacy"]
    assert privacy["mode"] == "sample_dp_sgd" and privacy["noise_multiplier"] == 0.5
    assert 0 < privacy["epsilon"] < float("inf") and privacy["steps"] > 0
    assert all(torch.isfinite(t).all() for t in result.model.values())


def test_a_data_loaders_batch_size_sets_the_sampling_rate() -> None:
    data = pairs(num_clients=2, seed=0)
    trainer = DPSGDTrainer(mlp(), data.clients[0], seed=1)
    result = trainer.train(to_vector(trainer.model), TrainPlan(
        local_steps=3, batch_size=64, learning_rate=0.1, options=DP))
    assert result.metrics["dp_sample_rate"] == pytest.approx(16 / trainer.num_examples())
    assert result.steps_completed == 3


def test_dp_sgd_on_the_same_data_gives_the_same_step_whatever_its_container() -> None:
    """Tensors sliced on the device and examples read one by one are the same Poisson
    samples and the same noise."""
    digits = _digits(2, 0)
    as_tensors = tensors(num_clients=2, seed=0).clients[1]
    as_pairs = Pairs(digits.clients[1].x, digits.clients[1].y)
    plan = TrainPlan(local_steps=4, batch_size=32, learning_rate=0.1, seed=3, options=DP)
    results = []
    for data in (digits.clients[1], as_tensors, as_pairs):
        torch.manual_seed(0)
        model = mlp()
        results.append(DPSGDTrainer(model, data, seed=5).train(to_vector(model), plan).params)
    np.testing.assert_allclose(results[0], results[1], atol=1e-6)
    np.testing.assert_allclose(results[0], results[2], atol=1e-6)


def test_a_batchnorm_model_is_refused_before_the_run_with_the_fix_named() -> None:
    with pytest.raises(ConfigError) as caught:
        Experiment.build(dp_config(), Plugs(model=bn_mlp))
    message = str(caught.value)
    assert "DP-SGD cannot train this model" in message and "(layers 1)" in message
    assert "GroupNorm" in message and "dp_fix_model = true" in message
    assert "opacus.validators.ModuleValidator.fix" in message
    with pytest.raises(ConfigError, match="GroupNorm"):  # the trainer alone says the same
        DPSGDTrainer(bn_mlp(), _digits(2, 0).clients[0])


def test_dp_fix_model_replaces_batchnorm_everywhere_and_learns(tmp_path: Path) -> None:
    config = dp_config(dp_fix_model=True)
    experiment = Experiment.build(config, Plugs(model=bn_cnn))
    model = experiment.new_model()
    assert isinstance(model[2], nn.GroupNorm)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert "2.running_var" not in experiment.spec().names
    result = run_simulation(config, tmp_path, progress=False, data=tensors, model=bn_cnn)
    assert result.summary["final_accuracy"] >= 0.6
    saved = torch.load(tmp_path / "dpsgd-data" / "model.pt", weights_only=True)
    assert "2.weight" in saved and "2.running_var" not in saved


def test_dp_fix_model_without_dp_sgd_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"client\.dp_fix_model.*trainer = 'dp_sgd'"):
        ExperimentConfig.from_dict({"client": {"dp_fix_model": True}})


class Drifting(nn.Module):
    """A layer Opacus does not know that keeps a running mean of its inputs in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen.mul_(0.9).add_(0.1 * x.detach().mean(0))
        return x


def test_a_buffer_that_dp_sgd_training_changes_is_not_sent() -> None:
    model = nn.Sequential(Drifting(), nn.Linear(64, 10))
    trainer = DPSGDTrainer(model, _digits(2, 0).clients[0])
    plan = TrainPlan(local_steps=2, batch_size=32, learning_rate=0.1, options=DP)
    with pytest.raises(ConfigError, match=r"changed the model's buffer '0\.seen'"):
        trainer.train(to_vector(trainer.model), plan)


def test_a_virtual_run_records_epsilon_over_each_clients_whole_life(tmp_path: Path) -> None:
    """Virtual mode builds a client's trainer per task; the accountant's history travels to
    the next one (as a device keeps its trainer), so the recorded epsilon covers every step
    the client took, and equals the gRPC run's."""
    from fedlink.privacy.accounting import Accountant

    records = {}
    for mode in ("virtual", "grpc"):
        table = dp_config(rounds=3).to_dict()
        config = ExperimentConfig.from_dict({
            "run": {"name": f"dp-eps-{mode}", "seed": 2, "mode": mode},
            "data": {"dataset": "digits", "clients": 4},
            "client": {"trainer": "dp_sgd"},
            "coordinator": {"rounds": 3, "flush": {"goal": 4, "min_updates": 4},
                            "training": {**table["coordinator"]["training"],
                                         "local_steps": 10},
                            "hooks": [{"name": "dp_sgd"}]},
        })
        records[mode] = run_simulation(config, tmp_path, progress=False, model=mlp,
                                       data=tensors).summary["privacy"]
    record = records["virtual"]
    assert record["steps"] == 3 * 10  # every client trained in each of the 3 rounds
    reference = Accountant("rdp")  # the analysis DPSGDTrainer.epsilon evaluates
    reference.history = [(0.5, record["sample_rate"], 3 * 10)]
    assert record["epsilon"] == pytest.approx(reference.epsilon(1e-5), rel=1e-9)
    once = Accountant("rdp")
    once.history = [(0.5, record["sample_rate"], 10)]
    assert record["epsilon"] > 1.2 * once.epsilon(1e-5)  # more than one task's worth
    assert records["grpc"]["steps"] == record["steps"]
    assert records["grpc"]["epsilon"] == pytest.approx(record["epsilon"], rel=1e-9)
