"""Bring your own model, data, loss and training loop: user code through fedlink's whole path.

A CNN with BatchNorm trained by ``run_simulation`` over emulated links matches the same CNN
trained centrally (its running statistics travel with the weights), FedBN keeps BatchNorm on
the clients, and a regression model with an MSE loss runs from import strings alone, both
through ``fedlink simulate`` and through ``fedlink serve`` with two ``fedlink client``
processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedlink.client import TrainPlan
from fedlink.client.torch_trainer import TorchTrainer
from fedlink.data import load_federated
from fedlink.experiment.setup import pooled_train
from fedlink.models import evaluate
from fedlink.params import load_vector, spec_of, to_vector
from fedlink.sim import ExperimentConfig, run_simulation

ROUNDS = 12
SEED = 3


def cnn(batchnorm: bool = True) -> nn.Module:
    """A small CNN for the 8x8 digits (inputs arrive flat: 64 features)."""
    torch.manual_seed(SEED)
    norm = nn.BatchNorm2d if batchnorm else (lambda _: nn.Identity())
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 16, 3, padding=1), norm(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), norm(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


def _config(name: str, **client: object) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": name, "seed": SEED},
        "data": {"dataset": "digits", "clients": 4, "partition": "iid"},
        "client": dict(client),
        "coordinator": {
            "rounds": ROUNDS,
            "flush": {"goal": 4, "min_updates": 4, "deadline_s": 120.0},
            "training": {"local_epochs": 1, "batch_size": 32, "learning_rate": 0.05},
        },
        "network": {"fleet": {"4g": 0.5, "wifi-good": 0.5}},
    })


def _central_accuracy(model: nn.Module) -> float:
    """The same CNN trained on the pooled training data for as many epochs as rounds."""
    data = load_federated("digits", 4, SEED, "iid")
    trainer = TorchTrainer(model, pooled_train(data), seed=SEED)
    vector = to_vector(trainer.model)
    for epoch in range(ROUNDS):
        vector = trainer.train(vector, TrainPlan(local_epochs=1, batch_size=32,
                                                 learning_rate=0.05, seed=epoch)).params
    load_vector(trainer.model, vector)
    return evaluate(trainer.model, data.test)["accuracy"]


@pytest.mark.timeout(480)
def test_cnn_with_batchnorm_matches_central_and_no_bn_variant(tmp_path: Path) -> None:
    with_bn = run_simulation(_config("cnn-bn"), tmp_path, progress=False, model=cnn(True))
    without_bn = run_simulation(_config("cnn"), tmp_path, progress=False, model=cnn(False))
    central = _central_accuracy(cnn(True))
    federated = with_bn.summary["final_accuracy"]
    assert federated >= central - 0.02, (federated, central)
    assert federated >= without_bn.summary["final_accuracy"] - 0.02, \
        (federated, without_bn.summary["final_accuracy"])
    # The running statistics moved away from their initial values, and travelled back.
    assert not torch.allclose(with_bn.model["2.running_mean"], torch.zeros(16))
    assert with_bn.model["2.num_batches_tracked"].item() > 0
    assert (tmp_path / "cnn-bn" / "model.pt").is_file()
    reloaded = cnn(True)
    reloaded.load_state_dict(torch.load(tmp_path / "cnn-bn" / "model.pt"))
    data = load_federated("digits", 4, SEED, "iid")
    assert evaluate(reloaded, data.test)["accuracy"] == pytest.approx(federated, abs=1e-9)


@pytest.mark.timeout(480)
def test_fedbn_keeps_batchnorm_on_the_clients(tmp_path: Path) -> None:
    result = run_simulation(_config("fedbn", keep_local=["batchnorm"]), tmp_path,
                            progress=False, model=cnn(True))
    final = np.load(tmp_path / "fedbn" / "model.npy")
    spec = spec_of(cnn(True))
    bn = np.zeros(spec.size, dtype=bool)
    for name, offset, numel in zip(spec.names, spec.offsets, spec.numels, strict=True):
        bn[offset:offset + numel] = name.split(".")[0] in ("2", "5")  # the BatchNorm layers
    start = to_vector(cnn(True))
    # The coordinator never moved BatchNorm (every update left it at the global value); the
    # saved central model holds the clients' mean of it, and says so ...
    assert result.summary["kept_local"]["clients"] == 4
    assert not np.allclose(final[bn], start[bn])
    assert not np.allclose(final[~bn], start[~bn])
    # ... while each client trained its own: the shared weights agree, BN stats differ.
    trainers = [t for t in result.trainers if isinstance(t, TorchTrainer)]
    assert len(trainers) == 4
    mine = [t.personalize(final) for t in trainers]
    for other in mine[1:]:
        assert np.array_equal(other[~bn], mine[0][~bn])
        assert not np.allclose(other[bn], mine[0][bn])
    personal = cnn(True)
    load_vector(personal, mine[0])
    data = load_federated("digits", 4, SEED, "iid")
    assert evaluate(personal, data.test)["accuracy"] >= 0.9


REGRESSION_MODULE = '''
"""A user's own regression task: y = x . w + b + noise, as torch datasets."""
import torch
from torch import nn
from torch.utils.data import TensorDataset

