"""``examples/custom_algorithm.py`` (FedDyn in one user file): a hand-computed case, and a run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from fedlink.client import TrainPlan
from fedlink.params import to_vector
from fedlink.sim import ExperimentConfig, run_simulation

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def feddyn() -> Iterator[ModuleType]:
    """The example module, imported the way its import strings name it."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import custom_algorithm

        yield custom_algorithm
    finally:
        sys.path.remove(str(EXAMPLES))


def test_server_step_matches_the_hand_computed_case(feddyn: ModuleType) -> None:
    server = feddyn.FedDynServer(alpha=0.5, participation=0.5)
    model = np.array([1.0, 2.0], dtype=np.float32)
    # h1 = -0.5 * 0.5 * [0.2, -0.4] = [-0.05, 0.1]; w1 = [1.2, 1.6] - h1 / 0.5 = [1.3, 1.4]
    first = server.step(model, np.array([0.2, -0.4], dtype=np.float32))
    np.testing.assert_allclose(first, [1.3, 1.4], atol=1e-6)
    # h2 = h1 - 0.25 * [0.1, 0.1] = [-0.075, 0.075]; w2 = [1.4, 1.5] - h2 / 0.5 = [1.55, 1.35]
    resumed = feddyn.FedDynServer()
    resumed.load_state_dict(server.state_dict())  # as a restarted coordinator would
    second = resumed.step(first, np.array([0.1, 0.1], dtype=np.float32))
    np.testing.assert_allclose(second, [1.55, 1.35], atol=1e-6)


def test_client_step_matches_the_hand_computed_case(feddyn: ModuleType) -> None:
    model = nn.Linear(1, 1, bias=False)
    data = TensorDataset(torch.tensor([[1.0]]), torch.tensor([3.0]))
    trainer = feddyn.FedDynTrainer(model, data, loss="mse")
    plan = TrainPlan(local_steps=1, batch_size=1, learning_rate=0.1,
                     options={"feddyn_alpha": "0.5"})
    # Task 1 from w = 1, g = 0: grad = 2 (1 - 3) = -4, so theta = 1.4; g = -0.5 * 0.4 = -0.2
    first = trainer.train(np.array([1.0], dtype=np.float32), plan)
    np.testing.assert_allclose(first.params, [1.4], atol=1e-6)
    # Task 2 from w = 2: grad = 2 (2 - 3) - g = -1.8, so theta = 2.18; g = -0.2 - 0.09
    second = trainer.train(np.array([2.0], dtype=np.float32), plan)
    np.testing.assert_allclose(second.params, [2.18], atol=1e-6)
    np.testing.assert_allclose(trainer._g[0].item(), -0.29, atol=1e-6)
    assert to_vector(model).shape == (1,)


@pytest.mark.timeout(180)
def test_feddyn_converges_on_digits(feddyn: ModuleType, tmp_path: Path) -> None:
    config = ExperimentConfig.from_dict(feddyn.CONFIG)
    result = run_simulation(config, tmp_path, progress=False)
    assert result.summary["final_accuracy"] >= 0.85, result.summary["final_accuracy"]
    assert result.summary["config"]["coordinator"]["server_optimizer"] == \
        "custom_algorithm:FedDynServer"
