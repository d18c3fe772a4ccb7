"""``[client] device`` (issue 24, finding 9): checked when the config is read, resolved on the
machine (a device that is not here is refused naming the key), honoured by the torch trainer,
the DP-SGD trainer, the central evaluator, custom trainer factories and virtual workers.

On a CPU-only machine ``"cpu"`` and ``"auto"`` train on the CPU and ``"cuda"`` is refused; the
tests marked for CUDA run where a GPU is present.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedlink.client import TrainPlan
from fedlink.client.device import check_device
from fedlink.client.torch_trainer import TorchTrainer, resolve_device
from fedlink.data import load_federated
from fedlink.errors import ConfigError
from fedlink.experiment.setup import Experiment, Plugs
from fedlink.models import build_model
from fedlink.params import to_vector
from fedlink.privacy.dp_sgd import DPSGDTrainer
from fedlink.sim import ExperimentConfig
from fedlink.sim.virtual.backends import ConfigPopulation

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
cpu_only = pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")


def _auto() -> torch.device:
    """What ``"auto"`` must mean here, worked out independently."""
    if CUDA:
        return torch.device("cuda", 0)
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def config(**client: Any) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": "device", "seed": 1},
        "data": {"dataset": "digits", "clients": 2},
        "model": {"options": {"hidden": [16]}},
        "client": client,
        "coordinator": {"rounds": 1, "flush": {"goal": 2}},
    })


@pytest.mark.parametrize("good", ["auto", "cpu", "cuda", "cuda:0", "cuda:12", "mps"])
def test_device_grammar_accepts_the_documented_names(good: str) -> None:
    assert check_device(good) == good
    assert config(device=good).client.device == good


@pytest.mark.parametrize("bad", ["gpu", "CUDA", "cuda:", "cuda:x", "cuda0", "", "tpu", "cpu:0"])
def test_bad_device_strings_are_refused_when_the_config_is_read(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"client\.device.*auto, cpu, cuda, cuda:<i>, mps"):
        config(device=bad)


def test_device_must_be_a_string() -> None:
    with pytest.raises(ConfigError, match=r"client\.device"):
        config(device=0)


def test_cpu_and_auto_resolve_on_this_machine() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == _auto()
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@cpu_only
@pytest.mark.parametrize("absent", ["cuda", "cuda:0", "cuda:3"])
def test_an_absent_cuda_device_is_refused_naming_the_key(absent: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_device(absent, key="[client] device")
    message = str(caught.value)
    assert f"[client] device = {absent!r}" in message
    assert "no CUDA device" in message and '"auto"' in message


@cpu_only
def test_experiment_with_cuda_on_a_cpu_machine_is_refused_before_the_run() -> None:
    with pytest.raises(ConfigError, match=r"\[client\] device = 'cuda'"):
        Experiment.build(config(device="cuda"))


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the refusal without MPS")
def test_an_absent_mps_device_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"\[client\] device = 'mps'.*no MPS device"):
        resolve_device("mps", key="[client] device")


@pytest.mark.parametrize("setting", ["cpu", "auto"])
def test_the_built_in_trainers_and_evaluator_use_the_device(setting: str) -> None:
    experiment = Experiment.build(config(device=setting))
    expected = resolve_device(setting)
    trainer = experiment.trainer(0)
    assert isinstance(trainer, TorchTrainer)
    assert {p.device for p in trainer.model.parameters()} == {expected}
    result = trainer.train(experiment.initial_vector(),
                           TrainPlan(local_steps=3, batch_size=16, learning_rate=0.1))
    assert result.steps_completed == 3 and np.all(np.isfinite(result.params))
    scores = experiment.evaluator()(result.params)
    assert 0.0 <= scores["accuracy"] <= 1.0


@pytest.mark.parametrize("setting", ["cpu", "auto"])
def test_dp_sgd_trains_on_the_device(setting: str) -> None:
    data = load_federated("digits", 2, 0, "iid")
    model = build_model("mlp", data.num_features, data.num_classes, seed=0, hidden=[16])
    trainer = DPSGDTrainer(model, data.clients[0], device=setting)
    assert {p.device for p in trainer.model.parameters()} == {resolve_device(setting)}
    plan = TrainPlan(local_steps=2, batch_size=16, learning_rate=0.1,
                     options={"dp_noise_multiplier": "1.0"})
    assert trainer.train(to_vector(model), plan).steps_completed == 2


def factory_without_device(model: nn.Module, data: Any, *, seed: int) -> TorchTrainer:
    """A trainer factory that cannot be told the device."""
    return TorchTrainer(model, data, seed=seed)


GIVEN: list[Any] = []


def factory_with_device(model: nn.Module, data: Any, *, seed: int,
                        device: Any = "cpu") -> TorchTrainer:
    """A trainer factory that takes the device, and records what it was given."""
    GIVEN.append(device)
    return TorchTrainer(model, data, seed=seed, device=device)


def test_a_factory_that_cannot_take_the_device_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError) as caught:
        Experiment.build(config(device="auto"), Plugs(trainer=factory_without_device))
    message = str(caught.value)
    assert "[client] device cannot apply" in message and "device=" in message
    assert "factory_without_device" in message
    # the default device needs nothing from the factory
    Experiment.build(config(), Plugs(trainer=factory_without_device)).trainer(0)


def test_a_factory_that_takes_the_device_is_given_the_resolved_one() -> None:
    GIVEN.clear()
    experiment = Experiment.build(config(device="auto"), Plugs(trainer=factory_with_device))
    experiment.trainer(1)
    assert GIVEN[-1] == _auto() and isinstance(GIVEN[-1], torch.device)


def test_each_virtual_worker_builds_for_its_own_number() -> None:
    populations = ConfigPopulation(config(device="cuda" if CUDA else "auto"))
    assert populations.worker == 0
    assert [populations.for_worker(n).worker for n in range(3)] == [0, 1, 2]
    assert Experiment.build(config(), worker=2).worker == 2


@needs_cuda
def test_cuda_spreads_workers_over_the_visible_devices() -> None:
    count = torch.cuda.device_count()
    for worker in range(2 * count):
        assert resolve_device("cuda", worker) == torch.device("cuda", worker % count)
        assert resolve_device("auto", worker) == torch.device("cuda", worker % count)
    assert resolve_device("cuda:0", worker=5) == torch.device("cuda", 0)
    with pytest.raises(ConfigError, match=f"this machine has {count} CUDA device"):
        resolve_device(f"cuda:{count}", key="[client] device")


@needs_cuda
def test_a_run_on_cuda_trains_and_evaluates_there(tmp_path: Any) -> None:
    from fedlink.sim.runner import run_simulation

    table = config(device="cuda").to_dict()
    cfg = ExperimentConfig.from_dict({
        "run": {"name": "cuda-run", "seed": 1, "mode": "virtual"},
        "data": {"dataset": "digits", "clients": 4},
        "client": {"device": "cuda"},
        "coordinator": {"rounds": 3, "flush": {"goal": 4, "min_updates": 4},
                        "training": {"local_steps": 20, "batch_size": 32,
                                     "learning_rate": 0.1}},
    })
    assert table["client"]["device"] == "cuda"
    result = run_simulation(cfg, tmp_path, progress=False)
    assert result.summary["config"]["client"]["device"] == "cuda"
    assert result.summary["final_accuracy"] > 0.5


def test_backends_give_each_worker_its_own_build() -> None:
    from fedlink.sim.virtual.backends import BackendContext

    built = ConfigPopulation(config(device="auto"))
    context = BackendContext(workers=3, population=None, build=built)  # type: ignore[arg-type]
    assert [context.build_for(n).worker for n in range(3)] == [0, 1, 2]  # type: ignore[attr-defined]
    plain = BackendContext(workers=2, population=None, build=len)  # type: ignore[arg-type]
    assert plain.build_for(1) is len  # a build without for_worker is used as it is