from fedlink.data.torch_data import TorchFederatedData

WEIGHTS = torch.tensor([1.5, -2.0, 0.5])


def linear_model() -> nn.Module:
    return nn.Linear(3, 1)


def data(num_clients: int, seed: int, *, noise: float = 0.01) -> TorchFederatedData:
    generator = torch.Generator().manual_seed(seed)

    def split(n: int) -> TensorDataset:
        x = torch.randn(n, 3, generator=generator)
        return TensorDataset(x, x @ WEIGHTS + 0.3 + noise * torch.randn(n, generator=generator))

    return TorchFederatedData([split(200) for _ in range(num_clients)], split(200), "linear")
'''

REGRESSION_CONFIG = '''
[run]
name = "byo-mse"
seed = 1
[data]
loader = "byo_regression:data"
clients = 2
options = { noise = 0.01 }
[model]
factory = "byo_regression:linear_model"
[client]
loss = "mse"
optimizer = "sgd"
optimizer_options = { momentum = 0.5 }
[coordinator]
rounds = 6
[coordinator.flush]
goal = 2
deadline_s = 60.0
[coordinator.training]
local_epochs = 1
batch_size = 16
learning_rate = 0.05
'''

FEDLINK = [sys.executable, "-m", "fedlink"]


def _user_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A user's module and config on disk; the environment that finds the module."""
    (tmp_path / "byo_regression.py").write_text(textwrap.dedent(REGRESSION_MODULE))
    config = tmp_path / "byo.toml"
    config.write_text(REGRESSION_CONFIG)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    return config, dict(os.environ, PYTHONPATH=path, MPLCONFIGDIR=str(tmp_path / "mpl"))


def _check_regression(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_accuracy"] is None  # a regression has no accuracy ...
    assert summary["final_loss"] < 0.01, summary["final_loss"]  # ... but its MSE is small
    state = torch.load(run_dir / "model.pt")
    assert torch.allclose(state["weight"], torch.tensor([[1.5, -2.0, 0.5]]), atol=0.05)


@pytest.mark.timeout(360)
def test_mse_regression_through_fedlink_simulate_by_import_strings(tmp_path: Path) -> None:
    config, env = _user_project(tmp_path)
    done = subprocess.run([*FEDLINK, "simulate", str(config), "--no-progress",
                           "--output-dir", str(tmp_path / "runs")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    _check_regression(tmp_path / "runs" / "byo-mse")


@pytest.mark.timeout(480)
def test_mse_regression_through_serve_and_two_clients(tmp_path: Path) -> None:
    config, env = _user_project(tmp_path)
    serve = subprocess.Popen([*FEDLINK, "serve", "--config", str(config), "--port", "0",
                              "--output-dir", str(tmp_path / "runs")], env=env, cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    clients: list[subprocess.Popen[str]] = []
    try:
        assert serve.stdout is not None
        address = _listening_address(serve)
        clients = [subprocess.Popen([*FEDLINK, "client", "--server", address, "--config",
                                     str(config), "--index", str(i)], env=env, cwd=tmp_path,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for i in range(2)]
        out, _ = serve.communicate(timeout=400)
        assert serve.returncode == 0, out
        for client in clients:
            client_out, _ = client.communicate(timeout=180)
            assert client.returncode == 0, client_out
    finally:
        for proc in (serve, *clients):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    _check_regression(tmp_path / "runs" / "byo-mse")


def _listening_address(serve: subprocess.Popen[str]) -> str:
    """HOST:PORT from the coordinator's first lines (it prints it once it listens)."""
    assert serve.stdout is not None
    seen = []
    for line in serve.stdout:
        seen.append(line)
        if "listening on " in line:
            return line.rsplit("listening on ", 1)[1].strip()
    raise AssertionError("fedlink serve exited before listening:\n" + "".join(seen))


EXTENDING = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


@pytest.mark.timeout(360)
def test_the_guide_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    section = EXTENDING.read_text().split("## Bring your own", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 22
    monkeypatch.chdir(tmp_path)  # its run folder goes to ./runs
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/extending.md", "exec"), namespace)
    result = namespace["result"]
    assert result.summary["final_accuracy"] >= 0.85  # type: ignore[attr-defined]
    assert (tmp_path / "runs" / "fedlink-run" / "model.pt").is_file()
